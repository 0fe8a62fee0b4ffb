"""State capsules: many MiniWoB environments on one shared, initialised browser runtime.

CUA-Sandbox (§3) observes that a trajectory needs its own mutable state, not its own
runtime. Here the runtime is one Chromium process (launched once, through Playwright);
each environment is a *capsule*: a page on a site of its own (so its own cookies, storage,
IndexedDB and cache), in one of a few *cells* that share a renderer process each
(SharedBrowserBackend; or a browser context per capsule), the task and its seed, reached
through a *route* keyed by the environment id. A route publishes one *generation* of the
capsule at a time; every generation gets a new page on a new site.

Lifecycle operations are transactions (CUA-Sandbox §3.4):

    freeze the route  -> requests arriving now are refused with CapsuleFrozenError
    drain             -> wait until requests already admitted have finished
    build successor   -> a new page (a warm one when the pool has it), prepared off the route
    publish           -> one assignment on the event loop swaps the route to the successor
    retire            -> the old generation's page is closed once the caller has its observation

If building fails, the route keeps its previous generation (LifecycleError says so) and the
half-built successor is closed. All route bookkeeping runs on one asyncio event loop, so
admission (check frozen, count in-flight) and publication are atomic with respect to each
other; `publications` records, for every publish, how many requests were in flight (0 by
construction, checked by the tests).

How fork reproduces state: from captured page state where that is exact, else by *replay*.
`snapshot` asks `miniwob_state.capture_state` for the page's state (form fields, focus,
selection, scroll, element ids, MiniWoB's globals), which it gives only when none of the
task's own code has run since the episode began; a fork then begins the same seed on a
fresh page and writes that state, and a fingerprint check sends a mismatch back to replay.
Otherwise (and with fork_by="replay") the fork replays. A generation records its task, its
seed and the prefix of actions it performed. MiniWoB generates every problem from `Math.seedrandom`
(core.js), and its handlers are deterministic functions of the DOM and the input events,
so loading the task, seeding, starting the episode and replaying the prefix rebuilds the
same DOM, pixels and reward state (the tests check observation equality and equal rewards
under the same next actions). The one quantity replay cannot reproduce is wall-clock time:
after replay the fork's MiniWoB clock is moved to the parent's elapsed time at the snapshot
and its time limit re-armed, so the fork keeps the time the parent had left then. Replay is
exact for tasks whose state is a function of the seed and the input events (the scripted
tasks and most of MiniWoB); tasks that move on their own clock (chase-circle, moving
targets) come back at the same seed and inputs but not the same animation phase (and capture
refuses them). `snapshot` captures (task, seed, prefix, elapsed time, page state) without
building anything; `fork` builds a new capsule
from an environment or a snapshot; `restore` replaces an environment's generation by one.

Faults: when the shared browser disconnects (crash, killed process), every capsule on it is
quarantined as "browser crashed: ..." (steps return EpisodeStatus.QUARANTINED with that
`fault`) and the backend relaunches the runtime; `reset` (or `restore`) of a quarantined
environment builds a fresh generation on the new runtime. When one renderer process dies,
each page it hosted reports the crash and exactly those capsules (one cell's) are
quarantined as "renderer crashed: ..."; the browser and the other cells serve on. The runtime remembers which
runtimes died, and asks the backend whether a runtime's browser still lives, so a request
that fails because its browser died (even before the disconnect is reported), and a build
that fails until the browser is back, also carry the browser crash (CapsuleFaultError,
BrowserCrashedError) rather than a setup or page failure. A Playwright error or timeout
inside one capsule whose browser lives quarantines only that capsule. An exception that
`faults.classify_environment_error` does not call an infrastructure fault is a bug in this
library and raises. Malformed action text becomes an invalid-action step; an action after
the episode ended raises EpisodeEndedError; unknown tasks raise UnknownTaskError; unknown
environment ids raise UnknownEnvironmentError.

The runtime is generic over a `RuntimeBackend` that hands out browser pages: the shared
browser here, and one browser or one container per environment in
`cua_jax.envs.browser_baselines`, so baselines run the same code path.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import itertools
import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.faults import Fault, FaultError, FaultKind, classify_environment_error
from cua_jax.envs.miniwob import (
    CHROMIUM_ARGS,
    CHROMIUM_EXECUTABLE,
    VIEWPORT,
    EpisodeEndedError,
    InvalidElementError,
    MiniWoBObservation,
    MiniWoBPage,
    MiniWoBServer,
    check_task,
    unsupported_reason,
)
from cua_jax.envs.miniwob_state import (
    PageState,
    StateRestoreMismatch,
    capture_state,
    install_state_recorder,
    restore_state,
)
from cua_jax.types import EpisodeStatus

log = logging.getLogger(__name__)

CrashCallback = Callable[[str, str], None]  # (runtime id, reason)


class CapsuleError(RuntimeError):
    """Base of the errors the capsule runtime raises about environments."""


class UnknownEnvironmentError(CapsuleError, LookupError, FaultError):
    """An environment id that no route holds (never created, or closed). To an episode that
    holds the id, its capsule was closed under it: the runtime no longer serves it."""

    fault_kind = FaultKind.SERVER_UNRESPONSIVE


class BrowserCrashedError(CapsuleError, FaultError):
    """The browser runtime a capsule needs died (crash, killed process) and is not back yet."""

    fault_kind = FaultKind.BROWSER_CRASHED


class RuntimeStartError(CapsuleError, FaultError):
    """A runtime a capsule needs (a browser, a container) could not be started."""

    fault_kind = FaultKind.SETUP_FAILED


class RuntimeShutDownError(CapsuleError, FaultError):
    """A request reached a runtime that has been shut down."""

    fault_kind = FaultKind.SERVER_UNRESPONSIVE


class CapsuleFaultError(CapsuleError, FaultError):
    """A request failed on a fault the runtime attributes: its capsule is quarantined, or the
    runtime serving it died or is shutting down."""

    def __init__(self, fault: Fault):
        super().__init__(fault.reason)
        self._fault = fault

    @property
    def fault(self) -> Fault:
        return self._fault


class BuildTimeoutError(CapsuleError, TimeoutError):
    """Building a capsule generation took longer than the runtime's build_timeout_s."""


