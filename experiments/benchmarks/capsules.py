"""State capsules vs a browser per environment vs a container per environment (MiniWoB++).

The three deployments run the same `CapsuleRuntime` code (same transactions, same MiniWoB
driver); only the isolation unit differs: a browser context on one shared Chromium, a
Chromium process per environment, or a `--network none` Docker container per environment.
For each concurrency c (8 and 16), side by side in one process:

  create    mean seconds per environment creation while c are created at once
  reset     mean seconds per reset inside the rollout workload below
  fork      mean seconds per fork (2-action prefix replayed) while c fork at once
  ep/s      episodes per second: c workers, each running --episodes episodes of
            reset + 5 steps (clicks on the task's checkboxes, a screenshot and DOM each)
  cpu s/ep  CPU seconds per episode in that workload, summed over this process and all its
            descendants (each process's utime + stime, sampled every 0.25 s; see CpuSampler):
            a cost that depends less on how busy the machine is than ep/s does. Container
            processes live outside this process tree (under containerd): "n/a" there.
  MiB/env   memory per environment: PSS (/proc/<pid>/smaps_rollup) of every process
            involved (browsers or containers with their shims, the Playwright driver),
            with c environments live, divided by c

Ratios are printed as `throughput capsules/containers: <x>x` and
`memory capsules/containers: <x>x` (and the same against browser-per-environment).

  python -m experiments.benchmarks.capsules [--concurrency 8 16] [--episodes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

from cua_jax.envs import actions as A
from cua_jax.envs.browser_baselines import (
    CONTAINER_IMAGE_NAME,
    BrowserPerEnvironmentBackend,
    ContainerPerEnvironmentBackend,
)
from cua_jax.envs.capsules import CapsuleRuntime, RuntimeBackend, SharedBrowserBackend, process_tree, pss_bytes
from cua_jax.envs.miniwob import MiniWoBObservation

TASK = "click-checkboxes"
STEPS_PER_EPISODE = 5
FORK_PREFIX = 2


def checkbox_click(obs: MiniWoBObservation, k: int) -> A.Action:
    """The k-th step of the workload: toggle a checkbox (never submit, so 5 steps always run)."""
    boxes = [e for e in obs.dom if e.tag == "INPUT_checkbox"]
    box = boxes[k % len(boxes)]
    x, y = A.pixels_to_grid(int(box.left + box.width / 2), int(box.top + box.height / 2), *obs.screen_size)
    return A.Click("left_click", x, y)


class CpuSampler:
    """CPU seconds (utime + stime) used by this process and all its descendants, sampled.

    Every `interval_s` the process tree is walked and each process's own CPU time recorded
    (keyed by pid and start time); a process that exits keeps its last sample. Counting
    each process's own time, never a parent's reaped-children time, avoids double counting
    and does not lose browsers whose children are reaped outside the tree.
    """

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self._seen: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid in process_tree([os.getpid()]):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self._seen[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])  # utime, stime; key: starttime

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "CpuSampler":
        self._sample()
        self._start = dict(self._seen)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def seconds(self) -> float:
        ticks = sum(v - self._start.get(k, 0) for k, v in self._seen.items())
        return ticks / os.sysconf("SC_CLK_TCK")


async def _timed(coro):
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def _measure(rt: CapsuleRuntime, concurrency: int, episodes: int) -> dict[str, float]:
    created = await asyncio.gather(*(_timed(rt.acreate(TASK, seed=i)) for i in range(concurrency)))
    envs = [env for _, env in created]
    memory = pss_bytes(rt.pids()) / concurrency / 2**20

    reset_times: list[float] = []

    async def worker(index: int, env: str) -> None:
        for episode in range(episodes):
            seconds, obs = await _timed(rt.areset(env, seed=10_000 + index * episodes + episode))
            reset_times.append(seconds)
            for k in range(STEPS_PER_EPISODE):
                result = await rt.astep(env, checkbox_click(obs, k))
                if result.done:  # MiniWoB's time limit (wall clock) can end it on a loaded machine
                    break
                obs = result.observation

    with CpuSampler() as cpu:
        started = time.perf_counter()
        await asyncio.gather(*(worker(i, env) for i, env in enumerate(envs)))
        throughput = concurrency * episodes / (time.perf_counter() - started)
    cpu_per_episode = cpu.seconds / (concurrency * episodes)

    for env in envs:  # a fresh episode with a prefix to replay
        obs = await rt.areset(env, seed=1)
        for k in range(FORK_PREFIX):
            obs = (await rt.astep(env, checkbox_click(obs, k))).observation
    forked = await asyncio.gather(*(_timed(rt.afork(env)) for env in envs))
    for env in envs + [env for _, env in forked]:
        await rt.aclose(env)
    return {
        "create": statistics.mean(s for s, _ in created),
        "reset": statistics.mean(reset_times),
        "fork": statistics.mean(s for s, _ in forked),
        "throughput": throughput,
        "cpu": cpu_per_episode,
        "memory": memory,
    }


def run(backend: RuntimeBackend, concurrency: int, episodes: int) -> dict[str, float]:
    rt = CapsuleRuntime(backend, call_timeout_s=1800)
    try:
        return rt.run_async(_measure(rt, concurrency, episodes))
    finally:
        rt.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--episodes", type=int, default=2, help="episodes per environment")
    parser.add_argument("--skip-containers", action="store_true", help="no Docker (then no container ratios)")
    args = parser.parse_args(argv)

    backends: dict[str, type[RuntimeBackend] | None] = {
        "capsules": SharedBrowserBackend,
        "browser-per-env": BrowserPerEnvironmentBackend,
    }
    if not args.skip_containers:
        from cua_jax.envs.images import build

        image = build(CONTAINER_IMAGE_NAME)
        backends["container-per-env"] = lambda: ContainerPerEnvironmentBackend(image)

    print(f"MiniWoB {TASK}: episodes of reset + {STEPS_PER_EPISODE} steps, {args.episodes} per environment")
    header = f"{'c':>3} {'deployment':<18} {'create s':>9} {'reset s':>8} {'fork s':>7} {'ep/s':>6} {'cpu s/ep':>9} {'MiB/env':>8}"
    for concurrency in args.concurrency:
        print(header, flush=True)
        results = {}
        for name, make in backends.items():
            r = results[name] = run(make(), concurrency, args.episodes)
            cpu = "n/a" if name == "container-per-env" else f"{r['cpu']:.2f}"
            print(
                f"{concurrency:>3} {name:<18} {r['create']:>9.3f} {r['reset']:>8.3f} {r['fork']:>7.3f} "
                f"{r['throughput']:>6.2f} {cpu:>9} {r['memory']:>8.1f}",
                flush=True,
            )
        caps = results["capsules"]
        for name, short in (("container-per-env", "containers"), ("browser-per-env", "browsers")):
            if name not in results:
                continue
            base = results[name]
            print(f"throughput capsules/{short}: {caps['throughput'] / base['throughput']:.2f}x  (c={concurrency})")
            print(
                f"memory capsules/{short}: {caps['memory'] / base['memory']:.3f}x  (c={concurrency}; "
                f"{base['memory'] / caps['memory']:.1f}x less per environment)"
            )
            if name != "container-per-env":
                print(f"cpu per episode capsules/{short}: {caps['cpu'] / base['cpu']:.3f}x  (c={concurrency})")
            print(
                f"latency {short}/capsules: create {base['create'] / caps['create']:.1f}x, "
                f"reset {base['reset'] / caps['reset']:.1f}x, fork {base['fork'] / caps['fork']:.1f}x  (c={concurrency})"
            )


if __name__ == "__main__":
    main()
