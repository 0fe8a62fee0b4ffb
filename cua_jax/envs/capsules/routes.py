"""Routes: a capsule's binding from its environment id to its published generation, and the
admission every request to it passes. The plumbing the MiniWoB and web application runtimes share.

A request is admitted while its route is not frozen and counts as in flight until it leaves; a
lifecycle operation freezes the route (requests meanwhile are refused with CapsuleFrozenError)
and waits until it is idle. A route whose generation is quarantined keeps the fault until a new
generation is published; its steps answer a QUARANTINED result.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

from cua_jax.envs.capsules.errors import CapsuleFaultError, CapsuleFrozenError, UnknownEnvironmentError
from cua_jax.envs.capsules.loop import LoopOwner
from cua_jax.envs.capsules.records import StepResult
from cua_jax.envs.faults import Fault
from cua_jax.types import EpisodeStatus


@dataclasses.dataclass
class Route:
    env_id: str
    generation: Any = None  # the runtime's published generation (it has a `number`)
    frozen: str | None = None  # the operation holding the freeze
    fault: Fault | None = None  # set: the published generation is quarantined
    in_flight: int = 0
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def quarantine_reason(self) -> str | None:
        return None if self.fault is None else self.fault.reason


class RoutedRuntime(LoopOwner):
    """A runtime whose environments are routes in `self._routes` (see the module doc)."""

    _routes: dict[str, Route]

    def _route(self, env_id: str) -> Route:
        route = self._routes.get(env_id)
        if route is None:
            raise UnknownEnvironmentError(f"no environment {env_id!r} (never created, or closed)")
        return route

    def _admit(self, env_id: str) -> tuple[Route, Any]:
        """The route and its generation, the request counted in flight (until `_leave`)."""
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
    def _leave(route: Route) -> None:
        route.in_flight -= 1
        if route.in_flight == 0:
            route.idle.set()

    @staticmethod
    def _quarantined(route: Route, generation: Any) -> StepResult:
        return StepResult(
            None, 0.0, 0.0, True, False, EpisodeStatus.QUARANTINED, generation.number,
            quarantine_reason=route.quarantine_reason, fault=route.fault,
        )  # fmt: skip

    step_timeout_s: float

    async def _page_request(self, env_id: str, request: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
        """`request(generation)`, bounded by step_timeout_s, on the capsule's page under its
        generation's lock: a request that does not change the episode (an observation, a
        script). A quarantined capsule raises CapsuleFaultError; a failure goes through
        `_page_request_failed` first."""
        route, generation = self._admit(env_id)
        try:
            if route.fault is not None:
                raise CapsuleFaultError(route.fault)
            async with generation.lock:
                try:
                    return await asyncio.wait_for(request(generation), self.step_timeout_s)
                except Exception as error:
                    self._page_request_failed(generation, error)
                    raise
        finally:
            self._leave(route)

    def _page_request_failed(self, generation: Any, error: Exception) -> None:
        """A runtime raises the fault behind `error` here, when it knows one (default: none)."""

    async def _close_route(self, env_id: str) -> Route:
        """Freeze the route for good, wait for its requests, forget it; the caller retires its
        generation."""
        route = self._route(env_id)
        if route.frozen is not None:
            raise CapsuleFrozenError(f"environment {env_id!r} is frozen by {route.frozen}; retry after it publishes")
        route.frozen = "close"
        await route.idle.wait()
        del self._routes[env_id]
        return route
