"""Task-selection math: Frontier and DTAC weights and Gumbel-top-k batch draws.

Selection is Gumbel-top-k (Efraimidis-Spirakis): adding Gumbel noise to log-weights and
taking the k largest draws k distinct tasks, each next one with probability proportional to
its weight among those left. The math is pure JAX over fixed-size [N] arrays (masks instead
of filtering; batch sizes are traced, so one compilation serves them all), taking the noise as
input so a numpy reference can replay it. The samplers (`cua_jax.tasks.samplers`) jit it:

    frontier_weights(p, mu, sigma)   ScaleCUA eq. 2   exp(-(p - mu)^2 / (2 sigma^2))
    vas_weights(p)                   EvoCUA-1.5 DTAC  4 p (1 - p)
    frontier_select(...)             ScaleCUA App. D  top-3B pool: (1-gamma)B by weight, gamma B
                                                      uniformly from outside it
    dtac_select(...)                 EvoCUA-1.5 DTAC  VAS-weighted feasible + rho_inf B infeasible
    uniform_select(...)
The EMA of eq. 1 lives with the statistics it updates (`pool.ema_update`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# Gap between priority levels of selection scores. Positive float32 weights have
# log w >= -104 and Gumbel noise of float32 uniforms lies in about [-3, 17], so a score
# lowered by this gap sorts after every score of the level above.
_PRIORITY_GAP = 1e4


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


def _batch_order(first_rank: jax.Array, first_count, second_rank: jax.Array, second_count) -> jax.Array:
    """A permutation [N] listing the first group's picks (rank < first_count) in rank order,
    then the second group's, then everything else."""
    n = first_rank.shape[0]
    in_first = first_rank < first_count
    in_second = ~in_first & (second_rank < second_count)
    position = jnp.where(in_first, first_rank, jnp.where(in_second, first_count + second_rank, n + jnp.arange(n)))
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


def weighted_select(gumbel: jax.Array, weights: jax.Array, eligible: jax.Array) -> jax.Array:
    """Draws without replacement over the eligible tasks, proportional to `weights`
    (Gumbel-top-k); equal weights give `uniform_select`'s order.

    Args:
      gumbel: float [N] standard Gumbel noise.
      weights: float [N] > 0.
      eligible: bool [N].

    Returns:
      int32 [N] permutation; its first k entries are k distinct eligible tasks.
    """
    return jnp.argsort(-weighted_draw_scores(gumbel, weights, eligible), stable=True).astype(jnp.int32)


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


def curriculum_competence(step: int, start: float, steps: int, schedule: str = "sqrt") -> float:
    """The share of the pool, easiest first, a fixed curriculum opens at `step` (competence-based
    curriculum learning, Platanios et al. 2019): `start` at step 0, all of it from `steps` on.

    schedule: "linear", c(t) = start + (1 - start) t / steps, or "sqrt", c(t) = sqrt(t (1 -
    start^2) / steps + start^2) (faster early, as the paper recommends); both clipped to 1.
    """
    if steps < 1:
        return 1.0
    t = min(max(step, 0), steps) / steps
    if schedule == "linear":
        return min(1.0, start + (1.0 - start) * t)
    if schedule == "sqrt":
        return min(1.0, math.sqrt(t * (1.0 - start * start) + start * start))
    raise ValueError(f"unknown curriculum schedule {schedule!r}; choose 'linear' or 'sqrt'")


def curriculum_select(gumbel: jax.Array, difficulty: jax.Array, eligible: jax.Array, window: jax.Array) -> jax.Array:
    """Uniform draws among the `window` easiest eligible tasks (a fixed curriculum's open set).

    Args:
      gumbel: float [N] i.i.d. noise.
      difficulty: float [N], lower is easier; ties go to the lower index.
      eligible: bool [N].
      window: int scalar, how many of the easiest eligible tasks are open (>= the batch size).

    Returns:
      int32 [N] permutation; its first k entries are k distinct tasks drawn uniformly from the
      open set, for any k <= min(window, number eligible).
    """
    by_difficulty = jnp.argsort(jnp.where(eligible, difficulty, jnp.inf), stable=True)
    rank = jnp.zeros_like(by_difficulty).at[by_difficulty].set(jnp.arange(by_difficulty.shape[0]))
    open_set = eligible & (rank < window)
    return jnp.argsort(-jnp.where(open_set, gumbel, -jnp.inf), stable=True).astype(jnp.int32)


def share_count(batch_size: int, fraction: float) -> int:
    """The number of a batch's B slots a share `fraction` takes: fraction * B rounded half up."""
    return int(math.floor(fraction * batch_size + 0.5))
