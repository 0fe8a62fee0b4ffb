"""The entrypoint's command line: a bad config field or job is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_main(*args, workdir):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "experiments.main", *args, f"--workdir={workdir}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_malformed_field_stops_the_run_naming_it(tmp_path):
    result = run_main("--config=experiments/configs/canopy.py", "--config.loss.clip_eps_low=1.5", workdir=tmp_path / "run")
    assert result.returncode != 0
    assert "config.loss.clip_eps_low" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the trainer started


def test_an_unknown_job_is_named(tmp_path):
    result = run_main("--config=experiments/configs/default.py", "--config.job=nope", workdir=tmp_path)
    assert result.returncode != 0 and "config.job='nope' is not one of" in result.stderr
