"""CANOPY's group-size comparison at matched compute, on MiniWoB++ capsules from the default
run's base policy.

    python -m launch.sweep --config=experiments/configs/default.py \
        --sweep=experiments/sweeps/canopy_group_size.py [--backend=local|ray|slurm]

CANOPY (§3.2) argues that the group size n sets how many groups carry gradient: a group of n
rollouts is informative only when it holds both a success and a failure, with chance
P_sig(p, n) = 1 - p^n - (1 - p)^n, and hard tiers (small p) need large n. At a fixed rollout
budget a larger n means fewer tasks per batch. This sweep runs n = 2, 4 and 8 with the same
budget of train.num_steps x rollout.batch_tasks x rollout.group_size episodes (rollout.batch_tasks
adjusted: 8, 4 and 2 tasks per step) and reports, from each run's episode log, the fraction of
informative groups per tier.

It starts from the default recipe (experiments/configs/default.py): the shipped pretrained base
(experiments/bases/miniwob-elements), so groups are not all failures, with its elements action
space, DOM text, compact prompt and RL settings. The tasks are eight on which the base is
neither perfect nor hopeless, in three tiers by the base's greedy success on unseen pages (its
manifest.json): tier 0 click-dialog-2 0.7, click-tab 0.6, click-option 0.5; tier 1
click-widget 0.4, click-button 0.3, unicode-test 0.3; tier 2 click-tab-2-easy 0.2,
click-link 0.1. Held-out evaluation is off so that the sweep measures the training signal at a
CPU-sized budget; turn it back on with --config.eval.enabled=true.
"""

TASKS = (  # (task, tier) records of env.tasks
    ("click-dialog-2", 0),
    ("click-tab", 0),
    ("click-option", 0),
    ("click-widget", 1),
    ("click-button", 1),
    ("unicode-test", 1),
    ("click-tab-2-easy", 2),
    ("click-link", 2),
)


def get_sweep():
    return {
        "name": "canopy_group_size",
        "grid": {"rollout.group_size": (2, 4, 8)},
        "fixed": {
            "env.tasks": TASKS,
            "env.drop_hardest_tier": False,
            "train.num_steps": 4,
            "train.checkpoint_every": 1,
            "eval.enabled": False,
        },
        "compute_matched": {"adjust": "rollout.batch_tasks", "budget": 4 * 16},
    }
