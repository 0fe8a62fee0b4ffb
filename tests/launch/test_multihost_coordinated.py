"""Coordinated collection for real (config.train.coordinated): two processes with 4 CPU devices
each, joined through jax.distributed (gloo) by launch/multihost.sh, each collecting its share of
every step's groups on real MiniWoB++ capsules with the tiny text Qwen3, against one process with
8 devices collecting everything, both on a data 2 x fsdp 2 x tensor 2 mesh, for 3 on-policy
updates (tests/launch/coordinated_step.py does the work and writes what each process collected,
trained and logged).

Both runs are coordinated runs: the one-process run is the reference (the same trainer with one
process collecting every group). A random policy never finishes a task, so every episode ends
NO_VERDICT and the advantages are 0; the entropy bonus (tiny.py) keeps the gradient non-zero.

The relaunched processes each serve their groups from JAX samplers in Ray actors on a local Ray
of their own (rollout.worker_backend ray), and evaluate the policy after the last update
together, each on its share of the held-out seeds.

The two-process run is also the fault test: process 1 kills itself (SIGKILL) right after the
checkpoint of its 2nd update, process 0 must then stop within the heartbeat timeout set here with
one error naming process 1 and its host (exit status 75, cua_jax/models/liveness.py), and both
relaunched with --resume (the same workdir) finish update 3 from that checkpoint. The
comparisons with the one-process run then cover the resumed run: its 3rd update's groups, loss
and parameters, every episode trained exactly once over both launches, the records of process 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.launch.conftest import REPO, TEXT_POLICY_FLAGS, free_port, process_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEP = "tests/launch/coordinated_step.py"
FLAGS = [
    *TEXT_POLICY_FLAGS,
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=2",
    # A checkpoint after the 2nd update (and the last): the one the killed run resumes from.
    "--config.train.checkpoint_every=2",
    "--config.mesh.heartbeat_timeout_s=10",
    # The held-out evaluation after the last update: 3 seeds of each task, split 2 + 1 over
    # the two processes.
    "--config.eval.enabled=true",
    "--config.eval.num_seeds=3",
    "--config.eval.max_turns=2",
    # Training traces of every step: 3 of its 4 episodes, from both processes' groups.
    "--config.train.trace_every=1",
    "--config.eval.num_traces=3",
]
# The relaunched processes serve their groups from JAX samplers in Ray actors, each process on a
# local Ray of its own (the first launch and the reference: in-process samplers).
RAY_WORKERS = "--config.rollout.worker_backend=ray"
STEPS = 3  # tiny.py's train.num_steps
HEARTBEAT_TIMEOUT_S = 10
DIE_AFTER = 2  # process 1 dies right after the checkpoint of this many updates
PROCESS_LOST_EXIT = 75


def _start(command: list[str], env: dict[str, str], log) -> subprocess.Popen:
    """A process in a session of its own (so that what it leaves behind, its browser, is stopped
    with it), its output to `log` (closed by `_stop`)."""
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    process.log = log
    return process


def _wait(processes: dict[str, subprocess.Popen], timeout: float) -> dict[str, float]:
    """Waits for every process to exit; each one's exit time (time.time())."""
    deadline, ended = time.monotonic() + timeout, {}
    while len(ended) < len(processes):
        assert time.monotonic() < deadline, f"still running after {timeout} s: {sorted(set(processes) - set(ended))}"
        for name, process in processes.items():
            if name not in ended and process.poll() is not None:
                ended[name] = time.time()
        time.sleep(0.2)
    return ended


def _stop(processes) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # its session: the process and its browser
        except ProcessLookupError:
            pass
        process.log.close()


