"""Signal coverage, the group-size floor and batch outcome statistics against numpy references."""

import functools
import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.rl.coverage import group_outcome_stats, min_group_size, signal_coverage

PROPERTY = settings(max_examples=40, deadline=None)

NUM_EPISODES, NUM_GROUPS, NUM_TIERS = 12, 5, 3

signal_coverage_jit = jax.jit(signal_coverage)
min_group_size_jit = jax.jit(min_group_size)
group_outcome_stats_jit = jax.jit(functools.partial(group_outcome_stats, num_groups=NUM_GROUPS, num_tiers=NUM_TIERS))


def reference_coverage(p: float, n: int) -> float:
    """P(at least one success and one failure among n), by summing the binomial terms directly."""
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(1, n))


@PROPERTY
@given(
    p=hnp.arrays(np.float32, (8,), elements=st.floats(0, 1, width=32, allow_subnormal=False)),
    n=hnp.arrays(np.int32, (8,), elements=st.integers(1, 64)),
)
def test_signal_coverage_matches_binomial_sum(p, n):
    got = np.asarray(signal_coverage_jit(p, n))
    want = [reference_coverage(float(pi), int(ni)) for pi, ni in zip(p, n)]
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.all((got >= -1e-6) & (got <= 1 + 1e-6))


def test_signal_coverage_canopy_figure_2_values():
    # CANOPY Fig. 2a: a hard task (p = 0.05) rises from 34% at n = 8 to 81% at n = 32.
    got = signal_coverage_jit(jnp.array([0.05, 0.05]), jnp.array([8, 32]))
    np.testing.assert_allclose(got, [0.34, 0.81], atol=0.005)
    assert float(signal_coverage_jit(0.3, 1)) == 0.0


def reference_min_group_size(p_min: float, tau: float) -> set[int]:
    """The smallest integer n >= max(2, ln(1 - tau) / ln(1 - p_min)), in float64.

    When the bound is an integer up to float32 rounding, either neighbour is accepted.
    """
    bound = 0.0 if p_min == 1 else math.log1p(-tau) / math.log1p(-p_min)
    candidates = {max(2, math.ceil(bound))}
    if abs(bound - round(bound)) <= 1e-5 * max(1.0, bound):
        candidates |= {max(2, round(bound)), max(2, round(bound) + 1)}
    return candidates


@PROPERTY
@given(
    p_min=hnp.arrays(np.float32, (8,), elements=st.floats(0.0009765625, 1, width=32)),
    tau=hnp.arrays(np.float32, (8,), elements=st.floats(0, 0.9990234375, width=32, allow_subnormal=False)),
)
def test_min_group_size_matches_reference(p_min, tau):
    got = np.asarray(min_group_size_jit(p_min, tau))
    assert got.dtype == np.int32
    for n, p, t in zip(got, p_min, tau):
        assert int(n) in reference_min_group_size(float(p), float(t)), (p, t, n)


def test_min_group_size_exact_bounds_and_canopy_example():
    # ln(0.25) / ln(0.5) = 2 exactly: must not round up to 3.
    assert int(min_group_size_jit(0.5, 0.75)) == 2
    # ln(1 - 0.875) / ln(0.5) = 3.
    assert int(min_group_size_jit(0.5, 0.875)) == 3
    # p_min = 0.05 and tau = 0.8 need 32 rollouts (CANOPY's main group size).
    assert int(min_group_size_jit(0.05, 0.8)) == 32
    assert int(min_group_size_jit(0.0, 0.5)) == np.iinfo(np.int32).max


@pytest.mark.parametrize("p_min, tau", [(0.0, 0.5), (1.5, 0.5), (0.1, 1.0), (0.1, -0.1)])
def test_min_group_size_rejects_out_of_range_inputs(p_min, tau):
    with pytest.raises(ValueError, match="p_min|tau"):
        min_group_size(p_min, tau)


