"""Online RL on Docker desktops: the desktop suite's OSWorld-format tasks (a terminal, a text
editor, a spreadsheet, a settings file and an infeasible request), judged inside the container
at the end of each episode, with the DTAC curriculum drawing the infeasible task as its ICS
share.

    python -m experiments.main --config=experiments/configs/desktop.py

Each rollout worker keeps `env.desktop.size` containers of the desktop image ready
(`--network none`, capped CPU and memory, health-checked while idle) and recreates each one
after its episode. A container that dies mid-episode quarantines that episode only (fault
`container exited`), before advantages. Groups start from one prepared state
(rollout.group_start = "shared": the task's setup runs on every container of the group, the
faster of the two ways experiments/benchmarks/group_fork.py measures).

Other task folders train the same way: `--config.env.task_dirs="('runs/verigen/tasks',)"` (a
folder experiments/synthesize.py wrote) or OSWorld's examples/ (domains by sub-folder), and
`--config.env.kind=mixed` adds the MiniWoB tasks of env.tasks, with per-domain success and
quarantine metrics and `env.domain_weights` for each domain's share of the draws.

The tiny random policy here exercises the loop (it does not solve desktop tasks); set
model.name / model.init_from to train a checkpoint.
"""

from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR
from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "desktop"
    c.workdir = "runs/desktop"
    c.model.num_layers = 2
    c.env.kind = "desktop"
    c.env.tasks = ()
    c.env.task_dirs = (str(SUITE_DIR),)
    c.env.desktop.size = 4
    c.env.desktop.screen = "1280x800"
    c.rollout.group_size = 4
    c.rollout.batch_tasks = 2
    c.rollout.max_turns = 8
    c.rollout.max_new_tokens = 48
    c.rollout.max_context_tokens = 4096
    c.rollout.prompt_style = "compact"
    c.rollout.group_start = "shared"
    c.context.segmenter = "sliding_window"
    c.context.sliding_window.keep = 3
    c.context.sliding_window.min_removal = 2
    c.sampler.kind = "dtac"
    c.sampler.dtac.rho_inf = 0.5  # one of the batch's two tasks is the infeasible one
    c.sampler.dtac.p_low = 0.0
    c.sampler.dtac.p_high = 0.5
    c.loss.entropy_coef = 1e-3
    c.optimizer.learning_rate = 1e-4
    c.learner.rows = 2
    c.learner.length_multiple = 256
    c.eval.enabled = False
    c.train.num_steps = 20
    return c
