"""Element-reference actions against grid coordinates, at the same supervised budget and after
the same few RL updates.

Both arms are the same run of the trainer (experiments/configs/default.py's agent loop,
context, prompt and RL settings) from the same random-init tiny Qwen3-VL, on the same tasks,
demonstration seeds and held-out seeds; only `env.action_space` differs ("coordinates":
grid points, with each element's click point in the DOM text; "elements": element ids, with
the ids drawn on the screenshot and listed in the DOM text). Each arm: a supervised warm start
of `--sft_steps` on the oracle's demonstrations, held-out success ("after SFT"), `--rl_steps`
on-policy GRPO updates, held-out success again ("after RL"). Printed side by side, with the
ratio elements / coordinates, the paired gain of RL in each arm, and each arm's wall time.

    python -m experiments.benchmarks.action_space [--sft_steps=200 --rl_steps=6 --eval_seeds=16 --eval_temperature=0.5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

ARMS = ("coordinates", "elements")


def arm_config(action_space: str, args, workdir: str):
    from experiments.configs import default
    from experiments.configs.base import at_tier

    c = default.get_config()
    c.name = f"action_space_{action_space}"
    c.workdir = workdir
    c.model.name, c.model.init_from = "tiny_qwen3_vl", ""  # both arms from the same random init
    c.env.action_space = action_space
    c.env.tasks = at_tier(args.tasks.split(","))
    c.rollout.batch_tasks = min(c.rollout.batch_tasks, len(c.env.tasks))
    c.warm_start.steps = args.sft_steps
    c.warm_start.demos_per_task = args.demos_per_task
    c.warm_start.held_out_seeds = 4
    c.train.num_steps = args.rl_steps
    c.train.checkpoint_every = max(args.rl_steps, 1)
    c.train.progress_bar = False
    c.eval.num_seeds = args.eval_seeds
    c.eval.temperature = args.eval_temperature
    c.eval.low_temperature = -1.0  # one evaluation temperature per arm
    return c


def run_arm(action_space: str, args, root: str) -> dict[str, float]:
    from cua_jax.train.trainer import build_trainer, prepare_run, warm_start

    start = time.perf_counter()
    config = arm_config(action_space, args, os.path.join(root, action_space))
    setup = prepare_run(config)
    warm_start(setup)
    with build_trainer(setup) as trainer:
        summary = trainer.run()
    evaluations = summary["evaluations"]
    gain = evaluations["gain"]
    warm = summary["warm_start"]
    return {
        "after_sft": evaluations["before"]["success_rate"],
        "after_rl": evaluations["after"]["success_rate"],
        "episodes": evaluations["before"]["episodes"],
        "rl_paired_gain": gain.get("paired_difference", gain["difference"]),
        "rl_gain_low": gain.get("paired_ci_low", gain["ci_low"]),
        "rl_gain_high": gain.get("paired_ci_high", gain["ci_high"]),
        "target_nll": warm.get("warm_start/held_out_click_nll", float("nan")),
        "target_prior_nll": warm.get("warm_start/click_prior_nll", float("nan")),
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="click-button,click-link,focus-text")
    parser.add_argument("--sft_steps", type=int, default=200)
    parser.add_argument("--demos_per_task", type=int, default=16)
    parser.add_argument("--rl_steps", type=int, default=6)
    parser.add_argument("--eval_seeds", type=int, default=16, help="held-out seeds per task")
    parser.add_argument("--eval_temperature", type=float, default=0.5, help="held-out sampling temperature")
    parser.add_argument("--workdir", default="", help="where the two runs write (default: a temporary folder)")
    args = parser.parse_args(argv)

    root = args.workdir or tempfile.mkdtemp(prefix="action_space_")
    rows = {arm: run_arm(arm, args, root) for arm in ARMS}
    print(
        f"tasks {args.tasks}; {args.sft_steps} SFT steps on {args.demos_per_task} demonstrations per task, "
        f"then {args.rl_steps} RL updates; held-out success over {int(rows['elements']['episodes'])} episodes per arm "
        f"at temperature {args.eval_temperature:g}"
    )
    print(f"{'':>22}" + "".join(f"{arm:>14}" for arm in ARMS) + f"{'ratio':>10}")
    for key in ("after_sft", "after_rl", "rl_paired_gain", "target_nll", "target_prior_nll", "seconds"):
        coordinates, elements = rows["coordinates"][key], rows["elements"][key]
        ratio = f"{elements / coordinates:10.2f}" if coordinates and key in ("after_sft", "after_rl") else f"{'':>10}"
        print(f"{key:>22}{coordinates:14.3f}{elements:14.3f}{ratio}")
    for arm in ARMS:
        row = rows[arm]
        print(
            f"{arm}: RL gain paired by seed {row['rl_paired_gain']:+.3f} "
            f"[{row['rl_gain_low']:+.3f}, {row['rl_gain_high']:+.3f}]"
        )
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
