"""Desktop environment pool benchmark, at concurrency 1, 4 and 8 (pool size = concurrency).

For each concurrency c, side by side in one process:
  start/s    containers started and ready per second: the pool's parallel start of c
             containers, against starting them one after another (baseline); both time
             start() alone, never the close
  reset      seconds per reset while c environments reset at once: `restart` (same
             container) against `recreate` (a fresh container, the default: clean files)
  step       seconds per step (a mouse move + a full-screen PNG) while c environments step
             at once: one /action call returning the screenshot, against OSWorld's two calls
             (the action, then GET /screenshot) as the baseline
  mem/env    memory per idle environment (cgroup usage less page cache), MiB

  python -m experiments.benchmarks.env_pool [--concurrency 1 4 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import time

from cua_jax.envs import actions as A
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image


def _parallel(fn, items):
    with concurrent.futures.ThreadPoolExecutor(max(1, len(items))) as executor:
        return list(executor.map(fn, items))


def _steps(env, steps: int, combined: bool, seed: int) -> list[float]:
    rng = random.Random(seed)
    latencies = []
    for _ in range(steps):
        action = A.MouseMove(rng.randint(0, A.GRID), rng.randint(0, A.GRID))
        started = time.perf_counter()
        if combined:
            result = env.client.step(action, screenshot=True)
            png = result.screenshot_png
        else:
            result = env.client.step(action, screenshot=False)
            png = env.client.screenshot()
        latencies.append(time.perf_counter() - started)
        assert result.ok and png.startswith(b"\x89PNG")
    return latencies


def _memory_mib(pool: DockerEnvPool, env) -> float:
    stats = pool.docker.api.stats(env.container_id, stream=False)["memory_stats"]
    detail = stats.get("stats", {})
    cache = detail.get("total_inactive_file", detail.get("inactive_file", detail.get("cache", 0)))
    return (stats["usage"] - cache) / 2**20


def measure(image: str, concurrency: int, steps: int) -> dict[str, float]:
    config = PoolConfig(image=image, size=concurrency, health_interval=None)
    row: dict[str, float] = {}

    # Baseline start: the same number of containers, one after another. Like the pool's
    # timing below, only start() counts: the pools are made before and closed after, and
    # all c containers stay up until the last is ready, as the pool's do.
    singles = [DockerEnvPool(PoolConfig(image=image, size=1, health_interval=None)) for _ in range(concurrency)]
    try:
        elapsed = 0.0
        for single in singles:
            started = time.perf_counter()
            single.start()
            elapsed += time.perf_counter() - started
    finally:
        for single in singles:
            single.close()
    row["start_seq"] = concurrency / elapsed

    pool = DockerEnvPool(config)
    started = time.perf_counter()
    pool.start()
    row["start_pool"] = concurrency / (time.perf_counter() - started)
    try:
        envs = [pool.acquire(timeout=300) for _ in range(concurrency)]
        _parallel(lambda e: e.client.screenshot(), envs)  # warm the X connection
        row["mem"] = statistics.mean(_memory_mib(pool, e) for e in envs)

        for combined, key in ((False, "step_2calls"), (True, "step_action")):
            latencies = _parallel(lambda ie: _steps(ie[1], steps, combined, ie[0]), list(enumerate(envs)))  # noqa: B023 - run within this iteration
            row[key] = statistics.mean(x for run in latencies for x in run)

        for mode, key in (("restart", "reset_restart"), ("recreate", "reset_recreate")):
            pool.config.reset_mode = mode

            def timed_reset(env):
                begun = time.perf_counter()
                fresh = pool.reset(env)
                return time.perf_counter() - begun, fresh

            results = _parallel(timed_reset, envs)
            row[key] = statistics.mean(r[0] for r in results)
            envs = [r[1] for r in results]
    finally:
        pool.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=20, help="steps per environment per variant")
    args = parser.parse_args()
    image = ensure_image("desktop")
    began = time.perf_counter()
    print(f"image {image}; {args.steps} steps per environment per variant")
    header = (
        f"{'conc':>4} | {'start/s seq':>11} {'pool':>6} {'ratio':>6} | {'reset s recreate':>16} "
        f"{'restart':>8} {'ratio':>6} | {'step s 2 calls':>14} {'/action':>8} {'ratio':>6} | {'mem/env MiB':>11}"
    )
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        r = measure(image, concurrency, args.steps)
        print(
            f"{concurrency:>4} | {r['start_seq']:>11.2f} {r['start_pool']:>6.2f} "
            f"{r['start_pool'] / r['start_seq']:>5.2f}x | "
            f"{r['reset_recreate']:>16.2f} {r['reset_restart']:>8.2f} "
            f"{r['reset_recreate'] / r['reset_restart']:>5.2f}x | "
            f"{r['step_2calls']:>14.3f} {r['step_action']:>8.3f} {r['step_2calls'] / r['step_action']:>5.2f}x | "
            f"{r['mem']:>11.1f}",
            flush=True,
        )
    print(f"wall time {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    main()
