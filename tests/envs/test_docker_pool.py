"""The environment pool against a real dockerd and the real desktop image.

A pool of 4 runs every suite task with its scripted solution (reward 1) and a wrong one
(reward 0); a container killed mid-episode quarantines that episode and is replaced while
the other episodes finish; a hung (paused) server times out and quarantines.
"""

import concurrent.futures
import time

import pytest

from cua_jax.environments.desktop_env import DesktopEpisode, run_scripted
from cua_jax.envs.docker_pool import LABEL_POOL, DockerEnvPool, PoolConfig
from cua_jax.envs.faults import FaultKind
from cua_jax.envs.images import ensure_image
from cua_jax.tasks.schema import load_suite
from cua_jax.tasks.suites.desktop.solutions import SOLUTIONS, SUITE_DIR, WRONG_SOLUTIONS
from cua_jax.types import EpisodeStatus

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASKS = {task.id: task for task in load_suite(SUITE_DIR)}


@pytest.fixture(scope="module")
def pool():
    image = ensure_image("desktop")
    with DockerEnvPool(
        PoolConfig(image=image, size=4, cpus=1.0, memory="1g", call_timeout=20.0, health_interval=5.0)
    ) as pool:
        yield pool
    remaining = pool.docker.api.containers(all=True, filters={"label": f"{LABEL_POOL}={pool.pool_id}"})
    assert remaining == [], "close() must remove every container the pool started"


def wait_for_full_pool(pool, timeout=180.0):
    deadline = time.monotonic() + timeout
    while pool.idle_count() < pool.config.size and time.monotonic() < deadline:
        time.sleep(0.5)
    return pool.idle_count()


def test_every_task_rewards_its_solution_and_not_a_wrong_one(pool):
    jobs = [
        (task_id, kind, texts)
        for task_id in TASKS
        for kind, texts in (("solution", SOLUTIONS[task_id]), ("wrong", WRONG_SOLUTIONS[task_id]))
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        futures = {
            executor.submit(run_scripted, pool, TASKS[task_id], texts): (task_id, kind) for task_id, kind, texts in jobs
        }
        outcomes = {futures[f]: f.result().outcome for f in concurrent.futures.as_completed(futures)}
    for (task_id, kind), outcome in sorted(outcomes.items()):
        if kind == "solution":
            assert (outcome.status, outcome.reward) == (EpisodeStatus.SUCCESS, 1.0), (task_id, outcome)
        else:
            assert (outcome.status, outcome.reward) == (EpisodeStatus.FAILURE, 0.0), (task_id, outcome)


def test_killed_container_quarantines_its_episode_and_is_replaced(pool):
    assert wait_for_full_pool(pool) == 4
    replaced_before = pool.counters["replaced"]
    task = TASKS["write-settings-json"]
    victim = DesktopEpisode(pool, task)
    with concurrent.futures.ThreadPoolExecutor(3) as executor:
        try:
            victim.start()
            victim.step(SOLUTIONS[task.id][0])
            killed_name = victim.env.name
            others = [executor.submit(run_scripted, pool, task, SOLUTIONS[task.id]) for _ in range(3)]
            pool.docker.api.kill(victim.env.container_id)  # SIGKILL, as an OOM or a crash would
            for text in SOLUTIONS[task.id][1:]:
                if not victim.done:
                    victim.step(text)
        finally:
            outcome = victim.finish()
        assert outcome.status is EpisodeStatus.QUARANTINED
        assert outcome.reason.startswith(FaultKind.CONTAINER_EXITED.value), outcome.reason
        assert "137" in outcome.reason  # the exit status of a SIGKILL
        for future in others:
            assert future.result().outcome.status is EpisodeStatus.SUCCESS

    assert wait_for_full_pool(pool) == 4
    assert pool.counters["replaced"] >= replaced_before + 1
    assert killed_name not in {env.name for env in pool.environments()}
    for env in pool.environments():
        assert pool.diagnose(env) is None


# Stops the server process (SIGSTOP): its socket still accepts connections, nothing answers.
FREEZE_SERVER = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    cmdline = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "    if int(pid) != os.getpid() and b'cua_jax.envs.server' in cmdline:\n"
    "        os.kill(int(pid), 19)\n"
)


