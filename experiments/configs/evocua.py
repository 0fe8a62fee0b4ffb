"""EvoCUA-1.5's online RL: STEPO over step-wise compact context, the DTAC curriculum, and
asynchronous training with a staleness window of 1 and whole-group mini-batches.

    python -m experiments.main --config=experiments/configs/evocua.py

The paper leaves most constants unpublished (DTAC's band and replay cap are ours, as in
cua_jax.tasks.samplers.DTACConfig). MiniWoB has no infeasible tasks, so DTAC's infeasible
share rho_inf is 0 here. Policy-aware filtering (§2.3): a pilot of 8 rollouts per task with the
current policy keeps the tasks whose pass rate lies in the learnable band [0.05, 0.95], and
every 20 steps 16 tasks of the whole pool are re-estimated and re-filtered (a task can
re-enter the band as the policy changes).
"""

from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "evocua"
    c.workdir = "runs/evocua"
    c.advantage.estimator = "grpo"  # trajectory-level advantage ...
    c.advantage.item_advantages = "stepo"  # ... spread as A_i / |T_i| over the step items
    c.context.segmenter = "compact_context"  # one item per step, compact action history
    c.context.compact_context.window = 3
    c.sampler.kind = "dtac"
    c.sampler.dtac.p_low = 0.05
    c.sampler.dtac.p_high = 0.5
    c.sampler.dtac.max_replays_per_trajectory = 2
    c.sampler.dtac.replay_cache_size = 4
    c.sampler.dtac.rho_inf = 0.0
    c.sampler.calibration.enabled = True
    c.sampler.calibration.p_min = 0.05
    c.sampler.calibration.p_max = 0.95
    c.sampler.pilot.enabled = True
    c.sampler.pilot.group_size = 8
    c.sampler.calibration.every_k_steps = 20
    c.sampler.calibration.sample_size = 16
    c.sampler.calibration.group_size = 8
    c.train.mode = "async"
    c.train.staleness_window = 1
    c.train.buffer_groups = 8
    c.learner.num_minibatches = 2  # mini-group batching: whole groups per update
    c.learner.old_logprobs = "rollout"  # the ratio corrects for the version that sampled
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.28
    c.loss.dual_clip_c = 3.0
    c.loss.kl_coef = 0.0
    c.rollout.group_size = 8
    c.rollout.batch_tasks = 4
    c.rollout.max_turns = 15
    c.train.num_steps = 100
    return c
