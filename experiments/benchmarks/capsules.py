"""State capsules vs a browser per environment vs a container per environment (MiniWoB++).

The deployments run the same `CapsuleRuntime` code (same transactions, same MiniWoB driver);
only the isolation unit differs: capsules on one shared Chromium (pages of private sites
sharing --renderers renderer processes, a warm pool of loaded pages, fork by captured
state), a Chromium process per environment, or a `--network none` Docker container per
environment. For each concurrency c (8, 16, 32 and 64 by default), side by side in one process:

  create    mean seconds per environment creation while c are created at once
  reset     mean seconds per reset (with its first observation) inside the workload below
  fork      mean seconds per fork (2-action prefix) while c fork at once
  ep/s      episodes per second: c workers, each running --episodes episodes of reset + 5
            steps (clicks on the task's checkboxes, a screenshot and DOM each). Every backend
            does exactly the same steps: MiniWoB's clock is set past the run (time_limit_s),
            the workload never submits, and an episode that ends early is an error.
  cpu s/ep  CPU seconds per episode, summed over this process and all its descendants (each
            process's utime + stime, sampled every 0.25 s; see CpuSampler). Container
            processes live outside this process tree (under containerd): "n/a" there.
  MiB/env   memory per environment: PSS (/proc/<pid>/smaps_rollup) of every process
            involved (browsers or containers with their shims, the Playwright driver, the
            HTTP server, the warm pages), with c environments live, divided by c. Processes
            whose memory could not be read are counted and printed ("unread").

After the forks, with 2c capsules live, renderer processes are killed one at a time until
one that hosted capsules dies: the capsules it quarantined are the blast radius of a renderer
crash (a cell's capsules when renderers are shared; with a context per capsule, one).

A baseline runs at a concurrency only when its memory, projected from the previous
concurrency's MiB/env, fits in the memory available now; the table says where each stops.

Lever table (--levers, at --lever-concurrency): the capsule deployment with its levers switched
on one at a time: a browser context per capsule (each with its own renderers) -> shared
renderers -> + warm pages -> + fork by captured state, and then a pool as large as c (what
forks cost when every fork finds a loaded page, and what the pool costs in memory). The
screenshot lever is timed on one page (mean of 40): Playwright's screenshot with and without
the frame-rate limit, and the single DevTools call capsules use. The caret lever: CPU per second
of --caret-capsules idle capsules on one shared browser, each text field focused by a click
(the frame-rate limit off, as capsules run), the caret blinking (the still style before its
fix) against stilled (`caret-animation: manual`).

Reset latency against MiniWoB++'s own environment (its Selenium driver on Debian's
chromedriver, `miniwob_reference`): one environment each, nothing else running, --resets
resets (reset + first observation), medians compared.

Ratios are printed as `throughput capsules/containers: <x>x`, `memory capsules/containers`,
`latency containers/capsules: create, reset, fork` (and the same against
browser-per-environment) and `reset+first observation miniwob/capsules`.

  python -m experiments.benchmarks.capsules [--concurrency 8 16 32 64] [--episodes 2]
      [--renderers 2] [--warm-pages 4] [--levers] [--caret] [--skip-containers]

The caret lever alone: --caret --concurrency --skip-containers --skip-miniwob (the screenshot
lever still runs; it takes seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable

from cua_jax.envs import actions as A
from cua_jax.envs.browser_baselines import (
    CONTAINER_IMAGE_NAME,
    CONTAINER_NAME_PREFIX,
    BrowserPerEnvironmentBackend,
    ContainerPerEnvironmentBackend,
)
from cua_jax.envs.capsules import CapsuleRuntime, RuntimeBackend, SharedBrowserBackend, process_tree, read_pss
from cua_jax.envs.miniwob import (
    CHROMIUM_ARGS,
    CHROMIUM_EXECUTABLE,
    TASK_HEIGHT,
    TASK_WIDTH,
    MiniWoBObservation,
    click_point,
)

TASK = "click-checkboxes"
CARET_TASK = "enter-text"  # a text field to focus (the caret lever)
CARET_IDLE_S = 10.0  # seconds the caret lever measures idle capsules
STEPS_PER_EPISODE = 5
FORK_PREFIX = 2
NO_TIME_LIMIT_S = 24 * 3600.0  # MiniWoB's clock never ends a benchmark episode
MEMORY_HEADROOM = 1.25  # a projection must fit with this margin
FRAME_RATE_SWITCHES = ("--disable-gpu-vsync", "--disable-frame-rate-limit")


def checkbox_click(obs: MiniWoBObservation, k: int) -> A.Action:
    """The k-th step of the workload: toggle a checkbox (never submit, so 5 steps always run)."""
    boxes = [e for e in obs.dom if e.tag == "INPUT_checkbox"]
    return A.Click("left_click", *click_point(boxes[k % len(boxes)], *obs.screen_size))


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

    def __enter__(self) -> CpuSampler:
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


@dataclasses.dataclass(frozen=True)
class Deployment:
    """One way to run the environments: a backend factory and the runtime's levers."""

    name: str
    backend: Callable[[], RuntimeBackend]
    warm_pages: int = 0
    fork_by: str = "replay"


