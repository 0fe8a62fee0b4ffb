"""Async coordinated mode for real, killed and resumed (config.train.coordinated with
train.mode "async"): two processes with one CPU device each, started by launch/multihost.sh
(experiments.main through launch.multihost), each with its own rollout thread and buffer
collecting its share of every draw on real MiniWoB++ capsules with the tiny Qwen3-VL on
screenshots (each process's rows of a global micro-batch carry every process's images), train
with a checkpoint after every step. Both processes (and everything they started) are killed
with SIGKILL once the checkpoint of step 1 is committed, and launched again with --resume.

Across the two launches every group either process collected is trained exactly once: the
checkpoint's per-process states account for every group each process drew (trained before the
checkpoint, buffered, waiting for room, or still running), the resumed run trains every saved
and every unfinished group, and no episode id is trained twice; every step trains one group of
each process, within the staleness window of the global policy version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.launch.conftest import REPO, SCREENSHOT_POLICY_FLAGS, free_port, process_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEPS = 5
WINDOW = 8  # wider than any lag here: no group is dropped, so every group drawn must be trained
# One CPU device per process, the learner's rows split over the two (data 2): the sharded learner
# is the on-policy test's; what is new here is host-side, and a smaller mesh compiles faster.
FLAGS = [
    *SCREENSHOT_POLICY_FLAGS,
    "--config.mesh.data=2",
    "--config.mesh.fsdp=1",
    "--config.mesh.tensor=1",
    "--config.train.mode=async",
    f"--config.train.staleness_window={WINDOW}",
    "--config.learner.old_logprobs=rollout",
    f"--config.train.num_steps={STEPS}",
    "--config.train.checkpoint_every=1",
    # A warm start first: on process 0 alone, whose result every process then trains from
    # (the trainer refuses processes whose policies differ).
    "--config.warm_start.steps=2",
    "--config.warm_start.demos_per_task=1",
    "--config.warm_start.warmup_steps=1",
    "--config.env.include_dom_text=true",  # what the oracle reads
    "--config.rollout.max_new_tokens=64",  # room for the oracle's replies
]


def _launch(workdir, logs, resume: bool) -> list[subprocess.Popen]:
    coordinator = f"127.0.0.1:{free_port()}"
    processes = []
    for process_id in range(2):
        env = process_env(1, CUA_PROCESS_ID=str(process_id), CUA_NUM_PROCESSES="2", CUA_COORDINATOR_ADDRESS=coordinator)
        with open(logs[process_id], "w") as log:
            processes.append(
                subprocess.Popen(
                    ["bash", "launch/multihost.sh", *FLAGS, f"--config.workdir={workdir}"]
                    + (["--resume"] if resume else []),
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a session of its own: killed whole, browsers included
                )
            )
    return processes


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_async_coordinated_run_killed_and_resumed_trains_every_episode_once(tmp_path):
    from cua_jax.train.checkpoint import checkpoint_steps, read_process_state

    workdir = tmp_path / "run"
    logs = [[tmp_path / f"launch{n}_process{p}.log" for p in range(2)] for n in range(2)]
    start = time.perf_counter()
    first = _launch(workdir, logs[0], resume=False)
    try:
        while not (workdir / "checkpoints" / "1").is_dir():
            for process, log in zip(first, logs[0]):
                assert process.poll() is None, log.read_text()[-6000:]
            assert time.perf_counter() - start < 600, "no checkpoint of step 1 within 600 s"
            time.sleep(0.2)
    finally:
        _kill(first)
    killed_s = time.perf_counter() - start
    before = _records(workdir / "episodes.jsonl")
    saved_step = checkpoint_steps(workdir)[-1]
    # The resumed run trains what each process saved within the steps left: at most a full
    # buffer of 2 groups and 1 more (waiting for room, or being collected) per process.
    assert 1 <= saved_step <= STEPS - 3, saved_step
    saved = [read_process_state(workdir, saved_step, p, 2).rollouts for p in range(2)]

    second = _launch(workdir, logs[1], resume=True)
    try:
        for process, log in zip(second, logs[1]):
            process.wait(timeout=600)
            assert process.returncode == 0, log.read_text()[-6000:]
            assert f"at step {saved_step}" in log.read_text()  # "resumed <workdir> at step S"
    finally:
        _kill(second)
    print(f"async coordinated run: killed after {killed_s:.0f} s, {time.perf_counter() - start:.0f} s in all")

    # The warm start ran once, on process 0, before the first launch's first step.
    warm = json.loads((workdir / "warm_start.json").read_text())
    assert len(warm["losses"]) == 2 and warm["demonstrations"] >= 1
    logged = [r for r in _records(workdir / "metrics.jsonl") if "warm_start/items" in r]
    assert len(logged) == 1 and logged[0]["step"] == 0 and logged[0]["warm_start/items"] > 0

    after = _records(workdir / "episodes.jsonl")
    # The steps before the checkpoint stay as the first launch logged them; the rest ran again.
    assert [r for r in after if r["step"] < saved_step] == [r for r in before if r["step"] < saved_step]
    assert sorted({r["step"] for r in after}) == list(range(STEPS))
    ids = [r["episode_id"] for r in after]
    assert len(ids) == len(set(ids)) == 4 * STEPS  # no episode trained twice
    for step in range(STEPS):  # each step: one whole group (2 episodes) from each process
        groups = sorted(r["group_id"] for r in after if r["step"] == step)
        assert len(groups) == 4 and groups[0] == groups[1] and groups[2] == groups[3]
        assert {g % 2 for g in groups} == {0, 1}  # position g mod 2 of its draw: process g mod 2's
    groups_step = {r["group_id"]: r["step"] for r in after}
    assert len(groups_step) == 2 * STEPS  # a group's episodes train in one step

    # Every group a process drew before the checkpoint is accounted for there, once: trained,
    # buffered, waiting for room, or being collected; the resumed run trained all the rest.
    for p, state in enumerate(saved):
        drawn = {draw * 2 + p for draw in range(state["next_draw"])}
        trained = {r["group_id"] for r in before if r["step"] < saved_step and r["group_id"] % 2 == p}
        kept = [g.group_id for g in state["buffer"]] + [g.group_id for gs in state["waiting"].values() for g in gs]
        running = [draw * 2 + p for draw in state["unfinished_draws"]]
        running += [group_id for _, (_, _, group_id) in state["unfinished_requests"]]  # streamed groups
        assert sorted([*trained, *kept, *running]) == sorted(drawn), p
        assert all(saved_step <= groups_step[g] for g in kept + running), p
    assert any(state["buffer"] or state["waiting"] or state["unfinished_draws"] for state in saved)

    # One global policy version: every episode trains within the window of the step's version,
    # and the rollout threads ran ahead of the learner (some trained a version late).
    lags = [r["step"] - r["policy_version"] for r in after]
    assert min(lags) >= 0 and max(lags) <= WINDOW and max(lags) >= 1
    metrics = [m for m in _records(workdir / "metrics.jsonl") if "policy/version" in m]  # not the trend's
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert all(m["policy/version"] == m["step"] + 1 and m["episodes/total"] == 4 for m in metrics)
    assert all(m["buffer/dropped_stale_groups"] == 0 for m in metrics)
