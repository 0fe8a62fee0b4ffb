"""A runtime that owns an asyncio event loop in a thread of its own: the plumbing every capsule
runtime shares (the MiniWoB one and the web application one).

A subclass calls `_start_loop(name)` first in its constructor, runs coroutines there with
`run_async` (blocking, bounded by `call_timeout_s`), and implements `shutdown()`, which ends
with `_stop_loop()`; `with runtime:` shuts it down on exit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from cua_jax.envs.capsules.errors import RuntimeShutDownError


class LoopOwner:
    call_timeout_s: float
    shut_down_message = "the runtime is shut down"

    def _start_loop(self, name: str) -> None:
        self._stopped = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

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
            raise RuntimeShutDownError(self.shut_down_message)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.call_timeout_s)

    def _stop_loop(self) -> None:
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def shutdown(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
