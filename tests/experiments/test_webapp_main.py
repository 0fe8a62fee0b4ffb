"""The `webapp` kind reached as a user reaches it: `python -m experiments.main` with
experiments/configs/webapp.py (MiniWoB tasks in the same pool, groups started by fork), and
`python -m experiments.evaluate --suite=<the task folder>` through the evaluation harness."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from cua_jax.envs.webapp.branches import overlay_mounts, remove_branch
from tests.support.entrypoint import ROOT, run_main

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_trainer_update_on_webapp_and_miniwob_tasks_in_one_pool(tmp_path):
    # Overlay branches where they mount (the default, "auto", takes a full copy on ext4; the
    # harness test below runs that): the config field reaches the runtime of every worker.
    # A short folder: the shared server's control socket lives in it (AF_UNIX paths are short).
    branches = pathlib.Path(tempfile.mkdtemp(prefix="wa-"))
    branch_by = "overlay" if overlay_mounts(branches) is None else "auto"
    workdir = tmp_path / "run"
    result = run_main(
        "--config=experiments/configs/webapp.py",
        "--config.env.tasks=(('click-button', 0),)",
        "--config.env.webapp.tasks=('trac-001',)",
        f"--config.env.webapp.branch_by={branch_by}",
        f"--config.env.webapp.workdir={branches}",
        "--config.train.num_steps=1",
        workdir=workdir,
    )
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        with open("/proc/self/mountinfo") as table:  # the run's overlays are gone with it
            assert not any(line.split()[4].startswith(str(branches)) for line in table)
    finally:
        remove_branch(branches)
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 1
    episodes = [json.loads(line) for line in (workdir / "episodes.jsonl").read_text().splitlines()]
    assert {e["domain"] for e in episodes} == {"webapp", "miniwob"} and len(episodes) == 4
    assert not any(e.get("fault") for e in episodes)
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["webapp/branches"] >= 2  # one capsule reset, the other forked from it


def _evaluate(policy: str, out, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.evaluate",
            f"--policy={policy}",
            "--suite=cua_jax/tasks/suites/webapp/trac",
            "--tasks=trac-002,trac-033",
            "--seeds=1",
            f"--out={out}",
            "--config.eval.max_turns=8",
            "--config.env.action_space=both",
            *flags,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _records(out) -> dict[str, dict]:
    lines = (out / "turns_8_temperature_1" / "results.jsonl").read_text().splitlines()
    return {record["task"]: record for record in map(json.loads, lines)}


def test_the_harness_evaluates_the_webapp_suite_with_the_random_policy_and_the_oracle(tmp_path):
    random = _evaluate("random", tmp_path / "random")
    assert random.returncode == 0, random.stderr[-3000:]
    records = _records(tmp_path / "random")
    assert sorted(records) == ["trac-002", "trac-033"]
    assert not any(r["quarantine_reason"] for r in records.values())
    # The oracle replays each task's recorded solution (validation.json) through the agent loop.
    # Without the DOM text: a Trac page's is about 6k tokens, and the replay does not read it.
    oracle = _evaluate("oracle", tmp_path / "oracle", "--config.env.include_dom_text=False")
    assert oracle.returncode == 0, oracle.stderr[-3000:]
    assert {task: r["success"] for task, r in _records(tmp_path / "oracle").items()} == {
        "trac-002": True,
        "trac-033": True,
    }
