"""Interval statistics of held-out success rates: Wilson's interval of one rate, Newcombe's
square-and-add interval of a difference, for independent samples and paired by seed; and the
least-squares slope of a training curve with its Student-t interval."""

from __future__ import annotations

import math
from collections.abc import Sequence


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial success rate.

    Args: successes, trials (>= 0 ints, successes <= trials); confidence in (0, 1).
    Returns (low, high) in [0, 1]; (0, 1) when trials == 0.
    """
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"wilson_interval: need 0 <= successes <= trials, got {successes} / {trials}")
    if trials == 0:
        return 0.0, 1.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # The interval always holds p; clamping removes rounding at the ends (k = 0 or k = n).
    return min(max(0.0, centre - half), p), max(min(1.0, centre + half), p)


def difference_interval(
    successes_a: int, trials_a: int, successes_b: int, trials_b: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """The difference of two independent binomial success rates, p_b - p_a, with Newcombe's
    hybrid score interval (Newcombe 1998, method 10: built from each rate's Wilson interval).

    Returns (difference, low, high) in [-1, 1]. The interval excludes 0 when the two rates
    differ at the given confidence. Applied to before / after evaluations on the same seeds it
    ignores the pairing; `paired_difference_interval` uses it.
    """
    p_a = successes_a / trials_a if trials_a else 0.0
    p_b = successes_b / trials_b if trials_b else 0.0
    low_a, high_a = wilson_interval(successes_a, trials_a, confidence)
    low_b, high_b = wilson_interval(successes_b, trials_b, confidence)
    difference = p_b - p_a
    low = difference - math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2)
    high = difference + math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2)
    return difference, max(-1.0, low), min(1.0, high)


def paired_difference_interval(
    both: int, first_only: int, second_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """The difference of two success rates measured on the same units (before / after on the
    same held-out seeds), p_second - p_first, with Newcombe's square-and-add interval for
    paired data (Newcombe 1998, "Improved confidence intervals for the difference between
    binomial proportions based on paired data", method 10).

    The four counts are the 2x2 table of (first, second) outcomes per unit: both succeeded,
    only the first, only the second, neither. Each rate's Wilson interval is combined with the
    estimated correlation phi of the two outcomes (shrunk towards 0 by N/2 when positive, as in
    the method), so outcomes that agree across the pair narrow the interval.

    Returns (difference, low, high) in [-1, 1].
    """
    counts = (both, first_only, second_only, neither)
    if min(counts) < 0:
        raise ValueError(f"paired counts must be non-negative, got {counts}")
    n = sum(counts)
    if n == 0:
        return 0.0, -1.0, 1.0
    first, second = both + first_only, both + second_only
    p_first, p_second = first / n, second / n
    low_first, high_first = wilson_interval(first, n, confidence)
    low_second, high_second = wilson_interval(second, n, confidence)
    margins = first * (n - first) * second * (n - second)
    agreement = both * neither - first_only * second_only
    if margins == 0 or 0 <= agreement <= n / 2:
        phi = 0.0
    elif agreement > n / 2:
        phi = (agreement - n / 2) / math.sqrt(margins)
    else:
        phi = agreement / math.sqrt(margins)
    difference = p_second - p_first

    def half_width(down_second: float, up_first: float) -> float:
        return math.sqrt(max(down_second**2 + up_first**2 - 2 * phi * down_second * up_first, 0.0))

    low = difference - half_width(p_second - low_second, high_first - p_first)
    high = difference + half_width(high_second - p_second, p_first - low_first)
    return difference, max(-1.0, low), min(1.0, high)


def slope_interval(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The ordinary least-squares slope of y on x with its Student-t interval (n - 2 degrees
    of freedom): a training curve's trend, e.g. success per update against the update index.

    Args: x, y of equal length n >= 2, x not all equal; confidence in (0, 1).
    Returns (slope, low, high); with n = 2 the interval is (-inf, inf) (no residual left to
    estimate the noise), and it has zero width when the points lie on a line.
    """
    if len(x) != len(y):
        raise ValueError(f"slope_interval: x and y differ in length ({len(x)} vs {len(y)})")
    if len(x) < 2:
        raise ValueError(f"slope_interval: need at least 2 points, got {len(x)}")
    if not 0 < confidence < 1:
        raise ValueError(f"slope_interval: confidence must be in (0, 1), got {confidence}")
    n = len(x)
    mean_x, mean_y = math.fsum(x) / n, math.fsum(y) / n
    sxx = math.fsum((xi - mean_x) ** 2 for xi in x)
    if sxx == 0:
        raise ValueError("slope_interval: x takes a single value, so no slope is defined")
    slope = math.fsum((xi - mean_x) * (yi - mean_y) for xi, yi in zip(x, y)) / sxx
    if n == 2:
        return slope, -math.inf, math.inf
    intercept = mean_y - slope * mean_x
    residual = math.fsum((yi - intercept - slope * xi) ** 2 for xi, yi in zip(x, y))
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + confidence / 2, n - 2)) * math.sqrt(residual / (n - 2) / sxx)
    return slope, slope - half, slope + half
