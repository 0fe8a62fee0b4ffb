# Single job: the capsule runtime's transactions (routes, generations, snapshot, fork, warm pool).
"""The capsule runtime: routes and generations, the freeze/drain/build/publish transactions,
snapshot and fork, the warm pool, fault attribution, and the blocking twin of every
coroutine. The design is the package docstring's (`cua_jax.envs.capsules`)."""

# One job, the transactional runtime over a backend's pages: over 600 lines because its route
# bookkeeping, lifecycle transactions and requests share one event loop's state.

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import os
import pathlib
import random
from collections.abc import Callable, Coroutine
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.capsules.backends import RuntimeBackend, SharedBrowserBackend, Slot, release_quietly
from cua_jax.envs.capsules.errors import (
    BuildTimeoutError,
    CapsuleFaultError,
    CapsuleFrozenError,
    LifecycleError,
)
from cua_jax.envs.capsules.procfs import command_line, process_tree
from cua_jax.envs.capsules.records import CapsuleSnapshot, PublicationRecord, StepResult
from cua_jax.envs.capsules.routes import Route, RoutedRuntime
from cua_jax.envs.faults import Fault, FaultKind, classify_environment_error
from cua_jax.envs.miniwob import (
    EpisodeEndedError,
    InvalidElementError,
    MiniWoBObservation,
    MiniWoBPage,
    MiniWoBServer,
    check_task,
    unsupported_reason,
)
from cua_jax.envs.miniwob_state import (
    StateRestoreMismatch,
    capture_state,
    install_state_recorder,
    restore_state,
)
from cua_jax.types import EpisodeStatus

log = logging.getLogger(__name__)

# MiniWoB tasks that begin an episode in a used page exactly as on a new page, as
# `python -m cua_jax.envs.capsules.restarts --write` measured them.
EXACT_TASKS_FILE = pathlib.Path(__file__).with_name("restart_exact_tasks.txt")


@functools.lru_cache(maxsize=1)
def restart_exact_tasks() -> frozenset[str]:
    """The tasks the file lists (lines that are not comments)."""
    lines = EXACT_TASKS_FILE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@dataclasses.dataclass
class _Generation:
    number: int
    slot: Slot
    driver: MiniWoBPage
    seed: int
    actions: list[A.Action]
    ended: bool = False  # the caller has been told the episode is done
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    page_episodes: int = 1  # episodes begun on this page, this one included
    restarted: bool = False  # a successor's build took its page (to restart in, or to release)

    @property
    def task(self) -> str:
        return self.driver.task


FORK_METHODS = ("capture", "replay")


