"""Pictures of a run: learning curves from metrics.jsonl, written as PNG."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cua_jax.observe.metrics import read_metrics


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the up to window - 1 values before it."""
    if window < 1:
        raise ValueError(f"trailing_mean: window must be >= 1, got {window}")
    sums, out = [0.0], []
    for v in values:
        sums.append(sums[-1] + v)
    for i in range(1, len(values) + 1):
        start = max(0, i - window)
        out.append((sums[i] - sums[start]) / (i - start))
    return out


def smoothing_window(points: int) -> int:
    """The trailing window a noisy per-update curve is smoothed over: a tenth of its points, at
    least 3; 1 (no smoothing) below 6 points."""
    return 1 if points < 6 else max(3, round(points / 10))


def plot_curves(
    metrics_path: str, keys: Sequence[str], out_path: str, title: str = "", smooth: Sequence[str] = ()
) -> str:
    """Plots each metric in `keys` against step, one panel each; returns out_path. Metrics in
    `smooth` also get their trailing mean over `smoothing_window` points, for curves too noisy
    to read update by update.

    Metrics missing from every record are reported in their panel rather than skipped.
    """
    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.4 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        points = [(r["step"], r[key]) for r in records if key in r and not math.isnan(r[key])]
        if points:
            steps, values = zip(*points)
            window = smoothing_window(len(values)) if key in smooth else 1
            ax.plot(
                steps,
                values,
                marker="o",
                markersize=3,
                alpha=0.45 if window > 1 else 1.0,
                label="per update" if window > 1 else None,
            )
            if window > 1:
                ax.plot(steps, trailing_mean(values, window), linewidth=2, label=f"mean of the last {window}")
                ax.legend(loc="best", fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no values for {key}", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


# What a training run's learning curve shows, one panel each.
LEARNING_CURVE_KEYS = ("reward/mean", "success/rate", "groups/informative_fraction", "learner/loss", "learner/entropy")
# Per-update rates over one batch of fresh pages: noisy, so shown with their trailing mean too.
SMOOTHED_KEYS = ("reward/mean", "success/rate")


def plot_learning_curve(workdir: str, title: str = "") -> str:
    """<workdir>/learning_curve.png from <workdir>/metrics.jsonl (`LEARNING_CURVE_KEYS`)."""
    return plot_curves(
        os.path.join(workdir, "metrics.jsonl"),
        LEARNING_CURVE_KEYS,
        os.path.join(workdir, "learning_curve.png"),
        title=title,
        smooth=SMOOTHED_KEYS,
    )
