"""The smallest whole training run: a 2-layer tiny Qwen3-VL on two MiniWoB++ tasks, groups of
2, one turn of at most 8 new tokens, no DOM text, no evaluation.

It exercises every part of the loop (capsules, agent loop, quarantine, advantages, learner,
weight sync, checkpoints) in seconds per step, which is what the trainer's integration tests
and the `async_vs_sync` benchmark measure; it does not learn (a random policy never finishes
a task, so an entropy bonus keeps the gradient non-zero).

    python -m experiments.main --config=experiments/configs/tiny.py
"""

from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "tiny"
    c.workdir = "runs/tiny"
    c.model.num_layers = 2
    c.env.tasks = (("click-button", 0), ("focus-text", 1))
    c.env.include_dom_text = False
    c.rollout.group_size = 2
    c.rollout.batch_tasks = 2
    c.rollout.max_turns = 1
    c.rollout.max_new_tokens = 8
    c.rollout.max_context_tokens = 1024
    c.loss.entropy_coef = 1e-2
    c.optimizer.learning_rate = 1e-3
    c.learner.rows = 4
    c.learner.length_multiple = 256
    c.eval.enabled = False
    c.train.num_steps = 3
    c.train.progress_bar = False
    return c
