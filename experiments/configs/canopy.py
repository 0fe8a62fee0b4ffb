"""CANOPY (Table A1, App. A-C) at small scale: strictly on-policy GRPO with a large group.

    python -m experiments.main --config=experiments/configs/canopy.py

Every entry of Table A1 is a field here; the ones scaled down for a CPU run say the paper's
value beside them. The recipe: n = 32 rollouts per task, one update per rollout batch
(mini-batch = batch, one epoch: ratio exactly 1, clip fraction 0, App. C), k3 KL 1e-4 to the
frozen base, token-mean loss pooled over every action token, sparse {0, 1} reward, no entropy
bonus, the hardest tier kept, and a larger turn budget at evaluation than in training.
"""

from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "canopy"
    c.workdir = "runs/canopy"
    c.model.name = "tiny_qwen3_vl"  # paper: Qwen3-14B
    # Train tasks: paper 90 AppWorld tasks, hardest tier kept.
    c.env.tasks = (
        ("click-button", 0),
        ("click-link", 0),
        ("focus-text", 0),
        ("click-checkboxes", 1),
        ("enter-text", 2),
    )
    c.env.drop_hardest_tier = False
    c.rollout.group_size = 32  # n
    c.rollout.batch_tasks = 2  # train batch, paper 90 tasks (2,880 rollouts per step)
    c.learner.num_minibatches = 1  # ppo mini-batch = train batch (90 / 90), 1 epoch
    c.learner.rows = 4  # micro-batch per device: gradient accumulation only
    c.learner.old_logprobs = "current"  # strictly on-policy
    c.train.mode = "on_policy"
    c.train.staleness_window = 0
    c.train.num_steps = 90  # checkpoint: step 90 (fixed)
    c.train.checkpoint_every = 10
    c.optimizer.learning_rate = 3e-6
    c.optimizer.schedule = "constant"
    c.optimizer.weight_decay = 0.0
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0  # no dual clip
    c.loss.kl_coef = 1e-4
    c.loss.kl_estimator = "k3"  # reference: the fixed base policy
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "token_mean"  # pooled over all action tokens (eq. 8)
    c.advantage.estimator = "grpo"  # std-normalized
    c.advantage.reward = "sparse"
    c.advantage.item_advantages = "broadcast"
    c.rollout.temperature = 0.9  # sampling temperature (train)
    c.rollout.max_turns = 10  # paper 50
    c.rollout.max_new_tokens = 64  # per-turn generation cap: none in the paper
    c.rollout.max_context_tokens = 4096  # prompt cap 4,096
    # The paper's episode caps, enforced by the agent loop (cua_jax/rollout/agent_loop.py): at
    # most 32,768 generated tokens per episode, an observation's text cut to 4,096 tokens.
    c.rollout.max_response_tokens = 32768
    c.rollout.max_observation_tokens = 4096
    c.context.segmenter = "whole_trajectory"
    c.sampler.kind = "uniform"
    c.eval.group_size = 4  # validation group size
    c.eval.max_turns = 20  # inference budget raised over training's: paper 100 turns vs 50
    c.eval.max_context_tokens = 8192  # paper 61k (YaRN)
    c.eval.temperature = 0.6  # inference sampling T = 0.6, top-k 20, top-p 0.95
    c.eval.top_k = 20
    c.eval.top_p = 0.95
    return c