class CapsuleFrozenError(CapsuleError):
    """A request reached a route frozen by a lifecycle transaction; retry after it publishes."""


class LifecycleError(CapsuleError):
    """A lifecycle transaction failed; the previous generation stays published."""


# ------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CapsuleSnapshot:
    """Everything needed to rebuild a capsule: task, seed, action prefix, clock, and the
    captured page state when capture is exact for it (`miniwob_state`); otherwise
    `replay_reason` says why a rebuild replays the prefix instead."""

    task: str
    seed: int
    actions: tuple[A.Action, ...]
    elapsed_ms: float | None  # None once the episode has ended
    source_env: str
    source_generation: int
    page_state: PageState | None = None
    replay_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one step.

    reward / env_reward: MiniWoB's raw reward and its time-scaled reward (0 until done).
    status: SUCCESS / FAILURE once done, QUARANTINED when the infrastructure ended the
    episode (then `quarantine_reason` says why), None while the episode runs.
    invalid_action: the parser's or the environment's message when the action was not
    performed (the page is unchanged). generation: the capsule generation that served it.
    fault: the infrastructure fault behind a quarantine; `quarantine_reason` is its reason.
    """

    observation: MiniWoBObservation | None
    reward: float
    env_reward: float
    done: bool
    success: bool
    status: EpisodeStatus | None
    generation: int
    invalid_action: str | None = None
    quarantine_reason: str | None = None
    reason: str | None = None  # MiniWoB's reason for the reward, e.g. "timed out"
    fault: Fault | None = None


@dataclasses.dataclass(frozen=True)
class PublicationRecord:
    """One publish of a route: which generation replaced which, and the in-flight count then."""

    env_id: str
    operation: str
    previous_generation: int | None
    generation: int
    in_flight_at_publish: int


# ------------------------------------------------------------------------------------
# Backends: where capsules' pages come from
# ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Slot:
    """A browser context and its page on the runtime `runtime_id`; `release` frees them.

    site: the host name the page must load its task from, when the backend isolates capsules
    by site (capsules sharing a browser context and its renderer); None: the backend's own
    task URL.
    """

    runtime_id: str
    context: Any
    page: Any
    release: Callable[[], Coroutine[Any, Any, None]]
    site: str | None = None
    cell: int | None = None  # the shared renderer's cell, when the backend shares renderers
    fault: Fault | None = None  # set when the page's renderer crashed


class RuntimeBackend(abc.ABC):
    """Hands out pages for capsules. All methods run on the runtime's event loop."""

    name: str = "backend"

    @abc.abstractmethod
    async def start(self, playwright: Any, on_crash: CrashCallback) -> None:
        """Prepare the backend; call `on_crash(runtime_id, reason)` when a runtime dies."""

    @abc.abstractmethod
    async def open_slot(self) -> Slot:
        """A fresh, private browser context with one page."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every runtime this backend started."""

    @abc.abstractmethod
    def pids(self) -> list[int]:
        """Root processes of the runtimes (their descendants belong to them too)."""

    def runtime_alive(self, runtime_id: str) -> bool:
        """False when the runtime is known to be gone. A backend that cannot tell answers True
        and relies on `on_crash` alone."""
        return True

    serves_over_http = True  # pages load tasks from the runtime's MiniWoBServer

    def task_url(self, server: MiniWoBServer, task: str, site: str | None = None) -> str:
        """The URL a page of this backend opens for `task`; `site`: the slot's own host name
        (`Slot.site`), which resolves to the same server."""
        return server.task_url(task) if site is None else server.task_url(task, host=site)


def launch_marker() -> str:
    """A unique, inert command-line switch that identifies one launched browser process."""
    return f"--cua-jax-runtime={uuid.uuid4().hex}"


def command_line(pid: int) -> list[bytes] | None:
    """The arguments `pid` was started with (/proc/<pid>/cmdline); None once it has exited."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def find_browser_pid(marker: str) -> int | None:
    """The pid of the browser process launched with `marker` (its children carry --type=)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = command_line(int(entry))
        if argv is not None and marker.encode() in argv and not any(a.startswith(b"--type=") for a in argv):
            return int(entry)
    return None


async def launch_browser(playwright: Any, marker: str, extra_args: Iterable[str] = ()) -> Any:
    """The system Chromium, headless, background networking off (never a downloaded browser)."""
    return await playwright.chromium.launch(
        executable_path=CHROMIUM_EXECUTABLE, headless=True, args=[*CHROMIUM_ARGS, *extra_args, marker]
    )


CAPSULE_SITE_DOMAIN = "test"  # RFC 2606's reserved top-level domain: never a real host


def renderer_sharing_args() -> list[str]:
    """Chromium switches that make the pages of one browser context share a renderer process:
    a process limit of 1 (past it Chromium reuses a process of the same context; processes of
    different contexts are never shared, so each context keeps one), site isolation off (else
    every site needs a process of its own), and every `<name>.test` host resolved to the
    loopback MiniWoB server. Capsules keep private storage because each generation's page
    lives on a site of its own (see SharedBrowserBackend)."""
    return [
        "--renderer-process-limit=1",
        "--disable-site-isolation-trials",
        "--disable-features=IsolateOrigins,site-per-process",
        f"--host-resolver-rules=MAP *.{CAPSULE_SITE_DOMAIN} 127.0.0.1",
    ]


