"""Metrics of k samples per problem: mean@k, the unbiased pass@k estimator, best@k.

Every function takes the outcomes of one problem's n samples (n >= k) and is pure:

    mean_at_k(successes)             mean success over the n samples (the mean of k draws)
    pass_at_k(n, c, k)               P(at least one of k samples drawn without replacement
                                     from the n succeeds) = 1 - C(n - c, k) / C(n, k)
                                     (Chen et al. 2021), as a product so it never overflows
    best_at_k(rewards, k)            expected best reward of k samples drawn without
                                     replacement from the n (pass@k for 0 / 1 rewards)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(n: int, k: int) -> None:
    if not isinstance(n, (int, np.integer)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"n and k must be integers, got n={n!r}, k={k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"k={k} samples need n >= k, got n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c succeeded.

    1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which stays in
    [0, 1] without the binomials' overflow. Args: ints with 1 <= k <= n and 0 <= c <= n.
    """
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"the successes c must be in [0, n={n}], got {c}")
    if n - c < k:  # every k-subset holds a success
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_at_k(successes: Sequence[float]) -> float:
    """Mean outcome of a problem's samples (float [n], n >= 1): the expected success of one
    draw, which is also the mean of k draws."""
    values = np.asarray(successes, np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"mean_at_k needs a non-empty 1-D sequence of outcomes, got shape {values.shape}")
    return float(values.mean())


def best_at_k(rewards: Sequence[float], k: int) -> float:
    """E[max of k rewards drawn without replacement] from a problem's n rewards (float [n]).

    With the rewards sorted ascending r_(1) <= ... <= r_(n), the i-th is the maximum of
    C(i-1, k-1) of the C(n, k) subsets; the weights are computed as running ratios (no
    binomial is formed), so large n is stable.
    """
    values = np.sort(np.asarray(rewards, np.float64))
    if values.ndim != 1:
        raise ValueError(f"best_at_k needs a 1-D sequence of rewards, got shape {values.shape}")
    n = values.size
    _check(n, k)
    # w_i = C(i-1, k-1) / C(n, k) for i = k..n; w_n = k / n, w_{i-1} = w_i * (i - k) / (i - 1).
    weights = np.zeros(n, np.float64)
    weights[n - 1] = k / n
    for i in range(n, k, -1):
        weights[i - 2] = weights[i - 1] * (i - k) / (i - 1)
    return float(np.dot(weights, values))


def problem_metrics(outcomes: Sequence[float], k: int) -> dict[str, float]:
    """mean@k, pass@k and best@k of one problem's n >= k outcomes (float [n]: 1 success, 0
    failure; an outcome above 0.5 counts as a success for pass@k)."""
    values = np.asarray(outcomes, np.float64)
    successes = int(np.sum(values > 0.5))
    return {"mean@k": mean_at_k(values), "pass@k": pass_at_k(values.size, successes, k), "best@k": best_at_k(values, k)}