def _two_processes(double, logs, name: str, *extra: str) -> dict[str, subprocess.Popen]:
    coordinator = f"127.0.0.1:{free_port()}"
    processes = {}
    for process_id in range(2):
        env = process_env(
            4,
            CUA_PROCESS_ID=str(process_id),
            CUA_NUM_PROCESSES="2",
            CUA_COORDINATOR_ADDRESS=coordinator,
            CUA_MULTIHOST_PROGRAM=STEP,
        )
        log = open(logs / f"{name}_{process_id}.log", "w")
        command = ["bash", "launch/multihost.sh", *FLAGS, f"--config.workdir={double / 'run'}", f"--out={double}"]
        processes[f"{name}_{process_id}"] = _start([*command, *extra], env, log)
    return processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(single-process output dir, two-process output dir, reference result, the two processes'
    results, the fault: what the killed launch did). The one-process run goes side by side with
    the two-process run's first launch (process 1 killed after update 2), then the two processes
    are relaunched with --resume."""
    single, double = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("double")
    logs = tmp_path_factory.mktemp("logs")
    start = time.perf_counter()
    processes = {
        "single": _start(
            [sys.executable, STEP, *FLAGS, f"--config.workdir={single / 'run'}", f"--out={single}"],
            process_env(8),
            open(logs / "single.log", "w"),
        )
    }
    resumed = {}
    try:
        processes |= _two_processes(double, logs, "first", "--die_process=1", f"--die_after_step={DIE_AFTER}")
        ended = _wait(processes, 900)
        first_s = time.perf_counter() - start
        out = {name: (logs / f"{name}.log").read_text() for name in processes}
        assert processes["single"].returncode == 0, out["single"][-6000:]
        assert processes["first_1"].returncode == -signal.SIGKILL, out["first_1"][-6000:]
        died = json.loads((double / "died_1.json").read_text())
        fault = {
            "died": died,
            "survivor_rc": processes["first_0"].returncode,
            "survivor_out": out["first_0"],
            "survivor_after_s": ended["first_0"] - died["time"],
        }
        resumed = _two_processes(double, logs, "resumed", "--resume", RAY_WORKERS)
        _wait(resumed, 600)
        for name, process in resumed.items():
            assert process.returncode == 0, (logs / f"{name}.log").read_text()[-6000:]
    finally:
        _stop([*processes.values(), *resumed.values()])
    print(
        f"coordinated runs: {time.perf_counter() - start:.0f} s (first launch and the one-process run "
        f"{first_s:.0f} s; process 0 stopped {fault['survivor_after_s']:.1f} s after process 1 died)"
    )
    reference = json.loads((single / "result_0.json").read_text())
    results = [json.loads((double / f"result_{p}.json").read_text()) for p in range(2)]
    return single, double, reference, results, fault


def test_a_dead_process_stops_the_others_with_an_error_naming_it(runs):
    """Process 1 killed after its 2nd update's checkpoint: process 0 does not hang in the next
    step's collectives; within the heartbeat timeout (plus a beat interval and this busy
    machine's scheduling) it stops with exit status 75 and one error naming process 1 and its
    host, and no traceback (its main thread, whose collective failed, waits for the verdict)."""
    *_, fault = runs
    assert fault["died"]["step"] == DIE_AFTER
    out = fault["survivor_out"]
    assert fault["survivor_rc"] == PROCESS_LOST_EXIT, out[-6000:]
    error = f"process 1 of 2 (host {socket.gethostname()}) stopped sending heartbeats"
    assert error in out, out[-6000:]
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert last.startswith(f"ERROR (cua_jax multi-host): {error}"), last
    assert "relaunch every process with --resume" in last
    assert "Traceback" not in out, out[-6000:]
    assert HEARTBEAT_TIMEOUT_S <= fault["survivor_after_s"] + 1 < HEARTBEAT_TIMEOUT_S + 20, fault["survivor_after_s"]


def test_the_relaunched_processes_resume_from_the_checkpoint_alike(runs):
    """Both relaunched processes restored the checkpoint of the 2nd update (Orbax, written by
    both): the same step, policy version and sampler state, the state both held after update 2
    in the killed launch, and the one-process run's after its update 2; update 3 ran in the
    resumed launch."""
    _, double, reference, results, _ = runs
    restored = [json.loads((double / f"restored_{p}.json").read_text()) for p in range(2)]
    for p, state in enumerate(restored):
        assert (state["step"], state["version"]) == (DIE_AFTER, DIE_AFTER)
        assert state["sampler"] == results[p]["steps"][DIE_AFTER - 1]["sampler"]
    assert restored[0]["sampler"] == restored[1]["sampler"]
    expected = dict(reference["steps"][DIE_AFTER - 1]["sampler"])
    got = dict(restored[0]["sampler"])
    np.testing.assert_allclose(_rates(got.pop("pass_rate")), _rates(expected.pop("pass_rate")), rtol=1e-6)
    got.pop("digest"), expected.pop("digest")  # the reference's replay cache holds full episodes
    assert got == expected
    for result in results:
        assert [s["launch"] for s in result["steps"]] == ["first"] * DIE_AFTER + ["resumed"] * (STEPS - DIE_AFTER)


def _rates(rates):
    return np.asarray(rates, float)  # None (no outcome yet) -> nan, which assert_allclose matches


def test_every_process_holds_the_same_sampler_state_after_every_step(runs):
    _, _, reference, results, _ = runs
    for step in range(STEPS):
        states = [r["steps"][step]["sampler"] for r in results]
        assert states[0] == states[1], step
        expected = reference["steps"][step]["sampler"]
        for key in ("step", "next_group_id", "attempts", "successes", "active"):
            assert states[0][key] == expected[key], (step, key)
        np.testing.assert_allclose(_rates(states[0]["pass_rate"]), _rates(expected["pass_rate"]), rtol=1e-6)


def _episodes(result, step):
    return {e["episode_id"]: e for e in result["steps"][step]["episodes"]}


def test_coordinated_processes_collect_exactly_the_groups_of_one_process(runs):
    _, _, reference, results, _ = runs
    assert reference["devices"] == [8, 8, 1]
    assert [r["devices"] for r in results] == [[8, 4, 2], [8, 4, 2]]
    for step in range(STEPS):
        expected = _episodes(reference, step)
        shares = [_episodes(r, step) for r in results]
        assert not set(shares[0]) & set(shares[1])  # each group runs on one process
        got = shares[0] | shares[1]
        assert sorted(got) == sorted(expected) and len(expected) == 4
        for episode_id, episode in expected.items():
            other = got[episode_id]
            for key in ("group_id", "task_id", "status", "reward", "tokens", "items"):
                assert other[key] == episode[key], (step, episode_id, key)
            # The engines batch other requests on each side: logprobs agree to float rounding.
            np.testing.assert_allclose(other["logprobs"], episode["logprobs"], atol=1e-5)
        # Whole groups, dealt round robin (equal expected costs): group g on process g mod 2.
        for p, share in enumerate(shares):
            assert {e["group_id"] % 2 for e in share.values()} == {p}
            assert len(share) == 2
        # Every process knows every episode of the step, in draw order.
        assert results[0]["steps"][step]["all_episode_ids"] == reference["steps"][step]["all_episode_ids"]
        assert results[1]["steps"][step]["all_episode_ids"] == reference["steps"][step]["all_episode_ids"]


def test_coordinated_updates_equal_the_one_process_updates(runs):
    """Loss and gradient norm to float32 rounding (the cross-process all-reduce adds in another
    order); parameters to 1e-5: Adam divides each coordinate's step by its gradient's scale, so on
    coordinates whose gradient is near 0 a rounding-level difference in the gradient moves the
    step by a small fraction of the learning rate (1e-3), and it adds up over the updates."""
    single, double, reference, results, _ = runs
    for step in range(STEPS):
        expected = reference["steps"][step]["metrics"]
        for result in results:
            metrics = result["steps"][step]["metrics"]
            for key in ("learner/loss", "learner/grad_norm", "learner/entropy"):
                np.testing.assert_allclose(metrics[key], expected[key], rtol=2e-5, err_msg=key)
            for key in ("learner/num_tokens", "learner/forward_tokens", "episodes/trained", "batch/items"):
                assert metrics[key] == expected[key], key
            assert result["steps"][step]["engine_version"] == step + 1  # each process's engine synced
        # A group's items share one prefix row (learner.share_prefix, the default): fewer tokens run.
        item_tokens = sum(len(ids) for e in reference["steps"][step]["episodes"] for ids in e["items"])
        assert expected["learner/forward_tokens"] < item_tokens
        got, want = np.load(double / f"params_{step}.npz"), np.load(single / f"params_{step}.npz")
        assert sorted(got.files) == sorted(want.files) and len(want.files) > 5
        for name in want.files:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5, err_msg=name)
    first, last = np.load(single / "params_0.npz"), np.load(single / f"params_{STEPS - 1}.npz")
    assert max(float(np.abs(first[n] - last[n]).max()) for n in first.files) > 1e-3  # the updates moved it


def test_coordinated_run_trains_every_episode_once(runs):
    _, double, reference, results, _ = runs
    seen: list[str] = []
    for step in range(STEPS):
        trained = [results[p]["steps"][step]["trained"] for p in range(2)]
        for p in range(2):  # a process trains the items of its own groups, one per episode here
            assert sorted(trained[p]) == sorted(_episodes(results[p], step))
        both = trained[0] + trained[1]
        assert sorted(both) == sorted(reference["steps"][step]["trained"])
        assert sorted(both) == sorted(results[0]["steps"][step]["all_episode_ids"])
        seen += both
    assert len(seen) == len(set(seen)) == 4 * STEPS
    # Process 0 alone wrote the run's records, over both processes' groups.
    records = [json.loads(line) for line in (double / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "episodes/total" in r]
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert all(r["episodes/total"] == 4 and r["groups/total"] == 2 for r in steps)
    # ... and, once, the evaluation after the last update (both processes' episodes).
    evaluations = [r for r in records if "eval_after/episodes" in r]
    assert [(r["step"], r["eval_after/episodes"]) for r in evaluations] == [(STEPS, 6.0)]
    assert len(records) == STEPS + 1
    logged = [json.loads(line)["episode_id"] for line in (double / "run" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(logged) == sorted(seen)


def test_relaunched_processes_sample_from_ray_actors_as_one_process_samples_in_process(runs):
    """The resumed launch's engines ran in Ray actors (the first launch's and the reference's in
    the trainer's process); the 3rd update's groups already matched the reference's above, and
    each process's engine holds the policy of every update (the weight sync reached the actors)."""
    _, _, reference, results, _ = runs
    assert reference["worker_type"] == "RolloutWorker"
    assert [r["worker_type"] for r in results] == ["RemoteRolloutWorker"] * 2
    assert [r["steps"][STEPS - 1]["engine_version"] for r in results] == [STEPS, STEPS]


