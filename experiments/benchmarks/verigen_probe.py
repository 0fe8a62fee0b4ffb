"""The shared interaction probe: tasks validated per minute with 1, 8 and 32 workers over 4 environments.

Each worker repeatedly takes a candidate, spends `--agent-latency` seconds outside any
environment (standing for its proposer / judger model calls, which hold no container),
then dry-runs the candidate through the probe (setup, judge 0, reference solution,
judge 1; a fresh environment each time). The 1-worker run is the baseline; the ratio is
throughput over it. Queue waits show the FIFO sharing of the few environments.

    python -m experiments.benchmarks.verigen_probe [--pool 4] [--workers 1 8 32] [--agent-latency 3]
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

import numpy as np

from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.tasks.verigen import templates
from cua_jax.tasks.verigen.probe import InteractionProbe
from cua_jax.tasks.verigen.roles import ScriptedChecker

FAMILIES = ("file_create", "file_append", "file_replace", "term_tree")


def measure(probe: InteractionProbe, workers: int, tasks: int, latency: float, seed: int) -> dict:
    candidates: queue.Queue = queue.Queue()
    for candidate in templates.TemplateProposer(seed=seed, families=FAMILIES).propose(tasks):
        candidates.put(candidate)
    checker = ScriptedChecker(probe, judge_timeout_cap=5.0)
    passed, lock = [0], threading.Lock()
    waits_before = len(probe.waits)

    def worker() -> None:
        while True:
            try:
                candidate = candidates.get_nowait()
            except queue.Empty:
                return
            time.sleep(latency)  # the model calls of a worker happen outside the environments
            ok = checker.check(candidate).passed
            with lock:
                passed[0] += ok

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    waits = np.asarray(probe.waits[waits_before:])
    return {
        "workers": workers,
        "tasks": tasks,
        "passed": passed[0],
        "seconds": seconds,
        "per_minute": 60.0 * tasks / seconds,
        "wait_p50": float(np.percentile(waits, 50)),
        "wait_p95": float(np.percentile(waits, 95)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tasks-per-worker", type=float, default=1.5)
    parser.add_argument("--min-tasks", type=int, default=6)
    parser.add_argument("--agent-latency", type=float, default=3.0)
    args = parser.parse_args()
    rows = []
    with (
        DockerEnvPool(PoolConfig(image=ensure_image("desktop"), size=args.pool, health_interval=None)) as pool,
        InteractionProbe(pool) as probe,
    ):
        for seed, workers in enumerate(args.workers):
            tasks = max(args.min_tasks, int(args.tasks_per_worker * workers))
            rows.append(measure(probe, workers, tasks, args.agent_latency, seed))
            print(f"[{workers} workers] {rows[-1]['seconds']:.0f}s", flush=True)
    base = rows[0]["per_minute"]
    print(
        f"\nVeriGen probe: {args.pool} environments, agent latency {args.agent_latency}s per task, "
        f"fresh environment per dry run"
    )
    print(
        f"{'workers':>7s} {'tasks':>5s} {'passed':>6s} {'seconds':>8s} {'tasks/min':>9s} {'ratio':>6s} "
        f"{'wait p50':>8s} {'wait p95':>8s}"
    )
    for row in rows:
        print(
            f"{row['workers']:7d} {row['tasks']:5d} {row['passed']:6d} {row['seconds']:8.1f} {row['per_minute']:9.2f} "
            f"{row['per_minute'] / base:6.2f} {row['wait_p50']:8.2f} {row['wait_p95']:8.2f}"
        )


if __name__ == "__main__":
    main()
