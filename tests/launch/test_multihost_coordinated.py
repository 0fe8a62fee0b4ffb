"""Coordinated collection for real (config.train.coordinated): two processes with 4 CPU devices
each, joined through jax.distributed (gloo) by launch/multihost.sh, each collecting its share of
every step's groups on real MiniWoB++ capsules with the tiny text Qwen3, against one process with
8 devices collecting everything, both on a data 2 x fsdp 2 x tensor 2 mesh, for 3 on-policy
updates (tests/launch/coordinated_step.py does the work and writes what each process collected,
trained and logged).

Both runs are coordinated runs: the one-process run is the reference (the same trainer with one
process collecting every group). A random policy never finishes a task, so every episode ends
NO_VERDICT and the advantages are 0; the entropy bonus (tiny.py) keeps the gradient non-zero.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = "tests/launch/coordinated_step.py"
FLAGS = [
    "--config=experiments/configs/tiny.py",
    "--config.model.name=tiny_qwen3",
    "--config.env.observation=text",
    "--config.env.include_dom_text=true",
    "--config.rollout.seed_per_turn=true",
    "--config.rollout.max_context_tokens=2048",
    "--config.rollout.prompt_style=compact",
    "--config.train.coordinated=true",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=2",
]
STEPS = 3  # tiny.py's train.num_steps


def _env(devices: int, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "CUA_JAX_PYTHON": sys.executable,
        **extra,
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(single-process output dir, two-process output dir), run side by side."""
    single, double = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("double")
    coordinator = f"127.0.0.1:{_free_port()}"
    start = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, STEP, *FLAGS, f"--config.workdir={single / 'run'}", f"--out={single}"],
            cwd=REPO,
            env=_env(8),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    ]
    for process_id in range(2):
        env = _env(
            4,
            CUA_PROCESS_ID=str(process_id),
            CUA_NUM_PROCESSES="2",
            CUA_COORDINATOR_ADDRESS=coordinator,
            CUA_MULTIHOST_PROGRAM=STEP,
        )
        processes.append(
            subprocess.Popen(
                ["bash", "launch/multihost.sh", *FLAGS, f"--config.workdir={double / 'run'}", f"--out={double}"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        for process in processes:
            out, _ = process.communicate(timeout=600)
            assert process.returncode == 0, out[-6000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    print(f"coordinated runs: {time.perf_counter() - start:.0f} s")
    reference = json.loads((single / "result_0.json").read_text())
    results = [json.loads((double / f"result_{p}.json").read_text()) for p in range(2)]
    return single, double, reference, results


def _episodes(result, step):
    return {e["episode_id"]: e for e in result["steps"][step]["episodes"]}


def test_coordinated_processes_collect_exactly_the_groups_of_one_process(runs):
    _, _, reference, results = runs
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
    single, double, reference, results = runs
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
    _, double, reference, results = runs
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
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(r["episodes/total"] == 4 and r["groups/total"] == 2 for r in records)
    logged = [json.loads(line)["episode_id"] for line in (double / "run" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(logged) == sorted(seen)