def test_hung_server_times_out_and_quarantines(pool):
    assert wait_for_full_pool(pool) == 4
    task = TASKS["write-settings-json"]
    episode = DesktopEpisode(pool, task)
    try:
        episode.start()
        frozen = pool.docker.api.exec_create(episode.env.container_id, ["python3", "-c", FREEZE_SERVER])
        pool.docker.api.exec_start(frozen["Id"])
        assert pool.docker.api.exec_inspect(frozen["Id"])["ExitCode"] == 0
        for text in SOLUTIONS[task.id]:
            if not episode.done:
                episode.step(text)
    finally:
        outcome = episode.finish()
    assert outcome.status is EpisodeStatus.QUARANTINED
    assert outcome.reason.startswith(FaultKind.SERVER_UNRESPONSIVE.value), outcome.reason
    assert wait_for_full_pool(pool) == 4
    assert all(pool.diagnose(env) is None for env in pool.environments())


def test_acquire_and_release_from_asyncio_tasks(pool):
    import asyncio

    async def use_one(i):
        env = await pool.acquire_async(timeout=300)
        reply = await asyncio.to_thread(env.client.execute, ["echo", str(i)])
        await pool.release_async(env, reset=False)
        return reply["output"].strip()

    async def main():
        return await asyncio.gather(*(use_one(i) for i in range(8)))

    assert wait_for_full_pool(pool) == 4
    assert asyncio.run(main()) == [str(i) for i in range(8)]


def test_containers_are_isolated_and_capped(pool):
    assert wait_for_full_pool(pool) == 4
    env = pool.acquire(timeout=300)
    try:
        attrs = pool.docker.api.inspect_container(env.container_id)
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["Memory"] == 1 << 30 and host["NanoCpus"] == 10**9 and host["PidsLimit"] == 1024
        assert attrs["Config"]["Labels"][LABEL_POOL] == pool.pool_id
        reply = env.client.execute("cat /sys/class/net/*/operstate; ls /sys/class/net", shell=True)
        assert reply["output"].split() == ["unknown", "lo"]  # loopback only
    finally:
        pool.release(env, reset=False)


def test_failed_setup_quarantines_and_spent_budget_is_no_verdict(pool):
    from cua_jax.envs import actions as A
    from cua_jax.tasks.schema import parse_task

    broken = parse_task(
        {
            "id": "broken-setup",
            "instruction": "x",
            "evaluator": {"func": "infeasible"},
            "config": [{"type": "open", "parameters": {"path": "/root/missing.txt", "timeout": 5}}],
        }
    )
    episode = run_scripted(pool, broken, [A.render_action(A.Done())])
    assert episode.outcome.status is EpisodeStatus.QUARANTINED
    assert episode.outcome.reason.startswith("setup failed: step 0 (open)"), episode.outcome.reason

    task = TASKS["write-settings-json"]
    episode = DesktopEpisode(pool, task, max_turns=2)
    assert episode.start().screenshot_png.startswith(b"\x89PNG")
    observation = episode.step("I will click somewhere.")  # no tool call: invalid, fed back
    assert observation.feedback.startswith("Invalid action: no action found")
    assert observation.screenshot_png is not None and not episode.done
    episode.step(A.render_action(A.Screenshot()))
    assert episode.done
    outcome = episode.finish()
    assert (outcome.status, outcome.reward) == (EpisodeStatus.NO_VERDICT, 0.0)


@pytest.mark.docker
def test_a_new_pool_removes_the_containers_a_killed_process_left(pool):
    """Containers whose owning process is gone (a run killed before its pool closed) are
    removed when a pool starts; a live process's containers, and another host's, stay."""
    import subprocess
    import sys

    import docker as docker_sdk

    from cua_jax.envs.docker_pool import LABEL_OWNER, LABEL_ROLE, _start_time, owner_is_gone, process_owner

    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    dead_owner = f"{process_owner().split(':')[0]}:{dead.pid}:{_start_time(dead.pid)}"
    dead.wait()
    assert owner_is_gone(dead_owner) and not owner_is_gone(process_owner())
    assert not owner_is_gone(f"another-host:{dead.pid}:1") and not owner_is_gone("unreadable")
    client = docker_sdk.from_env()
    image = pool.config.image
    made = {}
    for name, owner in (("dead", dead_owner), ("alive", process_owner()), ("elsewhere", "another-host:1:1")):
        made[name] = client.containers.run(
            image,
            entrypoint=["sleep", "600"],
            detach=True,
            network_mode="none",
            labels={LABEL_ROLE: "env", LABEL_OWNER: owner},
        )
    try:
        pool.remove_orphans()  # (another pool starting meanwhile may remove it first)
        left = {c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_ROLE}=env"})}
        assert made["dead"].id not in left
        assert made["alive"].id in left and made["elsewhere"].id in left
    finally:
        for container in made.values():
            try:
                container.remove(force=True)
            except docker_sdk.errors.NotFound:
                pass
