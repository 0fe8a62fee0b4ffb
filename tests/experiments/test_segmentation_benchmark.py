"""The segmentation benchmark at tiny sizes: its token table, and the learner-time table beside it."""

from __future__ import annotations

import numpy as np

from experiments.benchmarks import segmentation


def test_no_learner_prints_the_token_table_only(capsys):
    segmentation.main(["--turns", "12", "--no-learner"])
    out = capsys.readouterr().out
    assert "ratio step-wise/sliding-window (T=12, K=5)" in out
    assert "learner" not in out
    # T = 12 at K = Delta = 5 drops screenshots, each leaving its placeholder text.
    line = next(line for line in out.splitlines() if line.startswith("placeholder text"))
    assert int(line.split(": ")[1].split()[0]) > 0


def test_learner_times_both_segmenters_on_the_same_episodes(capsys):
    segmentation.main(["--turns", "5", "--learner-turns", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "learner s" in out
    row = next(line for line in out.splitlines() if line.startswith("  2 |"))
    cells = [cell.split() for cell in row.split("|")]
    sliding, step, ratios = cells[1], cells[2], cells[3]
    # items, tokens, attn, padded, learner seconds per segmenter; four step/sliding ratios
    assert len(sliding) == len(step) == 5 and len(ratios) == 4
    assert int(sliding[0]) == 1 and int(step[0]) == 2  # one item under K=D=5, one per turn step-wise
    assert float(sliding[4]) > 0 and float(step[4]) > 0
    assert np.isclose(float(ratios[3]), float(step[4]) / float(sliding[4]), rtol=0.05, atol=0.01)
    assert "learner-time ratio step-wise/sliding-window (T=2, K=5)" in out