@dataclasses.dataclass
class Measurement:
    create: float
    reset: float
    fork: float
    throughput: float
    cpu: float
    memory_mib: float
    unread: int
    steps: int
    fork_methods: dict[str, int]
    blast_radius: int | None  # capsules one renderer crash quarantined (of 2c live)


async def _timed(coro):
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def _measure(rt: CapsuleRuntime, concurrency: int, episodes: int) -> Measurement:
    created = await asyncio.gather(*(_timed(rt.acreate(TASK, seed=i)) for i in range(concurrency)))
    envs = [env for _, env in created]
    await asyncio.sleep(1.0)  # let the warm pool (if any) fill, as it would between episodes
    memory = read_pss(rt.pids())

    reset_times: list[float] = []
    steps = 0

    async def worker(index: int, env: str) -> None:
        nonlocal steps
        for episode in range(episodes):
            seconds, obs = await _timed(rt.areset(env, seed=10_000 + index * episodes + episode))
            reset_times.append(seconds)
            for k in range(STEPS_PER_EPISODE):
                result = await rt.astep(env, checkbox_click(obs, k))
                if result.done or result.observation is None:
                    raise RuntimeError(
                        f"{env} ended after {k + 1} steps "
                        f"({result.status}, {result.reason or result.quarantine_reason}): "
                        "every backend must do the same steps"
                    )
                steps += 1
                obs = result.observation

    with CpuSampler() as cpu:
        started = time.perf_counter()
        await asyncio.gather(*(worker(i, env) for i, env in enumerate(envs)))
        throughput = concurrency * episodes / (time.perf_counter() - started)
    cpu_per_episode = cpu.seconds / (concurrency * episodes)

    async def prefix(index: int, env: str) -> None:  # a fresh episode with a prefix to carry over
        obs = await rt.areset(env, seed=20_000 + index)
        for k in range(FORK_PREFIX):
            obs = (await rt.astep(env, checkbox_click(obs, k))).observation

    await asyncio.gather(*(prefix(i, env) for i, env in enumerate(envs)))
    await asyncio.sleep(1.0)
    forked = await asyncio.gather(*(_timed(rt.afork(env)) for env in envs))
    live = envs + [env for _, env in forked]
    blast_radius = await _renderer_crash_blast_radius(rt, live)
    for env in live:
        await rt.aclose(env)
    return Measurement(
        create=statistics.mean(s for s, _ in created),
        reset=statistics.mean(reset_times),
        fork=statistics.mean(s for s, _ in forked),
        throughput=throughput,
        cpu=cpu_per_episode,
        memory_mib=memory.pss_bytes / concurrency / 2**20,
        unread=len(memory.unreadable),
        steps=steps,
        fork_methods=dict(rt.fork_methods),
        blast_radius=blast_radius,
    )


async def _renderer_crash_blast_radius(rt: CapsuleRuntime, live: list[str]) -> int | None:
    """How many of the `live` capsules one renderer crash quarantines: renderer processes are
    SIGKILLed one at a time until one that hosted capsules dies. None for other backends."""
    if not isinstance(rt.backend, SharedBrowserBackend):
        return None
    for pid in rt.backend.renderer_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            quarantined = sum(rt.quarantine_reason(env) is not None for env in live)
            if quarantined:
                await asyncio.sleep(0.5)  # every page of the renderer reports its crash
                return sum(rt.quarantine_reason(env) is not None for env in live)
            await asyncio.sleep(0.1)
    return 0