def test_coordinated_evaluation_splits_the_seeds_and_equals_one_process(runs):
    """eval.enabled in a coordinated run: process 0 ran seeds 0 and 2 of each task, process 1
    seed 1, each on its own engines (<out>/process_<i>); both returned the metrics over all 6
    episodes, equal to the one-process evaluation's (per-turn sampling seeds: a seed samples the
    same tokens whichever process runs it), and process 0 wrote the whole tables."""
    single, double, reference, results, _ = runs
    expected = reference["evaluation"]
    assert expected["episodes"] == 6.0 and len(expected["outcomes"]) == 6
    for result in results:
        assert result["evaluation"] == expected
    folder = double / "run" / "evals" / f"after_{STEPS:06d}"
    shares = {p: _records(folder / f"process_{p}") for p in range(2)}
    seeds = {p: sorted({r["seed"] for r in records}) for p, records in shares.items()}
    first = min(seeds[0] + seeds[1])
    assert seeds == {0: [first, first + 2], 1: [first + 1]}
    assert [len(records) for records in shares.values()] == [4, 2]  # both tasks on each of its seeds
    # The episodes themselves: status, turns and valid actions of each (task, seed) as in one process.
    want = {(r["task"], r["seed"]): _episode(r) for r in _records(single / "run" / "evals" / f"after_{STEPS:06d}")}
    got = {(r["task"], r["seed"]): _episode(r) for records in shares.values() for r in records}
    assert got == want
    assert (folder / "results.md").exists() and not (double / "run" / "evals" / "process_1").exists()


