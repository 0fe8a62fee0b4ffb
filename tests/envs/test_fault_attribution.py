"""Environment faults quarantine with their cause; library bugs raise.

The classification rule (`faults.classify_environment_error`) on its own, then the MiniWoB
adapter of the agent loop on a real capsule runtime: a SIGKILLed shared browser, a bug in
the runtime's own code, a Playwright timeout and a closed page.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time

import psutil
import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.environments.kinds import environment_kind
from cua_jax.envs import actions as A
from cua_jax.envs import miniwob
from cua_jax.envs.capsules import (
    BrowserCrashedError,
    BuildTimeoutError,
    CapsuleFaultError,
    CapsuleFrozenError,
    CapsuleRuntime,
    LifecycleError,
    RuntimeBackend,
    RuntimeShutDownError,
    RuntimeStartError,
    UnknownEnvironmentError,
    process_alive,
)
from cua_jax.envs.contract import EnvironmentFault
from cua_jax.envs.faults import Fault, FaultKind, classify_environment_error
from cua_jax.envs.miniwob import EpisodeEndedError
from cua_jax.envs.miniwob import page as miniwob_page
from cua_jax.envs.miniwob_oracle import oracle_action
from cua_jax.rollout.rollout_worker import RolloutWorker
from cua_jax.train.collect import EnvironmentCounters
from cua_jax.types import EpisodeStatus


def _raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """`error` as raised `from cause` (its __cause__ set the way `raise ... from` sets it)."""
    try:
        raise error from cause
    except BaseException as caught:  # noqa: BLE001 - the point is to hold the raised error
        return caught


async def _timed_out_wait_for() -> BaseException:
    try:
        await asyncio.wait_for(asyncio.sleep(1), 0.001)
    except BaseException as error:  # noqa: BLE001
        return error
    raise AssertionError("wait_for did not time out")


# ------------------------------------------------------------------------------------
# The rule
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error,kind",
    [
        (TimeoutError("no answer"), FaultKind.SERVER_UNRESPONSIVE),
        (PlaywrightTimeoutError("Timeout 30000ms exceeded"), FaultKind.SERVER_UNRESPONSIVE),
        (ConnectionRefusedError("refused"), FaultKind.SERVER_UNRESPONSIVE),
        (BrokenPipeError("pipe"), FaultKind.SERVER_UNRESPONSIVE),
        (PlaywrightError("Target page, context or browser has been closed"), FaultKind.SERVER_ERROR),
        (OSError("no space left on device"), FaultKind.SERVER_ERROR),
        (OSError(errno.ECONNRESET, "reset by peer"), FaultKind.SERVER_UNRESPONSIVE),  # a ConnectionResetError
        (OSError(errno.EHOSTUNREACH, "no route to host"), FaultKind.SERVER_ERROR),
        (BrowserCrashedError("shared browser runtime shared-browser-1 is down"), FaultKind.BROWSER_CRASHED),
        (RuntimeShutDownError("the capsule runtime is shut down"), FaultKind.SERVER_UNRESPONSIVE),
        (RuntimeStartError("docker run cua-jax/chromium failed"), FaultKind.SETUP_FAILED),
        (UnknownEnvironmentError("no environment 'env-9'"), FaultKind.SERVER_UNRESPONSIVE),
        (BuildTimeoutError("building took longer than 180s"), FaultKind.SERVER_UNRESPONSIVE),
    ],
)
def test_infrastructure_errors_are_faults_of_their_kind(error, kind):
    fault = classify_environment_error(error)
    assert fault is not None and fault.kind is kind
    assert str(error) in fault.detail


def test_target_closed_is_a_playwright_error_fault():
    from playwright._impl._errors import TargetClosedError  # not re-exported by playwright.async_api

    fault = classify_environment_error(TargetClosedError())
    assert fault is not None and fault.kind is FaultKind.SERVER_ERROR


@pytest.mark.parametrize(
    "bug",
    [
        TypeError("unsupported operand"),
        AttributeError("'NoneType' object has no attribute 'page'"),
        KeyError("dom"),
        AssertionError("generation is None"),
        ValueError("not a DOM text line"),
        EpisodeEndedError("the episode already ended"),
        CapsuleFrozenError("frozen by reset"),
        LifecycleError("environment 'env-1' has no task; pass one"),
        # A wrong local path is this library's bug, not the environment's.
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/tmp/miniwob/click-button.html"),
        PermissionError(errno.EACCES, "Permission denied", "/proc/1/smaps_rollup"),
        NotADirectoryError(errno.ENOTDIR, "Not a directory", "/etc/hosts/x"),
        IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp"),
        OSError(errno.ENOENT, "No such file or directory"),  # Python makes it a FileNotFoundError
        _raised(LifecycleError("reset failed"), FileNotFoundError("task page missing")),
    ],
)
def test_library_bugs_are_not_faults(bug):
    assert classify_environment_error(bug) is None
    assert classify_environment_error(bug, setup=True) is None


def test_a_wrapper_is_judged_by_its_cause():
    crash = Fault(FaultKind.BROWSER_CRASHED, "shared browser runtime shared-browser-1 crashed")
    wrapped_bug = _raised(LifecycleError("reset failed; generation 3 stays published"), TypeError("bad argument"))
    wrapped_closed = _raised(LifecycleError("reset failed"), PlaywrightError("Target closed"))
    wrapped_crash = _raised(
        LifecycleError("reset failed"), _raised(CapsuleFaultError(crash), PlaywrightError("closed"))
    )
    assert classify_environment_error(wrapped_bug) is None
    assert classify_environment_error(wrapped_closed).kind is FaultKind.SERVER_ERROR
    assert "reset failed" in classify_environment_error(wrapped_closed).detail  # the outer error says where
    assert classify_environment_error(wrapped_crash) == crash
    # asyncio.wait_for raises TimeoutError from the CancelledError of the task it stopped.
    timed_out = asyncio.run(_timed_out_wait_for())
    assert classify_environment_error(timed_out).kind is FaultKind.SERVER_UNRESPONSIVE


def test_setup_errors_are_setup_failures_unless_they_name_their_fault():
    crash = BrowserCrashedError("shared browser runtime shared-browser-2 died")
    assert classify_environment_error(TimeoutError(), setup=True).kind is FaultKind.SETUP_FAILED
    assert classify_environment_error(PlaywrightError("closed"), setup=True).kind is FaultKind.SETUP_FAILED
    assert classify_environment_error(crash, setup=True).kind is FaultKind.BROWSER_CRASHED
    assert classify_environment_error(crash, setup=True).reason.startswith("browser crashed: ")


# ------------------------------------------------------------------------------------
# The adapter on a real runtime
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime():
    rt = CapsuleRuntime(call_timeout_s=120)
    yield rt
    rt.shutdown()


def _chromium_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if "chrom" in p.name().lower()}


@pytest.mark.browser
def test_sigkill_of_the_shared_browser_quarantines_running_episodes_and_resets_as_browser_crashed():
    """A batch of four episodes when the shared browser is SIGKILLed: a reset that reaches the
    dead browser before Playwright reports the disconnect, two running episodes, and a reset
    that follows. None ends as "setup failed": the first reset and the running episodes are
    "browser crashed"; the later reset is too, unless it waited for the relaunched browser
    and was built on it. After the relaunch every reset works."""
    rt = CapsuleRuntime(call_timeout_s=120)
    try:
        envs = [MiniWoBEnvironment(rt) for _ in range(4)]

        async def reset_or_fault(env, seed):
            try:
                await env.reset("click-button", seed=seed)
            except EnvironmentFault as error:
                return error.fault
            return None

        async def scenario():
            for i, env in enumerate(envs):
                await env.reset("click-button", seed=i)
            pid = rt.backend.browser_pid()
            assert pid in _chromium_children()  # the runtime's browser is the chromium this process started
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)  # blocks the runtime's loop: Playwright cannot report the disconnect yet
            assert not process_alive(pid) and not rt.crashes
            first_reset = await reset_or_fault(envs[0], 7)
            steps = [await env.step(A.Click("left_click", 500, 500)) for env in envs[1:3]]
            later_reset = await reset_or_fault(envs[3], 8)
            return first_reset, steps, later_reset

        crashed_runtime = rt.backend.runtime_id
        first_reset, steps, later_reset = rt.run_async(scenario())
        assert first_reset is not None and first_reset.kind is FaultKind.BROWSER_CRASHED, first_reset
        assert first_reset.reason.startswith("browser crashed: ") and crashed_runtime in first_reset.reason
        for transition in steps:
            assert transition.outcome.status is EpisodeStatus.QUARANTINED
            assert transition.outcome.reason.startswith("browser crashed: "), transition.outcome.reason
            assert crashed_runtime in transition.outcome.reason
        if later_reset is None:
            assert rt.runtime_of(envs[3].env_id) != crashed_runtime
        else:
            assert later_reset.kind is FaultKind.BROWSER_CRASHED, later_reset
        deadline = time.monotonic() + 30
        while not rt.crashes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [runtime_id for runtime_id, _ in rt.crashes] == [crashed_runtime]
        # Once the disconnect is reported every capsule of the dead browser carries the crash.
        for env in envs[:3]:
            assert rt.quarantine_reason(env.env_id).startswith("browser crashed: ")

        async def recover():
            for i, env in enumerate(envs):
                reset = await env.reset("click-button", seed=10 + i)
                assert reset.instruction
            return [await rt.aobserve(env.env_id) for env in envs]

        observations = rt.run_async(recover())
        assert rt.backend.restarts == 1 and rt.backend.runtime_id != crashed_runtime
        for env, observation in zip(envs, observations):
            assert rt.quarantine_reason(env.env_id) is None
            assert rt.step(env.env_id, oracle_action(observation)).success
    finally:
        rt.shutdown()


@pytest.mark.browser
def test_a_bug_in_the_runtime_raises_out_of_step_and_reset(runtime, monkeypatch):
    env = MiniWoBEnvironment(runtime)

    async def broken_step_page(generation, action):
        raise TypeError("_step_page() got an unexpected keyword argument")

    async def broken_begin_episode(self, seed, time_limit_ms=None):
        raise AttributeError("'MiniWoBPage' object has no attribute 'seed_rng'")

    async def scenario():
        await env.reset("click-button", seed=1)
        with monkeypatch.context() as patch:
            patch.setattr(runtime, "_step_page", broken_step_page)
            with pytest.raises(TypeError, match="unexpected keyword"):
                await env.step(A.Click("left_click", 500, 500))
        assert runtime.quarantine_reason(env.env_id) is None  # a bug quarantines nothing
        with monkeypatch.context() as patch:
            patch.setattr(miniwob.MiniWoBPage, "begin_episode", broken_begin_episode)
            with pytest.raises(LifecycleError) as caught:
                await env.reset("click-button", seed=2)
        assert isinstance(caught.value.__cause__, AttributeError)
        transition = await env.step(A.Screenshot())  # the published generation still serves
        assert transition.outcome is None and transition.observation is not None
        await env.close()

    runtime.run_async(scenario())


@pytest.mark.browser
def test_a_playwright_timeout_in_a_step_quarantines_as_unresponsive(runtime):
    env = MiniWoBEnvironment(runtime)

    async def scenario():
        await env.reset("click-button", seed=3)
        driver = runtime._routes[env.env_id].generation.driver
        # The step's screenshot waits on the page through Playwright, which gives up after 1 ms.
        driver.screenshot = lambda: driver.page.wait_for_function("() => false", timeout=1)
        transition = await env.step(A.Click("left_click", 500, 500))
        await env.close()
        return transition

    transition = runtime.run_async(scenario())
    assert transition.outcome.status is EpisodeStatus.QUARANTINED
    assert transition.outcome.reason.startswith("server unresponsive: "), transition.outcome.reason
    assert "Timeout 1ms exceeded" in transition.outcome.reason


@pytest.mark.browser
def test_a_closed_page_quarantines_as_a_server_error_and_only_its_capsule(runtime):
    victim, bystander = MiniWoBEnvironment(runtime), MiniWoBEnvironment(runtime)

    async def scenario():
        await victim.reset("click-button", seed=4)
        await bystander.reset("click-button", seed=5)
        await runtime._routes[victim.env_id].generation.driver.page.close()
        closed = await victim.step(A.Click("left_click", 500, 500))
        served = await bystander.step(A.Screenshot())
        reset = await victim.reset("click-button", seed=6)  # a fresh generation replaces the closed page
        after = await victim.step(A.Screenshot())
        for env in (victim, bystander):
            await env.close()
        return closed, served, reset, after

    closed, served, reset, after = runtime.run_async(scenario())
    assert closed.outcome.status is EpisodeStatus.QUARANTINED
    assert closed.outcome.reason.startswith("server error: "), closed.outcome.reason
    assert "closed" in closed.outcome.reason
    assert served.outcome is None and served.observation is not None
    assert reset.instruction and after.outcome is None


@pytest.mark.browser
def test_a_playwright_timeout_during_setup_is_a_setup_failure(runtime, monkeypatch):
    env = MiniWoBEnvironment(runtime)
    monkeypatch.setattr(miniwob_page, "PAGE_TIMEOUT_MS", 300)  # read where the page sets it
    # A page without MiniWoB: waiting for its task to load times out in Playwright.
    monkeypatch.setattr(
        runtime.backend, "task_url", lambda server, task, site=None: "data:text/html,<p>no task here</p>"
    )

    async def scenario():
        with pytest.raises(EnvironmentFault) as caught:
            await env.reset("click-button", seed=1)
        return caught.value

    raised = runtime.run_async(scenario())
    assert raised.fault.kind is FaultKind.SETUP_FAILED and "Timeout 300ms exceeded" in raised.fault.reason
    assert isinstance(raised.__cause__.__cause__, PlaywrightTimeoutError)  # LifecycleError from the timeout
    assert env.env_id is None  # nothing was published


@pytest.mark.browser
def test_a_shut_down_runtime_is_a_fault_not_a_hang():
    rt = CapsuleRuntime(call_timeout_s=120)
    env = MiniWoBEnvironment(rt)

    async def reset():
        await env.reset("click-button", seed=1)

    rt.run_async(reset())
    rt.shutdown()
    with pytest.raises(RuntimeShutDownError):
        rt.observe(env.env_id)

    async def step_after_shutdown():
        started = time.monotonic()
        transition = await env.step(A.Screenshot())
        await env.close()  # nothing left to close: quietly done
        return transition, time.monotonic() - started

    transition, seconds = asyncio.run(step_after_shutdown())
    assert transition.outcome.status is EpisodeStatus.QUARANTINED
    assert transition.outcome.reason.startswith("server unresponsive: ") and "shut down" in transition.outcome.reason
    assert seconds < 5


class _PagelessBackend(RuntimeBackend):
    """A browser that gives no pages: every open_slot raises `error`."""

    def __init__(self, error: Exception):
        self.error = error

    async def start(self, playwright, on_crash):
        pass

    async def open_slot(self):
        raise self.error

    async def close(self):
        pass

    def pids(self):
        return []


@pytest.mark.parametrize(
    "error,level",
    [
        (ConnectionResetError(errno.ECONNRESET, "browser gone"), logging.WARNING),
        (TypeError("open_slot() takes no arguments"), logging.ERROR),
    ],
)
def test_a_page_that_fails_to_warm_is_counted_and_logged_with_its_traceback(caplog, error, level):
    rt = CapsuleRuntime(_PagelessBackend(error), warm_pages=1, call_timeout_s=60)
    try:
        with caplog.at_level(logging.WARNING, logger="cua_jax.envs.capsules.runtime"):
            rt.run_async(rt._warm_one("click-button"))
            rt.run_async(rt._warm_one("click-button"))
        assert rt.warm_pool_failures == 2
        records = [r for r in caplog.records if "warming a click-button page failed" in r.getMessage()]
        assert len(records) == 2 and all(r.levelno == level and r.exc_info[1] is error for r in records)
    finally:
        rt.shutdown()


class _RuntimeOnlyWorker:
    """A rollout worker's environment side alone: its capsule runtime, reported the worker's way."""

    environment_stats = RolloutWorker.environment_stats

    def __init__(self, runtime):
        self.kinds = {"miniwob": environment_kind("miniwob")}
        self.resources = {"miniwob": runtime}


def test_a_page_that_fails_to_warm_reaches_the_step_metrics_as_a_count_per_update():
    rt = CapsuleRuntime(_PagelessBackend(ConnectionResetError(errno.ECONNRESET, "browser gone")), warm_pages=1)
    try:
        worker, counters = _RuntimeOnlyWorker(rt), EnvironmentCounters()
        assert counters.read([worker])["capsules/warm_failures"] == 0.0
        rt.run_async(rt._warm_one("click-button"))
        rt.run_async(rt._warm_one("click-button"))
        stats = worker.environment_stats()
        assert stats["capsules/warm_failures"] == 2.0 and stats["capsules/browser_crashes"] == 0.0
        assert counters.read([worker])["capsules/warm_failures"] == 2.0
        rt.run_async(rt._warm_one("click-button"))
        # each update counts its own failures; two workers' counts add up
        assert counters.read([worker])["capsules/warm_failures"] == 1.0
        assert counters.read([worker, worker])["capsules/warm_failures"] == 3.0
    finally:
        rt.shutdown()
