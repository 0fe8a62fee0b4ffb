"""The sweep launcher (launch/sweep.py, experiments/sweep_runs.py) on real training runs of the tiny config:
the local back end stopped part way, resumed as Ray jobs on the Ray cluster of conftest.py,
then skipped as finished; and the SLURM array script (written and read back by bash, not
submitted)."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from experiments.sweep_runs import SweepError, load_sweep, run_command, run_state

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "experiments/configs/tiny.py")
TINY_SWEEP = os.path.join(REPO, "experiments/sweeps/tiny_group_size.py")


def _launch(*flags: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "launch.sweep", f"--config={TINY}", *flags, "--poll_s=0.2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def _write_sweep(path, body: str) -> str:
    path.write_text(f"def get_sweep():\n    return {body}\n")
    return str(path)


def test_compute_matched_runs_hold_the_budget_and_bad_sweeps_name_the_field(tmp_path):
    sweep = load_sweep(TINY_SWEEP, TINY, str(tmp_path))
    assert [r.name for r in sweep.runs] == ["group_size=2", "group_size=4"]
    assert [r.overrides["train.num_steps"] for r in sweep.runs] == [2, 1]
    assert {r.budget for r in sweep.runs} == {8}
    assert [r.workdir for r in sweep.runs] == [str(tmp_path / "group_size=2"), str(tmp_path / "group_size=4")]
    assert sweep.runs[0].task_tiers == {"click-button": 0, "focus-text": 1}
    argv = run_command(sweep, sweep.runs[1])
    assert "--config.rollout.group_size=4" in argv and "--config.train.num_steps=1" in argv and argv[-1] == "--resume"

    grid = load_sweep(
        _write_sweep(
            tmp_path / "g.py", "{'grid': {'rollout.group_size': (2, 4), 'optimizer.learning_rate': (1e-3, 1e-4)}}"
        ),
        TINY,
        str(tmp_path),
    )
    assert len(grid.runs) == 4 and grid.runs[1].swept == {"rollout.group_size": 2, "optimizer.learning_rate": 1e-4}

    with pytest.raises(SweepError, match=r"group_size=3.*budget 8 is not a multiple"):
        load_sweep(
            _write_sweep(
                tmp_path / "b.py",
                "{'runs': ({'rollout.group_size': 3},), 'compute_matched': {'adjust': 'train.num_steps', 'budget': 8}}",
            ),
            TINY,
        )
    with pytest.raises(SweepError, match=r"config.rollout.group_sise: no such config field"):
        load_sweep(_write_sweep(tmp_path / "u.py", "{'runs': ({'rollout.group_sise': 3},)}"), TINY)
    with pytest.raises(SweepError, match="exactly one of 'grid' and 'runs'"):
        load_sweep(_write_sweep(tmp_path / "n.py", "{'fixed': {}}"), TINY)


def test_sweep_stopped_part_way_resumes_on_ray_and_then_skips_finished_runs(tmp_path, ray_cluster):
    """Local back end stopped after the first run's first checkpoint; the same sweep launched
    as Ray jobs resumes that run and starts the other; launched again, it skips both."""
    sweep_dir = tmp_path / "sweep"
    first_run = sweep_dir / "group_size=2"
    launcher = _launch(f"--sweep={TINY_SWEEP}", f"--sweep_dir={sweep_dir}")
    deadline = time.time() + 240
    while not (first_run / "checkpoints" / "1").is_dir():
        assert launcher.poll() is None, launcher.stdout.read()
        assert time.time() < deadline, "no checkpoint after 240 s"
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)  # the launcher stops its runs' process groups
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 1 and "the same command resumes the sweep" in out
    sweep = load_sweep(TINY_SWEEP, TINY, str(sweep_dir))
    assert [run_state(r) for r in sweep.runs] == ["partial", "new"]

    resumed = _launch(
        f"--sweep={TINY_SWEEP}",
        f"--sweep_dir={sweep_dir}",
        "--backend=ray",
        "--parallel=2",
        f"--ray_address={ray_cluster['dashboard']}",
        env=ray_cluster["env"],
    )
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "group_size=2: resuming from its checkpoint" in out and "group_size=4: starting" in out
    assert out.count("submitted as Ray job") == 2
    log = (first_run / "run.log").read_text()
    assert "Ray job on" in log and "resumed" in log  # the Ray job wrote its log into the workdir
    assert [run_state(r) for r in sweep.runs] == ["done", "done"]
    steps = [json.loads(line)["step"] for line in (first_run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]  # the stopped run's records are not repeated

    with open(sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["group_size=2", "group_size=4"]
    assert [int(r["episodes"]) for r in rows] == [8, 8]  # the same rollout budget, spent
    assert [int(r["steps"]) for r in rows] == [2, 1]
    # Tier 0 holds click-button, tier 1 focus-text; every group is counted once.
    assert [int(r["groups_tier0"]) + int(r["groups_tier1"]) for r in rows] == [4, 2]
    assert (sweep_dir / "results.md").read_text().count("\n") == 4
    assert (sweep_dir / "comparison.png").stat().st_size > 0

    stamps = [os.path.getmtime(sweep_dir / name / "summary.json") for name in ("group_size=2", "group_size=4")]
    again = _launch(f"--sweep={TINY_SWEEP}", f"--sweep_dir={sweep_dir}", "--parallel=2")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert out.count("done, skipped") == 2
    assert stamps == [os.path.getmtime(sweep_dir / n / "summary.json") for n in ("group_size=2", "group_size=4")]


def test_slurm_backend_writes_an_array_script_of_the_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    launcher = _launch(
        f"--sweep={TINY_SWEEP}",
        f"--sweep_dir={sweep_dir}",
        "--backend=slurm",
        "--parallel=1",
        "--slurm=--partition=debug",
        "--slurm=--time=01:00:00",
    )
    out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, out
    script = sweep_dir / "slurm" / "sweep.sbatch"
    assert f"sbatch {script}" in out
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --array=0-1%1" in directives and "#SBATCH --partition=debug" in directives
    assert "#SBATCH --time=01:00:00" in directives
    # The array as bash reads it: entry i is run i's command, quoting intact.
    block = text[text.index("RUNS=(") : text.index("\n)\n") + 2]
    listed = subprocess.run(
        ["bash", "-c", f'{block}\nprintf "%s\\0" "${{RUNS[@]}}"'], capture_output=True, text=True, check=True
    ).stdout.split("\0")[:-1]
    sweep = load_sweep(TINY_SWEEP, TINY, str(sweep_dir))
    assert [shlex.split(entry) for entry in listed] == [run_command(sweep, r)[1:] for r in sweep.runs]
    # What array task 1 execs, with the cluster's Python in CUA_JAX_PYTHON ("echo" stands in for it).
    body = text[text.index("RUNS=(") :]
    ran = subprocess.run(
        ["bash", "-c", body],
        env={**os.environ, "CUA_JAX_PYTHON": "echo", "SLURM_ARRAY_TASK_ID": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ran.split() == run_command(sweep, sweep.runs[1])[1:]


def test_a_submission_before_the_clusters_job_agent_is_up_is_tried_again(monkeypatch):
    """Ray refuses jobs until a node's job agent has registered (a cluster just started, or one
    under load); the sweep submits again until AGENT_WAIT_S, and raises any other refusal."""
    from launch import sweep as sweep_launcher

    class RefusingClient:
        def __init__(self, refusals: int, message: str):
            self.refusals, self.message, self.calls = refusals, message, 0

        def submit_job(self, **job):
            self.calls += 1
            if self.calls <= self.refusals:
                raise RuntimeError(f"Request failed with status code 500: {self.message}")
            return f"job-{job['entrypoint']}"

    monkeypatch.setattr(sweep_launcher.time, "sleep", lambda s: None)
    waiting = RefusingClient(3, "No available agent to submit job, please try again later..")
    assert sweep_launcher._submit_job(waiting, entrypoint="run") == "job-run" and waiting.calls == 4
    other = RefusingClient(1, "Job with submission_id x already exists.")
    with pytest.raises(RuntimeError, match="already exists"):
        sweep_launcher._submit_job(other, entrypoint="run")
    monkeypatch.setattr(sweep_launcher, "AGENT_WAIT_S", -1.0)  # past the wait at once
    with pytest.raises(RuntimeError, match="No available agent"):
        sweep_launcher._submit_job(RefusingClient(1, "No available agent to submit job"), entrypoint="run")
