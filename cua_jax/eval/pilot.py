"""CANOPY's pilot pass (§3.2): per-task pass rates from a few samples, the signal coverage each
difficulty tier gets at the configured group size, and the group-size floor for a target.

    python -m experiments.evaluate --pilot --config=experiments/configs/canopy.py --policy=... --out=pilots/x
    python -m experiments.main --config=experiments/configs/canopy.py --config.sampler.pilot.file=pilots/x/pilot.json

The pilot runs config.sampler.pilot.group_size samples of every training task on each seed
(`pilot_report` over the harness's records). A tier's coverage at n is the mean over its tasks
of P_sig(p_i, n) (`tier_signal_coverage`). The floor is `min_group_size(p_min, target)` with
p_min the lowest pass rate among the tiers the pilot reached (a tier with no success has no
finite floor; it is listed as unreached). A run given the file (`sampler.pilot.file`) takes
rollout.group_size from the floor and its pool's pass rates from the pilot
(`cua_jax.train.settings.apply_pilot_file`, `seed_pool`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.rl.coverage import min_group_size, tier_signal_coverage
from cua_jax.types import EpisodeStatus

PILOT_FILE = "pilot.json"
PILOT_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class PilotConfig:
    """A run's pilot (config.sampler.pilot).

    enabled: with calibration on, the run starts with a pilot filter of its own
      (cua_jax.tasks.calibration), unless it is given a pilot file.
    group_size: samples per (task, seed) of a pilot, the run's own or `experiments.evaluate --pilot`'s.
    target: the signal coverage the hardest tier reached gets at the group-size floor (eq. 5).
    file: a pilot file (`experiments.evaluate --pilot`): the run takes rollout.group_size from its
      floor and its pool's pass rates from it ("" : none).
    """

    enabled: bool = True
    group_size: int = 8
    target: float = 0.9
    file: str = ""

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"PilotConfig.group_size must be >= 1, got {self.group_size}")
        if not 0 < self.target < 1:
            raise ValueError(f"PilotConfig.target must lie in (0, 1), got {self.target}")


def pilot_report(
    records: Sequence[Mapping[str, Any]],
    task_tiers: Mapping[str, int],
    group_size: int,
    target: float,
    samples: int,
    policy: str = "policy",
) -> dict[str, Any]:
    """The pilot file's content from a harness results file's records (quarantined records are
    not scored). group_size: the configured n; target: the coverage tau the floor aims at;
    samples: the pilot's samples per (task, seed). Every task of `task_tiers` must have scored
    samples."""
    if not 0 < target < 1:
        raise ValueError(f"the pilot's coverage target must lie in (0, 1), got {target}")
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    successes, attempts = collections.Counter(), collections.Counter()
    for r in records:
        if r["status"] != EpisodeStatus.QUARANTINED.value:
            successes[r["task"]] += int(r["success"])
            attempts[r["task"]] += 1
    missing = sorted(t for t in task_tiers if not attempts[t])
    if missing:
        raise ValueError(f"the pilot scored no episode of {missing}")
    tasks = sorted(task_tiers)
    rates = np.asarray([successes[t] / attempts[t] for t in tasks])
    tiers = np.asarray([task_tiers[t] for t in tasks], np.int32)
    num_tiers = int(tiers.max()) + 1
    tier_rate = {}
    for tier in sorted(set(tiers.tolist())):
        members = [t for t in tasks if task_tiers[t] == tier]
        tier_rate[tier] = sum(successes[t] for t in members) / sum(attempts[t] for t in members)
    reached = {tier: rate for tier, rate in tier_rate.items() if rate > 0}
    floor = p_min = hardest = None
    if reached:
        hardest = min(reached, key=lambda tier: (reached[tier], -tier))
        p_min = reached[hardest]
        floor = int(min_group_size(p_min, target))
    at_n = np.asarray(tier_signal_coverage(rates, tiers, num_tiers, group_size))
    at_floor = None if floor is None else np.asarray(tier_signal_coverage(rates, tiers, num_tiers, floor))
    return {
        "format": PILOT_FORMAT,
        "policy": policy,
        "samples": int(samples),
        "target": float(target),
        "configured_group_size": int(group_size),
        "group_size_floor": floor,
        "p_min": p_min,
        "hardest_reached_tier": hardest,
        "unreached_tiers": sorted(set(tier_rate) - set(reached)),
        "tasks": {
            t: {
                "tier": int(task_tiers[t]),
                "successes": successes[t],
                "attempts": attempts[t],
                "pass_rate": successes[t] / attempts[t],
            }
            for t in tasks
        },
        "tiers": {
            str(tier): {
                "tasks": [t for t in tasks if task_tiers[t] == tier],
                "pass_rate": rate,
                "coverage_at_configured": float(at_n[tier]),
                "coverage_at_floor": None if at_floor is None else float(at_floor[tier]),
            }
            for tier, rate in tier_rate.items()
        },
    }


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report in a few lines for a terminal: one per tier, then the floor."""
    n = report["configured_group_size"]
    lines = [
        f"tier {tier}: {len(row['tasks'])} tasks, pass rate {row['pass_rate']:.3f}, P_sig at n={n} "
        f"{row['coverage_at_configured']:.3f}"
        + (
            ""
            if row["coverage_at_floor"] is None
            else f", at n={report['group_size_floor']} {row['coverage_at_floor']:.3f}"
        )
        for tier, row in report["tiers"].items()
    ]
    if report["group_size_floor"] is None:
        lines.append("no tier succeeded in the pilot: no finite group size covers any of them")
    else:
        lines.append(
            f"group-size floor for coverage {report['target']:g} of the hardest reached tier "
            f"({report['hardest_reached_tier']}, p_min {report['p_min']:.3f}): n >= {report['group_size_floor']}"
            f" (configured n = {n})"
        )
    for tier in report["unreached_tiers"]:
        lines.append(f"tier {tier}: no success in the pilot (unreached; no group size covers it)")
    return lines


def write_pilot_file(out: str | os.PathLike, report: Mapping[str, Any]) -> str:
    path = os.path.join(out, PILOT_FILE)
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    return path


def read_pilot_file(path: str | os.PathLike) -> dict[str, Any]:
    """A pilot file's content; a missing, unreadable or foreign file raises ValueError naming it."""
    try:
        with open(path) as f:
            report = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no pilot file at {path} (write one with python -m experiments.evaluate --pilot)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(report, dict) or report.get("format") != PILOT_FORMAT or "tasks" not in report:
        raise ValueError(f"{path} is not a pilot file of format {PILOT_FORMAT}")
    return report
