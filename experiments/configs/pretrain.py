"""Pretraining the shipped base policy (python -m experiments.pretrain, cua_jax.train.pretrain).

The policy interface is the embedded default run's (experiments/configs/default.py): the same
prompt style, observation (screenshot + DOM text) and context, in the `elements` action space
(element ids drawn on the screenshot and listed in the DOM text), so a run with those settings
and model.init_from=<the export> continues from the base. Only the tasks and the supervised
budget differ: every task the oracle solves in both action spaces, many demonstrations each, a
long cosine schedule.
"""

from experiments.configs import default
from experiments.configs.base import ORACLE_BOTH_SPACES, at_tier


def get_config():
    c = default.get_config()
    c.name = "pretrain"
    c.workdir = "runs/pretrain"
    c.model.name = "tiny_qwen3_vl"
    c.model.init_from = ""
    c.env.action_space = "elements"
    c.env.tasks = at_tier(ORACLE_BOTH_SPACES)
    c.rollout.batch_tasks = 1
    # Demonstrations run to the oracle's longest episode on these tasks (login-user: 5 steps).
    c.rollout.max_turns = 6
    c.eval.max_turns = 6
    # Replies that type a whole value (use-autocomplete, login-user) run past the default's 64
    # tokens; a run that starts from this base needs the same budget.
    c.rollout.max_new_tokens = 128
    # Held-out pages start past the first 16 evaluation seeds (as for the shipped base).
    c.eval.num_seeds = 16
    c.warm_start.demos_per_task = 40
    c.warm_start.held_out_seeds = 4
    c.warm_start.steps = 2400
    c.warm_start.rows = 4
    c.warm_start.learning_rate = 2e-3
    c.warm_start.warmup_steps = 50
    c.warm_start.schedule = "cosine"
    c.warm_start.min_lr_ratio = 0.05
    c.warm_start.concurrency = 4
    c.pretrain.checkpoint_every = 100
    c.pretrain.eval_every = 250
    c.pretrain.eval_seeds = 10
    return c
