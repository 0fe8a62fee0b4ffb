import json
import math
import os

import numpy as np
import pytest

from cua_jax.observe.metrics import MetricWriter, read_metrics
from cua_jax.observe.plots import plot_curves, smoothing_window, trailing_mean


def test_jsonl_and_tensorboard_round_trip(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        writer.write(0, {"reward/mean": np.float32(0.25), "loss": 1.5})
        writer.write(1, {"reward/mean": 0.5, "loss": float("nan")})
    records = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["reward/mean"] == pytest.approx(0.25)
    assert math.isnan(records[1]["loss"]), "non-finite values are kept, not dropped"
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        assert json.loads(f.readlines()[1])["loss"] is None
    event_files = os.listdir(os.path.join(tmp_path, "tensorboard"))
    assert any(name.startswith("events.out.tfevents") for name in event_files)


def test_non_scalar_metric_is_refused(tmp_path):
    with MetricWriter(str(tmp_path), tensorboard=False) as writer:
        with pytest.raises(ValueError, match="scalars"):
            writer.write(0, {"bad": np.zeros(3)})


def test_malformed_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n')
    with pytest.raises(ValueError, match=":2:"):
        read_metrics(str(path))


def test_learning_curve_png(tmp_path):
    with MetricWriter(str(tmp_path), tensorboard=False) as writer:
        for step in range(5):
            writer.write(step, {"reward/mean": step / 4})
    out = plot_curves(str(tmp_path / "metrics.jsonl"), ["reward/mean", "absent"], str(tmp_path / "curve.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_noisy_curve_is_drawn_with_its_trailing_mean(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.random(40).tolist()
    window = smoothing_window(len(values))
    assert window == 4 and smoothing_window(5) == 1
    reference = [float(np.mean(values[max(0, i - window + 1) : i + 1])) for i in range(len(values))]
    np.testing.assert_allclose(trailing_mean(values, window), reference, atol=1e-12)
    with MetricWriter(str(tmp_path), tensorboard=False) as writer:
        for step, value in enumerate(values):
            writer.write(step, {"success/rate": value})
    out = plot_curves(
        str(tmp_path / "metrics.jsonl"), ["success/rate"], str(tmp_path / "curve.png"), smooth=["success/rate"]
    )
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
