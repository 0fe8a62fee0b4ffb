"""Task samplers over a `TaskPool`: uniform, Frontier Sampling (ScaleCUA), DTAC (EvoCUA-1.5)
and a fixed curriculum (the baseline ScaleCUA's Fig. 6a compares Frontier Sampling with), their
configs, and `build_sampler`, which builds the sampler a training config names (wrapped in
pass-rate calibration when it asks for one).

Each implements `cua_jax.tasks.sampler_interface.TaskSampler`; the weights and draws are the
pure math of `cua_jax.tasks.selection`, jitted here.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.tasks.calibration import CalibrationConfig, PassRateCalibration
from cua_jax.tasks.pool import GroupOutcome, TaskPool
from cua_jax.tasks.sampler_interface import Replay, RunGroups, TaskSampler, check_fraction
from cua_jax.tasks.selection import (
    curriculum_competence,
    curriculum_select,
    dtac_select,
    frontier_select,
    frontier_weights,
    share_count,
    uniform_select,
    vas_weights,
    weighted_select,
)

_uniform_select_jit = jax.jit(uniform_select)
_weighted_select_jit = jax.jit(weighted_select)
_frontier_select_jit = jax.jit(frontier_select)
_dtac_select_jit = jax.jit(dtac_select)
_curriculum_select_jit = jax.jit(curriculum_select)
_frontier_weights_jit = jax.jit(frontier_weights)
_vas_weights_jit = jax.jit(vas_weights)


def _gumbels(key: jax.Array, count: int, n: int) -> list[jax.Array]:
    return [jax.random.gumbel(k, (n,), dtype=jnp.float32) for k in jax.random.split(key, count)]


@dataclasses.dataclass(frozen=True)
class UniformConfig:
    """ema_alpha: smoothing of the tracked pass rates (ScaleCUA eq. 1); draws ignore them."""

    ema_alpha: float = 0.2

    def __post_init__(self):
        check_fraction("UniformConfig", "ema_alpha", self.ema_alpha, low_open=True)


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """Frontier Sampling (ScaleCUA §3.3, eq. 1-2, App. D).

    ema_alpha: EMA smoothing of eq. 1. mu, sigma: the Gaussian of eq. 2. gamma: the batch
    share drawn uniformly from outside the candidate pool. pool_factor: the candidate pool is
    the pool_factor * B highest-weight tasks. unknown_pass_rate: the rate assumed for a task
    without an estimate yet (no pilot, never drawn).
    The pilot filter to [p_min, p_max] is `PassRateCalibration` with `pilot=True`.
    """

    ema_alpha: float = 0.2
    mu: float = 0.5
    sigma: float = 0.25
    gamma: float = 0.2
    pool_factor: int = 3
    unknown_pass_rate: float = 0.5

    def __post_init__(self):
        check_fraction("FrontierConfig", "ema_alpha", self.ema_alpha, low_open=True)
        check_fraction("FrontierConfig", "mu", self.mu)
        check_fraction("FrontierConfig", "gamma", self.gamma)
        check_fraction("FrontierConfig", "unknown_pass_rate", self.unknown_pass_rate)
        if not self.sigma > 0:
            raise ValueError(f"FrontierConfig.sigma must be > 0, got {self.sigma}")
        if self.pool_factor < 1:
            raise ValueError(f"FrontierConfig.pool_factor must be >= 1, got {self.pool_factor}")


@dataclasses.dataclass(frozen=True)
class DTACConfig:
    """DTAC (EvoCUA-1.5); its constants are unpublished, so these defaults are ours.

    ema_alpha: EMA smoothing of the pass rates the VAS weights read.
    p_low, p_high: the hard-but-learnable band of positive replay (AdaPR): an all-fail group
      of a task with p_low <= p <= p_high receives a cached success. Successes are cached for
      tasks with p <= p_high (or no estimate yet), so a hard task's first success is kept.
    max_replays_per_trajectory: a cached success is replayed at most this many times.
    replay_cache_size: successes kept per task (oldest dropped first).
    rho_inf: the share of each batch drawn (uniformly) from infeasible tasks (ICS).
    unknown_pass_rate: the rate assumed for a task without an estimate yet.
    """

    ema_alpha: float = 0.2
    p_low: float = 0.05
    p_high: float = 0.5
    max_replays_per_trajectory: int = 2
    replay_cache_size: int = 4
    rho_inf: float = 0.1
    unknown_pass_rate: float = 0.5

    def __post_init__(self):
        check_fraction("DTACConfig", "ema_alpha", self.ema_alpha, low_open=True)
        for name in ("p_low", "p_high", "rho_inf", "unknown_pass_rate"):
            check_fraction("DTACConfig", name, getattr(self, name))
        if self.p_low > self.p_high:
            raise ValueError(f"DTACConfig.p_low {self.p_low} exceeds p_high {self.p_high}")
        if self.max_replays_per_trajectory < 1:
            raise ValueError(
                f"DTACConfig.max_replays_per_trajectory must be >= 1, got {self.max_replays_per_trajectory}"
            )
        if self.replay_cache_size < 1:
            raise ValueError(f"DTACConfig.replay_cache_size must be >= 1, got {self.replay_cache_size}")


CURRICULUM_DIFFICULTIES = ("tier", "pass_rate")
CURRICULUM_SCHEDULES = ("linear", "sqrt")


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """A fixed curriculum: tasks ordered once by a difficulty measure, the easiest share open
    first, widened on a schedule that ignores how the policy does (ScaleCUA Fig. 6a's baseline).

    difficulty: "tier" (the task's tier, higher is harder) or "pass_rate" (1 - the pass rate the
      pool holds at the first draw: a pilot file's or the pilot pass's; unknown tasks take
      unknown_pass_rate), with ties in pool order.
    start: the share of the pool open at the first draw. steps: draws until all of it is open.
    schedule: how the share grows (`selection.curriculum_competence`).
    """

    ema_alpha: float = 0.2
    difficulty: str = "tier"
    start: float = 0.25
    steps: int = 100
    schedule: str = "sqrt"
    unknown_pass_rate: float = 0.5

    def __post_init__(self):
        check_fraction("CurriculumConfig", "ema_alpha", self.ema_alpha, low_open=True)
        check_fraction("CurriculumConfig", "unknown_pass_rate", self.unknown_pass_rate)
        if not 0.0 < self.start <= 1.0:
            raise ValueError(f"CurriculumConfig.start must lie in (0, 1], got {self.start}")
        if self.steps < 1:
            raise ValueError(f"CurriculumConfig.steps must be >= 1, got {self.steps}")
        if self.difficulty not in CURRICULUM_DIFFICULTIES:
            raise ValueError(f"CurriculumConfig.difficulty {self.difficulty!r} is not one of {CURRICULUM_DIFFICULTIES}")
        if self.schedule not in CURRICULUM_SCHEDULES:
            raise ValueError(f"CurriculumConfig.schedule {self.schedule!r} is not one of {CURRICULUM_SCHEDULES}")


class PoolSampler(TaskSampler):
    """Shared machinery of the samplers that draw straight from a pool."""

    def __init__(self, pool: TaskPool, ema_alpha: float):
        self._pool = pool
        self._step = 0
        self._ema_alpha = ema_alpha

    @property
    def pool(self) -> TaskPool:
        return self._pool

    @property
    def step(self) -> int:
        return self._step

    def eligible_mask(self, exclude: Sequence[str] = ()) -> np.ndarray:
        """bool [N]: active tasks not in `exclude`."""
        mask = self._pool.active.copy()
        if len(exclude):
            mask[self._pool.indices_of(exclude)] = False
        return mask

    def num_eligible(self, exclude: Sequence[str] = ()) -> int:
        return int(self.eligible_mask(exclude).sum())

    def sample(self, key: jax.Array, batch_size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"{type(self).__name__}.sample: batch_size must be an int >= 1, got {batch_size!r}")
        eligible = self.eligible_mask(exclude)
        if eligible.sum() < batch_size:
            raise ValueError(
                f"{type(self).__name__}.sample: cannot draw {batch_size} distinct tasks, only "
                f"{int(eligible.sum())} are eligible (active and not excluded) out of {len(self._pool)}"
            )
        indices = np.asarray(self._select(key, int(batch_size), eligible))[:batch_size]
        self._pool.mark_sampled(indices, self._step)
        return self._pool.ids_of(indices)

    @abc.abstractmethod
    def _select(self, key: jax.Array, batch_size: int, eligible: np.ndarray) -> jax.Array:
        """A permutation [N] of the pool whose first `batch_size` entries are the batch."""

    def _known_pass_rate(self, unknown: float) -> np.ndarray:
        rate = self._pool.pass_rate
        return np.where(np.isnan(rate), np.float32(unknown), rate)

    def assign_replays(self, outcomes: Sequence[GroupOutcome]) -> list[Replay]:
        return []

    def update(self, outcomes: Sequence[GroupOutcome]) -> None:
        self._pool.record_outcomes(outcomes, self._ema_alpha)
        self._step += 1

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": type(self).__name__, "step": self._step, "pool": self._pool.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("sampler") != type(self).__name__:
            raise ValueError(f"sampler state was saved by {state.get('sampler')!r}, not {type(self).__name__!r}")
        self._pool.load_state_dict(state["pool"])
        self._step = int(state["step"])


class UniformSampler(PoolSampler):
    """Draws B distinct active tasks uniformly (by the pool's prior when it has one: per-domain
    weights); tracks pass rates for reporting."""

    def __init__(self, pool: TaskPool, config: UniformConfig = UniformConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config

    def _select(self, key, batch_size, eligible):
        (gumbel,) = _gumbels(key, 1, len(self._pool))
        if np.all(self._pool.prior == self._pool.prior[0]):
            return _uniform_select_jit(gumbel, eligible)
        return _weighted_select_jit(gumbel, self._pool.prior, eligible)


class FrontierSampler(PoolSampler):
    """ScaleCUA Frontier Sampling: eq. 2 weights on EMA pass rates, top-3B candidate pool,
    (1 - gamma) B by weight from it and gamma B uniformly from the rest."""

    def __init__(self, pool: TaskPool, config: FrontierConfig = FrontierConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config

    def weights(self) -> np.ndarray:
        """float32 [N] eq. 2 weights of every task (ineligible ones included), times the pool's prior."""
        p = self._known_pass_rate(self.config.unknown_pass_rate)
        return np.asarray(_frontier_weights_jit(p, self.config.mu, self.config.sigma)) * self._pool.prior

    def metrics(self) -> dict[str, float]:
        """Beside the pool's: the eq. 2 weights over the active tasks (mean, max), which the
        draws follow."""
        weights = self.weights()[self._pool.active]
        return {
            **super().metrics(),
            "sampler/frontier_weight_mean": float(weights.mean()),
            "sampler/frontier_weight_max": float(weights.max()),
        }

    def _select(self, key, batch_size, eligible):
        n_explore = share_count(batch_size, self.config.gamma)
        gumbel_frontier, gumbel_explore = _gumbels(key, 2, len(self._pool))
        order, _ = _frontier_select_jit(
            gumbel_frontier,
            gumbel_explore,
            self.weights(),
            eligible,
            batch_size - n_explore,
            n_explore,
            self.config.pool_factor * batch_size,
        )
        return order


class DTACSampler(PoolSampler):
    """EvoCUA-1.5 DTAC: VAS weights 4p(1-p) on EMA pass rates, positive replay of cached
    successes into all-fail groups of hard-but-learnable tasks, and a fixed rho_inf share of
    infeasible tasks per batch."""

    def __init__(self, pool: TaskPool, config: DTACConfig = DTACConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config

    def weights(self) -> np.ndarray:
        """float32 [N] VAS weights of every task, times the pool's prior."""
        return np.asarray(_vas_weights_jit(self._known_pass_rate(self.config.unknown_pass_rate))) * self._pool.prior

    def _select(self, key, batch_size, eligible):
        n_infeasible = share_count(batch_size, self.config.rho_inf)
        n_vas = batch_size - n_infeasible
        feasible = self._pool.feasible
        for what, count, have in (
            ("feasible", n_vas, int((eligible & feasible).sum())),
            ("infeasible", n_infeasible, int((eligible & ~feasible).sum())),
        ):
            if have < count:
                raise ValueError(
                    f"DTACSampler.sample: a batch of {batch_size} with rho_inf={self.config.rho_inf} "
                    f"needs {count} {what} tasks, only {have} are eligible"
                )
        gumbel_vas, gumbel_infeasible = _gumbels(key, 2, len(self._pool))
        return _dtac_select_jit(gumbel_vas, gumbel_infeasible, self.weights(), eligible, feasible, n_vas, n_infeasible)

    def metrics(self) -> dict[str, float]:
        """Beside the pool's: tasks in the replay band, cached successes, and the mean pass rate
        of each tier that has estimates (DTAC's curriculum moving through the tiers)."""
        pool = self._pool
        out = {
            **super().metrics(),
            "sampler/replay_band_tasks": float(sum(self._in_replay_band(i) for i in range(len(pool)))),
            "sampler/replay_cache": float(sum(len(entries) for entries in pool.replay_cache.values())),
        }
        for tier in np.unique(pool.tiers):
            rates = pool.pass_rate[(pool.tiers == tier) & ~np.isnan(pool.pass_rate)]
            if len(rates):
                out[f"sampler/tier_{int(tier)}/pass_rate"] = float(rates.mean())
        return out

    def _in_replay_band(self, index: int) -> bool:
        p = self._pool.pass_rate[index]
        return bool(self.config.p_low <= p <= self.config.p_high)  # False for NaN

    def assign_replays(self, outcomes: Sequence[GroupOutcome]) -> list[Replay]:
        """All-fail groups (with at least two episodes, so a swap leaves a failure beside the
        success) of tasks in [p_low, p_high] get one cached success while the cache has one."""
        replays = []
        for group_index, outcome in enumerate(outcomes):
            if outcome.successes or outcome.attempts < 2:
                continue
            index = int(self._pool.indices_of([outcome.task_id])[0])
            if not self._in_replay_band(index):
                continue
            trajectory = self._pool.take_replay(index, self.config.max_replays_per_trajectory)
            if trajectory is not None:
                replays.append(Replay(group_index, outcome.task_id, trajectory))
        return replays

    def update(self, outcomes: Sequence[GroupOutcome]) -> None:
        for outcome in outcomes:
            if outcome.success_trajectory is None:
                continue
            index = int(self._pool.indices_of([outcome.task_id])[0])
            p = self._pool.pass_rate[index]  # before this step's update: the rate it was drawn at
            if np.isnan(p) or p <= self.config.p_high:
                self._pool.cache_success(index, outcome.success_trajectory, self._step, self.config.replay_cache_size)
        super().update(outcomes)


class CurriculumSampler(PoolSampler):
    """A fixed curriculum: uniform draws among the easiest `competence(draw)` share of the
    eligible tasks (at least a batch), by a difficulty fixed at the first draw."""

    def __init__(self, pool: TaskPool, config: CurriculumConfig = CurriculumConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config
        self._draws = 0
        self._difficulty: np.ndarray | None = None

    def difficulty(self) -> np.ndarray:
        """float32 [N], lower is easier; fixed at the first call."""
        if self._difficulty is None:
            if self.config.difficulty == "tier":
                self._difficulty = self._pool.tiers.astype(np.float32)
            else:
                self._difficulty = (1.0 - self._known_pass_rate(self.config.unknown_pass_rate)).astype(np.float32)
        return self._difficulty

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "sampler/open_share": self.open_share()}

    def open_share(self) -> float:
        """The share of the eligible tasks the next draw may take."""
        return curriculum_competence(self._draws, self.config.start, self.config.steps, self.config.schedule)

    def _select(self, key, batch_size, eligible):
        window = max(batch_size, int(np.ceil(self.open_share() * int(eligible.sum()) - 1e-9)))
        (gumbel,) = _gumbels(key, 1, len(self._pool))
        order = _curriculum_select_jit(gumbel, self.difficulty(), eligible, np.int32(window))
        self._draws += 1
        return order

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "draws": self._draws,
            "difficulty": None if self._difficulty is None else self._difficulty.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._draws = int(state["draws"])
        self._difficulty = None if state["difficulty"] is None else np.asarray(state["difficulty"], np.float32)


SAMPLER_KINDS = ("uniform", "frontier", "dtac", "curriculum")


def build_sampler(
    kind: str,
    pool: TaskPool,
    *,
    uniform: UniformConfig = UniformConfig(),
    frontier: FrontierConfig = FrontierConfig(),
    dtac: DTACConfig = DTACConfig(),
    curriculum: CurriculumConfig = CurriculumConfig(),
    calibration: CalibrationConfig | None = None,
    run_groups: RunGroups | None = None,
) -> TaskSampler:
    """The sampler a training config names.

    kind: one of SAMPLER_KINDS; its config is the matching keyword. With `calibration`, the
    sampler is wrapped in `PassRateCalibration` (ScaleCUA's pilot filter, EvoCUA-1.5's periodic
    calibration), which runs rollouts through `run_groups`.
    """
    samplers = {
        "uniform": lambda: UniformSampler(pool, uniform),
        "frontier": lambda: FrontierSampler(pool, frontier),
        "dtac": lambda: DTACSampler(pool, dtac),
        "curriculum": lambda: CurriculumSampler(pool, curriculum),
    }
    if kind not in samplers:
        raise ValueError(f"unknown sampler kind {kind!r}; choose one of {list(SAMPLER_KINDS)}")
    sampler = samplers[kind]()
    if calibration is None:
        return sampler
    if run_groups is None:
        raise ValueError("build_sampler: pass-rate calibration needs run_groups to run its rollouts")
    return PassRateCalibration(sampler, calibration, run_groups)
