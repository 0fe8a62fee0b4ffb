"""Group start latency: n fresh resets against one prepared state shared by the group.

The wall time from "start the group" until all n environments show their first observation,
measured through the adapters the agent loop drives (`cua_jax.envs.contract`), side by side
in one process on the same environments:

  capsules  MiniWoB++ in capsules of one shared browser (`click-button`, one seed):
            fresh   n concurrent `reset(task, seed)`;
            shared  one `reset`, its `shared_state()` (a snapshot) and n - 1 concurrent
                    `reset_to` (forks rebuilt from the snapshot), as rollout.group_start
                    = "shared" runs it.
  desktops  the desktop suite's `terminal-create-file` (launch xterm, wait for its window) on
            a pool of n ready containers:
            fresh   n concurrent resets: each container runs the task's setup (what the
                    trainer's "shared" start does on desktops);
            commit  one setup, `docker commit` of the prepared container, n containers
                    started from the commit, and the setup's launch steps run again on each
                    (a commit keeps files, not running programs or the X server's state).

    python -m experiments.benchmarks.group_fork [--n 4] [--repeats 3] [--skip-desktops]

Each ratio printed is fresh / shared (or fresh / commit): above 1 means the shared start is faster.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import time

CAPSULE_TASK = "click-button"
DESKTOP_TASK = "terminal-create-file"
LAUNCH_STEPS = ("launch", "open", "execute", "command", "sleep")  # what a restored container must redo


async def _capsule_round(envs, seed: int) -> tuple[float, float]:
    started = time.perf_counter()
    await asyncio.gather(*(env.reset(CAPSULE_TASK, seed) for env in envs))
    fresh = time.perf_counter() - started
    started = time.perf_counter()
    await envs[0].reset(CAPSULE_TASK, seed + 1)
    state = await envs[0].shared_state()
    await asyncio.gather(*(env.reset_to(CAPSULE_TASK, seed + 1, state) for env in envs[1:]))
    return fresh, time.perf_counter() - started


def measure_capsules(n: int, repeats: int) -> dict[str, float]:
    from cua_jax.environments.capsule_env import MiniWoBEnvironment
    from cua_jax.envs.capsules import CapsuleRuntime

    runtime = CapsuleRuntime(include_dom_text=True)
    try:
        envs = [MiniWoBEnvironment(runtime) for _ in range(n)]

        async def run():
            await asyncio.gather(*(env.reset(CAPSULE_TASK, 0) for env in envs))  # warm: capsules exist
            rounds = [await _capsule_round(envs, 100 + 2 * r) for r in range(repeats)]
            await asyncio.gather(*(env.close() for env in envs))
            return rounds

        rounds = runtime.run_async(run())
    finally:
        runtime.shutdown()
    return {"fresh": statistics.median(f for f, _ in rounds), "shared": statistics.median(s for _, s in rounds)}


def _desktop_fresh(pool, task, n: int) -> float:
    from cua_jax.environments.desktop_env import DesktopEnvironment

    envs = [DesktopEnvironment(pool) for _ in range(n)]

    async def run():
        started = time.perf_counter()
        await asyncio.gather(*(env.reset(task) for env in envs))
        seconds = time.perf_counter() - started
        await asyncio.gather(*(env.close() for env in envs))
        return seconds

    return asyncio.run(run())


def _desktop_commit(pool, task, n: int, image: str) -> float:
    from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
    from cua_jax.tasks import judges
    from cua_jax.tasks.judges import set_up_task

    relaunch = tuple(step for step in task.config if step.type in LAUNCH_STEPS)
    env = pool.acquire(timeout=600)
    repository = f"cua-jax/group-fork-{pool.pool_id}"
    try:
        started = time.perf_counter()
        set_up_task(task, env.client)
        pool.docker.api.commit(env.container_id, repository=repository, tag="prepared")
        config = PoolConfig(
            image=f"{repository}:prepared",
            size=n,
            cpus=pool.config.cpus,
            memory=pool.config.memory,
            screen=pool.config.screen,
            health_interval=None,
        )
        with DockerEnvPool(config) as restored:
            envs = [restored.acquire(timeout=600) for _ in range(n)]
            with concurrent.futures.ThreadPoolExecutor(n) as executor:
                list(executor.map(lambda e: judges.run_steps(relaunch, e.client, task.base_dir), envs))
            seconds = time.perf_counter() - started
            for e in envs:
                restored.release(e, reset=False)
    finally:
        pool.release(env)
        pool.docker.images.remove(f"{repository}:prepared", force=True)
    return seconds


def measure_desktops(n: int, repeats: int) -> dict[str, float]:
    from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
    from cua_jax.envs.images import ensure_image
    from cua_jax.tasks.schema import load_suite
    from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR

    task = {t.id: t for t in load_suite(SUITE_DIR)}[DESKTOP_TASK]
    image = ensure_image("desktop")
    fresh, commit = [], []
    with DockerEnvPool(PoolConfig(image=image, size=n, health_interval=None)) as pool:
        for _ in range(repeats):
            _wait_full(pool)
            fresh.append(_desktop_fresh(pool, task, n))
            _wait_full(pool)
            commit.append(_desktop_commit(pool, task, n, image))
    return {"fresh": statistics.median(fresh), "commit": statistics.median(commit)}


def _wait_full(pool, timeout_s: float = 600.0) -> None:
    """Until every container of the pool is ready again (released ones are recreated)."""
    deadline = time.monotonic() + timeout_s
    while pool.idle_count() < pool.config.size and time.monotonic() < deadline:
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4, help="episodes per group")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-desktops", action="store_true")
    args = parser.parse_args(argv)
    print(f"group start latency, n = {args.n}, median of {args.repeats} (seconds until all n first observations)")
    caps = measure_capsules(args.n, args.repeats)
    print(f"capsules ({CAPSULE_TASK}): fresh {caps['fresh']:.3f} s  shared {caps['shared']:.3f} s", flush=True)
    print(f"group start capsules fresh/shared: {caps['fresh'] / caps['shared']:.2f}x")
    if not args.skip_desktops:
        desk = measure_desktops(args.n, args.repeats)
        print(f"desktops ({DESKTOP_TASK}): fresh setups {desk['fresh']:.2f} s  commit + restore {desk['commit']:.2f} s")
        print(f"group start desktops fresh/commit: {desk['fresh'] / desk['commit']:.2f}x")


if __name__ == "__main__":
    main()
