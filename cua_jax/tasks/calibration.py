"""Policy-aware pass-rate calibration (EvoCUA-1.5) and ScaleCUA's pilot filter (§3.3):
`PassRateCalibration` wraps a sampler, estimates pass rates with the current policy before the
first draw and every k steps, and keeps the tasks in the learnable band active.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from cua_jax.checks import require_at_least
from cua_jax.tasks.pool import GroupOutcome, TaskPool
from cua_jax.tasks.sampler_interface import (
    Replay,
    RunGroups,
    TaskSampler,
    check_fraction,
    check_outcomes_match,
)


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    """Policy-aware pass-rate calibration (EvoCUA-1.5) and the pilot filter (ScaleCUA §3.3).

    pilot: before the first draw, run `pilot_group_size` rollouts on every task, set each
      estimate to its observed rate, and keep the tasks with p_min <= p <= p_max active.
    every_k_steps: then, every k steps (0: never), re-estimate `sample_size` tasks drawn
      uniformly from the whole pool (inactive ones too, since a task can re-enter the band)
      with `group_size` rollouts each, and re-filter them to the band.
    keep_infeasible: infeasible tasks stay active whatever their rate (DTAC's ICS channel
      draws them on its own); False filters them like any other task.
    min_active: if filtering leaves fewer active tasks, the inactive tasks nearest to the band
      are re-activated up to this count (so a batch can still be drawn).
    """

    p_min: float = 0.1
    p_max: float = 0.9
    pilot: bool = True
    pilot_group_size: int = 8
    every_k_steps: int = 0
    sample_size: int = 64
    group_size: int = 8
    keep_infeasible: bool = True
    min_active: int = 0

    def __post_init__(self):
        check_fraction("CalibrationConfig", "p_min", self.p_min)
        check_fraction("CalibrationConfig", "p_max", self.p_max)
        if self.p_min > self.p_max:
            raise ValueError(f"CalibrationConfig.p_min {self.p_min} exceeds p_max {self.p_max}")
        require_at_least(self, ("pilot_group_size", "group_size", "sample_size"), 1)
        if self.every_k_steps < 0 or self.min_active < 0:
            raise ValueError("CalibrationConfig.every_k_steps and min_active must be >= 0")


@dataclasses.dataclass(frozen=True)
class CalibrationReport:
    """What one pilot or calibration pass did."""

    step: int
    pilot: bool
    num_estimated: int
    rollouts: int
    num_active: int
    deactivated: int
    activated: int


class PassRateCalibration(TaskSampler):
    """Wraps a sampler with a pilot filter and periodic pass-rate calibration.

    Every `sample` call splits its key into a calibration key and the inner sampler's key,
    whether or not a calibration is due, so draws stay deterministic under the caller's keys.
    """

    def __init__(self, inner: TaskSampler, config: CalibrationConfig, run_groups: RunGroups):
        self.inner = inner
        self.config = config
        self.run_groups = run_groups
        self.last_calibrated_step = -1
        self.reports: list[CalibrationReport] = []

    @property
    def pool(self) -> TaskPool:
        return self.inner.pool

    @property
    def step(self) -> int:
        return self.inner.step

    def _due(self) -> bool | None:
        """None when nothing is due; else whether the due pass is the pilot."""
        if self.last_calibrated_step == self.step:
            return None
        if self.config.pilot and self.last_calibrated_step < 0:
            return True
        k = self.config.every_k_steps
        if k and self.step > 0 and self.step % k == 0:
            return False
        return None

    def sample(self, key: jax.Array, batch_size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        calibration_key, key = jax.random.split(key)
        pilot = self._due()
        if pilot is not None:
            self.calibrate(calibration_key, pilot=pilot)
        return self.inner.sample(key, batch_size, exclude=exclude)

    def calibrate(self, key: jax.Array, *, pilot: bool) -> CalibrationReport:
        """Re-estimates pass rates with the current policy and re-filters to [p_min, p_max]."""
        pool, cfg = self.pool, self.config
        n = len(pool)
        if pilot or cfg.sample_size >= n:
            indices = np.arange(n)
        else:
            indices = np.sort(np.asarray(jax.random.choice(key, n, (cfg.sample_size,), replace=False)))
        group_size = cfg.pilot_group_size if pilot else cfg.group_size
        task_ids = pool.ids_of(indices)
        outcomes = list(self.run_groups(task_ids, group_size))
        check_outcomes_match(task_ids, outcomes, "PassRateCalibration")
        successes = np.array([o.successes for o in outcomes], dtype=np.int64)
        attempts = np.array([o.attempts for o in outcomes], dtype=np.int64)
        pool.set_pass_rates(indices, successes, attempts)

        before = pool.active.copy()
        rate = pool.pass_rate[indices]
        in_band = (rate >= cfg.p_min) & (rate <= cfg.p_max)  # NaN (no verdict at all): out
        if cfg.keep_infeasible:
            in_band |= ~pool.feasible[indices]
        pool.active[indices] = in_band
        shortfall = cfg.min_active - int(pool.active.sum())
        if shortfall > 0:
            distance = np.maximum(cfg.p_min - pool.pass_rate, pool.pass_rate - cfg.p_max)
            distance = np.where(np.isnan(distance) | pool.active, np.inf, distance)
            nearest = np.argsort(distance, kind="stable")[:shortfall]
            pool.active[nearest[np.isfinite(distance[nearest])]] = True
        report = CalibrationReport(
            step=self.step,
            pilot=pilot,
            num_estimated=len(indices),
            rollouts=int(attempts.sum()),
            num_active=int(pool.active.sum()),
            deactivated=int((before & ~pool.active).sum()),
            activated=int((~before & pool.active).sum()),
        )
        self.last_calibrated_step = self.step
        self.reports.append(report)
        return report

    def num_eligible(self, exclude: Sequence[str] = ()) -> int:
        return self.inner.num_eligible(exclude)

    def metrics(self) -> dict[str, float]:
        """The inner sampler's, and how many calibration passes have run (the pilot included)."""
        return {**self.inner.metrics(), "sampler/calibrations": float(len(self.reports))}

    def assign_replays(self, outcomes: Sequence[GroupOutcome]) -> list[Replay]:
        return self.inner.assign_replays(outcomes)

    def update(self, outcomes: Sequence[GroupOutcome]) -> None:
        self.inner.update(outcomes)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sampler": type(self).__name__,
            "last_calibrated_step": self.last_calibrated_step,
            "inner": self.inner.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("sampler") != type(self).__name__:
            raise ValueError(f"sampler state was saved by {state.get('sampler')!r}, not 'PassRateCalibration'")
        self.inner.load_state_dict(state["inner"])
        self.last_calibrated_step = int(state["last_calibrated_step"])
