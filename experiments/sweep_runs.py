"""Config sweeps: a sweep file's runs, their workdirs and commands, their state on disk, and
the results table and comparison plots built from the runs' own records.

A sweep file is a Python file whose `get_sweep()` returns a dict:

    {"name": "canopy_group_size",
     "grid": {"rollout.group_size": (2, 4, 8)},      # every combination of the values
     # or "runs": ({"rollout.group_size": 2, ...}, ...)   # an explicit list of overrides
     "fixed": {"train.num_steps": 3, ...},          # overrides every run gets (optional)
     "compute_matched": {"adjust": "rollout.batch_tasks", "budget": 48}}   # optional

Compute-matched mode holds each run's rollout budget, train.num_steps x rollout.batch_tasks x
rollout.group_size episodes, at `budget` (default: the base config's own, after `fixed`) by
setting the `adjust` field (rollout.batch_tasks or train.num_steps); a budget that does not
divide exactly is an error naming the run, so the runs compared really did the same work.

Each run trains with `python -m experiments.main` in its own workdir, <sweep dir>/<run name>,
and is always started with --resume: a run with a checkpoint continues from it. A run is done
when its summary.json records the run's train.num_steps; done runs are skipped, so a sweep that
was stopped part way is completed by launching it again.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from cua_jax.observe.episode_log import EPISODE_LOG
from cua_jax.observe.metrics import read_metrics
from cua_jax.rl.coverage import group_outcome_stats, signal_coverage

# The fields a compute-matched sweep may adjust, and the three factors of the rollout budget.
BUDGET_FIELDS = ("train.num_steps", "rollout.batch_tasks", "rollout.group_size")
ADJUSTABLE = ("rollout.batch_tasks", "train.num_steps")
SWEEP_KEYS = {"name", "grid", "runs", "fixed", "compute_matched"}
MANIFEST = "sweep.json"
RUN_RECORD = "sweep_run.json"
RUN_LOG = "run.log"


class SweepError(ValueError):
    """A sweep file or a sweep's state that cannot be run; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its name (from the swept values), every override it gets, and where
    it writes. `swept` holds the values that differ between runs (what the table compares)."""

    name: str
    swept: dict[str, Any]
    overrides: dict[str, Any]
    workdir: str
    num_steps: int
    budget: int  # episodes: num_steps x batch_tasks x group_size
    task_tiers: dict[str, int]  # MiniWoB task -> tier, for coverage per tier

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    config_path: str
    sweep_path: str
    directory: str
    runs: tuple[SweepRun, ...]


# -- loading -------------------------------------------------------------------------------------


def _load_module(path: str, what: str):
    if not os.path.isfile(path):
        raise SweepError(f"{what} {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"_sweep_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(config_path: str) -> ml_collections.ConfigDict:
    """The ConfigDict of an experiments/configs file (its get_config())."""
    module = _load_module(config_path, "config file")
    if not hasattr(module, "get_config"):
        raise SweepError(f"config file {config_path!r} defines no get_config()")
    return module.get_config()


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any], where: str) -> None:
    """Sets each dotted field of `overrides` on `config`; an unknown field is an error naming it."""
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
                raise SweepError(f"{where}: config.{key}: no such config field")
            node = node[part]
        if leaf not in node:
            raise SweepError(f"{where}: config.{key}: no such config field")
        if isinstance(node[leaf], tuple) and isinstance(value, list):
            value = tuple(value)
        try:
            node[leaf] = value
        except (TypeError, ValueError) as error:
            raise SweepError(f"{where}: config.{key}: {error}") from None


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def _format_value(value: Any) -> str:
    """A value as absl's --config.x=value parses it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return str(value)


def run_name(swept: Mapping[str, Any]) -> str:
    """A filesystem-safe name from the swept values: `group_size=4,learning_rate=0.0001`."""
    parts = [f"{key.split('.')[-1]}={_format_value(value)}" for key, value in swept.items()]
    name = ",".join(parts) or "run"
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)