def _records(folder):
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def _episode(record):
    return record["status"], record["turns"], record["valid_actions"]


def test_coordinated_training_traces_equal_one_process_traces(runs):
    """train.trace_every in a coordinated run: the episodes one process would trace, chosen from
    the whole batch, each scored by the learner on the process that collected it and saved by
    process 0 with its screenshots: the same traces as the one-process run's, learner logprobs
    to float rounding."""
    single, double, _, _, _ = runs
    want_root, got_root = single / "run" / "traces", double / "run" / "traces"
    steps = sorted(p.name for p in want_root.glob("train_*"))
    assert steps == [f"train_{step:06d}" for step in range(STEPS)]
    assert sorted(p.name for p in got_root.glob("train_*")) == steps
    owners = set()
    for step in steps:
        folders = sorted(p.name for p in (want_root / step).iterdir())
        assert folders == ["00", "01", "02"]
        assert sorted(p.name for p in (got_root / step).iterdir()) == folders
        for folder in folders:
            want = json.loads((want_root / step / folder / "trace.json").read_text())
            got = json.loads((got_root / step / folder / "trace.json").read_text())
            owners.add(got["group_id"] % 2)
            want_turns, got_turns = want.pop("turns"), got.pop("turns")
            assert got == want, (step, folder)
            assert len(got_turns) == len(want_turns)
            for g, w in zip(got_turns, want_turns):
                got_logprobs, want_logprobs = g.pop("learner_logprobs"), w.pop("learner_logprobs")
                g.pop("rollout_logprobs"), w.pop("rollout_logprobs")
                assert g == w, (step, folder)
                assert want_logprobs and len(got_logprobs) == len(want_logprobs)
                np.testing.assert_allclose(got_logprobs, want_logprobs, atol=1e-5)
    assert owners == {0, 1}  # traced episodes of both processes' groups