class CapsuleRuntime(RoutedRuntime):
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

    episodes_per_page: how many episodes a page may serve (1: a new page every generation).
    Above 1, a reset or restore of a capsule whose page holds the same task begins the next
    episode in that page, as MiniWoB++'s own environment does (seed, `core.startEpisodeReal`),
    until the page has served that many; the page then is replaced by a new one. This saves
    the page load of each reset. Only tasks measured to begin in a used page exactly as on a
    new one (`restart_tasks`, by default `restart_exact_tasks()`) restart in page; the
    others always get a new page.
    """

    shut_down_message = "the capsule runtime is shut down"

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
        episodes_per_page: int = 1,
        restart_tasks: frozenset[str] | None = None,
    ):
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive (or None for MiniWoB's own limits), got {time_limit_s}")
        if warm_pages < 0:
            raise ValueError(f"warm_pages must be 0 or more, got {warm_pages}")
        if episodes_per_page < 1:
            raise ValueError(f"episodes_per_page must be 1 or more, got {episodes_per_page}")
        self.episodes_per_page = int(episodes_per_page)
        self.restart_tasks = restart_exact_tasks() if restart_tasks is None else frozenset(restart_tasks)
        self.page_restarts = 0  # generations begun in their predecessor's page
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
        self._rng = random.Random(seed)
        self._routes: dict[str, Route] = {}
        self._generation_ids = itertools.count(1)
        self._env_ids = itertools.count(1)
        self._server = MiniWoBServer()
        self._start_loop("capsule-runtime")
        self._playwright_cm: Any = None
        self._playwright: Any = None
        try:
            self.run_async(self._start())
        except BaseException:
            self._stop_loop()
            raise

    # ---- plumbing -------------------------------------------------------------------

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

    def playwright_pids(self) -> list[int]:
        """The Playwright driver process(es) this runtime talks through (children of this process)."""
        me = os.getpid()
        return [
            pid for pid in process_tree([me]) if pid != me and any(b"playwright" in a for a in command_line(pid) or ())
        ]

    # ---- generations ----------------------------------------------------------------

    async def _build(
        self, task: str, seed: int, snapshot: CapsuleSnapshot | None = None, predecessor: _Generation | None = None
    ) -> _Generation:
        """A new generation off any route: a (warm or fresh) page with the task loaded and seeded,
        then the snapshot's state restored from its capture or by replaying its prefix.
        predecessor: the route's published generation, whose page the successor restarts in
        when `_restartable` allows (it is then marked `restarted`: its page is no longer its)."""
        try:
            return await asyncio.wait_for(
                self._build_unbounded(task, seed, snapshot, predecessor), self.build_timeout_s
            )
        except TimeoutError:
            raise BuildTimeoutError(f"building a {task} capsule took longer than {self.build_timeout_s:.0f}s") from None

    def _restartable(self, generation: _Generation | None, task: str) -> bool:
        """Whether the next episode of `task` may begin in `generation`'s page."""
        return (
            generation is not None
            and generation.page_episodes < self.episodes_per_page
            and generation.task == task
            and task in self.restart_tasks
            and self._slot_alive(generation.slot)
        )

    def _slot_alive(self, slot: Slot) -> bool:
        """Whether `slot`'s page can still serve: no fault, not closed, its runtime up."""
        return slot.fault is None and not slot.page.is_closed() and self._runtime_down(slot.runtime_id) is None

    async def _build_unbounded(
        self, task: str, seed: int, snapshot: CapsuleSnapshot | None, predecessor: _Generation | None = None
    ) -> _Generation:
        if self._restartable(predecessor, task):
            predecessor.restarted = True  # its page is the successor's now, or released here
            try:
                generation = await self._restart_in_page(task, seed, snapshot, predecessor)
            except Exception as error:
                if classify_environment_error(error) is None:
                    raise  # a bug, or a snapshot no page can rebuild
                # The page failed under the restart (and is released): a new page, as without restarts.
                log.info("restarting a %s episode in its page failed (%s); loading a new page", task, error)
                generation = None
            if generation is not None:
                self.page_restarts += 1
                return generation
        warm = self._take_warm(task)
        if warm:
            self.warm_builds += 1
        else:
            self.cold_builds += 1
        slot = warm[0] if warm else await self.backend.open_slot()
        try:
            driver = warm[1] if warm else await self._load(slot, task)
        except BaseException as error:
            await release_quietly(slot)
            if isinstance(error, Exception):
                self._raise_if_runtime_down(slot.runtime_id, error)
            raise
        return await self._begin(task, seed, snapshot, slot, driver, 1)

    async def _restart_in_page(
        self, task: str, seed: int, snapshot: CapsuleSnapshot | None, predecessor: _Generation
    ) -> _Generation | None:
        """The successor begun in `predecessor`'s page, or None when that page left the task
        document (it is released then, as it is when this raises)."""
        slot, driver = predecessor.slot, predecessor.driver
        try:
            usable = await driver.holds_task_document()
            if usable:
                await driver.prepare_next_episode()
        except BaseException:
            await release_quietly(slot)
            raise
        if not usable:  # navigated away or reloaded
            await release_quietly(slot)
            return None
        return await self._begin(task, seed, snapshot, slot, driver, predecessor.page_episodes + 1)

    async def _begin(
        self,
        task: str,
        seed: int,
        snapshot: CapsuleSnapshot | None,
        slot: Slot,
        driver: MiniWoBPage,
        page_episodes: int,
    ) -> _Generation:
        """The generation whose episode `driver`'s loaded page begins now (seeded, then the
        snapshot's state restored); the page is released when this fails."""
        try:
            limit_ms = None if self.time_limit_s is None else self.time_limit_s * 1000
            if snapshot is not None and snapshot.page_state is not None:
                limit_ms = snapshot.page_state.max_time_ms  # the parent's limit, whoever set it
            await driver.begin_episode(seed, limit_ms)
            if page_episodes > 1:
                await driver.repaint()
            actions: tuple[A.Action, ...] = ()
            if snapshot is not None:
                actions = snapshot.actions
                if snapshot.page_state is not None:
                    try:
                        await restore_state(slot.page, snapshot.page_state)
                        self.fork_methods["capture"] += 1
                    except StateRestoreMismatch as mismatch:
                        # The page is half restored: start over on a fresh page, by replay.
                        await release_quietly(slot)
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
            return _Generation(
                next(self._generation_ids), slot, driver, seed, list(actions), ended=ended, page_episodes=page_episodes
            )
        except BaseException as error:
            if slot is not None:
                await release_quietly(slot)
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
            if self._slot_alive(slot):
                return slot, driver
            self._in_background(release_quietly(slot))
        return None

    def _replenish(self, task: str) -> None:
        """Free the retired generations' pages and start loading pages of `task` until the pool
        (with the loads under way) is full. Called once an operation has its observation, so
        this work does not compete with it."""
        while self._retired:
            self._in_background(release_quietly(self._retired.pop()))
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
                await release_quietly(slot)
                raise
            if self._shutting_down:
                await release_quietly(slot)
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
        self, route: Route, operation: str, build: Callable[[], Coroutine[Any, Any, _Generation]]
    ) -> _Generation:
        """Freeze, drain, build, publish (see the package docstring, `cua_jax.envs.capsules`)."""
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
                if old is not None and old.restarted:  # its page was handed on, and is closed now
                    route.fault = Fault(
                        FaultKind.SERVER_ERROR, f"{operation} of {route.env_id!r} in its page failed: {error}"
                    )
                    kept = f"generation {old.number} lost its page and is quarantined"
                else:
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
        if old is not None and not old.restarted:  # unpublished: freed once the caller has its observation
            self._retired.append(old.slot)
        return successor

    # ---- lifecycle (coroutines on the loop) -----------------------------------------

    async def _publish_new(
        self, operation: str, source: str, task: str, seed: int, snapshot: CapsuleSnapshot | None = None
    ) -> str:
        """The id of a new environment, built from (task, seed[, snapshot]) and published as
        `operation`; when the build fails nothing is published and a LifecycleError names
        `operation` of `source`."""
        env_id = f"env-{next(self._env_ids)}"
        route = Route(env_id)
        route.frozen = operation  # unreachable until published
        self._routes[env_id] = route
        try:
            route.generation = await self._build(task, seed, snapshot)
            self.publications.append(PublicationRecord(env_id, operation, None, route.generation.number, 0))
            self._replenish(task)
        except BaseException as error:
            del self._routes[env_id]
            if isinstance(error, Exception):
                raise LifecycleError(f"{operation} of {source} failed ({error}); nothing was published") from error
            raise
        finally:
            route.frozen = None
        return env_id

    async def acreate(self, task: str, seed: int | None = None) -> str:
        check_task(task)
        seed = self._rng.randrange(2**31) if seed is None else int(seed)
        return await self._publish_new("create", f"a {task} capsule", task, seed)

    async def areset(self, env_id: str, seed: int | None = None, task: str | None = None) -> MiniWoBObservation:
        route = self._route(env_id)
        if task is None:
            if route.generation is None:
                raise LifecycleError(f"environment {env_id!r} has no task; pass one")
            task = route.generation.task
        check_task(task)
        seed = self._rng.randrange(2**31) if seed is None else int(seed)
        generation = await self._transaction(route, "reset", lambda: self._build(task, seed, None, route.generation))
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
        return await self._publish_new("fork", repr(snap.source_env), snap.task, snap.seed, snap)

    async def arestore(self, env_id: str, snapshot: CapsuleSnapshot) -> MiniWoBObservation:
        route = self._route(env_id)
        generation = await self._transaction(
            route, "restore", lambda: self._build(snapshot.task, snapshot.seed, snapshot, route.generation)
        )
        observation = await generation.driver.observe(self.include_dom_text, self.action_space)
        self._replenish(snapshot.task)
        return observation

    async def aclose(self, env_id: str) -> None:
        route = await self._close_route(env_id)
        if route.generation is not None:
            await release_quietly(route.generation.slot)

    # ---- requests (coroutines on the loop) ------------------------------------------

    def _page_request_failed(self, generation: _Generation, error: Exception) -> None:
        """A page request failed with `error`: CapsuleFaultError when the page's runtime died
        under it, or its renderer crashed (the slot's fault), rather than the request itself."""
        self._raise_if_runtime_down(generation.slot.runtime_id, error)
        if generation.slot.fault is not None and classify_environment_error(error) is not None:
            raise CapsuleFaultError(generation.slot.fault) from error

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
        pages that failed to warm, builds on warm and on cold pages and in a used page, browser
        (runtime) and renderer crashes, and forks rebuilt from captured state and by replay."""
        fork_methods = dict(self.fork_methods)  # one copy: the runtime's loop may add to it meanwhile
        captured = fork_methods.get("capture", 0)
        return {
            "warm_failures": self.warm_pool_failures,
            "warm_builds": self.warm_builds,
            "cold_builds": self.cold_builds,
            "page_restarts": self.page_restarts,
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
                await release_quietly(slot)
        self._warm.clear()
        while self._retired:
            await release_quietly(self._retired.pop())
        for route in list(self._routes.values()):
            if route.generation is not None:
                await release_quietly(route.generation.slot)
        self._routes.clear()
        try:
            await self.backend.close()
        finally:
            if self._playwright_cm is not None:
                await self._playwright_cm.__aexit__(None, None, None)


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
