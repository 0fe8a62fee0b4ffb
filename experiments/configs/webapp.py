"""Web application tasks on Trac in state capsules (CUA-Sandbox on a stateful application):
every episode gets a private copy-on-write branch of a seeded Trac project (tickets,
milestones, wiki pages, attachments) served by one shared application server, and is judged on
the branch's database (WebArena's evaluators plus `db_query` and `db_diff`).

    python -m experiments.main --config=experiments/configs/webapp.py

The tasks are the suite cua_jax/tasks/suites/webapp/trac (WebArena's JSON format; its README
lists the kinds); `env.webapp.tasks = ()` trains on all of them, and MiniWoB tasks in
`env.tasks` join the same pool. Groups start from one state (`rollout.group_start = "shared"`):
one capsule resets and the others fork it (a branch of its database, not a rebuild).
Scaled for two CPU cores like experiments/configs/tiny.py: the 2-layer tiny Qwen3-VL, pages of
400 x 300 pixels with element ids drawn (set-of-marks), two turns of at most 32 new tokens. A
random policy exercises the loop; it does not solve these tasks.
"""

import ml_collections

from experiments.configs.base import base_config

# Questions answered from the data, a navigation, and two edits (a status change, a comment).
TASKS = ("trac-001", "trac-002", "trac-003", "trac-004")


def get_config():
    c = base_config()
    c.name = "webapp"
    c.workdir = "runs/webapp"
    c.model.num_layers = 2
    c.env.kind_modules = ("cua_jax.environments.webapp_env",)
    c.env.kind = "webapp"
    c.env.tasks = ()
    c.env.action_space = "both"
    c.env.include_dom_text = False
    c.env.webapp = ml_collections.ConfigDict(
        {
            "suite_dir": "cua_jax/tasks/suites/webapp/trac",
            "tasks": TASKS,
            "scale": "test",
            "viewport": (400, 300),
            "branch_by": "auto",
            "workdir": "",
        }
    )
    c.env.drop_hardest_tier = False
    c.rollout.group_size = 2
    c.rollout.batch_tasks = 2
    c.rollout.group_start = "shared"
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 32
    c.rollout.max_context_tokens = 2048
    c.loss.entropy_coef = 1e-2
    c.optimizer.learning_rate = 1e-3
    c.learner.rows = 4
    c.learner.length_multiple = 256
    c.eval.enabled = False
    c.train.num_steps = 3
    c.train.progress_bar = False
    return c
