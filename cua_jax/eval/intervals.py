"""Interval statistics of held-out success rates: Wilson's interval of one rate, Newcombe's
square-and-add interval of a difference, for independent samples and paired by seed."""

from __future__ import annotations

import math

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


def difference_interval(successes_a: int, trials_a: int, successes_b: int, trials_b: int,
                        confidence: float = 0.95) -> tuple[float, float, float]:
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



def paired_difference_interval(both: int, first_only: int, second_only: int, neither: int,
                               confidence: float = 0.95) -> tuple[float, float, float]:
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
