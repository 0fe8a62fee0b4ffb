"""Task samplers over a `TaskPool`: uniform, Frontier Sampling, DTAC, pass-rate calibration,
and DAPO dynamic sampling.

One interface (`TaskSampler`), used once per training step:

    ids = sampler.sample(key, batch_size)            # explicit jax.random key; deterministic
    outcomes = run the groups                         # [GroupOutcome], one per task id
    replays = sampler.assign_replays(outcomes)        # DTAC: cached successes for all-fail groups
    ... swap each replay into its group, compute advantages, train ...
    sampler.update(outcomes)                          # statistics, replay cache; step += 1
    checkpoint: sampler.state_dict() (holds the pool's state too) / load_state_dict()

The sampler keeps no random state: every draw comes from the key it is given, so a run
restored from `state_dict()` and fed the same keys samples exactly as an uninterrupted one.

`build_sampler(kind, pool, ...)` builds the sampler a training config names.

Selection is Gumbel-top-k (Efraimidis-Spirakis): adding Gumbel noise to log-weights and
taking the k largest draws k distinct tasks, each next one with probability proportional to
its weight among those left. The math is pure, jit-compiled JAX over fixed-size [N] arrays
(masks instead of filtering; batch sizes are traced, so one compilation serves them all),
taking the noise as input so a numpy reference can replay it:

    frontier_weights(p, mu, sigma)   ScaleCUA eq. 2   exp(-(p - mu)^2 / (2 sigma^2))
    vas_weights(p)                   EvoCUA-1.5 DTAC  4 p (1 - p)
    frontier_select(...)             ScaleCUA App. D  top-3B pool: (1-gamma)B by weight, gamma B
                                                      uniformly from outside it
    dtac_select(...)                 EvoCUA-1.5 DTAC  VAS-weighted feasible + rho_inf B infeasible
    uniform_select(...)
The EMA of eq. 1 lives with the statistics it updates (`pool.ema_update`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.rl.coverage import GroupOutcomeStats, group_outcome_stats
from cua_jax.tasks.pool import GroupOutcome, TaskPool

# Runs one group of `group_size` rollouts per task id with the current policy and returns
# their outcomes in the same order. Calibration and dynamic sampling take one of these.
RunGroups = Callable[[Sequence[str], int], Sequence[GroupOutcome]]

# Gap between priority levels of selection scores. Positive float32 weights have
# log w >= -104 and Gumbel noise of float32 uniforms lies in about [-3, 17], so a score
# lowered by this gap sorts after every score of the level above.
_PRIORITY_GAP = 1e4


# ---------------------------------------------------------------------------------------
# Pure math
# ---------------------------------------------------------------------------------------


def frontier_weights(pass_rate: jax.Array, mu: float, sigma: float) -> jax.Array:
    """ScaleCUA eq. 2: w = exp(-(p - mu)^2 / (2 sigma^2)).

    Args:
      pass_rate: float [N] EMA pass rates in [0, 1].
      mu: target success rate; sigma: bandwidth (> 0).

    Returns:
      float [N] weights in (0, 1], peaking at p = mu.
    """
    p = jnp.asarray(pass_rate, dtype=jnp.float32)
    return jnp.exp(-jnp.square(p - mu) / (2.0 * sigma * sigma))


def vas_weights(pass_rate: jax.Array) -> jax.Array:
    """DTAC variance-adaptive sampling weight w = 4 p (1 - p): the Bernoulli variance
    scaled to peak at 1 for p = 0.5, and 0 for solved (p = 1) or hopeless (p = 0) tasks.

    Args:
      pass_rate: float [N] EMA pass rates in [0, 1].

    Returns:
      float [N] weights in [0, 1].
    """
    p = jnp.asarray(pass_rate, dtype=jnp.float32)
    return 4.0 * p * (1.0 - p)


def weighted_draw_scores(gumbel: jax.Array, weights: jax.Array, eligible: jax.Array) -> jax.Array:
    """Gumbel-top-k keys: the k largest give k draws without replacement, proportional to weight.

    Zero-weight tasks rank after every positive-weight task and uniformly among themselves,
    so a draw larger than the positive-weight set still fills up; ineligible tasks get -inf.

    Args:
      gumbel: float [N] standard Gumbel noise.
      weights: float [N] non-negative weights.
      eligible: bool [N].

    Returns:
      float [N] scores.
    """
    positive = weights > 0
    log_w = jnp.log(jnp.where(positive, weights, 1.0))
    scores = jnp.where(positive, log_w + gumbel, gumbel - _PRIORITY_GAP)
    return jnp.where(eligible, scores, -jnp.inf)


def descending_rank(scores: jax.Array) -> jax.Array:
    """int32 [N]: each entry's position when `scores` [N] are sorted high to low (ties: lower
    index first)."""
    n = scores.shape[0]
    order = jnp.argsort(-scores, stable=True)
    return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))


def _batch_order(
    first_rank: jax.Array, first_count, second_rank: jax.Array, second_count
) -> jax.Array:
    """A permutation [N] listing the first group's picks (rank < first_count) in rank order,
    then the second group's, then everything else."""
    n = first_rank.shape[0]
    in_first = first_rank < first_count
    in_second = ~in_first & (second_rank < second_count)
    position = jnp.where(
        in_first, first_rank, jnp.where(in_second, first_count + second_rank, n + jnp.arange(n))
    )
    return jnp.argsort(position, stable=True).astype(jnp.int32)


