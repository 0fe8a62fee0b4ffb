"""The embedded default run: online RL of a small Qwen3-VL-architecture policy on MiniWoB++.

    python -m experiments.main            (this config)

Strictly on-policy GRPO (the CANOPY recipe at CPU scale) on the MiniWoB tasks the scripted
oracle solves, in browser capsules, with MiniWoB's DOM as text beside the screenshot (the
screenshots still go through the vision tower and sliding-window segmentation). Success on
held-out seeds is measured before and after RL with a Wilson interval; metrics, checkpoints,
the learning curve and episode traces go to the workdir.

The supervised warm start on the oracle's demonstrations (warm_start.*) is described here and
switched off (steps = 0) until the trainer runs it; with a random-init policy the run
exercises the whole loop but does not yet learn.

The segmentation benchmark stays available: --config.job=segmentation_benchmark.
"""

from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "default"
    c.workdir = "runs/default"
    c.model.name = "tiny_qwen3_vl"
    c.env.include_dom_text = True
    c.rollout.group_size = 4
    c.rollout.batch_tasks = 2
    c.rollout.max_turns = 3
    c.rollout.max_new_tokens = 48
    c.rollout.max_context_tokens = 4096
    c.rollout.temperature = 1.0
    c.train.mode = "on_policy"
    c.learner.old_logprobs = "current"
    c.learner.num_minibatches = 1
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.kl_coef = 1e-4
    c.loss.entropy_coef = 0.0
    c.optimizer.learning_rate = 1e-4
    c.context.segmenter = "sliding_window"
    c.context.keep = 2
    c.context.min_removal = 1
    c.train.num_steps = 6
    c.train.checkpoint_every = 2
    c.eval.num_seeds = 4
    c.eval.max_turns = 5
    c.warm_start.steps = 0  # the embedded run's warm start: demos_per_task oracle demonstrations
    c.warm_start.demos_per_task = 8
    c.warm_start.learning_rate = 1e-3
    return c