def run(deployment: Deployment, concurrency: int, episodes: int) -> Measurement:
    rt = CapsuleRuntime(
        deployment.backend(),
        call_timeout_s=3600,
        time_limit_s=NO_TIME_LIMIT_S,
        warm_pages=deployment.warm_pages,
        fork_by=deployment.fork_by,
    )
    try:
        return rt.run_async(_measure(rt, concurrency, episodes))
    finally:
        rt.shutdown()


def settle(timeout_s: float = 300.0) -> None:
    """Wait until no container of a container-per-environment run is left (Docker removes them
    after the run returns) and give the machine a few quiet seconds, so that one deployment's
    teardown is not measured as the next one's load."""
    import subprocess

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"name={CONTAINER_NAME_PREFIX}"], capture_output=True, text=True
        )
        if listed.returncode != 0 or not listed.stdout.strip():
            break
        time.sleep(1.0)
    time.sleep(5.0)


def available_mib() -> float:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return info["MemAvailable"] / 1024


TURN_S = 0.5  # between resets of the one-environment comparison, both sides: an agent's turn


def capsule_reset_latencies(deployment: Deployment, resets: int) -> list[float]:
    """Seconds per reset (with its first observation) of one capsule, nothing else running,
    TURN_S between resets (the warm pool refills meanwhile, as it does during an episode)."""
    with CapsuleRuntime(deployment.backend(), warm_pages=deployment.warm_pages, fork_by=deployment.fork_by) as rt:
        env = rt.create(TASK, seed=0)
        latencies = []
        for seed in range(1, resets + 1):
            time.sleep(TURN_S)
            started = time.perf_counter()
            rt.reset(env, seed=seed)
            latencies.append(time.perf_counter() - started)
        return latencies


def screenshot_ms(switches: tuple[str, ...], playwright_shots: bool, shots: int = 40) -> float:
    """Mean milliseconds per screenshot of a loaded task page's 160 x 210 region, decoded to an
    array, Chromium launched with this benchmark's arguments with or without the frame-rate
    switches: Playwright's screenshot (restyling the page around every capture for its caret
    and animations) or `MiniWoBPage.screenshot` (one DevTools call on a page stilled at load)."""
    import io

    import numpy as np
    from PIL import Image

    from cua_jax.envs.miniwob import VIEWPORT, MiniWoBPage, MiniWoBServer

    args = [a for a in CHROMIUM_ARGS if a not in FRAME_RATE_SWITCHES] + list(switches)
    clip = {"x": 0, "y": 0, "width": TASK_WIDTH, "height": TASK_HEIGHT}
    server = MiniWoBServer()

    async def shoot() -> float:
        from playwright.async_api import async_playwright

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM_EXECUTABLE, headless=True, args=args)
            page = await browser.new_page(viewport=VIEWPORT)
            driver = MiniWoBPage(page, TASK)
            await driver.load(server.task_url(TASK))

            async def one() -> np.ndarray:
                if playwright_shots:
                    png = await page.screenshot(clip=clip, type="png", animations="disabled")
                    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
                return await driver.screenshot()

            await one()
            started = time.perf_counter()
            for _ in range(shots):
                await one()
            elapsed = time.perf_counter() - started
            await browser.close()
        return elapsed / shots * 1000

    try:
        return asyncio.run(shoot())
    finally:
        server.close()


@contextlib.contextmanager
def _caret_blinking(blinking: bool):
    """The still style pages get at load (`cua_jax.envs.miniwob.page._STILL_PAGE_JS`), without
    its `caret-animation: manual` while `blinking`: the style before the caret fix."""
    from cua_jax.envs.miniwob import page as page_module

    still = page_module._STILL_PAGE_JS
    rule = "'caret-animation: manual !important; ' +"
    assert rule in still, "the still style no longer stops the caret's blink: update this lever"
    page_module._STILL_PAGE_JS = still.replace(rule, "") if blinking else still
    try:
        yield
    finally:
        page_module._STILL_PAGE_JS = still


