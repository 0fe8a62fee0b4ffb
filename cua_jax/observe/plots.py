"""Pictures of a run: learning curves from metrics.jsonl, written as PNG."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cua_jax.observe.metrics import read_metrics  # noqa: E402


def plot_curves(metrics_path: str, keys: Sequence[str], out_path: str, title: str = "") -> str:
    """Plots each metric in `keys` against step, one panel each; returns out_path.

    Metrics missing from every record are reported in their panel rather than skipped.
    """
    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.4 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        points = [(r["step"], r[key]) for r in records if key in r and not math.isnan(r[key])]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o", markersize=3)
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


def plot_learning_curve(workdir: str, title: str = "") -> str:
    """<workdir>/learning_curve.png from <workdir>/metrics.jsonl (`LEARNING_CURVE_KEYS`)."""
    return plot_curves(os.path.join(workdir, "metrics.jsonl"), LEARNING_CURVE_KEYS,
                       os.path.join(workdir, "learning_curve.png"), title=title)