# Batch sizes are traced, not static: one compilation per pool size serves every batch size
# (dynamic sampling asks for varying counts). Each selector therefore returns a permutation
# [N] of the pool whose first (batch size) entries are the batch; `PoolSampler` slices it.


def uniform_select(gumbel: jax.Array, eligible: jax.Array) -> jax.Array:
    """Uniform draws without replacement over the eligible tasks.

    Args:
      gumbel: float [N] noise (any i.i.d. continuous noise gives a uniform draw).
      eligible: bool [N].

    Returns:
      int32 [N] permutation; its first k entries are k distinct eligible tasks drawn
      uniformly, for any k <= the number of eligible tasks.
    """
    return jnp.argsort(-jnp.where(eligible, gumbel, -jnp.inf), stable=True).astype(jnp.int32)


def frontier_select(
    gumbel_frontier: jax.Array,
    gumbel_explore: jax.Array,
    weights: jax.Array,
    eligible: jax.Array,
    n_frontier: jax.Array | int,
    n_explore: jax.Array | int,
    pool_size: jax.Array | int,
) -> tuple[jax.Array, jax.Array]:
    """Frontier Sampling's batch (ScaleCUA App. D).

    The `pool_size` (= 3B) eligible tasks of highest weight form the candidate pool (ties:
    lower index first); `n_frontier` (= (1 - gamma) B) are drawn from it by weight, and
    `n_explore` (= gamma B) uniformly from the eligible tasks outside it. When fewer than
    `n_explore` tasks lie outside, the rest come uniformly from the pool's undrawn tasks.

    Args:
      gumbel_frontier, gumbel_explore: float [N] independent standard Gumbel noise.
      weights: float [N] eq. 2 weights.
      eligible: bool [N], at least n_frontier + n_explore True.
      n_frontier, n_explore, pool_size: int scalars, n_frontier <= pool_size.

    Returns:
      (order int32 [N]: a permutation whose first n_frontier entries are the frontier draws
       and next n_explore entries the exploration draws;
       in_pool bool [N]: the candidate pool).
    """
    ranked = jnp.where(eligible, weights, -jnp.inf)
    in_pool = eligible & (descending_rank(ranked) < pool_size)
    frontier_rank = descending_rank(weighted_draw_scores(gumbel_frontier, weights, in_pool))
    chosen = frontier_rank < n_frontier
    explore_scores = jnp.where(
        eligible & ~chosen, gumbel_explore - _PRIORITY_GAP * in_pool.astype(jnp.float32), -jnp.inf
    )
    order = _batch_order(frontier_rank, n_frontier, descending_rank(explore_scores), n_explore)
    return order, in_pool