def idle_focused_fields_cpu(blinking: bool, capsules: int, renderers: int, seconds: float = CARET_IDLE_S) -> float:
    """CPU seconds per second of this process and its browser while `capsules` capsules of
    CARET_TASK on one shared Chromium (`renderers` renderer processes, the frame-rate limit off
    as capsules run) sit idle, each with its text field focused by a click, their caret
    blinking or stilled (`caret-animation: manual`, what capsules run)."""
    with _caret_blinking(blinking):
        rt = CapsuleRuntime(SharedBrowserBackend(renderers=renderers), time_limit_s=NO_TIME_LIMIT_S)
        try:
            for seed in range(capsules):
                env = rt.create(CARET_TASK, seed=seed)
                obs = rt.observe(env)
                field = next(e for e in obs.dom if e.tag == "INPUT_text")
                rt.step(env, A.Click("left_click", *click_point(field, *obs.screen_size)))
            time.sleep(1.0)  # past the clicks' own frames
            with CpuSampler() as cpu:
                started = time.perf_counter()
                time.sleep(seconds)
                elapsed = time.perf_counter() - started
        finally:
            rt.shutdown()
    return cpu.seconds / elapsed


def print_row(concurrency: int, name: str, r: Measurement) -> None:
    cpu = "n/a" if name == "container-per-env" else f"{r.cpu:.2f}"
    print(
        f"{concurrency:>3} {name:<26} {r.create:>9.3f} {r.reset:>8.3f} {r.fork:>7.3f} {r.throughput:>6.2f} "
        f"{cpu:>9} {r.memory_mib:>8.1f} {r.unread:>6} {r.steps:>6}",
        flush=True,
    )


HEADER = (
    f"{'c':>3} {'deployment':<26} {'create s':>9} {'reset s':>8} {'fork s':>7} {'ep/s':>6} "
    f"{'cpu s/ep':>9} {'MiB/env':>8} {'unread':>6} {'steps':>6}"
)


