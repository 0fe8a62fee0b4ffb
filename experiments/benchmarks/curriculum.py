"""Curriculum benchmark: uniform vs Frontier Sampling vs DTAC (and uniform + DAPO dynamic
sampling) on the task-pool simulator, at the same rollout budget, for group sizes n = 8 and
n = 32 (CANOPY's contrast, compute-matched: B = rollouts_per_step / n tasks per step).

Every run spends the same number of rollouts; pilot and calibration rollouts count against
it, so the x axis is "step-equivalents" = rollouts spent / rollouts_per_step. (A dynamic-
sampling step runs up to 3 rounds of groups, so "dapo" may end up to two step-equivalents
past the budget.)

Printed per (sampler, n), averaged over seeds:
  inf.run      fraction of the groups run (policy rollouts) that were informative
  inf.trained  fraction of the trained groups that were informative (after DTAC replays and
               DAPO filtering)
  to-target    step-equivalents until the true mean pass rate over the training pool
               reaches --target (">" when a seed never does: the mean is over those that do)
  train / held-out   final true mean pass rate on the training pool / held-out tasks
  F/U inf      Frontier over uniform informative-group fraction (groups run), same n
and a per-tier table of the informative fraction of groups run. A PNG of the curves is written
next to the table.

  python -m experiments.benchmarks.curriculum [--steps 200] [--seeds 2] [--out runs/benchmarks/curriculum]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from cua_jax.rl.coverage import signal_coverage
from cua_jax.tasks.calibration import CalibrationConfig
from cua_jax.tasks.dynamic_sampling import (
    DynamicSamplingConfig,
    collect_informative_groups,
    outcome_stats,
)
from cua_jax.tasks.pool import TaskPool
from cua_jax.tasks.sampler_interface import TaskSampler
from cua_jax.tasks.samplers import build_sampler
from cua_jax.tasks.simulator import SimulatorConfig, TaskPoolSimulator

SAMPLERS = ("uniform", "dapo", "frontier", "dtac")
GROUP_SIZES = (8, 32)


@dataclasses.dataclass
class RunTrace:
    """Per-step curves of one run; x is step-equivalents spent when the step finished."""

    x: list[float]
    informative_run: list[float]
    informative_trained: list[float]
    train_pass: list[float]
    held_out_pass: list[float]
    tier_informative: list[np.ndarray]  # [num_tiers] per step (NaN where a tier had no group)


def make_sampler(name: str, pool: TaskPool, sim: TaskPoolSimulator, args) -> TaskSampler:
    if name in ("uniform", "dapo"):
        return build_sampler("uniform", pool)
    if name == "frontier":  # ScaleCUA: pilot filter to [0.1, 0.9], then eq. 1-2 sampling
        pilot = CalibrationConfig(p_min=0.1, p_max=0.9, pilot=True, pilot_group_size=8, keep_infeasible=False)
        return build_sampler("frontier", pool, calibration=pilot, run_groups=sim.run_groups)
    if name == "dtac":  # EvoCUA-1.5: pilot + periodic calibration around DTAC
        calibration = CalibrationConfig(
            p_min=0.05,
            p_max=0.95,
            pilot=True,
            pilot_group_size=8,
            every_k_steps=args.calibrate_every,
            sample_size=args.calibration_sample,
            group_size=8,
            keep_infeasible=True,
        )
        return build_sampler("dtac", pool, calibration=calibration, run_groups=sim.run_groups)
    raise ValueError(f"unknown sampler {name!r}")


def run_one(name: str, group_size: int, seed: int, args) -> RunTrace:
    sim = TaskPoolSimulator(SimulatorConfig(), seed=seed)
    pool = TaskPool(sim.pool_tasks())
    sampler = make_sampler(name, pool, sim, args)
    batch_size = args.rollouts_per_step // group_size
    budget = args.steps * args.rollouts_per_step
    num_tiers = len(sim.config.tier_difficulty)
    key = jax.random.key(seed)
    trace = RunTrace([], [], [], [], [], [])
    while sim.rollouts + batch_size * group_size <= budget:
        key, step_key = jax.random.split(key)
        if name == "dapo":
            batch = collect_informative_groups(
                step_key,
                sampler,
                sim.run_groups,
                batch_size,
                group_size,
                DynamicSamplingConfig(max_rounds=3),
            )
            run = batch.groups + batch.dropped
            trained, replayed = batch.groups, np.zeros(len(batch.groups), bool)
        else:
            task_ids = sampler.sample(step_key, batch_size)
            run = trained = sim.run_groups(task_ids, group_size)
            replays = sampler.assign_replays(trained)
            replayed = np.zeros(len(trained), bool)
            replayed[[r.group_index for r in replays]] = True
        tiers = pool.tiers[pool.indices_of([o.task_id for o in run])]
        run_stats = outcome_stats(run, tiers=tiers, num_tiers=num_tiers)
        trained_stats = outcome_stats(trained, replayed)
        sim.learn(trained, replayed)
        if name != "dapo":
            sampler.update(trained)
        tier_fraction = np.where(
            np.asarray(run_stats.tier_num_groups) > 0,
            np.asarray(run_stats.tier_informative_fraction),
            np.nan,
        )
        trace.x.append(sim.rollouts / args.rollouts_per_step)
        trace.informative_run.append(float(run_stats.informative_fraction))
        trace.informative_trained.append(float(trained_stats.informative_fraction))
        trace.train_pass.append(float(sim.pass_rates().mean()))
        trace.held_out_pass.append(float(sim.held_out_pass_rates().mean()))
        trace.tier_informative.append(tier_fraction)
    return trace


def steps_to(trace: RunTrace, target: float) -> float:
    reached = np.nonzero(np.asarray(trace.train_pass) >= target)[0]
    return float(trace.x[reached[0]]) if reached.size else np.nan


def summarize(traces: list[RunTrace], target: float) -> dict[str, float]:
    to_target = np.array([steps_to(t, target) for t in traces])
    return {
        "inf_run": float(np.mean([np.mean(t.informative_run) for t in traces])),
        "inf_trained": float(np.mean([np.mean(t.informative_trained) for t in traces])),
        "to_target": float(np.nanmean(to_target)) if np.isfinite(to_target).any() else np.nan,
        "missed": int(np.isnan(to_target).sum()),
        "train": float(np.mean([t.train_pass[-1] for t in traces])),
        "held_out": float(np.mean([t.held_out_pass[-1] for t in traces])),
        "tiers": np.nanmean(np.stack([np.nanmean(np.stack(t.tier_informative), axis=0) for t in traces]), axis=0),
    }


def plot(results: dict, args, path: str) -> None:
    colors = {
        "uniform": "tab:gray",
        "dapo": "tab:purple",
        "frontier": "tab:blue",
        "dtac": "tab:orange",
    }
    fig, axes = plt.subplots(len(GROUP_SIZES), 3, figsize=(15, 4.2 * len(GROUP_SIZES)), squeeze=False)
    for row, n in enumerate(GROUP_SIZES):
        for name in SAMPLERS:
            traces = results[(name, n)]
            length = min(len(t.x) for t in traces)
            x = np.mean([t.x[:length] for t in traces], axis=0)
            for col, (field, smooth) in enumerate((("informative_run", 10), ("train_pass", 1), ("held_out_pass", 1))):
                y = np.mean([getattr(t, field)[:length] for t in traces], axis=0)
                if smooth > 1:  # moving average: per-batch fractions are noisy
                    y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
                    xs = x[smooth - 1 :]
                else:
                    xs = x
                axes[row, col].plot(xs, y, color=colors[name], label=name, lw=1.8)
        titles = (
            f"informative fraction of groups run (n={n}, B={args.rollouts_per_step // n})",
            f"true mean pass rate, training pool (n={n})",
            f"true mean pass rate, held-out tasks (n={n})",
        )
        for col, title in enumerate(titles):
            ax = axes[row, col]
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(f"step-equivalents ({args.rollouts_per_step} rollouts each, pilot/calibration included)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        axes[row, 1].axhline(args.target, color="k", ls=":", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="budget in step-equivalents")
    parser.add_argument("--rollouts-per-step", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.5, help="target true mean pass rate (training pool)")
    parser.add_argument("--calibrate-every", type=int, default=20)
    parser.add_argument("--calibration-sample", type=int, default=96)
    parser.add_argument("--out", default="runs/benchmarks/curriculum")
    args = parser.parse_args()

    start = time.perf_counter()
    results = {
        (name, n): [run_one(name, n, seed, args) for seed in range(args.seeds)]
        for n in GROUP_SIZES
        for name in SAMPLERS
    }
    summaries = {k: summarize(v, args.target) for k, v in results.items()}

    sim = TaskPoolSimulator(SimulatorConfig(), seed=0)
    p0 = sim.pass_rates()
    print(
        f"simulated pool: {len(p0)} training tasks, {len(sim.held_out_pass_rates())} held-out, "
        f"{len(SimulatorConfig().tier_difficulty)} tiers; initial mean pass rate {p0.mean():.3f}; "
        f"budget {args.steps} x {args.rollouts_per_step} rollouts; {args.seeds} seeds"
    )
    header = (
        f"{'sampler':<9}{'n':>4}{'B':>4}{'inf.run':>9}{'inf.trained':>12}{'to-target':>11}"
        f"{'train':>8}{'held-out':>10}{'F/U inf':>9}"
    )
    print(f"\ntarget mean pass rate {args.target}; 'to-target' in step-equivalents")
    print(header)
    print("-" * len(header))
    for n in GROUP_SIZES:
        for name in SAMPLERS:
            s = summaries[(name, n)]
            ratio = s["inf_run"] / summaries[("uniform", n)]["inf_run"] if name == "frontier" else None
            to_target = "never" if np.isnan(s["to_target"]) else f"{s['to_target']:.1f}"
            if s["missed"] and not np.isnan(s["to_target"]):
                to_target = ">" + to_target
            print(
                f"{name:<9}{n:>4}{args.rollouts_per_step // n:>4}{s['inf_run']:>9.3f}{s['inf_trained']:>12.3f}"
                f"{to_target:>11}{s['train']:>8.3f}{s['held_out']:>10.3f}"
                f"{'' if ratio is None else f'{ratio:.2f}x':>9}"
            )
    tiers = sim.tier
    print("\ninformative fraction of groups run, per tier (0 easiest); P_sig: the tier's mean initial coverage:")
    print(
        f"{'sampler':<9}{'n':>4}" + "".join(f"{f'tier {t}':>9}" for t in range(len(SimulatorConfig().tier_difficulty)))
    )
    for n in GROUP_SIZES:
        p_sig = np.asarray(signal_coverage(p0, n))
        coverage = [p_sig[tiers == t].mean() for t in range(len(SimulatorConfig().tier_difficulty))]
        print(f"{'P_sig':<9}{n:>4}" + "".join(f"{c:>9.3f}" for c in coverage))
        for name in SAMPLERS:
            print(f"{name:<9}{n:>4}" + "".join(f"{v:>9.3f}" for v in summaries[(name, n)]["tiers"]))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.abspath(os.path.join(args.out, "curriculum.png"))
    plot(results, args, path)
    print(f"\ncurves: {path}")
    print(f"wall time {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