class SharedBrowserBackend(RuntimeBackend):
    """One Chromium for every capsule.

    renderers=None: each capsule generation gets its own browser context, so Chromium gives it
    renderer processes of its own (a fixed cost per capsule). renderers=R: R *cells*, each a
    browser context whose pages share one renderer process; every generation's page opens in
    the cell with the fewest pages, on a host of its own (`c<n>.test`, never reused). A page's
    cookies, local storage, IndexedDB and HTTP cache are keyed by its site, and `.test` names
    are registrable domains of an unlisted suffix, so no page can reach another's storage or
    set a cookie for a parent domain; releasing a generation closes its page and clears its
    origin's data. The price is a shared fate: a renderer that crashes takes down every page
    of its cell, and `CapsuleRuntime` quarantines exactly those capsules (each page reports
    the crash); `Slot.cell` says which capsules share a fate.

    When the browser disconnects without being asked to close, `on_crash` quarantines its
    capsules and a new browser is launched; slots opened afterwards live on it.
    """

    name = "capsules"

    def __init__(self, renderers: int | None = 2) -> None:
        self._playwright: Any = None
        self._on_crash: CrashCallback | None = None
        self._browser: Any = None
        self._marker = ""
        self._pid: int | None = None
        self._runtime_id = ""
        self._ready: asyncio.Future | None = None
        self._closing = False
        self._launches = itertools.count(1)
        self._restarts = 0
        if renderers is not None and renderers < 1:
            raise ValueError(f"renderers must be at least 1 (or None for a context per capsule), got {renderers}")
        self.renderers = renderers
        self._cells: list[Any] = []  # renderers=R: one browser context per shared renderer
        self._cell_pages: list[int] = []  # live pages per cell
        self._browser_cdp: Any = None  # clears a released site's data
        self._sites = itertools.count(1)

    @property
    def runtime_id(self) -> str:
        return self._runtime_id

    @property
    def restarts(self) -> int:
        """How many times the shared browser has been relaunched after a crash."""
        return self._restarts

    async def start(self, playwright: Any, on_crash: CrashCallback) -> None:
        self._playwright, self._on_crash = playwright, on_crash
        self._ready = asyncio.ensure_future(self._launch())
        await self._ready

    async def _launch(self) -> None:
        self._marker = launch_marker()
        extra = [] if self.renderers is None else renderer_sharing_args()
        browser = await launch_browser(self._playwright, self._marker, extra)
        runtime_id = f"shared-browser-{next(self._launches)}"
        browser.on("disconnected", lambda _: self._disconnected(runtime_id))
        if self.renderers is not None:
            self._cells = [await browser.new_context(viewport=VIEWPORT) for _ in range(self.renderers)]
            self._cell_pages = [0] * self.renderers
            self._browser_cdp = await browser.new_browser_cdp_session()
        self._browser, self._runtime_id = browser, runtime_id
        self._pid = find_browser_pid(self._marker)

    def _disconnected(self, runtime_id: str) -> None:
        if self._closing or runtime_id != self._runtime_id:
            return
        self._browser = None
        assert self._on_crash is not None
        self._on_crash(runtime_id, f"shared browser runtime {runtime_id} crashed (browser disconnected)")
        self._restarts += 1
        self._ready = asyncio.ensure_future(self._launch())

    def runtime_alive(self, runtime_id: str) -> bool:
        # A runtime replaced by a relaunch is dead; the current one lives while its browser is
        # connected and its process runs (a killed process is gone before Playwright reports it).
        if runtime_id != self._runtime_id or self._browser is None or not self._browser.is_connected():
            return False
        return self._pid is None or process_alive(self._pid)

    async def open_slot(self) -> Slot:
        assert self._ready is not None, "start() the backend first"
        launch = self._ready
        try:
            await launch
        except Exception as error:
            if self._restarts == 0 or self._closing:
                raise  # the first launch failed: there was no crash
            if self._ready is launch:  # the relaunch after a crash failed: the next slot tries again
                self._ready = asyncio.ensure_future(self._launch())
            raise BrowserCrashedError(f"shared browser runtime crashed and its relaunch failed: {error}") from error
        browser, runtime_id = self._browser, self._runtime_id
        if browser is None:
            raise BrowserCrashedError(f"shared browser runtime {runtime_id} is down")
        if self.renderers is not None:
            return await self._open_shared_slot(runtime_id)
        try:
            context = await browser.new_context(viewport=VIEWPORT)
        except Exception as error:
            if not self.runtime_alive(runtime_id):
                raise BrowserCrashedError(f"shared browser runtime {runtime_id} died: {error}") from error
            raise
        try:
            page = await context.new_page()
        except BaseException as error:
            await _close_quietly(context.close)
            if isinstance(error, Exception) and not self.runtime_alive(runtime_id):
                raise BrowserCrashedError(f"shared browser runtime {runtime_id} died: {error}") from error
            raise
        return Slot(runtime_id, context, page, context.close)

    async def _open_shared_slot(self, runtime_id: str) -> Slot:
        cell = min(range(len(self._cells)), key=self._cell_pages.__getitem__)
        context, cdp, counts = self._cells[cell], self._browser_cdp, self._cell_pages
        counts[cell] += 1  # before the await: slots opened meanwhile see it and balance
        site = f"c{next(self._sites)}.{CAPSULE_SITE_DOMAIN}"
        try:
            page = await context.new_page()
        except BaseException as error:
            counts[cell] -= 1
            if isinstance(error, Exception) and not self.runtime_alive(runtime_id):
                raise BrowserCrashedError(f"shared browser runtime {runtime_id} died: {error}") from error
            raise

        async def release() -> None:
            counts[cell] -= 1
            origin = page.url.split("/miniwob/", 1)[0] if site in page.url else None
            await page.close()
            if origin is not None:  # the site is never used again: its data would only pile up
                await cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})

        return Slot(runtime_id, context, page, release, site=site, cell=cell)

    def renderer_pids(self) -> list[int]:
        """The browser's live renderer processes (a cell's, and any spare Chromium keeps)."""
        pid = self.browser_pid()
        # Chromium rewrites its children's command lines into one space-joined argument: a substring test.
        return [
            child
            for child in process_tree([pid] if pid else [])
            if any(b"--type=renderer" in arg for arg in command_line(child) or ())
        ]

    def cell_pages(self) -> list[int]:
        """Live pages per cell (renderers=R): how many capsules each renderer's crash would end."""
        return list(self._cell_pages)

    def browser_pid(self) -> int | None:
        return find_browser_pid(self._marker) if self._marker else None

    def pids(self) -> list[int]:
        pid = self.browser_pid()
        return [pid] if pid else []

    async def close(self) -> None:
        self._closing = True
        if self._ready is not None and not self._ready.done():
            await asyncio.wait([self._ready])
        if self._browser is not None:
            await self._browser.close()
            self._browser = None


