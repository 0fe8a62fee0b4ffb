# Single job: the web application capsules' transactions (routes, branches, generations, snapshot, fork, judging).
"""State capsules over one shared web application server (CUA-Sandbox §3 on a stateful
application): `WebappRuntime`.

The application (Trac) runs once, as one server process (`app_server.py`) that is already
initialised; a capsule is the private *authoritative state* of one environment: a branch of the
seeded base state (a Trac environment directory: its SQLite database and attachment files),
made by copy-on-write where the filesystem can clone (`branches.py`), with a full copy as the
measured fallback. A capsule's page lives in a browser context of its own in one shared browser
and loads from the capsule's own site (`<env id>.test`, resolved to the loopback server); its
context sends the generation's route token with every request, and the server maps that route
to the generation's branch, refusing a request whose Host is not the route's site. The route is
the binding from the capsule's site to its branch (§3.3). Sessions and cookies are ephemeral:
each generation gets a new browser context, so they start empty.

Lifecycle operations are transactions (§3.4), on two levels at once: the runtime's route (the
agent's steps) and the server's route (the page's HTTP requests):

    freeze   -> the runtime refuses new steps (CapsuleFrozenError), the server new requests (503)
    drain    -> wait until admitted steps and requests have finished
    stage    -> build the successor: a new branch (of the base, of the parent, of a snapshot),
                registered on the server under a new route token, a new page loaded on it
    publish  -> one assignment swaps the runtime's route to the successor
    retire   -> the old route is dropped, its environment closed in the server, its branch removed

A failed stage thaws the old generation, which stays published (LifecycleError says so), and
removes what was staged. Trac keeps an environment open per path, so a successor is always a
new directory under a new name, never files swapped under a running one.

snapshot(env_id) freezes and drains the capsule, branches its current state into a snapshot
directory (not served) with the page's path, and thaws it; fork(env_id | snapshot) stages a new
capsule from it; restore(env_id, snapshot) replaces a capsule's generation by one. A fork made
mid-episode carries the parent's database exactly, and diverges after.

An episode ends when the agent ends it (done, fail, answer): the runtime drains the server's
route (no request of the page still writing) and judges the branch's database, the answer and
the page's path with the task's evaluators (`judges.py`), read from the framework's side.

Faults: when the application server dies, every capsule is quarantined with the cause
("application server crashed: killed by signal 9") and the server is restarted; a reset builds
a fresh generation on it. The browser's crash quarantines every capsule too (the shared
browser backend relaunches it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import pathlib
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import (
    CAPSULE_SITE_DOMAIN,
    BuildTimeoutError,
    CapsuleFaultError,
    CapsuleFrozenError,
    LifecycleError,
    PublicationRecord,
    SharedBrowserBackend,
    Slot,
    StepResult,
)
from cua_jax.envs.capsules.backends import release_quietly
from cua_jax.envs.capsules.procfs import process_tree
from cua_jax.envs.capsules.routes import Route, RoutedRuntime
from cua_jax.envs.faults import Fault, FaultKind, classify_environment_error
from cua_jax.envs.miniwob import DomElement, EpisodeEndedError, InvalidElementError
from cua_jax.envs.webapp import judges
from cua_jax.envs.webapp.branches import branch, check_branch_method, remove_branch
from cua_jax.envs.webapp.page import DEFAULT_VIEWPORT, WebappPage
from cua_jax.envs.webapp.server import AppServer, AppServerError
from cua_jax.envs.webapp.tasks import WebappTask
from cua_jax.types import EpisodeStatus

log = logging.getLogger(__name__)

DATABASE = pathlib.Path("db", "trac.db")  # a branch's database, relative to the branch


@dataclasses.dataclass(frozen=True)
class WebappObservation:
    """What an agent sees of a capsule's page.

    screenshot: uint8 [height, width, 3], the viewport (element ids drawn on it when the
    action space acts on elements). dom: the marked elements (`page.py`); dom_text: the same
    as text (None unless asked for). url: the page's path on its site.
    """

    task: str
    utterance: str
    screenshot: np.ndarray
    dom: tuple[DomElement, ...]
    url: str
    title: str
    dom_text: str | None = None

    @property
    def screen_size(self) -> tuple[int, int]:
        return int(self.screenshot.shape[1]), int(self.screenshot.shape[0])


@dataclasses.dataclass(frozen=True)
class WebappSnapshot:
    """A capsule's state at a moment: its task, its database and files (a branch kept under
    `path`, not served) and the page's path. Valid until `release_snapshot` or shutdown."""

    task: WebappTask
    path: pathlib.Path
    url: str
    source_env: str
    source_generation: int