def reference_outcome_stats(success, group_ids, valid, group_tiers):
    size = np.zeros(NUM_GROUPS, int)
    wins = np.zeros(NUM_GROUPS, int)
    for s, g, v in zip(success, group_ids, valid):
        if v:
            size[g] += 1
            wins[g] += int(s)
    nonempty = size > 0
    kinds = {
        "informative": nonempty & (wins > 0) & (wins < size),
        "all_success": nonempty & (wins == size),
        "all_fail": nonempty & (wins == 0),
    }
    overall = {k: (v.sum() / nonempty.sum() if nonempty.any() else 0.0) for k, v in kinds.items()}
    per_tier = {}
    for k, v in kinds.items():
        per_tier[k] = np.array(
            [
                v[(group_tiers == t) & nonempty].sum() / max(((group_tiers == t) & nonempty).sum(), 1)
                for t in range(NUM_TIERS)
            ]
        )
    return size, wins, kinds, overall, per_tier, nonempty


@PROPERTY
@given(
    success=hnp.arrays(bool, (NUM_EPISODES,)),
    group_ids=hnp.arrays(np.int32, (NUM_EPISODES,), elements=st.integers(0, NUM_GROUPS - 1)),
    valid=hnp.arrays(bool, (NUM_EPISODES,)),
    group_tiers=hnp.arrays(np.int32, (NUM_GROUPS,), elements=st.integers(0, NUM_TIERS - 1)),
)
def test_group_outcome_stats_matches_reference(success, group_ids, valid, group_tiers):
    got = group_outcome_stats_jit(success, group_ids, valid=valid, group_tiers=group_tiers)
    size, wins, kinds, overall, per_tier, nonempty = reference_outcome_stats(success, group_ids, valid, group_tiers)
    np.testing.assert_array_equal(got.group_size, size)
    np.testing.assert_array_equal(got.group_successes, wins)
    for name in kinds:
        np.testing.assert_array_equal(getattr(got, name), kinds[name])
        np.testing.assert_allclose(getattr(got, f"{name}_fraction"), overall[name], rtol=1e-6)
        np.testing.assert_allclose(getattr(got, f"tier_{name}_fraction"), per_tier[name], rtol=1e-6)
    assert int(got.num_groups) == nonempty.sum()
    # Every non-empty group is exactly one of the three kinds.
    if nonempty.any():
        total = got.informative_fraction + got.all_success_fraction + got.all_fail_fraction
        np.testing.assert_allclose(total, 1.0, rtol=1e-6)


def test_group_outcome_stats_without_tiers_and_with_quarantine():
    # Group 0: success + failure, but the failure is quarantined -> all-success.
    stats = jax.jit(functools.partial(group_outcome_stats, num_groups=2))(
        jnp.array([True, False, True, False]),
        jnp.array([0, 0, 1, 1]),
        valid=jnp.array([True, False, True, True]),
    )
    np.testing.assert_array_equal(stats.all_success, [True, False])
    np.testing.assert_array_equal(stats.informative, [False, True])
    assert stats.tier_num_groups.shape == (0,)


def test_group_outcome_stats_rejects_bad_shapes():
    with pytest.raises(ValueError, match="matching 1-D"):
        group_outcome_stats(jnp.zeros(3, bool), jnp.zeros(4, jnp.int32), num_groups=2)
    with pytest.raises(ValueError, match="num_tiers"):
        group_outcome_stats(jnp.zeros(3, bool), jnp.zeros(3, jnp.int32), 2, group_tiers=jnp.zeros(2))
    with pytest.raises(ValueError, match=r"group_ids must lie in \[0, 2\)"):
        group_outcome_stats(jnp.zeros(3, bool), jnp.array([0, 1, -1]), num_groups=2)
    with pytest.raises(ValueError, match=r"group_tiers must lie in \[0, 2\)"):
        group_outcome_stats(jnp.zeros(3, bool), jnp.zeros(3, jnp.int32), 2, group_tiers=jnp.array([0, 2]), num_tiers=2)
    with pytest.raises(ValueError, match="group_tiers must have shape"):
        group_outcome_stats(jnp.zeros(3, bool), jnp.zeros(3, jnp.int32), 2, group_tiers=jnp.zeros(3), num_tiers=2)
