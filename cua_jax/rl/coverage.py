"""Signal coverage of group-relative RL under a sparse reward (CANOPY §3.2, eq. 4-5).

A group of n rollouts of one task carries gradient only when it holds at least one
success and one failure ("informative"); an all-success or all-fail group standardises
to zero advantage. If rollouts succeed independently with probability p, the chance of an
informative group is the signal coverage P_sig(p, n) = 1 - p^n - (1 - p)^n.

Everything here is jnp and jit-compiles; `num_groups` and `num_tiers` are static sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cua_jax.rl._checks import check_ids_in_range, is_concrete

# Group sizes below 2 can never be informative (P_sig(p, 1) = 0 for every p).
MIN_INFORMATIVE_GROUP_SIZE = 2


def signal_coverage(p: jax.Array | float, n: jax.Array | int) -> jax.Array:
    """P_sig(p, n) = 1 - p^n - (1 - p)^n: the chance that a group of n is informative (eq. 4).

    Args:
      p: per-rollout success probability in [0, 1], any shape.
      n: group size (>= 1), broadcastable against `p`.

    Returns:
      float array of the broadcast shape, in [0, 1].
    """
    p = jnp.asarray(p, dtype=jnp.result_type(float))
    n = jnp.asarray(n, dtype=p.dtype)
    return 1.0 - p**n - (1.0 - p) ** n


def min_group_size(p_min: jax.Array | float, tau: jax.Array | float) -> jax.Array:
    """The group-size floor of CANOPY eq. 5: the smallest integer n >= ln(1 - tau) / ln(1 - p_min).

    For small p, P_sig(p, n) ~ 1 - (1 - p)^n, so this n gives the hardest tier (success rate
    p_min) a coverage of about tau. It is a first-order floor, not an optimum. The result is
    never below 2, since a group of one is never informative.

    Args:
      p_min: the hardest tier's estimated success rate, in (0, 1], any shape.
      tau: target coverage, in [0, 1), broadcastable against `p_min`.

    Returns:
      int32 array of the broadcast shape. Where p_min == 0 no finite group suffices and the
      result is the int32 maximum; concrete (non-traced) out-of-range inputs raise ValueError.
    """
    if is_concrete(p_min, tau):
        if not bool(jnp.all((jnp.asarray(p_min) > 0) & (jnp.asarray(p_min) <= 1))):
            raise ValueError(f"min_group_size: p_min must lie in (0, 1], got {p_min!r}")
        if not bool(jnp.all((jnp.asarray(tau) >= 0) & (jnp.asarray(tau) < 1))):
            raise ValueError(f"min_group_size: tau must lie in [0, 1), got {tau!r}")
    p_min = jnp.asarray(p_min, dtype=jnp.result_type(float))
    tau = jnp.asarray(tau, dtype=p_min.dtype)
    bound = jnp.log1p(-tau) / jnp.log1p(-p_min)  # log1p(-1) = -inf gives bound 0 at p_min = 1
    # A bound that is an integer up to rounding (e.g. p = 0.5, tau = 0.75 -> 2) must not round
    # up to the next integer: shave a few ulps before the ceiling.
    shaved = bound * (1.0 - 8.0 * jnp.finfo(bound.dtype).eps)
    int_max = jnp.iinfo(jnp.int32).max
    n = jnp.where(
        p_min > 0,
        jnp.ceil(jnp.minimum(shaved, float(int_max) / 2)).astype(jnp.int32),
        int_max,
    )
    return jnp.maximum(n, MIN_INFORMATIVE_GROUP_SIZE)


def tier_signal_coverage(pass_rates: jax.Array, task_tiers: jax.Array, num_tiers: int, n: jax.Array | int) -> jax.Array:
    """Per tier, the mean signal coverage of its tasks at group size n: the expected share of
    the tier's groups that are informative when each task succeeds at its pass rate.

    Args:
      pass_rates: float [T], each task's success probability in [0, 1].
      task_tiers: int [T] in [0, num_tiers): each task's tier.
      num_tiers: static number of tiers.
      n: group size (>= 1), a scalar.

    Returns:
      float [num_tiers]: mean_i P_sig(p_i, n) over the tier's tasks; 0 for a tier with none.
    """
    pass_rates = jnp.asarray(pass_rates, dtype=jnp.result_type(float))
    task_tiers = jnp.asarray(task_tiers, dtype=jnp.int32)
    if pass_rates.shape != task_tiers.shape or pass_rates.ndim != 1:
        raise ValueError(
            f"tier_signal_coverage: pass_rates {pass_rates.shape} and task_tiers {task_tiers.shape} "
            "must be matching 1-D arrays"
        )
    check_ids_in_range("tier_signal_coverage", "task_tiers", task_tiers, num_tiers)
    total = jax.ops.segment_sum(signal_coverage(pass_rates, n), task_tiers, num_segments=num_tiers)
    count = jax.ops.segment_sum(jnp.ones_like(pass_rates), task_tiers, num_segments=num_tiers)
    return _safe_fraction(total, count)


class GroupOutcomeStats(NamedTuple):
    """Outcome composition of a batch of groups (a pytree of arrays).

    Per group [G]: `group_size` (valid episodes), `group_successes`, and boolean
    `informative` / `all_success` / `all_fail` (an empty group is none of the three).
    Overall scalars: the fractions of non-empty groups that are informative, all-success,
    all-fail, and `num_groups` (the number of non-empty groups).
    Per tier [num_tiers]: the same fractions and `tier_num_groups`; all-zero when no tiers
    were given (num_tiers = 0 gives arrays of length 0).
    """

    group_size: jax.Array
    group_successes: jax.Array
    informative: jax.Array
    all_success: jax.Array
    all_fail: jax.Array
    informative_fraction: jax.Array
    all_success_fraction: jax.Array
    all_fail_fraction: jax.Array
    num_groups: jax.Array
    tier_informative_fraction: jax.Array
    tier_all_success_fraction: jax.Array
    tier_all_fail_fraction: jax.Array
    tier_num_groups: jax.Array


def _safe_fraction(count: jax.Array, total: jax.Array) -> jax.Array:
    return jnp.where(total > 0, count / jnp.maximum(total, 1), 0.0)


def group_outcome_stats(
    success: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    valid: jax.Array | None = None,
    group_tiers: jax.Array | None = None,
    num_tiers: int = 0,
) -> GroupOutcomeStats:
    """Fractions of informative, all-success and all-fail groups, overall and per tier.

    Args:
      success: bool [E], whether each episode succeeded.
      group_ids: int [E] in [0, num_groups): the group (task) of each episode.
      num_groups: static number of group slots G; slots with no valid episode are ignored.
      valid: optional bool [E]; False (quarantined, padding) episodes are left out entirely.
      group_tiers: optional int [G] in [0, num_tiers): the difficulty tier of each group.
      num_tiers: static number of tiers (required with `group_tiers`).

    Returns:
      GroupOutcomeStats.
    """
    success = jnp.asarray(success, dtype=bool)
    group_ids = jnp.asarray(group_ids, dtype=jnp.int32)
    if success.shape != group_ids.shape or success.ndim != 1:
        raise ValueError(
            f"group_outcome_stats: success {success.shape} and group_ids {group_ids.shape} must be matching 1-D arrays"
        )
    check_ids_in_range("group_outcome_stats", "group_ids", group_ids, num_groups)
    valid = jnp.ones_like(success) if valid is None else jnp.asarray(valid, dtype=bool)
    if group_tiers is not None and num_tiers <= 0:
        raise ValueError("group_outcome_stats: group_tiers given without a positive num_tiers")

    counted = valid.astype(jnp.int32)
    group_size = jax.ops.segment_sum(counted, group_ids, num_segments=num_groups)
    group_successes = jax.ops.segment_sum((success & valid).astype(jnp.int32), group_ids, num_segments=num_groups)
    nonempty = group_size > 0
    all_success = nonempty & (group_successes == group_size)
    all_fail = nonempty & (group_successes == 0)
    informative = nonempty & ~all_success & ~all_fail

    total = jnp.sum(nonempty)
    if group_tiers is None:
        tier_total = jnp.zeros((num_tiers,), jnp.int32)
        tier_counts = [jnp.zeros((num_tiers,), jnp.int32)] * 3
    else:
        group_tiers = jnp.asarray(group_tiers, dtype=jnp.int32)
        if group_tiers.shape != (num_groups,):
            raise ValueError(
                f"group_outcome_stats: group_tiers must have shape ({num_groups},), got {group_tiers.shape}"
            )
        check_ids_in_range("group_outcome_stats", "group_tiers", group_tiers, num_tiers)

        def per_tier(flags):
            return jax.ops.segment_sum(flags.astype(jnp.int32), group_tiers, num_segments=num_tiers)

        tier_total = per_tier(nonempty)
        tier_counts = [per_tier(informative), per_tier(all_success), per_tier(all_fail)]

    return GroupOutcomeStats(
        group_size=group_size,
        group_successes=group_successes,
        informative=informative,
        all_success=all_success,
        all_fail=all_fail,
        informative_fraction=_safe_fraction(jnp.sum(informative), total),
        all_success_fraction=_safe_fraction(jnp.sum(all_success), total),
        all_fail_fraction=_safe_fraction(jnp.sum(all_fail), total),
        num_groups=total,
        tier_informative_fraction=_safe_fraction(tier_counts[0], tier_total),
        tier_all_success_fraction=_safe_fraction(tier_counts[1], tier_total),
        tier_all_fail_fraction=_safe_fraction(tier_counts[2], tier_total),
        tier_num_groups=tier_total,
    )