# ------------------------------------------------------------------------------------
# Processes and memory
# ------------------------------------------------------------------------------------


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_tree(roots: Iterable[int]) -> list[int]:
    """`roots` and all their live descendants (from /proc/*/stat parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    seen: list[int] = []
    stack = [r for r in roots if os.path.exists(f"/proc/{r}")]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack.extend(children.get(pid, ()))
    return seen


@dataclasses.dataclass(frozen=True)
class PssReading:
    """Summed proportional set size of a set of processes, and which of them could not be read.

    pss_bytes: the sum over the processes read. unreadable: pids that exist but whose
    /proc/<pid>/smaps_rollup could not be read (permissions, a kernel without it): their
    memory is missing from pss_bytes, so a report must say so. exited: pids gone before
    they were read (nothing of theirs is live).
    """

    pss_bytes: int
    read: int
    unreadable: tuple[int, ...]
    exited: tuple[int, ...]


def read_pss(pids: Iterable[int]) -> PssReading:
    """The PSS of `pids` (/proc/<pid>/smaps_rollup), counting the processes it could not read."""
    total, read, unreadable, exited = 0, 0, [], []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), None)
        except (FileNotFoundError, ProcessLookupError):
            exited.append(pid)
            continue
        except OSError:
            (unreadable if os.path.exists(f"/proc/{pid}") else exited).append(pid)
            continue
        if pss is None:  # no memory map: a zombie holds no memory; anything else is unaccounted for
            (unreadable if process_alive(pid) else exited).append(pid)
            continue
        total += pss
        read += 1
    return PssReading(total, read, tuple(unreadable), tuple(exited))


# ------------------------------------------------------------------------------------
# Routes and generations
# ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Generation:
    number: int
    slot: Slot
    driver: MiniWoBPage
    seed: int
    actions: list[A.Action]
    ended: bool = False  # the caller has been told the episode is done
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    @property
    def task(self) -> str:
        return self.driver.task


@dataclasses.dataclass
class _Route:
    env_id: str
    generation: _Generation | None = None
    frozen: str | None = None  # the operation holding the freeze
    fault: Fault | None = None  # set: the published generation is quarantined
    in_flight: int = 0
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def quarantine_reason(self) -> str | None:
        return None if self.fault is None else self.fault.reason


FORK_METHODS = ("capture", "replay")


@dataclasses.dataclass(frozen=True)
class CapsuleOptions:
    """How a runtime's capsules share their browser: `renderers` cells sharing a renderer
    process each (0: a browser context, and renderers, per capsule), `warm_pages` loaded pages
    per task kept ready, fork and restore by captured state or by replay (`fork_by`)."""

    renderers: int = 2
    warm_pages: int = 2
    fork_by: str = "capture"

    def __post_init__(self) -> None:
        if self.renderers < 0 or self.warm_pages < 0:
            raise ValueError(
                f"capsule renderers and warm_pages must be 0 or more, got {self.renderers}, {self.warm_pages}"
            )
        if self.fork_by not in FORK_METHODS:
            raise ValueError(f"capsule fork_by must be one of {FORK_METHODS}, got {self.fork_by!r}")

    @classmethod
    def from_config(cls, section: Any) -> CapsuleOptions:
        """From an experiment config's `env.capsules` section."""
        return cls(int(section.renderers), int(section.warm_pages), str(section.fork_by))

    def runtime(self, **kwargs: Any) -> CapsuleRuntime:
        """A CapsuleRuntime on a shared browser with these options (kwargs: its other arguments)."""
        backend = SharedBrowserBackend(renderers=self.renderers or None)
        return CapsuleRuntime(backend, warm_pages=self.warm_pages, fork_by=self.fork_by, **kwargs)