@dataclasses.dataclass
class _Generation:
    number: int
    task: WebappTask
    branch: str  # directory name under the runtime's branch parent
    route: str  # the server's route token
    slot: Slot
    page: WebappPage
    ended: bool = False
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class _Route(Route):
    @property
    def site(self) -> str:
        return f"{self.env_id}.{CAPSULE_SITE_DOMAIN}"


class WebappRuntime(RoutedRuntime):
    """Web application capsules (see the module doc) over the seeded state `base` (a Trac
    environment directory), with branches under `workdir`.

    Every public method is blocking and thread-safe; its `a`-prefixed twin is a coroutine for
    the runtime's own event loop (`loop`). API:
        create(task) -> env_id                 a new capsule on a new branch of the base state
        reset(env_id, task=None) -> WebappObservation
        observe(env_id) -> WebappObservation
        step(env_id, action) -> StepResult     reward: the judges' score once the agent ended it
        snapshot(env_id) -> WebappSnapshot; fork(env_id | snapshot) -> env_id
        restore(env_id, snapshot) -> WebappObservation; release_snapshot(snapshot)
        close(env_id); shutdown()
        database(env_id) -> path of the capsule's database now (tests, benchmarks)

    branch_by: "auto" (the cheapest method `workdir` allows: see `branches`), "overlay",
    "reflink" or "copy" (the ablation). viewport: (width, height) of every page.
    """

    shut_down_message = "the web application runtime is shut down"

    def __init__(
        self,
        base: str | os.PathLike,
        workdir: str | os.PathLike,
        *,
        viewport: tuple[int, int] = DEFAULT_VIEWPORT,
        include_dom_text: bool = False,
        action_space: str = "coordinates",
        branch_by: str = "auto",
        python: str | None = None,
        call_timeout_s: float = 300.0,
        step_timeout_s: float = 60.0,
        build_timeout_s: float = 120.0,
        max_snapshots: int = 64,
    ):
        self.base = pathlib.Path(base).resolve()
        if not (self.base / DATABASE).is_file():
            raise ValueError(f"{self.base} holds no seeded state ({DATABASE} is missing)")
        self.workdir = pathlib.Path(workdir).resolve()
        self.branches_dir = self.workdir / "branches"
        self.snapshots_dir = self.workdir / "snapshots"
        for folder in (self.branches_dir, self.snapshots_dir):
            remove_branch(folder)  # a previous runtime's leftovers, its mounts included
            folder.mkdir(parents=True)
        self.branch_by = check_branch_method(branch_by, self.branches_dir)
        self.viewport = (int(viewport[0]), int(viewport[1]))
        self.include_dom_text = include_dom_text
        self.action_space = A.check_action_space(action_space)
        self.call_timeout_s = call_timeout_s
        self.step_timeout_s = step_timeout_s
        self.build_timeout_s = build_timeout_s
        self.max_snapshots = int(max_snapshots)
        self.publications: list[PublicationRecord] = []
        self.server_crashes: list[str] = []  # the reason of each crash of the application server
        self.branches_made = 0
        self.branch_seconds_total = 0.0  # time spent making branches (reflink or copy)
        self._snapshots: collections.OrderedDict[pathlib.Path, None] = collections.OrderedDict()
        self._routes: dict[str, _Route] = {}
        self._env_ids = itertools.count(1)
        self._generation_ids = itertools.count(1)
        self._names = itertools.count(1)
        self._shutting_down = False
        self.server = AppServer(self.branches_dir, python=python).start()
        self._server_fault: Fault | None = None
        self.backend = SharedBrowserBackend(
            renderers=None, extra_args=(f"--host-resolver-rules=MAP *.{CAPSULE_SITE_DOMAIN} 127.0.0.1",)
        )
        self._start_loop("webapp-runtime")
        self._playwright_cm: Any = None
        try:
            self.run_async(self._start())
        except BaseException:
            self._stop_loop()
            self.server.stop()
            raise

    # ---- plumbing -------------------------------------------------------------------

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        self._playwright_cm = async_playwright()
        playwright = await self._playwright_cm.__aenter__()
        await self.backend.start(playwright, self._browser_crashed)
        self._watcher = self._loop.create_task(self._watch_server())

    def _quarantine_all(self, fault: Fault) -> None:
        for route in self._routes.values():
            if route.generation is not None and route.fault is None:
                route.fault = fault

    def _browser_crashed(self, runtime_id: str, reason: str) -> None:
        self._quarantine_all(Fault(FaultKind.BROWSER_CRASHED, reason))

    async def _watch_server(self) -> None:
        """Quarantines every capsule when the application server dies, and restarts it."""
        while not self._shutting_down:
            await asyncio.sleep(0.2)
            if self._shutting_down or self.server.alive():
                continue
            reason = f"application server crashed: {self.server.exit_status()} (pid {self.server.pid})"
            log.warning("%s; quarantining %d capsule(s) and restarting it", reason, len(self._routes))
            self.server_crashes.append(reason)
            self._server_fault = Fault(FaultKind.APP_SERVER_CRASHED, reason)
            self._quarantine_all(self._server_fault)
            try:
                await asyncio.to_thread(self.server.restart)
                self._server_fault = None
            except Exception:  # logged; the next round tries again
                log.exception("restarting the application server failed")

    # ---- generations ----------------------------------------------------------------

    async def _new_branch(self, source: pathlib.Path) -> str:
        name = f"g{next(self._names)}-{secrets.token_hex(4)}"
        started = time.perf_counter()
        await asyncio.to_thread(branch, source, self.branches_dir / name, self.branch_by)
        self.branches_made += 1
        self.branch_seconds_total += time.perf_counter() - started
        return name

    async def _stage(self, route: _Route, task: WebappTask, source: pathlib.Path, url: str) -> _Generation:
        """A generation of `task` on a new branch of `source`, its route registered on the server
        and its page loaded at `url`; everything staged is removed when this fails."""
        try:
            return await asyncio.wait_for(self._stage_unbounded(route, task, source, url), self.build_timeout_s)
        except TimeoutError:
            raise BuildTimeoutError(f"staging a {task.task_id} capsule took over {self.build_timeout_s:.0f}s") from None

    async def _stage_unbounded(self, route: _Route, task: WebappTask, source: pathlib.Path, url: str) -> _Generation:
        if self._server_fault is not None:
            raise CapsuleFaultError(self._server_fault)
        name = await self._new_branch(source)
        token = secrets.token_urlsafe(18)
        slot: Slot | None = None
        try:
            # The server opens the branch's environment while the browser opens the page.
            opened = asyncio.ensure_future(self._open_on_server(token, route.site, name))
            try:
                slot = await self.backend.open_slot()
            finally:
                await opened
            await slot.context.set_extra_http_headers({"X-Cua-Route": token})
            page = WebappPage(slot.page, self.viewport)
            await page.load(f"http://{route.site}:{self.server.port}{url}")
            return _Generation(next(self._generation_ids), task, name, token, slot, page)
        except BaseException:
            await self._retire(name, token, slot)
            raise

    async def _open_on_server(self, token: str, site: str, name: str) -> None:
        await self.server.control("publish", route=token, site=site, branch=name)
        await self.server.control("open", branch=name)

    async def _retire(self, name: str, token: str, slot: Slot | None) -> None:
        """Drop a generation's route, page, open environment and branch (each as far as it exists)."""
        if slot is not None:
            await release_quietly(slot)
        if self.server.alive():
            try:
                await self.server.control("unroute", route=token)
                await self.server.control("retire", branch=name)
            except Exception as error:  # a server dying meanwhile: nothing left open
                if classify_environment_error(error) is None:
                    raise
        await asyncio.to_thread(remove_branch, self.branches_dir / name)

    async def _freeze_and_drain(self, route: _Route, operation: str) -> None:
        """Freeze the runtime's and the server's route and wait for both to drain."""
        if route.frozen is not None:
            raise CapsuleFrozenError(
                f"environment {route.env_id!r} is frozen by {route.frozen}; retry after it publishes"
            )
        route.frozen = operation
        await route.idle.wait()
        generation = route.generation
        if generation is not None and route.fault is None:
            await self.server.control("freeze", route=generation.route)
            await self.server.control("drain", route=generation.route, timeout=self.step_timeout_s)

    async def _thaw(self, route: _Route) -> None:
        generation = route.generation
        if generation is not None and route.fault is None and self.server.alive():
            await self.server.control("thaw", route=generation.route)
        route.frozen = None

    async def _transaction(self, route: _Route, operation: str, stage: Callable[[], Coroutine[Any, Any, _Generation]]):
        await self._freeze_and_drain(route, operation)
        old = route.generation
        try:
            successor = await stage()
        except Exception as error:
            try:
                await self._thaw(route)
            except AppServerError:  # the server died too: the quarantine says so
                route.frozen = None
            kept = f"generation {old.number} stays published" if old else "nothing was published"
            raise LifecycleError(f"{operation} of environment {route.env_id!r} failed ({error}); {kept}") from error
        self.publications.append(
            PublicationRecord(route.env_id, operation, old.number if old else None, successor.number, route.in_flight)
        )
        route.generation, route.fault, route.frozen = successor, None, None
        if old is not None:
            await self._retire(old.branch, old.route, old.slot)
        return successor

    # ---- lifecycle ------------------------------------------------------------------

    async def _publish_new(self, operation: str, task: WebappTask, source: pathlib.Path, url: str) -> str:
        env_id = f"w{next(self._env_ids)}"
        route = _Route(env_id)
        route.frozen = operation  # unreachable until published
        self._routes[env_id] = route
        try:
            route.generation = await self._stage(route, task, source, url)
            self.publications.append(PublicationRecord(env_id, operation, None, route.generation.number, 0))
        except BaseException as error:
            del self._routes[env_id]
            if isinstance(error, Exception):
                raise LifecycleError(
                    f"{operation} of a {task.task_id} capsule failed ({error}); nothing was published"
                ) from error
            raise
        finally:
            route.frozen = None
        return env_id

    async def acreate(self, task: WebappTask) -> str:
        return await self._publish_new("create", task, self.base, task.start_url)

    async def areset(self, env_id: str, task: WebappTask | None = None) -> WebappObservation:
        route = self._route(env_id)
        task = task or (route.generation.task if route.generation else None)
        if task is None:
            raise LifecycleError(f"environment {env_id!r} has no task; pass one")
        generation = await self._transaction(
            route, "reset", lambda: self._stage(route, task, self.base, task.start_url)
        )
        return await self._observe(generation)

    @contextlib.asynccontextmanager
    async def _held(self, env_id: str, operation: str):
        """The capsule's published generation, frozen and drained while the block runs (a
        snapshot or a fork reads its branch then), thawed after; a quarantined one refuses."""
        route = self._route(env_id)
        if route.fault is not None:
            raise LifecycleError(f"cannot {operation} quarantined environment {env_id!r}: {route.fault.reason}")
        await self._freeze_and_drain(route, operation)
        try:
            assert route.generation is not None
            yield route.generation
        finally:
            await self._thaw(route)

    async def asnapshot(self, env_id: str) -> WebappSnapshot:
        async with self._held(env_id, "snapshot") as generation:
            path = self.snapshots_dir / f"s{next(self._names)}-{secrets.token_hex(4)}"
            await asyncio.to_thread(branch, self.branches_dir / generation.branch, path, self.branch_by)
            snapshot = WebappSnapshot(generation.task, path, generation.page.path(), env_id, generation.number)
        self._snapshots[path] = None
        while len(self._snapshots) > self.max_snapshots:
            oldest, _ = self._snapshots.popitem(last=False)
            await asyncio.to_thread(remove_branch, oldest)
        return snapshot

    def _snapshot_source(self, snapshot: WebappSnapshot) -> pathlib.Path:
        if snapshot.path not in self._snapshots:
            raise LifecycleError(
                f"snapshot of {snapshot.source_env!r} generation {snapshot.source_generation} was released "
                f"(the runtime keeps the last {self.max_snapshots})"
            )
        return snapshot.path

    async def afork(self, source: str | WebappSnapshot) -> str:
        if isinstance(source, WebappSnapshot):
            return await self._publish_new("fork", source.task, self._snapshot_source(source), source.url)
        async with self._held(source, "fork") as generation:
            return await self._publish_new(
                "fork", generation.task, self.branches_dir / generation.branch, generation.page.path()
            )

    async def arestore(self, env_id: str, snapshot: WebappSnapshot) -> WebappObservation:
        route = self._route(env_id)
        source = self._snapshot_source(snapshot)
        generation = await self._transaction(
            route, "restore", lambda: self._stage(route, snapshot.task, source, snapshot.url)
        )
        return await self._observe(generation)

    async def arelease_snapshot(self, snapshot: WebappSnapshot) -> None:
        if self._snapshots.pop(snapshot.path, "gone") is None:
            await asyncio.to_thread(remove_branch, snapshot.path)

    async def aclose(self, env_id: str) -> None:
        route = await self._close_route(env_id)
        if route.generation is not None:
            await self._retire(route.generation.branch, route.generation.route, route.generation.slot)

    # ---- requests -------------------------------------------------------------------

    async def _observe(self, generation: _Generation) -> WebappObservation:
        title, dom, image, text = await generation.page.observe(self.include_dom_text, self.action_space)
        return WebappObservation(
            generation.task.task_id, generation.task.intent, image, dom, generation.page.path(), title, text
        )

    async def aobserve(self, env_id: str) -> WebappObservation:
        return await self._page_request(env_id, self._observe)

    async def aevaluate(self, env_id: str, expression: str, arg: Any = None) -> Any:
        """JavaScript in the capsule's page (scripted solutions' element look-ups, tests; no agent action)."""
        return await self._page_request(env_id, lambda g: g.page.page.evaluate(expression, arg))

    async def astep(self, env_id: str, action: A.Action | A.InvalidAction | str) -> StepResult:
        if isinstance(action, str):
            action = A.parse_action(action, self.action_space)
        route, generation = self._admit(env_id)
        try:
            if route.fault is not None:
                return self._quarantined(route, generation)
            async with generation.lock:
                if generation.ended:
                    raise EpisodeEndedError(f"environment {env_id!r}: the episode already ended; reset it first")
                budget = self.step_timeout_s + (float(action.seconds) if isinstance(action, A.Wait) else 0.0)
                try:
                    return await asyncio.wait_for(self._step_page(route, generation, action), budget)
                except Exception as error:
                    fault = classify_environment_error(error)
                    if fault is None:
                        raise
                    if route.fault is None:
                        route.fault = self._server_fault or fault
                    return self._quarantined(route, generation)
        finally:
            self._leave(route)

    async def _step_page(self, route: _Route, generation: _Generation, action: A.Action | A.InvalidAction):
        invalid = action.message if isinstance(action, A.InvalidAction) else _unsupported(action, self.action_space)
        if invalid is None:
            try:
                await generation.page.perform(action)
            except InvalidElementError as error:
                invalid = str(error)
        if invalid is None and A.is_terminal(action):
            verdict = await self._judge(generation)
            generation.ended = True
            status = EpisodeStatus.SUCCESS if verdict.score > 0 else EpisodeStatus.FAILURE
            reason = "; ".join(verdict.reasons) or None
            return StepResult(
                None, verdict.score, verdict.score, True, verdict.score > 0, status, generation.number, reason=reason
            )
        observation = await self._observe(generation)
        return StepResult(observation, 0.0, 0.0, False, False, None, generation.number, invalid_action=invalid)

    async def _judge(self, generation: _Generation) -> judges.Verdict:
        """The task's evaluators over the branch's database once no request of the page is in flight."""
        await generation.page.settle()
        await self.server.control("drain", route=generation.route, timeout=self.step_timeout_s)
        task = generation.task
        return await asyncio.to_thread(
            judges.judge,
            {"task_id": task.task_id, "eval": dict(task.eval)},
            generation.page.answer,
            generation.page.path(),
            str(self.branches_dir / generation.branch / DATABASE),
            str(self.base / DATABASE),
        )

    # ---- blocking API ---------------------------------------------------------------

    def create(self, task: WebappTask) -> str:
        return self.run_async(self.acreate(task))

    def reset(self, env_id: str, task: WebappTask | None = None) -> WebappObservation:
        return self.run_async(self.areset(env_id, task))

    def observe(self, env_id: str) -> WebappObservation:
        return self.run_async(self.aobserve(env_id))

    def step(self, env_id: str, action: A.Action | A.InvalidAction | str) -> StepResult:
        return self.run_async(self.astep(env_id, action))

    def evaluate(self, env_id: str, expression: str, arg: Any = None) -> Any:
        return self.run_async(self.aevaluate(env_id, expression, arg))

    def snapshot(self, env_id: str) -> WebappSnapshot:
        return self.run_async(self.asnapshot(env_id))

    def fork(self, source: str | WebappSnapshot) -> str:
        return self.run_async(self.afork(source))

    def restore(self, env_id: str, snapshot: WebappSnapshot) -> WebappObservation:
        return self.run_async(self.arestore(env_id, snapshot))

    def release_snapshot(self, snapshot: WebappSnapshot) -> None:
        self.run_async(self.arelease_snapshot(snapshot))

    def close(self, env_id: str) -> None:
        self.run_async(self.aclose(env_id))

    def database(self, env_id: str) -> pathlib.Path:
        generation = self._route(env_id).generation
        assert generation is not None
        return self.branches_dir / generation.branch / DATABASE

    def route_of(self, env_id: str) -> tuple[str, str]:
        """(site, route token) of the capsule's published generation: what its page sends, for
        benchmarks and tests that write through the server as the page would."""
        route = self._route(env_id)
        assert route.generation is not None
        return route.site, route.generation.route

    def generation_of(self, env_id: str) -> int:
        generation = self._route(env_id).generation
        assert generation is not None
        return generation.number

    def quarantine_reason(self, env_id: str) -> str | None:
        fault = self._route(env_id).fault
        return None if fault is None else fault.reason

    def counters(self) -> dict[str, float]:
        """Counts since the runtime started (a Ray actor returns them as plain data)."""
        return {
            "server_crashes": len(self.server_crashes),
            "server_starts": self.server.starts,
            "branches": self.branches_made,
            "branch_seconds": self.branch_seconds_total,
        }

    def pids(self) -> list[int]:
        """The application server and the browser, with their descendants."""
        roots = self.backend.pids() + ([self.server.pid] if self.server.alive() else [])
        return process_tree(roots)

    def shutdown(self) -> None:
        if not self._loop.is_running():
            return
        try:
            self.run_async(self._shutdown())
        finally:
            self._stop_loop()
            self.server.stop()
            remove_branch(self.branches_dir)  # its mounts too, where branches are overlays
            remove_branch(self.snapshots_dir)

    async def _shutdown(self) -> None:
        self._shutting_down = True
        self._watcher.cancel()
        for route in list(self._routes.values()):
            if route.generation is not None:
                await release_quietly(route.generation.slot)
        self._routes.clear()
        try:
            await self.backend.close()
        finally:
            if self._playwright_cm is not None:
                await self._playwright_cm.__aexit__(None, None, None)


def _unsupported(action: A.Action, action_space: str) -> str | None:
    if isinstance(action, A.WriteFile):
        return "write_file is not available in a web page; the task is done in the application's pages"
    return A.outside_action_space(action, action_space)