def dtac_select(
    gumbel_vas: jax.Array,
    gumbel_infeasible: jax.Array,
    weights: jax.Array,
    eligible: jax.Array,
    feasible: jax.Array,
    n_vas: jax.Array | int,
    n_infeasible: jax.Array | int,
) -> jax.Array:
    """DTAC's batch: `n_vas` feasible tasks by VAS weight and `n_infeasible` infeasible
    tasks uniformly (ICS, a fixed rho_inf share of the batch).

    Args:
      gumbel_vas, gumbel_infeasible: float [N] independent standard Gumbel noise.
      weights: float [N] VAS weights.
      eligible, feasible: bool [N]; at least n_vas eligible feasible and n_infeasible eligible
        infeasible tasks.
      n_vas, n_infeasible: int scalars.

    Returns:
      int32 [N] permutation: first the n_vas VAS draws, then the n_infeasible infeasible draws.
    """
    vas_rank = descending_rank(weighted_draw_scores(gumbel_vas, weights, eligible & feasible))
    infeasible_rank = descending_rank(jnp.where(eligible & ~feasible, gumbel_infeasible, -jnp.inf))
    return _batch_order(vas_rank, n_vas, infeasible_rank, n_infeasible)


def share_count(batch_size: int, fraction: float) -> int:
    """The number of a batch's B slots a share `fraction` takes: fraction * B rounded half up."""
    return int(math.floor(fraction * batch_size + 0.5))


_uniform_select_jit = jax.jit(uniform_select)
_frontier_select_jit = jax.jit(frontier_select)
_dtac_select_jit = jax.jit(dtac_select)
_frontier_weights_jit = jax.jit(frontier_weights)
_group_outcome_stats_jit = jax.jit(group_outcome_stats, static_argnames=("num_groups", "num_tiers"))
_vas_weights_jit = jax.jit(vas_weights)


def _gumbels(key: jax.Array, count: int, n: int) -> list[jax.Array]:
    return [jax.random.gumbel(k, (n,), dtype=jnp.float32) for k in jax.random.split(key, count)]


# ---------------------------------------------------------------------------------------
# Group outcomes -> coverage statistics
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Replay:
    """A cached success to swap into group `group_index` in place of one failed episode."""

    group_index: int
    task_id: str
    trajectory: Any


def outcome_stats(
    outcomes: Sequence[GroupOutcome],
    replayed: Sequence[bool] | None = None,
    tiers: Sequence[int] | None = None,
    num_tiers: int = 0,
) -> GroupOutcomeStats:
    """CANOPY coverage statistics (`cua_jax.rl.coverage`) of a list of group outcomes.

    A replayed group counts one of its failures as a success, as the trainer sees it.

    Args:
      outcomes: [G] groups.
      replayed: optional bool [G], groups that received a replayed success.
      tiers: optional int [G] difficulty tiers, with `num_tiers`.
    """
    num_groups = len(outcomes)
    extra = np.zeros(num_groups, np.int64) if replayed is None else np.asarray(replayed, np.int64)
    attempts = np.array([o.attempts for o in outcomes], dtype=np.int64)
    successes = np.minimum(
        np.array([o.successes for o in outcomes], dtype=np.int64) + extra, attempts
    )
    group_ids = np.repeat(np.arange(num_groups), attempts)
    position = np.arange(group_ids.shape[0]) - np.repeat(np.cumsum(attempts) - attempts, attempts)
    success = position < np.repeat(successes, attempts)
    # Pad groups and episodes to powers of two so that the jitted statistics compile once per
    # bucket: padding episodes are invalid and padding groups empty, which the stats ignore.
    group_slots, episode_slots = _bucket(num_groups), _bucket(group_ids.shape[0])
    pad = episode_slots - group_ids.shape[0]
    tier_slots = None
    if tiers is not None:
        tier_slots = np.zeros(group_slots, np.int64)
        tier_slots[:num_groups] = tiers
    stats = _group_outcome_stats_jit(
        np.concatenate([success, np.zeros(pad, bool)]),
        np.concatenate([group_ids, np.zeros(pad, np.int64)]),
        group_slots,
        valid=np.arange(episode_slots) < group_ids.shape[0],
        group_tiers=tier_slots,
        num_tiers=num_tiers,
    )
    per_group = ("group_size", "group_successes", "informative", "all_success", "all_fail")
    return stats._replace(
        **{name: np.asarray(getattr(stats, name))[:num_groups] for name in per_group}
    )