class CapsuleRuntime:
    """MiniWoB environments as capsules on a backend's runtimes (default: one shared browser).

    Every public method is thread-safe and blocking; its `a`-prefixed twin is a coroutine
    for the runtime's own event loop (`run_async` schedules a coroutine there). Playwright
    and all route bookkeeping live on that loop, in a thread the runtime owns.

    Environment API (env ids are strings):
        create(task, seed=None) -> env_id              first generation, episode started
        reset(env_id, seed=None, task=None) -> MiniWoBObservation
        observe(env_id) -> MiniWoBObservation
        step(env_id, action: Action | InvalidAction | str) -> StepResult
        snapshot(env_id) -> CapsuleSnapshot
        fork(env_id | CapsuleSnapshot) -> env_id       a new capsule in the same state
        restore(env_id, snapshot) -> MiniWoBObservation
        close(env_id); shutdown()
        evaluate(env_id, js) -> Any                    JavaScript in the page (evaluators, tests)
        runtime_of(env_id), cell_of(env_id), generation_of(env_id), quarantine_reason(env_id), pids()

    time_limit_s replaces MiniWoB's per-task episode limits (None keeps them), for every
    generation: created, reset, forked or restored. action_space (`actions.ACTION_SPACES`)
    says which pointer actions steps accept; other than "coordinates", screenshots show the
    element ids (set-of-marks) and `click_element` / `fill_element` act by id.

    Every step is bounded by step_timeout_s (plus the action's own wait) and every build by
    build_timeout_s: a hung page quarantines its capsule instead of hanging the caller.

    warm_pages: how many loaded, not yet started pages of each task the runtime keeps ready
    (0: none). A build takes one when it can, so a reset or fork begins on a page already
    loaded, and a replacement loads in the background; a task gets its pool once it is built
    the first time. fork_by: "capture" rebuilds snapshots from captured page state where that
    is exact (`miniwob_state`) and by replay elsewhere, "replay" always replays;
    `fork_methods` counts which way each rebuild went (with the reason for each replay).
    """

    def __init__(
        self,
        backend: RuntimeBackend | None = None,
        *,
        include_dom_text: bool = False,
        action_space: str = "coordinates",
        seed: int = 0,
        call_timeout_s: float = 300.0,
        step_timeout_s: float = 60.0,
        build_timeout_s: float = 180.0,
        time_limit_s: float | None = None,
        warm_pages: int = 0,
        fork_by: str = "capture",
    ):
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive (or None for MiniWoB's own limits), got {time_limit_s}")
        if warm_pages < 0:
            raise ValueError(f"warm_pages must be 0 or more, got {warm_pages}")
        if fork_by not in FORK_METHODS:
            raise ValueError(f"fork_by must be one of {FORK_METHODS}, got {fork_by!r}")
        self.warm_pages = int(warm_pages)
        self.fork_by = fork_by
        self.fork_methods: collections.Counter[str] = collections.Counter()
        self.renderer_crashes: list[str] = []  # the quarantine reason of each capsule a renderer crash ended
        self.warm_pool_failures = 0  # pages that failed to warm (their builds load cold); each is logged
        self.warm_builds = 0  # generations built on a warm page
        self.cold_builds = 0  # generations that loaded their own page
        self._warm: dict[str, list[tuple[Slot, MiniWoBPage]]] = {}
        self._warming: collections.Counter[str] = collections.Counter()
        self._background: set[asyncio.Task] = set()
        self._retired: list[Slot] = []  # pages of unpublished generations, not yet freed
        self.backend = backend or SharedBrowserBackend()
        self.include_dom_text = include_dom_text
        self.action_space = A.check_action_space(action_space)
        self.time_limit_s = time_limit_s
        self.call_timeout_s = call_timeout_s
        self.step_timeout_s = step_timeout_s
        self.build_timeout_s = build_timeout_s
        self.publications: list[PublicationRecord] = []
        self.crashes: list[tuple[str, str]] = []  # (runtime id, reason)
        self._crash_faults: dict[str, Fault] = {}  # runtime id -> its crash, for every runtime that died
        self._shutting_down = False
        self._stopped = False
        self._rng = random.Random(seed)
        self._routes: dict[str, _Route] = {}
        self._generation_ids = itertools.count(1)
        self._env_ids = itertools.count(1)
        self._server = MiniWoBServer()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="capsule-runtime", daemon=True)
        self._thread.start()
        self._playwright_cm: Any = None
        self._playwright: Any = None
        try:
            self.run_async(self._start())
        except BaseException:
            self._stop_loop()
            raise

    # ---- plumbing -------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the a-methods must run on (Playwright lives there)."""
        return self._loop

    def run_async(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the runtime's loop and wait for its result (bounded by call_timeout_s)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking call from the runtime's own loop; await the a-method instead")
        if self._stopped:
            coro.close()
            raise RuntimeShutDownError("the capsule runtime is shut down")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.call_timeout_s)

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        self._playwright_cm = async_playwright()
        self._playwright = await self._playwright_cm.__aenter__()
        await self.backend.start(self._playwright, self._runtime_crashed)

    def _runtime_crashed(self, runtime_id: str, reason: str) -> None:
        self.crashes.append((runtime_id, reason))
        fault = Fault(FaultKind.BROWSER_CRASHED, reason)
        self._crash_faults[runtime_id] = fault
        for route in self._routes.values():
            if route.generation is not None and route.generation.slot.runtime_id == runtime_id:
                route.fault = fault

    def _runtime_down(self, runtime_id: str) -> Fault | None:
        """Why the runtime `runtime_id` no longer serves, if it does not: shut down or crashed."""
        if self._shutting_down:
            return Fault(FaultKind.SERVER_UNRESPONSIVE, "the capsule runtime is shut down")
        if runtime_id in self._crash_faults:
            return self._crash_faults[runtime_id]
        if not self.backend.runtime_alive(runtime_id):  # dead, though the disconnect is not reported yet
            return Fault(FaultKind.BROWSER_CRASHED, f"runtime {runtime_id} died (its browser process is gone)")
        return None

    def _environment_fault(self, runtime_id: str, error: Exception) -> Fault | None:
        """The fault behind an error from a capsule on `runtime_id`: its runtime's death or
        shutdown when it has happened, else the error's own class; None for a bug."""
        fault = classify_environment_error(error)
        if fault is None:
            return None
        return self._runtime_down(runtime_id) or fault

    def _raise_if_runtime_down(self, runtime_id: str, error: Exception) -> None:
        """Raise CapsuleFaultError when `error` is an infrastructure error and the runtime
        `runtime_id` has died or is shutting down: that, not the page, is why it failed."""
        if classify_environment_error(error) is not None and (down := self._runtime_down(runtime_id)) is not None:
            raise CapsuleFaultError(down) from error

    def _route(self, env_id: str) -> _Route:
        route = self._routes.get(env_id)
        if route is None:
            raise UnknownEnvironmentError(f"no environment {env_id!r} (never created, or closed)")
        return route

    def playwright_pids(self) -> list[int]:
        """The Playwright driver process(es) this runtime talks through (children of this process)."""
        me = os.getpid()
        return [
            pid for pid in process_tree([me]) if pid != me and any(b"playwright" in a for a in command_line(pid) or ())
        ]

    # ---- generations ----------------------------------------------------------------

    async def _build(self, task: str, seed: int, snapshot: CapsuleSnapshot | None = None) -> _Generation:
        """A new generation off any route: a (warm or fresh) page with the task loaded and seeded,
        then the snapshot's state restored from its capture or by replaying its prefix."""
        try:
            return await asyncio.wait_for(self._build_unbounded(task, seed, snapshot), self.build_timeout_s)
        except TimeoutError:
            raise BuildTimeoutError(f"building a {task} capsule took longer than {self.build_timeout_s:.0f}s") from None

    async def _build_unbounded(self, task: str, seed: int, snapshot: CapsuleSnapshot | None) -> _Generation:
        warm = self._take_warm(task)
        if warm:
            self.warm_builds += 1
        else:
            self.cold_builds += 1
        slot = warm[0] if warm else await self.backend.open_slot()
        try:
            driver = warm[1] if warm else await self._load(slot, task)
            limit_ms = None if self.time_limit_s is None else self.time_limit_s * 1000
            if snapshot is not None and snapshot.page_state is not None:
                limit_ms = snapshot.page_state.max_time_ms  # the parent's limit, whoever set it
            await driver.begin_episode(seed, limit_ms)
            actions: tuple[A.Action, ...] = ()
            if snapshot is not None:
                actions = snapshot.actions
                if snapshot.page_state is not None:
                    try:
                        await restore_state(slot.page, snapshot.page_state)
                        self.fork_methods["capture"] += 1
                    except StateRestoreMismatch as mismatch:
                        # The page is half restored: start over on a fresh page, by replay.
                        await _release_quietly(slot)
                        slot = None  # type: ignore[assignment]
                        return await self._build_unbounded(
                            task,
                            seed,
                            dataclasses.replace(
                                snapshot, page_state=None, replay_reason=f"restore did not match: {mismatch}"
                            ),
                        )
                else:
                    for action in actions:
                        await driver.number_elements()  # where the original episode observed the page
                        await driver.perform(action)
                    self.fork_methods[f"replay: {snapshot.replay_reason or 'no captured state'}"] += 1
                if snapshot.elapsed_ms is not None:
                    await driver.set_elapsed_ms(snapshot.elapsed_ms)
            ended = (await driver.state()).done
            return _Generation(next(self._generation_ids), slot, driver, seed, list(actions), ended=ended)
        except BaseException as error:
            if slot is not None:
                await _release_quietly(slot)
                if isinstance(error, Exception):
                    self._raise_if_runtime_down(slot.runtime_id, error)
            raise

    async def _load(self, slot: Slot, task: str) -> MiniWoBPage:
        """The task's page loaded in `slot` (its start cover up, no episode begun)."""
        slot.page.on("crash", lambda _: self._page_crashed(slot))
        if self.fork_by == "capture":
            await install_state_recorder(slot.page)
        url = self.backend.task_url(self._server, task, slot.site)
        driver = MiniWoBPage(slot.page, task)
        await driver.load(url)
        return driver

    def _page_crashed(self, slot: Slot) -> None:
        """A renderer died: quarantine the capsule whose page it hosted (each of the pages that
        renderer hosted reports its own crash, so exactly those capsules end)."""
        for route in self._routes.values():
            if route.generation is not None and route.generation.slot is slot:
                slot.fault = Fault(
                    FaultKind.RENDERER_CRASHED,
                    f"the renderer process hosting environment {route.env_id!r} crashed (runtime {slot.runtime_id})",
                )
                if route.fault is None:
                    route.fault = slot.fault
                    self.renderer_crashes.append(slot.fault.reason)
                return
        slot.fault = Fault(FaultKind.RENDERER_CRASHED, f"the renderer process of a page on {slot.runtime_id} crashed")

    # ---- warm pages -----------------------------------------------------------------

    def _take_warm(self, task: str) -> tuple[Slot, MiniWoBPage] | None:
        """A loaded page of `task` from the pool, if it holds a live one (dead ones are dropped)."""
        pool = self._warm.get(task, [])
        while pool:
            slot, driver = pool.pop(0)
            if slot.fault is None and not slot.page.is_closed() and self._runtime_down(slot.runtime_id) is None:
                return slot, driver
            self._in_background(_release_quietly(slot))
        return None

    def _replenish(self, task: str) -> None:
        """Free the retired generations' pages and start loading pages of `task` until the pool
        (with the loads under way) is full. Called once an operation has its observation, so
        this work does not compete with it."""
        while self._retired:
            self._in_background(_release_quietly(self._retired.pop()))
        if not self.warm_pages or self._shutting_down:
            return
        for _ in range(self.warm_pages - len(self._warm.get(task, [])) - self._warming[task]):
            self._warming[task] += 1
            self._in_background(self._warm_one(task))

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _warm_one(self, task: str) -> None:
        try:
            slot = await self.backend.open_slot()
            try:
                driver = await asyncio.wait_for(self._load(slot, task), self.build_timeout_s)
            except BaseException:
                await _release_quietly(slot)
                raise
            if self._shutting_down:
                await _release_quietly(slot)
            else:
                self._warm.setdefault(task, []).append((slot, driver))
        except Exception as error:
            # Nothing awaits this task, so the failure is logged here; one that is no environment
            # fault is a bug, which the cold build that follows runs into as well.
            self.warm_pool_failures += 1
            bug = classify_environment_error(error) is None
            log.log(
                logging.ERROR if bug else logging.WARNING,
                "warming a %s page failed%s",
                task,
                " (a bug, not an environment fault)" if bug else "",
                exc_info=True,
            )
        finally:
            self._warming[task] -= 1

    async def _transaction(
        self, route: _Route, operation: str, build: Callable[[], Coroutine[Any, Any, _Generation]]
    ) -> _Generation:
        """Freeze, drain, build, publish (see the module docstring)."""
        if route.frozen is not None:
            raise CapsuleFrozenError(
                f"environment {route.env_id!r} is frozen by {route.frozen}; retry after it publishes"
            )
        route.frozen = operation  # set before the first await: admission sees it at once
        old = route.generation
        try:
            await route.idle.wait()
            try:
                successor = await build()
            except Exception as error:
                kept = f"generation {old.number} stays published" if old else "nothing was published"
                raise LifecycleError(f"{operation} of environment {route.env_id!r} failed ({error}); {kept}") from error
            self.publications.append(
                PublicationRecord(
                    route.env_id, operation, old.number if old else None, successor.number, route.in_flight
                )
            )
            route.generation = successor
            route.fault = None
        finally:
            route.frozen = None
        if old is not None:  # unpublished: nothing reaches it; freed once the caller has its observation
            self._retired.append(old.slot)
        return successor

    # ---- lifecycle (coroutines on the loop) -----------------------------------------

    async def acreate(self, task: str, seed: int | None = None) -> str:
        check_task(task)
        seed = self._rng.randrange(2**31) if seed is None else int(seed)
        env_id = f"env-{next(self._env_ids)}"
        route = _Route(env_id)
        route.frozen = "create"  # unreachable until published
        self._routes[env_id] = route
        try:
            route.generation = await self._build(task, seed)
            self.publications.append(PublicationRecord(env_id, "create", None, route.generation.number, 0))
            self._replenish(task)
        except BaseException as error:
            del self._routes[env_id]
            if isinstance(error, Exception):
                raise LifecycleError(f"create of a {task} capsule failed ({error}); nothing was published") from error
            raise
        finally:
            route.frozen = None
        return env_id

    async def areset(self, env_id: str, seed: int | None = None, task: str | None = None) -> MiniWoBObservation:
        route = self._route(env_id)
        if task is None:
            if route.generation is None:
                raise LifecycleError(f"environment {env_id!r} has no task; pass one")
            task = route.generation.task
        check_task(task)
        seed = self._rng.randrange(2**31) if seed is None else int(seed)
        generation = await self._transaction(route, "reset", lambda: self._build(task, seed))
        observation = await generation.driver.observe(self.include_dom_text, self.action_space)
        self._replenish(task)
        return observation

    async def asnapshot(self, env_id: str) -> CapsuleSnapshot:
        route = self._route(env_id)
        if route.frozen is not None:
            raise CapsuleFrozenError(f"environment {env_id!r} is frozen by {route.frozen}; retry after it publishes")
        if route.fault is not None:
            raise LifecycleError(f"cannot snapshot quarantined environment {env_id!r}: {route.quarantine_reason}")
        route.frozen = "snapshot"
        try:
            await route.idle.wait()
            g = route.generation
            assert g is not None
            state = await g.driver.state()
            elapsed = None if state.done else await g.driver.elapsed_ms()
            page_state, replay_reason = None, "fork_by is replay"
            if self.fork_by == "capture":
                captured = await capture_state(g.driver.page)
                page_state, replay_reason = (None, captured) if isinstance(captured, str) else (captured, None)
            return CapsuleSnapshot(
                g.task, g.seed, tuple(g.actions), elapsed, env_id, g.number, page_state, replay_reason
            )
        finally:
            route.frozen = None

    async def afork(self, source: str | CapsuleSnapshot) -> str:
        snap = source if isinstance(source, CapsuleSnapshot) else await self.asnapshot(source)
        env_id = f"env-{next(self._env_ids)}"
        route = _Route(env_id)
        route.frozen = "fork"
        self._routes[env_id] = route
        try:
            route.generation = await self._build(snap.task, snap.seed, snap)
            self.publications.append(PublicationRecord(env_id, "fork", None, route.generation.number, 0))
            self._replenish(snap.task)
        except BaseException as error:
            del self._routes[env_id]
            if isinstance(error, Exception):
                raise LifecycleError(f"fork of {snap.source_env!r} failed ({error}); nothing was published") from error
            raise
        finally:
            route.frozen = None
        return env_id

    async def arestore(self, env_id: str, snapshot: CapsuleSnapshot) -> MiniWoBObservation:
        route = self._route(env_id)
        generation = await self._transaction(
            route, "restore", lambda: self._build(snapshot.task, snapshot.seed, snapshot)
        )
        observation = await generation.driver.observe(self.include_dom_text, self.action_space)
        self._replenish(snapshot.task)
        return observation

    async def aclose(self, env_id: str) -> None:
        route = self._route(env_id)
        if route.frozen is not None:
            raise CapsuleFrozenError(f"environment {env_id!r} is frozen by {route.frozen}; retry after it publishes")
        route.frozen = "close"
        await route.idle.wait()
        del self._routes[env_id]
        if route.generation is not None:
            await _release_quietly(route.generation.slot)

    # ---- requests (coroutines on the loop) ------------------------------------------

    def _admit(self, env_id: str) -> tuple[_Route, _Generation]:
        route = self._route(env_id)
        if route.frozen is not None:
            raise CapsuleFrozenError(
                f"environment {env_id!r} is frozen by {route.frozen}; the request was refused, retry after it publishes"
            )
        assert route.generation is not None
        route.in_flight += 1
        route.idle.clear()
        return route, route.generation

    @staticmethod
    def _leave(route: _Route) -> None:
        route.in_flight -= 1
        if route.in_flight == 0:
            route.idle.set()

    def _quarantined(self, route: _Route, generation: _Generation) -> StepResult:
        return StepResult(
            None,
            0.0,
            0.0,
            True,
            False,
            EpisodeStatus.QUARANTINED,
            generation.number,
            quarantine_reason=route.quarantine_reason,
            fault=route.fault,
        )

    async def _page_request(self, env_id: str, request: Callable[[_Generation], Coroutine[Any, Any, Any]]) -> Any:
        """A bounded request to the capsule's page that does not change its episode. A quarantined
        capsule, or one whose runtime died under the request, raises CapsuleFaultError."""
        route, generation = self._admit(env_id)
        try:
            if route.fault is not None:
                raise CapsuleFaultError(route.fault)
            async with generation.lock:
                try:
                    return await asyncio.wait_for(request(generation), self.step_timeout_s)
                except Exception as error:
                    self._raise_if_runtime_down(generation.slot.runtime_id, error)
                    if generation.slot.fault is not None and classify_environment_error(error) is not None:
                        raise CapsuleFaultError(generation.slot.fault) from error
                    raise
        finally:
            self._leave(route)

    async def aobserve(self, env_id: str) -> MiniWoBObservation:
        return await self._page_request(env_id, lambda g: g.driver.observe(self.include_dom_text, self.action_space))

    async def aevaluate(self, env_id: str, expression: str, arg: Any = None) -> Any:
        """Evaluate JavaScript in the capsule's page (for evaluators and tests; not an agent action)."""
        return await self._page_request(env_id, lambda g: g.driver.page.evaluate(expression, arg))

    async def astep(self, env_id: str, action: A.Action | A.InvalidAction | str) -> StepResult:
        if isinstance(action, str):
            action = A.parse_action(action, self.action_space)
        route, generation = self._admit(env_id)
        try:
            if route.fault is not None:
                return self._quarantined(route, generation)
            async with generation.lock:
                if generation.ended:
                    raise EpisodeEndedError(
                        f"environment {env_id!r}: the episode already ended; reset it before sending {action!r}"
                    )
                budget = self.step_timeout_s + _action_seconds(action)
                try:
                    return await asyncio.wait_for(self._step_page(generation, action), budget)
                except Exception as error:
                    fault = self._environment_fault(generation.slot.runtime_id, error)
                    if fault is not None and generation.slot.fault is not None:
                        fault = generation.slot.fault  # the page's renderer crashed under the step
                    elif fault is not None:
                        fault = await _left_task(generation) or fault
                    if fault is None:
                        raise  # a bug in this library, not the environment's fault
                    if fault.kind is FaultKind.SERVER_UNRESPONSIVE and isinstance(error, asyncio.TimeoutError):
                        # a hung page must not hang its caller or the route
                        fault = Fault(fault.kind, f"environment {env_id!r} did not answer a step within {budget:.0f}s")
                    if route.fault is None:
                        route.fault = fault
                    return self._quarantined(route, generation)
        finally:
            self._leave(route)

    async def _step_page(self, generation: _Generation, action: A.Action | A.InvalidAction) -> StepResult:
        driver = generation.driver
        invalid = (
            action.message if isinstance(action, A.InvalidAction) else unsupported_reason(action, self.action_space)
        )
        state = await driver.state()
        if invalid is None and not state.done:  # a time limit may have ended it since the last step
            try:
                await driver.perform(action)
                generation.actions.append(action)
            except InvalidElementError as error:  # an id the page cannot act on: the agent's mistake
                invalid = str(error)
        observation, state = await driver.observe_with_state(self.include_dom_text, self.action_space)
        status = None
        if state.done:
            generation.ended = True
            status = EpisodeStatus.SUCCESS if state.success else EpisodeStatus.FAILURE
        return StepResult(
            observation,
            state.raw_reward if state.done else 0.0,
            state.env_reward if state.done else 0.0,
            state.done,
            state.success,
            status,
            generation.number,
            invalid_action=invalid,
            reason=state.reason,
        )

    # ---- blocking API ---------------------------------------------------------------

    def create(self, task: str, seed: int | None = None) -> str:
        return self.run_async(self.acreate(task, seed))

    def reset(self, env_id: str, seed: int | None = None, task: str | None = None) -> MiniWoBObservation:
        return self.run_async(self.areset(env_id, seed, task))

    def observe(self, env_id: str) -> MiniWoBObservation:
        return self.run_async(self.aobserve(env_id))

    def step(self, env_id: str, action: A.Action | A.InvalidAction | str) -> StepResult:
        return self.run_async(self.astep(env_id, action))

    def snapshot(self, env_id: str) -> CapsuleSnapshot:
        return self.run_async(self.asnapshot(env_id))

    def fork(self, source: str | CapsuleSnapshot) -> str:
        return self.run_async(self.afork(source))

    def restore(self, env_id: str, snapshot: CapsuleSnapshot) -> MiniWoBObservation:
        return self.run_async(self.arestore(env_id, snapshot))

    def close(self, env_id: str) -> None:
        self.run_async(self.aclose(env_id))

    def evaluate(self, env_id: str, expression: str, arg: Any = None) -> Any:
        return self.run_async(self.aevaluate(env_id, expression, arg))

    def generation_of(self, env_id: str) -> int:
        generation = self._route(env_id).generation
        assert generation is not None
        return generation.number

    def runtime_of(self, env_id: str) -> str:
        """The id of the runtime (shared browser, browser, container) serving `env_id` now."""
        generation = self._route(env_id).generation
        assert generation is not None
        return generation.slot.runtime_id

    def cell_of(self, env_id: str) -> int | None:
        """The shared-renderer cell serving `env_id` (None when its backend does not share
        renderers): capsules of one cell end together when its renderer crashes."""
        generation = self._route(env_id).generation
        assert generation is not None
        return generation.slot.cell

    def quarantine_reason(self, env_id: str) -> str | None:
        return self._route(env_id).quarantine_reason

    def counters(self) -> dict[str, int]:
        """The runtime's counts since it started, as plain data (a Ray actor returns them):
        pages that failed to warm, builds on warm and on cold pages, browser (runtime) and
        renderer crashes, and forks rebuilt from captured state and by replay."""
        fork_methods = dict(self.fork_methods)  # one copy: the runtime's loop may add to it meanwhile
        captured = fork_methods.get("capture", 0)
        return {
            "warm_failures": self.warm_pool_failures,
            "warm_builds": self.warm_builds,
            "cold_builds": self.cold_builds,
            "browser_crashes": len(self.crashes),
            "renderer_crashes": len(self.renderer_crashes),
            "forks_captured": captured,
            "forks_replayed": sum(fork_methods.values()) - captured,
        }

    def pids(self) -> list[int]:
        """Every process serving this runtime's environments: browsers (or containers), Playwright,
        and the HTTP server when the backend loads tasks from it."""
        server = [self._server.pid] if self.backend.serves_over_http else []
        return process_tree(self.backend.pids() + self.playwright_pids() + server)

    def shutdown(self) -> None:
        """Close every capsule and runtime, Playwright and the HTTP server. Idempotent."""
        if not self._loop.is_running():
            return
        try:
            self.run_async(self._shutdown())
        finally:
            self._stop_loop()
            self._server.close()

    async def _shutdown(self) -> None:
        self._shutting_down = True  # requests failing from here on fail because of the shutdown
        # Releases run to their end (a cancelled one could leave a container running), and warm
        # loads (bounded by build_timeout_s) see the flag and release their page.
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        for pool in self._warm.values():
            for slot, _ in pool:
                await _release_quietly(slot)
        self._warm.clear()
        while self._retired:
            await _release_quietly(self._retired.pop())
        for route in list(self._routes.values()):
            if route.generation is not None:
                await _release_quietly(route.generation.slot)
        self._routes.clear()
        try:
            await self.backend.close()
        finally:
            if self._playwright_cm is not None:
                await self._playwright_cm.__aexit__(None, None, None)

    def _stop_loop(self) -> None:
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> CapsuleRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


