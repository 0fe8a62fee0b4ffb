"""Backends: where capsules' pages come from (the runtime's `RuntimeBackend` contract, and
the shared browser of cells of shared renderers), and freeing what they hand out."""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import itertools
import os
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from cua_jax.envs.capsules.errors import BrowserCrashedError
from cua_jax.envs.capsules.procfs import command_line, process_alive, process_tree
from cua_jax.envs.faults import Fault, classify_environment_error
from cua_jax.envs.miniwob import CHROMIUM_ARGS, CHROMIUM_EXECUTABLE, VIEWPORT, MiniWoBServer

CrashCallback = Callable[[str, str], None]  # (runtime id, reason)


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

    def __init__(self, renderers: int | None = 2, extra_args: Iterable[str] = ()) -> None:
        self.extra_args = tuple(extra_args)  # more Chromium switches (a web application's host rules)
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
        extra = ([] if self.renderers is None else renderer_sharing_args()) + list(self.extra_args)
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
            await close_quietly(context.close)
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


async def release_quietly(slot: Slot) -> None:
    """Free a slot whose runtime may already be gone (crashed, killed): nothing left to free then."""
    await close_quietly(slot.release)


async def close_quietly(release: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        await asyncio.wait_for(release(), timeout=30)
    except Exception as error:
        if classify_environment_error(error) is None:
            raise  # a bug in this library, not a dead runtime
        # a dead runtime's context cannot be closed; it died with it
