"""Launches a config sweep: python -m launch.sweep --config=CONFIG --sweep=SWEEP_FILE [flags]

    python -m launch.sweep --config=experiments/configs/default.py \
        --sweep=experiments/sweeps/canopy_group_size.py --backend=local --parallel=1

Back ends (--backend):
  local   runs each training command here as a subprocess, --parallel at once
  ray     submits each as a Ray job to the cluster at --ray_address (its dashboard, e.g.
          http://127.0.0.1:8265); the repository and the sweep directory must be at the same
          paths on the cluster's nodes (a shared file system)
  slurm   writes <sweep dir>/slurm/sweep.sbatch, a job array of the unfinished runs, and prints
          the sbatch command; nothing is submitted
  results only (re)builds the table and plots from the runs' records

Every run has its own workdir, <sweep dir>/<run name>; --config.x=y overrides apply to every
run. Launching a sweep again skips its finished runs and resumes its checkpointed ones
(experiments/sweep_runs.py). After the local and ray back ends, <sweep dir>/results.csv, results.md and
comparison.png hold the table and the plots.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.sweep_runs import (
    RUN_LOG,
    Sweep,
    SweepError,
    SweepRun,
    load_sweep,
    prepare_run,
    run_command,
    run_state,
    shell_command,
    write_manifest,
    write_results,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIG = config_flags.DEFINE_config_file("config", None, "Base experiment config file.", lock_config=False)
_SWEEP = flags.DEFINE_string("sweep", None, "Sweep file (experiments/sweeps/NAME.py).")
_DIR = flags.DEFINE_string("sweep_dir", "", "Sweep directory (default runs/sweeps/<sweep name>).")
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "ray", "slurm", "results"], "Where the runs go.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once (local and ray); given with slurm, the array's % limit.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", "http://127.0.0.1:8265", "Ray dashboard address (ray back end).")
_RAY_CPUS = flags.DEFINE_float("ray_job_cpus", 1.0, "CPUs each Ray job's entrypoint reserves.")
_RAY_RESOURCES = flags.DEFINE_multi_string(
    "ray_job_resource", [], "NAME=AMOUNT custom resources each Ray job reserves."
)
_SLURM = flags.DEFINE_multi_string("slurm", [], "An #SBATCH option for the array script, e.g. --slurm=--partition=gpu.")
_POLL = flags.DEFINE_float("poll_s", 1.0, "Seconds between checks on running runs.")


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise _Stop()


def _pending(sweep: Sweep) -> list[SweepRun]:
    pending = []
    for run in sweep.runs:
        state = prepare_run(run)
        if state == "done":
            logging.info("%s: done, skipped", run.name)
        else:
            logging.info("%s: %s", run.name, "resuming from its checkpoint" if state == "partial" else "starting")
            pending.append(run)
    return pending


def run_local(sweep: Sweep, parallel: int, poll_s: float) -> dict[str, int]:
    """Runs the unfinished runs as subprocesses, `parallel` at once; their return codes by name.
    On SIGTERM / SIGINT every running run's process group is stopped (its checkpoints stay)."""
    queue = _pending(sweep)
    running: dict[str, tuple[subprocess.Popen, object]] = {}
    codes: dict[str, int] = {}
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        while queue or running:
            while queue and len(running) < parallel:
                run = queue.pop(0)
                log = open(os.path.join(run.workdir, RUN_LOG), "a")
                process = subprocess.Popen(
                    run_command(sweep, run), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
                running[run.name] = (process, log)
            time.sleep(poll_s)
            for name, (process, log) in list(running.items()):
                if process.poll() is not None:
                    log.close()
                    codes[name] = process.returncode
                    del running[name]
                    logging.info("%s: exit %d", name, process.returncode)
    except (_Stop, KeyboardInterrupt):
        for process, _log in running.values():
            os.killpg(process.pid, signal.SIGTERM)
        for process, _log in running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            log.close()
        logging.warning("stopped; the same command resumes the sweep")
        raise SystemExit(1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return codes


# A cluster just started takes a while to register its nodes' job agents; until one is up, Ray
# refuses submissions with this message ("please try again later").
_NO_AGENT_YET = "No available agent to submit job"
AGENT_WAIT_S = 120.0


def _submit_job(client, **job) -> str:
    """client.submit_job(**job), tried again for up to AGENT_WAIT_S while the cluster has no job
    agent up yet; any other refusal, or one past that wait, is raised."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as error:
            if _NO_AGENT_YET not in str(error) or time.monotonic() > deadline:
                raise
            logging.info("no Ray job agent is up yet; submitting again in 2 s")
            time.sleep(2.0)


def run_ray(
    sweep: Sweep, address: str, parallel: int, poll_s: float, cpus: float, resources: dict[str, float]
) -> dict[str, int]:
    """Submits the unfinished runs as Ray jobs, `parallel` at a time; each job writes its log into
    its run's workdir. Returns 0 / 1 per run (succeeded / not)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    queue = _pending(sweep)
    running: dict[str, str] = {}
    codes: dict[str, int] = {}
    finished = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
    try:
        while queue or running:
            while queue and len(running) < parallel:
                run = queue.pop(0)
                # The run writes its log straight into its workdir (a file system the nodes share,
                # as the workdirs must be): Ray's own log API needs each node's dashboard agent.
                log = shlex.quote(os.path.join(run.workdir, RUN_LOG))
                entrypoint = (
                    f"cd {shlex.quote(REPO_ROOT)} && echo Ray job on $(hostname) >> {log} && "
                    f"exec {shell_command(run_command(sweep, run))} >> {log} 2>&1"
                )
                job_id = _submit_job(
                    client,
                    entrypoint=entrypoint,
                    submission_id=f"{sweep.name}-{run.name}-{time.time_ns()}".replace(",", "-"),
                    entrypoint_num_cpus=cpus,
                    entrypoint_resources=resources or None,
                    metadata={"sweep": sweep.name, "run": run.name},
                )
                running[run.name] = job_id
                logging.info("%s: submitted as Ray job %s", run.name, job_id)
            time.sleep(poll_s)
            for name, job_id in list(running.items()):
                status = client.get_job_status(job_id)
                if status in finished:
                    codes[name] = 0 if status == JobStatus.SUCCEEDED else 1
                    del running[name]
                    logging.info("%s: Ray job %s %s", name, job_id, status)
    except KeyboardInterrupt:
        for job_id in running.values():
            client.stop_job(job_id)
        raise
    return codes


def write_slurm(sweep: Sweep, parallel: int, options: list[str]) -> str | None:
    """<sweep dir>/slurm/sweep.sbatch: a job array over the unfinished runs (array index ->
    run), each array task one training command in the repository. None when all are done."""
    pending = _pending(sweep)
    if not pending:
        return None
    folder = os.path.join(sweep.directory, "slurm")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "sweep.sbatch")
    limit = f"%{parallel}" if parallel > 0 else ""  # at most this many array tasks at once
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sweep.name}",
        f"#SBATCH --array=0-{len(pending) - 1}{limit}",
        f"#SBATCH --output={folder}/%A_%a.out",
    ]
    lines += [f"#SBATCH {option}" for option in options]
    # The node's own Python: the project venv (launch/setup.sh), unless CUA_JAX_PYTHON names one.
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(REPO_ROOT)}",
        'if [[ -z "${CUA_JAX_PYTHON:-}" ]]; then source launch/setup.sh; fi',
        "RUNS=(",
    ]
    lines += [f"  {shlex.quote(shell_command(run_command(sweep, run)[1:]))}  # {run.name}" for run in pending]
    lines += [")", r'eval "exec \"\$CUA_JAX_PYTHON\" ${RUNS[$SLURM_ARRAY_TASK_ID]}"', ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    os.chmod(path, 0o755)
    return path


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    if not _SWEEP.value or _CONFIG.value is None:
        raise app.UsageError("--config and --sweep are required")
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    try:
        sweep = load_sweep(_SWEEP.value, config_flags.get_config_filename(flags.FLAGS["config"]), _DIR.value, overrides)
    except SweepError as error:
        raise app.UsageError(str(error)) from error
    write_manifest(sweep)
    for run in sweep.runs:
        logging.info("%s: %s (budget %d episodes) -> %s", run.name, run_state(run), run.budget, run.workdir)
    codes: dict[str, int] = {}
    if _BACKEND.value == "slurm":
        path = write_slurm(sweep, _PARALLEL.value if flags.FLAGS["parallel"].present else 0, _SLURM.value)
        print(f"sbatch {path}" if path else f"{sweep.name}: every run is done")
        return
    if _BACKEND.value == "local":
        codes = run_local(sweep, max(1, _PARALLEL.value), _POLL.value)
    elif _BACKEND.value == "ray":
        resources = {}
        for item in _RAY_RESOURCES.value:
            name, _, amount = item.partition("=")
            resources[name] = float(amount)
        codes = run_ray(sweep, _RAY_ADDRESS.value, max(1, _PARALLEL.value), _POLL.value, _RAY_CPUS.value, resources)
    paths = write_results(sweep.directory)
    print(f"results: {paths['markdown']} {paths['csv']} {paths['plot']}")
    failed = sorted(name for name, code in codes.items() if code != 0)
    if failed:
        logging.error("failed runs (logs in their workdirs' %s): %s", RUN_LOG, failed)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