def print_ratios(concurrency: int, results: dict[str, Measurement]) -> None:
    caps = results["capsules"]
    for name, short in (("container-per-env", "containers"), ("browser-per-env", "browsers")):
        if name not in results:
            continue
        base = results[name]
        print(f"throughput capsules/{short}: {caps.throughput / base.throughput:.2f}x  (c={concurrency})")
        print(
            f"memory capsules/{short}: {caps.memory_mib / base.memory_mib:.3f}x  (c={concurrency}; "
            f"{base.memory_mib / caps.memory_mib:.1f}x less per environment)"
        )
        if name != "container-per-env":
            print(f"cpu per episode capsules/{short}: {caps.cpu / base.cpu:.3f}x  (c={concurrency})")
        print(
            f"latency {short}/capsules: create {base.create / caps.create:.1f}x, "
            f"reset {base.reset / caps.reset:.1f}x, fork {base.fork / caps.fork:.1f}x  (c={concurrency})"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[8, 16, 32, 64], help="none: no table")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per environment")
    parser.add_argument("--renderers", type=int, default=2, help="renderer processes the capsules share")
    parser.add_argument("--warm-pages", type=int, default=4, help="loaded pages of the task kept ready")
    parser.add_argument("--resets", type=int, default=20, help="resets per side of the MiniWoB comparison")
    parser.add_argument("--levers", action="store_true", help="also the capsule levers one at a time")
    parser.add_argument("--lever-concurrency", type=int, default=16)
    parser.add_argument("--caret", action="store_true", help="the caret lever (also part of --levers)")
    parser.add_argument("--caret-capsules", type=int, default=8, help="idle capsules of the caret lever")
    parser.add_argument("--skip-containers", action="store_true", help="no Docker (then no container ratios)")
    parser.add_argument("--skip-miniwob", action="store_true", help="no comparison with MiniWoB's own environment")
    args = parser.parse_args(argv)

    capsules = Deployment(
        "capsules",
        lambda: SharedBrowserBackend(renderers=args.renderers),
        warm_pages=args.warm_pages,
        fork_by="capture",
    )
    deployments = [capsules, Deployment("browser-per-env", BrowserPerEnvironmentBackend)]
    if not args.skip_containers:
        from cua_jax.envs.images import build

        image = build(CONTAINER_IMAGE_NAME)
        deployments.append(Deployment("container-per-env", lambda: ContainerPerEnvironmentBackend(image)))

    print(
        f"MiniWoB {TASK}: episodes of reset + {STEPS_PER_EPISODE} steps, {args.episodes} per environment; "
        f"capsules share {args.renderers} renderers, {args.warm_pages} warm pages",
        flush=True,
    )

    if not args.skip_miniwob:
        ours = statistics.median(capsule_reset_latencies(capsules, args.resets)) * 1000
        from experiments.benchmarks.miniwob_reference import reset_latencies

        theirs = statistics.median(reset_latencies(TASK, range(1, args.resets + 1), turn_s=TURN_S)) * 1000
        print(
            f"reset + first observation, one environment, {TURN_S} s apart, median of {args.resets}: "
            f"capsules {ours:.1f} ms, MiniWoB's own (Selenium) {theirs:.1f} ms"
        )
        print(f"reset+first observation miniwob/capsules: {theirs / ours:.2f}x", flush=True)

    before = screenshot_ms((), playwright_shots=True)
    unlimited = screenshot_ms(FRAME_RATE_SWITCHES, playwright_shots=True)
    ours = screenshot_ms(FRAME_RATE_SWITCHES, playwright_shots=False)
    print(
        f"screenshot (160x210 region, decoded): Playwright's with the frame-rate limit {before:.1f} ms, without it "
        f"{unlimited:.1f} ms, one DevTools call on a stilled page {ours:.1f} ms; "
        f"screenshot before/now: {before / ours:.2f}x",
        flush=True,
    )

    if args.levers or args.caret:
        c = args.caret_capsules
        settle()
        blinking = idle_focused_fields_cpu(True, c, args.renderers)
        settle()
        stilled = idle_focused_fields_cpu(False, c, args.renderers)
        print(
            f"{c} idle {CARET_TASK} capsules ({args.renderers} renderers), each field focused by a click, CPU "
            f"seconds per second over {CARET_IDLE_S:.0f} s: caret blinking {blinking:.3f}, stilled {stilled:.3f}; "
            f"idle CPU blinking/stilled: {blinking / stilled:.1f}x",
            flush=True,
        )

    if args.levers:
        c = args.lever_concurrency
        print(f"\ncapsule levers at c={c}\n{HEADER}", flush=True)
        levers = [
            Deployment("context per capsule", lambda: SharedBrowserBackend(renderers=None)),
            Deployment(f"shared renderers ({args.renderers})", capsules.backend),
            Deployment("+ warm pages", capsules.backend, warm_pages=args.warm_pages),
            Deployment("+ fork by capture", capsules.backend, warm_pages=args.warm_pages, fork_by="capture"),
            Deployment(f"  with {c} warm pages", capsules.backend, warm_pages=c, fork_by="capture"),
        ]
        for lever in levers:
            settle()
            r = run(lever, c, args.episodes)
            print_row(c, lever.name, r)
            print(
                f"    fork rebuilds: {r.fork_methods}; one renderer crash quarantined {r.blast_radius} "
                f"of {2 * c} live capsules",
                flush=True,
            )

    per_env: dict[str, float] = {}
    stopped: dict[str, str] = {}
    for concurrency in args.concurrency:
        print(f"\n{HEADER}", flush=True)
        results: dict[str, Measurement] = {}
        for deployment in deployments:
            name = deployment.name
            if name in stopped:
                continue
            if name in per_env:
                projected, free = per_env[name] * concurrency * MEMORY_HEADROOM, available_mib()
                if projected > free:
                    stopped[name] = (
                        f"stops before c={concurrency}: {projected / 1024:.1f} GiB projected "
                        f"(with {MEMORY_HEADROOM}x headroom) > {free / 1024:.1f} GiB available"
                    )
                    print(f"{concurrency:>3} {name:<26} {stopped[name]}", flush=True)
                    continue
            settle()
            try:
                r = results[name] = run(deployment, concurrency, args.episodes)
            except Exception as error:  # noqa: BLE001 - a deployment that fails at this load is a row of the table
                stopped[name] = f"stops at c={concurrency}: {type(error).__name__}: {error}"
                print(f"{concurrency:>3} {name:<26} {stopped[name]}", flush=True)
                continue
            per_env[name] = r.memory_mib
            print_row(concurrency, name, r)
        if "capsules" in results:
            caps = results["capsules"]
            print(
                f"capsule fork rebuilds: {caps.fork_methods}; one renderer crash quarantined "
                f"{caps.blast_radius} of {2 * concurrency} live capsules ({args.renderers} cells)"
            )
            print_ratios(concurrency, results)
    for name, why in stopped.items():
        print(f"{name}: {why}")


if __name__ == "__main__":
    main()