def _bucket(size: int) -> int:
    return 1 << max(0, size - 1).bit_length()


# ---------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------


class TaskSampler(abc.ABC):
    """The interface every sampler (and sampler wrapper) implements."""

    @property
    @abc.abstractmethod
    def pool(self) -> TaskPool: ...

    @property
    @abc.abstractmethod
    def step(self) -> int:
        """Completed training steps (calls to `update`)."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, batch_size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        """`batch_size` distinct active task ids not in `exclude`, drawn with `key`."""

    @abc.abstractmethod
    def num_eligible(self, exclude: Sequence[str] = ()) -> int:
        """How many tasks `sample` could draw from with this `exclude`."""

    @abc.abstractmethod
    def assign_replays(self, outcomes: Sequence[GroupOutcome]) -> list[Replay]:
        """Which of this step's groups receive a cached success (call before advantages)."""

    @abc.abstractmethod
    def update(self, outcomes: Sequence[GroupOutcome]) -> None:
        """Records this step's groups (all of them, dropped ones included) and ends the step."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def _check_fraction(
    owner: str, name: str, value: float, *, low_open: bool = False, high_open: bool = False
):
    low_ok = value > 0 if low_open else value >= 0
    high_ok = value < 1 if high_open else value <= 1
    if not (low_ok and high_ok):
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{owner}.{name} must lie in {interval}, got {value}")


@dataclasses.dataclass(frozen=True)
class UniformConfig:
    """ema_alpha: smoothing of the tracked pass rates (ScaleCUA eq. 1); draws ignore them."""

    ema_alpha: float = 0.2

    def __post_init__(self):
        _check_fraction("UniformConfig", "ema_alpha", self.ema_alpha, low_open=True)


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
        _check_fraction("FrontierConfig", "ema_alpha", self.ema_alpha, low_open=True)
        _check_fraction("FrontierConfig", "mu", self.mu)
        _check_fraction("FrontierConfig", "gamma", self.gamma)
        _check_fraction("FrontierConfig", "unknown_pass_rate", self.unknown_pass_rate)
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
        _check_fraction("DTACConfig", "ema_alpha", self.ema_alpha, low_open=True)
        for name in ("p_low", "p_high", "rho_inf", "unknown_pass_rate"):
            _check_fraction("DTACConfig", name, getattr(self, name))
        if self.p_low > self.p_high:
            raise ValueError(f"DTACConfig.p_low {self.p_low} exceeds p_high {self.p_high}")
        if self.max_replays_per_trajectory < 1:
            raise ValueError(
                f"DTACConfig.max_replays_per_trajectory must be >= 1, got {self.max_replays_per_trajectory}"
            )
        if self.replay_cache_size < 1:
            raise ValueError(
                f"DTACConfig.replay_cache_size must be >= 1, got {self.replay_cache_size}"
            )


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
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(
                f"{type(self).__name__}.sample: batch_size must be an int >= 1, got {batch_size!r}"
            )
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
            raise ValueError(
                f"sampler state was saved by {state.get('sampler')!r}, not {type(self).__name__!r}"
            )
        self._pool.load_state_dict(state["pool"])
        self._step = int(state["step"])


class UniformSampler(PoolSampler):
    """Draws B distinct active tasks uniformly; tracks pass rates for reporting."""

    def __init__(self, pool: TaskPool, config: UniformConfig = UniformConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config

    def _select(self, key, batch_size, eligible):
        (gumbel,) = _gumbels(key, 1, len(self._pool))
        return _uniform_select_jit(gumbel, eligible)


class FrontierSampler(PoolSampler):
    """ScaleCUA Frontier Sampling: eq. 2 weights on EMA pass rates, top-3B candidate pool,
    (1 - gamma) B by weight from it and gamma B uniformly from the rest."""

    def __init__(self, pool: TaskPool, config: FrontierConfig = FrontierConfig()):
        super().__init__(pool, config.ema_alpha)
        self.config = config

    def weights(self) -> np.ndarray:
        """float32 [N] eq. 2 weights of every task (ineligible ones included)."""
        p = self._known_pass_rate(self.config.unknown_pass_rate)
        return np.asarray(_frontier_weights_jit(p, self.config.mu, self.config.sigma))

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
        """float32 [N] VAS weights of every task."""
        return np.asarray(_vas_weights_jit(self._known_pass_rate(self.config.unknown_pass_rate)))

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
        return _dtac_select_jit(
            gumbel_vas, gumbel_infeasible, self.weights(), eligible, feasible, n_vas, n_infeasible
        )

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
                self._pool.cache_success(
                    index, outcome.success_trajectory, self._step, self.config.replay_cache_size
                )
        super().update(outcomes)


# ---------------------------------------------------------------------------------------
# Pass-rate calibration (and ScaleCUA's pilot filter)
# ---------------------------------------------------------------------------------------


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
        _check_fraction("CalibrationConfig", "p_min", self.p_min)
        _check_fraction("CalibrationConfig", "p_max", self.p_max)
        if self.p_min > self.p_max:
            raise ValueError(f"CalibrationConfig.p_min {self.p_min} exceeds p_max {self.p_max}")
        for name in ("pilot_group_size", "group_size", "sample_size"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"CalibrationConfig.{name} must be >= 1, got {getattr(self, name)}"
                )
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


def _check_outcomes_match(
    task_ids: Sequence[str], outcomes: Sequence[GroupOutcome], who: str
) -> None:
    got = [o.task_id for o in outcomes]
    if got != list(task_ids):
        raise ValueError(
            f"{who}: run_groups must return one outcome per requested task id, in order; "
            f"asked for {len(task_ids)} ids, got {len(got)} outcomes"
            + ("" if len(got) != len(task_ids) else " with different ids")
        )


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
            indices = np.sort(
                np.asarray(jax.random.choice(key, n, (cfg.sample_size,), replace=False))
            )
        group_size = cfg.pilot_group_size if pilot else cfg.group_size
        task_ids = pool.ids_of(indices)
        outcomes = list(self.run_groups(task_ids, group_size))
        _check_outcomes_match(task_ids, outcomes, "PassRateCalibration")
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
            raise ValueError(
                f"sampler state was saved by {state.get('sampler')!r}, not 'PassRateCalibration'"
            )
        self.inner.load_state_dict(state["inner"])
        self.last_calibrated_step = int(state["last_calibrated_step"])


SAMPLER_KINDS = ("uniform", "frontier", "dtac")


def build_sampler(
    kind: str,
    pool: TaskPool,
    *,
    uniform: UniformConfig = UniformConfig(),
    frontier: FrontierConfig = FrontierConfig(),
    dtac: DTACConfig = DTACConfig(),
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
    }
    if kind not in samplers:
        raise ValueError(f"unknown sampler kind {kind!r}; choose one of {list(SAMPLER_KINDS)}")
    sampler = samplers[kind]()
    if calibration is None:
        return sampler
    if run_groups is None:
        raise ValueError(
            "build_sampler: pass-rate calibration needs run_groups to run its rollouts"
        )
    return PassRateCalibration(sampler, calibration, run_groups)


# ---------------------------------------------------------------------------------------
# DAPO dynamic sampling
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO dynamic sampling: drop degenerate (all-success / all-fail) groups and draw more
    tasks until the batch holds `batch_size` informative groups.

    max_rounds: sampling rounds per step, the first included (DAPO's cap on generation
      batches); a batch still short after them is returned short, with the count.
    oversample: each extra round draws ceil(oversample * missing) tasks.
    """

    max_rounds: int = 3
    oversample: float = 1.0

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(
                f"DynamicSamplingConfig.max_rounds must be >= 1, got {self.max_rounds}"
            )
        if self.oversample < 1.0:
            raise ValueError(
                f"DynamicSamplingConfig.oversample must be >= 1, got {self.oversample}"
            )