def _run_overrides(spec: Mapping[str, Any], sweep_path: str) -> list[dict[str, Any]]:
    has_grid, has_runs = "grid" in spec, "runs" in spec
    if has_grid == has_runs:
        raise SweepError(f"{sweep_path}: get_sweep() must return exactly one of 'grid' and 'runs'")
    if has_grid:
        grid = spec["grid"]
        if not isinstance(grid, Mapping) or not grid:
            raise SweepError(f"{sweep_path}: 'grid' must be a non-empty dict of field -> values")
        for key, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise SweepError(f"{sweep_path}: grid[{key!r}] must be a non-empty list of values")
        keys = list(grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    runs = spec["runs"]
    if not isinstance(runs, Sequence) or not runs or not all(isinstance(r, Mapping) for r in runs):
        raise SweepError(f"{sweep_path}: 'runs' must be a non-empty list of dicts of overrides")
    return [dict(r) for r in runs]


def load_sweep(
    sweep_path: str, config_path: str, directory: str = "", extra_overrides: Mapping[str, Any] | None = None
) -> Sweep:
    """The runs of `sweep_path` over the config file `config_path`.

    extra_overrides: fields set on every run before the sweep's own (the command line's
    --config.x=y). directory: the sweep's directory (default runs/sweeps/<sweep name>).
    """
    module = _load_module(sweep_path, "sweep file")
    if not hasattr(module, "get_sweep"):
        raise SweepError(f"sweep file {sweep_path!r} defines no get_sweep()")
    spec = module.get_sweep()
    if not isinstance(spec, Mapping):
        raise SweepError(f"{sweep_path}: get_sweep() must return a dict, got {type(spec).__name__}")
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise SweepError(f"{sweep_path}: unknown keys {sorted(unknown)}; known: {sorted(SWEEP_KEYS)}")
    name = spec.get("name") or os.path.splitext(os.path.basename(sweep_path))[0]
    fixed = {**dict(extra_overrides or {}), **dict(spec.get("fixed", {}))}
    variants = _run_overrides(spec, sweep_path)

    base = load_config(config_path)
    apply_overrides(base, fixed, f"{sweep_path}: fixed")
    matched = spec.get("compute_matched")
    adjust, budget = None, None
    if matched is not None:
        if not isinstance(matched, Mapping) or set(matched) - {"adjust", "budget"}:
            raise SweepError(f"{sweep_path}: 'compute_matched' must be a dict with 'adjust' and optional 'budget'")
        adjust = matched.get("adjust")
        if adjust not in ADJUSTABLE:
            raise SweepError(f"{sweep_path}: compute_matched.adjust must be one of {ADJUSTABLE}, got {adjust!r}")
        budget = matched.get("budget") or int(np.prod([_get(base, k) for k in BUDGET_FIELDS]))
        if not isinstance(budget, int) or budget < 1:
            raise SweepError(f"{sweep_path}: compute_matched.budget must be a positive integer, got {budget!r}")

    directory = os.path.abspath(directory or os.path.join("runs", "sweeps", name))
    runs, names = [], set()
    for variant in variants:
        if adjust is not None and adjust in variant:
            raise SweepError(f"{sweep_path}: run {variant} sets {adjust}, which compute_matched adjusts")
        config = load_config(config_path)
        overrides = {**fixed, **variant}
        apply_overrides(config, overrides, f"{sweep_path}: run {run_name(variant)}")
        if adjust is not None:
            others = int(np.prod([_get(config, k) for k in BUDGET_FIELDS if k != adjust]))
            if budget % others:
                raise SweepError(
                    f"{sweep_path}: run {run_name(variant)}: compute_matched.budget {budget} is not a "
                    f"multiple of {' x '.join(k for k in BUDGET_FIELDS if k != adjust)} = {others}"
                )
            overrides[adjust] = budget // others
            apply_overrides(config, {adjust: budget // others}, f"{sweep_path}: run {run_name(variant)}")
        name_ = run_name(variant)
        if name_ in names:
            raise SweepError(f"{sweep_path}: two runs are both named {name_!r}")
        names.add(name_)
        tiers = {str(task): int(tier) for task, tier in config.env.tasks}
        runs.append(
            SweepRun(
                name=name_,
                swept=dict(variant),
                overrides=overrides,
                workdir=os.path.join(directory, name_),
                num_steps=int(config.train.num_steps),
                budget=int(np.prod([_get(config, k) for k in BUDGET_FIELDS])),
                task_tiers=tiers,
            )
        )
    return Sweep(
        name=name,
        config_path=os.path.abspath(config_path),
        sweep_path=os.path.abspath(sweep_path),
        directory=directory,
        runs=tuple(runs),
    )


# -- commands and state ---------------------------------------------------------------------------


def run_command(sweep: Sweep, run: SweepRun, python: str = sys.executable) -> list[str]:
    """The training command of `run` (always --resume: a checkpointed run continues)."""
    flags = [f"--config.{key}={_format_value(value)}" for key, value in run.overrides.items()]
    return [
        python,
        "-m",
        "experiments.main",
        f"--config={sweep.config_path}",
        *flags,
        f"--workdir={run.workdir}",
        "--resume",
    ]


def shell_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def checkpoint_steps(workdir: str) -> list[int]:
    """Finished checkpoint steps under <workdir>/checkpoints (Orbax's in-flight ones carry a suffix)."""
    folder = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


def run_state(run: SweepRun) -> str:
    """'done' (summary.json records the run's num_steps), 'partial' (a checkpoint to resume
    from) or 'new'."""
    summary = os.path.join(run.workdir, "summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            if json.load(f).get("steps") == run.num_steps:
                return "done"
    return "partial" if checkpoint_steps(run.workdir) else "new"


def prepare_run(run: SweepRun) -> str:
    """Readies `run`'s workdir to be launched and returns its state. A workdir with records but
    no checkpoint (stopped before its first save) cannot resume: its records are removed so
    the fresh run's metrics do not follow the stopped one's."""
    state = run_state(run)
    if state == "new" and os.path.isdir(run.workdir):
        shutil.rmtree(run.workdir)
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, RUN_RECORD), "w") as f:
        json.dump(run.to_json(), f, indent=2)
    return state


def write_manifest(sweep: Sweep) -> str:
    os.makedirs(sweep.directory, exist_ok=True)
    path = os.path.join(sweep.directory, MANIFEST)
    with open(path, "w") as f:
        json.dump(
            {
                "name": sweep.name,
                "config": sweep.config_path,
                "sweep": sweep.sweep_path,
                "runs": [r.to_json() for r in sweep.runs],
            },
            f,
            indent=2,
        )
    return path


def read_manifest(directory: str) -> tuple[str, list[SweepRun]]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise SweepError(f"{directory}: no {MANIFEST} (not a sweep directory)")
    with open(path) as f:
        manifest = json.load(f)
    return manifest["name"], [SweepRun(**r) for r in manifest["runs"]]


# -- results --------------------------------------------------------------------------------------


def tier_coverage(episodes: Sequence[Mapping[str, Any]], task_tiers: Mapping[str, int]) -> dict[int, tuple[float, int]]:
    """Per tier: (fraction of groups with both a success and a failure, number of groups), over
    every group of a run's episode log. Quarantined episodes leave their group first."""

    keys = sorted({(e["step"], e["group_id"], e["task_id"]) for e in episodes})
    if not keys:
        return {}
    index = {k: i for i, k in enumerate(keys)}
    tiers = sorted(set(task_tiers.values()))
    tier_slot = {t: i for i, t in enumerate(tiers)}
    group_tiers = np.asarray([tier_slot[task_tiers[k[2]]] for k in keys], np.int32)
    stats = group_outcome_stats(
        np.asarray([e["status"] == "success" for e in episodes]),
        np.asarray([index[(e["step"], e["group_id"], e["task_id"])] for e in episodes], np.int32),
        len(keys),
        valid=np.asarray([e["status"] != "quarantined" for e in episodes]),
        group_tiers=group_tiers,
        num_tiers=len(tiers),
    )
    counts = np.asarray(stats.tier_num_groups)
    return {
        t: (float(stats.tier_informative_fraction[i]) if counts[i] else math.nan, int(counts[i]))
        for t, i in tier_slot.items()
    }


def predicted_tier_coverage(episodes: Sequence[Mapping[str, Any]], task_tiers: Mapping[str, int]) -> dict[int, float]:
    """Per tier: the mean over its groups of P_sig(p, n) (CANOPY eq. 4), with p the group's task
    success rate over the whole run and n the group's size: the coverage independent
    rollouts at those rates would give, to set beside the measured one."""

    valid = [e for e in episodes if e["status"] != "quarantined"]
    outcomes: dict[str, list[bool]] = {}
    sizes: dict[tuple, int] = {}
    for e in valid:
        outcomes.setdefault(e["task_id"], []).append(e["status"] == "success")
        key = (e["step"], e["group_id"], e["task_id"])
        sizes[key] = sizes.get(key, 0) + 1
    per_tier: dict[int, list[float]] = {}
    for (_, _, task), n in sizes.items():
        p = float(np.mean(outcomes[task]))
        per_tier.setdefault(task_tiers[task], []).append(float(signal_coverage(p, n)))
    return {tier: float(np.mean(values)) for tier, values in per_tier.items()}


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def run_results(run: SweepRun) -> dict[str, Any]:
    """One table row from the run's own records (metrics.jsonl, episodes.jsonl, summary.json)."""

    row: dict[str, Any] = {
        "run": run.name,
        **{k: _format_value(v) for k, v in run.swept.items()},
        "state": run_state(run),
        "budget": run.budget,
    }
    metrics_path = os.path.join(run.workdir, "metrics.jsonl")
    records = [r for r in read_metrics(metrics_path) if "success/rate" in r] if os.path.isfile(metrics_path) else []
    row["steps"] = len(records)
    row["episodes"] = int(sum(r.get("episodes/total", 0) for r in records))
    row["success"] = _mean([r["success/rate"] for r in records])
    row["informative_groups"] = _mean([r.get("groups/informative_fraction", math.nan) for r in records])
    episodes_path = os.path.join(run.workdir, EPISODE_LOG)
    episodes = []
    if os.path.isfile(episodes_path):
        with open(episodes_path) as f:
            episodes = [json.loads(line) for line in f if line.strip()]
    predicted = predicted_tier_coverage(episodes, run.task_tiers)
    for tier, (fraction, groups) in sorted(tier_coverage(episodes, run.task_tiers).items()):
        row[f"coverage_tier{tier}"] = fraction
        row[f"predicted_tier{tier}"] = predicted.get(tier, math.nan)
        row[f"groups_tier{tier}"] = groups
    summary_path = os.path.join(run.workdir, "summary.json")
    if os.path.isfile(summary_path):
        with open(summary_path) as f:
            evaluations = json.load(f).get("evaluations", {})
        for label in ("before", "after"):
            if label in evaluations:
                row[f"held_out_{label}"] = evaluations[label]["success_rate"]
    return row


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def write_results(directory: str) -> dict[str, str]:
    """<directory>/results.csv, results.md and comparison.png from the runs' records."""
    name, runs = read_manifest(directory)
    rows = [run_results(r) for r in runs]
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    csv_path = os.path.join(directory, "results.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows([{k: _cell(row.get(k, "")) for k in columns} for row in rows])
    md_path = os.path.join(directory, "results.md")
    with open(md_path, "w") as f:
        f.write(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}\n")
        for row in rows:
            f.write(f"| {' | '.join(_cell(row.get(k, '')) for k in columns)} |\n")
    plot_path = plot_comparison(name, runs, os.path.join(directory, "comparison.png"))
    return {"csv": csv_path, "markdown": md_path, "plot": plot_path}


# What the comparison plot shows against rollouts spent, one panel each.
COMPARISON_KEYS = ("success/rate", "groups/informative_fraction", "reward/mean")


def plot_comparison(name: str, runs: Sequence[SweepRun], out_path: str) -> str:
    """Each run's curves against cumulative episodes (the compute axis), plus coverage per tier."""
    import matplotlib  # heavy optional dependency: imported only when a sweep is plotted

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(COMPARISON_KEYS) + 1, figsize=(4.2 * (len(COMPARISON_KEYS) + 1), 3.4))
    tier_rows = []
    for run in runs:
        path = os.path.join(run.workdir, "metrics.jsonl")
        records = [r for r in read_metrics(path) if "success/rate" in r] if os.path.isfile(path) else []
        spent = np.cumsum([r.get("episodes/total", 0) for r in records])
        for ax, key in zip(axes, COMPARISON_KEYS):
            points = [(x, r[key]) for x, r in zip(spent, records) if key in r and not math.isnan(r[key])]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, label=run.name)
        episodes_path = os.path.join(run.workdir, EPISODE_LOG)
        episodes = []
        if os.path.isfile(episodes_path):
            with open(episodes_path) as f:
                episodes = [json.loads(line) for line in f if line.strip()]
        tier_rows.append((run.name, tier_coverage(episodes, run.task_tiers)))
    for ax, key in zip(axes, COMPARISON_KEYS):
        ax.set_title(key)
        ax.set_xlabel("episodes")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    tiers = sorted({t for _, cov in tier_rows for t in cov})
    width = 0.8 / max(len(tier_rows), 1)
    for i, (label, cov) in enumerate(tier_rows):
        xs = [t + i * width for t in range(len(tiers))]
        values = [cov.get(t, (math.nan, 0)) for t in tiers]
        ax.bar(xs, [0.0 if math.isnan(v) else v for v, _ in values], width, label=label)
        for x, (v, groups) in zip(xs, values):  # how many groups each bar pools
            ax.text(x, (0.0 if math.isnan(v) else v) + 0.02, f"{groups}", ha="center", fontsize=7)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tiers))], [f"tier {t}" for t in tiers])
    ax.set_ylim(0, 1.1)
    ax.set_title("informative groups per tier (count above)")
    ax.legend(fontsize=7)
    fig.suptitle(name)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
