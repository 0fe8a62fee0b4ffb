"""The `webapp` kind reached as a user reaches it: `python -m experiments.main` with
experiments/configs/webapp.py (MiniWoB tasks in the same pool, groups started by fork), and
`python -m experiments.evaluate --suite=<the task folder>` through the evaluation harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.entrypoint import ROOT, run_main

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_trainer_update_on_webapp_and_miniwob_tasks_in_one_pool(tmp_path):
    workdir = tmp_path / "run"
    result = run_main(
        "--config=experiments/configs/webapp.py",
        "--config.env.tasks=(('click-button', 0),)",
        "--config.env.webapp.tasks=('trac-001',)",
        "--config.train.num_steps=1",
        workdir=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 1
    episodes = [json.loads(line) for line in (workdir / "episodes.jsonl").read_text().splitlines()]
    assert {e["domain"] for e in episodes} == {"webapp", "miniwob"} and len(episodes) == 4
    assert not any(e.get("fault") for e in episodes)
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["webapp/branches"] >= 2  # one capsule reset, the other forked from it


def test_the_harness_evaluates_the_webapp_suite(tmp_path):
    out = tmp_path / "eval"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.evaluate",
            "--policy=random",
            "--suite=cua_jax/tasks/suites/webapp/trac",
            "--tasks=trac-002,trac-010",
            "--seeds=1",
            f"--out={out}",
            "--config.eval.max_turns=2",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["evaluations"] == ["turns_2_temperature_1"]
    results = (out / "turns_2_temperature_1" / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in results]
    assert sorted(r["task"] for r in records) == ["trac-002", "trac-010"]
    assert not any(r["quarantine_reason"] for r in records)