@dataclasses.dataclass
class DynamicBatch:
    """A step's groups after dynamic sampling.

    groups: the kept informative groups (at most batch_size), in draw order.
    replays: replayed successes, `group_index` into `groups`.
    dropped: the degenerate groups (and informative ones beyond a full batch).
    rounds: sampling rounds used. rollouts: episodes run (kept and dropped).
    missing: batch_size - len(groups); > 0 when the round cap or the pool ran out.
    """

    groups: list[GroupOutcome]
    replays: list[Replay]
    dropped: list[GroupOutcome]
    rounds: int
    rollouts: int
    missing: int


def collect_informative_groups(
    key: jax.Array,
    sampler: TaskSampler,
    run_groups: RunGroups,
    batch_size: int,
    group_size: int,
    config: DynamicSamplingConfig = DynamicSamplingConfig(),
) -> DynamicBatch:
    """One training step's groups under DAPO dynamic sampling, ending the sampler's step.

    Each round draws tasks not yet drawn this step, runs their groups, applies the sampler's
    replays, and keeps the informative groups; every group run (kept or dropped) updates the
    sampler's statistics once the step's groups are collected. A replay given to a group that
    is dropped because the batch is already full still counts against its trajectory's cap.
    """
    drawn: list[str] = []
    every_outcome: list[GroupOutcome] = []
    kept: list[GroupOutcome] = []
    kept_replays: list[Replay] = []
    dropped: list[GroupOutcome] = []
    rounds = 0
    for _ in range(config.max_rounds):
        missing = batch_size - len(kept)
        count = min(
            math.ceil(config.oversample * missing) if rounds else missing,
            sampler.num_eligible(drawn),
        )
        if missing == 0 or count == 0:
            break
        key, round_key = jax.random.split(key)
        task_ids = sampler.sample(round_key, count, exclude=drawn)
        outcomes = list(run_groups(task_ids, group_size))
        _check_outcomes_match(task_ids, outcomes, "collect_informative_groups")
        rounds += 1
        drawn.extend(task_ids)
        every_outcome.extend(outcomes)
        replays = {r.group_index: r for r in sampler.assign_replays(outcomes)}
        replayed = [g in replays for g in range(len(outcomes))]
        informative = np.asarray(outcome_stats(outcomes, replayed).informative)
        for g, outcome in enumerate(outcomes):
            if informative[g] and len(kept) < batch_size:
                if g in replays:
                    kept_replays.append(dataclasses.replace(replays[g], group_index=len(kept)))
                kept.append(outcome)
            else:
                dropped.append(outcome)
    sampler.update(every_outcome)
    return DynamicBatch(
        groups=kept,
        replays=kept_replays,
        dropped=dropped,
        rounds=rounds,
        rollouts=sum(o.attempts for o in every_outcome),
        missing=batch_size - len(kept),
    )
