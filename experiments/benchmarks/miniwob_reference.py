"""MiniWoB++'s own environment as the reference for "reset + first observation" latency.

What is measured: seconds for one `env.reset(seed=...)` of the `miniwob` package's Gymnasium
environment (`gymnasium.make("miniwob/<task>-v1")`), timed with `time.perf_counter` around
exactly that call. MiniWoB's reset returns the episode's first observation, so the time
covers: ending the previous episode, `Math.seedrandom(seed)`, starting the new episode and
waiting until the task reports ready, reading the utterance and the DOM, and a PNG
screenshot decoded to an array, all through Selenium and ChromeDriver.

How: one environment (one ChromeDriver, one headless Chromium, the task page loaded once)
serves every reset. MiniWoB's environment reuses its page: a reset re-seeds and restarts the
episode in the already loaded page rather than loading it again. One untimed reset warms the
page up first. Browser launch and page load are outside every timed reset.

Browser and driver: Debian's `/usr/bin/chromium` through Debian's `/usr/bin/chromedriver`,
named to miniwob through MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER, with SE_OFFLINE=true
so that Selenium Manager never downloads a driver or a browser. Those variables are set only
while miniwob creates its driver and restored afterwards. miniwob's headless flags already
include --no-sandbox (needed as root in a container) and --disable-gpu; Debian's launcher
adds --disable-dev-shm-usage when /dev/shm is small.

    python -m experiments.benchmarks.miniwob_reference [--task click-checkboxes] [--resets 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

from cua_jax.envs.capsules import process_tree

CHROMIUM_BINARY = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PROCESS_EXIT_WAIT_S = 5.0
WARM_UP_SEED = 1_000_000  # Gymnasium refuses negative seeds


@contextlib.contextmanager
def system_browser_variables() -> Iterator[None]:
    """Point miniwob at the system Chromium and ChromeDriver, Selenium Manager offline; restore after."""
    for path in (CHROMIUM_BINARY, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(
                f"{path} is missing (or not executable): the MiniWoB reference needs Debian's chromium and "
                "chromium-driver packages (launch/debian-packages.txt); nothing is downloaded instead"
            )
    values = {"MINIWOB_CHROME_BINARY": CHROMIUM_BINARY, "MINIWOB_CHROMEDRIVER": CHROMEDRIVER, "SE_OFFLINE": "true"}
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def running(pids: Sequence[int]) -> list[int]:
    """The pids in `pids` that are still running (zombies count as ended)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def terminate(pids: Sequence[int]) -> None:
    """SIGTERM whatever of `pids` still runs, then SIGKILL what outlives PROCESS_EXIT_WAIT_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in running(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + PROCESS_EXIT_WAIT_S
        while running(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not running(pids):
            return


def _chromedriver_children() -> set[int]:
    """ChromeDriver processes started by this process (Selenium starts the driver as a direct child)."""
    driver = os.path.realpath(CHROMEDRIVER)
    children = set()
    for pid in process_tree([os.getpid()]):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            executable = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if parent == os.getpid() and executable == driver:
            children.add(pid)
    return children


class MiniWoBSeleniumEnvironment:
    """One MiniWoB++ environment of the `miniwob` package, on the system Chromium; a context manager.

    Entering launches ChromeDriver and Chromium and loads the task page; leaving quits them
    and terminates any of their processes that outlive the quit, also after errors.
    """

    def __init__(self, task: str = "click-checkboxes"):
        self.task = task
        self.observation: dict[str, Any] | None = None  # the first observation of the current episode
        self._env = None
        self._driver_pid: int | None = None

    def open(self) -> MiniWoBSeleniumEnvironment:
        import gymnasium
        import miniwob  # noqa: F401  (registers the miniwob/* environments)

        before = _chromedriver_children()
        try:
            with system_browser_variables():
                self._env = gymnasium.make(f"miniwob/{self.task}-v1")
        except BaseException:
            # A driver whose page failed to load is lost inside miniwob: find it by its process.
            for pid in _chromedriver_children() - before:
                terminate(process_tree([pid]))
            raise
        self._driver_pid = self._env.unwrapped.instance.driver.service.process.pid
        return self

    @property
    def process_ids(self) -> list[int]:
        """ChromeDriver and every Chromium process under it (empty once closed)."""
        return process_tree([self._driver_pid]) if self._driver_pid is not None else []

    def reset(self, seed: int) -> dict[str, Any]:
        """Start a new episode with `seed`; return MiniWoB's first observation of it."""
        self.reset_and_observe(seed)
        return self.observation

    def reset_and_observe(self, seed: int) -> float:
        """Seconds for MiniWoB's reset with `seed`, which includes the first observation."""
        if self._env is None:
            raise RuntimeError("the environment is not open")
        # miniwob relaunches its driver inside reset if the old one died: keep it offline there too.
        with system_browser_variables():
            start = time.perf_counter()
            observation, _ = self._env.reset(seed=seed)
            elapsed = time.perf_counter() - start
        self.observation = observation
        return elapsed

    def close(self) -> None:
        if self._env is None:
            return
        pids = self.process_ids  # before quitting: Chromium leaves this tree once ChromeDriver exits
        try:
            self._env.close()  # quits the WebDriver session and stops ChromeDriver
        finally:
            terminate(pids)
            self._env, self._driver_pid = None, None

    def __enter__(self) -> MiniWoBSeleniumEnvironment:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def reset_latencies(task: str, seeds: Sequence[int], turn_s: float = 0.0) -> list[float]:
    """Seconds per reset + first observation of MiniWoB's own environment, one per seed, with
    `turn_s` seconds (an agent's turn) before each.

    One environment serves all of them, after one untimed warm-up reset.
    """
    with MiniWoBSeleniumEnvironment(task) as env:
        env.reset_and_observe(WARM_UP_SEED)
        latencies = []
        for seed in seeds:
            time.sleep(turn_s)
            latencies.append(env.reset_and_observe(seed))
        return latencies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="click-checkboxes")
    parser.add_argument("--resets", type=int, default=20, help="timed resets, seeds 0..n-1")
    args = parser.parse_args(argv)
    if args.resets < 2:
        parser.error("--resets must be at least 2 for a p90")

    milliseconds = [1000.0 * s for s in reset_latencies(args.task, range(args.resets))]
    p90 = statistics.quantiles(milliseconds, n=10, method="inclusive")[-1]
    print(
        f"MiniWoB++ own environment (Selenium, system Chromium), {args.task}, {args.resets} resets: "
        f"reset + first observation median {statistics.median(milliseconds):.1f} ms, p90 {p90:.1f} ms"
    )


if __name__ == "__main__":
    main()
