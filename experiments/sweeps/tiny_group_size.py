"""The smallest compute-matched sweep: the tiny config at group sizes 2 and 4, each run spending
8 episodes (train.num_steps x rollout.batch_tasks x rollout.group_size), so the group-of-2 run
takes 2 steps and the group-of-4 run 1. It checks the sweep machinery end to end in about a
minute; a random policy does not learn.

    python -m launch.sweep --config=experiments/configs/tiny.py --sweep=experiments/sweeps/tiny_group_size.py
"""


def get_sweep():
    return {
        "name": "tiny_group_size",
        "grid": {"rollout.group_size": (2, 4)},
        "fixed": {"train.checkpoint_every": 1},
        "compute_matched": {"adjust": "train.num_steps", "budget": 8},
    }
