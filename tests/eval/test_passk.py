"""pass@k, mean@k and best@k against brute force over every k-subset, plus properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.eval.passk import best_at_k, mean_at_k, pass_at_k, problem_metrics


def brute_pass_at_k(outcomes, k):
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def brute_best_at_k(rewards, k):
    subsets = list(itertools.combinations(rewards, k))
    return sum(max(s) for s in subsets) / len(subsets)


outcome_lists = st.lists(st.integers(0, 1), min_size=1, max_size=9)


@settings(max_examples=200, deadline=None)
@given(outcomes=outcome_lists, data=st.data())
def test_pass_at_k_matches_every_subset(outcomes, data):
    k = data.draw(st.integers(1, len(outcomes)))
    assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(rewards=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=8), data=st.data())
def test_best_at_k_matches_every_subset(rewards, data):
    k = data.draw(st.integers(1, len(rewards)))
    assert best_at_k(rewards, k) == pytest.approx(brute_best_at_k(rewards, k), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), data=st.data())
def test_pass_at_k_properties(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the success rate
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12  # more samples never hurt
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12
    assert (value == 0.0) == (c == 0)


def test_large_n_is_stable_and_binary_best_is_pass():
    # C(2000, 1000) overflows float64; the product form does not.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    outcomes = [1, 0, 0, 1, 0, 0, 0]
    assert best_at_k(outcomes, 3) == pytest.approx(pass_at_k(7, 2, 3))
    assert mean_at_k(outcomes) == pytest.approx(2 / 7)
    metrics = problem_metrics(outcomes, 3)
    assert metrics == pytest.approx(
        {"mean@k": 2 / 7, "pass@k": brute_pass_at_k(outcomes, 3), "best@k": brute_pass_at_k(outcomes, 3)}
    )
    assert np.isfinite(best_at_k(np.linspace(0, 1, 3000), 1500))


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(2, 1, 0)
    with pytest.raises(ValueError, match=r"successes c must be in \[0, n=2\]"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="non-empty"):
        mean_at_k([])
    with pytest.raises(ValueError, match="n >= k"):
        best_at_k([1.0], 2)