async def _left_task(generation: _Generation) -> Fault | None:
    """PAGE_LEFT_TASK when the capsule's page no longer holds its task's document (it navigated
    to another URL, or to one without MiniWoB's globals), else None."""
    page, expected = generation.driver.page, generation.driver.url
    try:
        if page.is_closed():
            return None
        if expected is not None and page.url != expected:
            return Fault(FaultKind.PAGE_LEFT_TASK, f"the page went from its task to {page.url[:200]}")
        if not await asyncio.wait_for(page.evaluate("() => typeof WOB_DONE_GLOBAL !== 'undefined'"), 5.0):
            return Fault(FaultKind.PAGE_LEFT_TASK, "the page's document is no longer its task's")
    except Exception:  # noqa: BLE001 - the page cannot tell: the original fault stands
        return None
    return None


def _action_seconds(action: A.Action | A.InvalidAction) -> float:
    """How long an action itself takes by design (waits, held keys)."""
    if isinstance(action, A.Wait):
        return float(action.seconds)
    if isinstance(action, A.HoldKey):
        return float(action.duration)
    return 0.0


async def _release_quietly(slot: Slot) -> None:
    """Free a slot whose runtime may already be gone (crashed, killed): nothing left to free then."""
    await _close_quietly(slot.release)


async def _close_quietly(release: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        await asyncio.wait_for(release(), timeout=30)
    except Exception as error:
        if classify_environment_error(error) is None:
            raise  # a bug in this library, not a dead runtime
        # a dead runtime's context cannot be closed; it died with it
