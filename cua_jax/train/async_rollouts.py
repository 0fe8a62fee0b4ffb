"""Asynchronous mode's rollout side: one thread per rollout worker, each drawing tasks and
running groups with whatever policy version its engine holds, into a `RolloutBuffer` the
learner takes whole groups from (the buffer drops groups older than the staleness window).

Draws are numbered 0, 1, 2, ... across all threads (a draw's tasks come from the key of its
number), and every draw is accounted for at all times: being collected, collected with groups
waiting for room in the buffer, in the buffer, or taken by the learner. `state_dict` (taken by
the learner between its steps) holds the next draw number, the draws being collected, the
waiting groups and the buffer's groups; a feeder built from it (`load_state_dict`) puts the
saved groups back first and collects the unfinished draws again, so a resumed asynchronous
run loses no episode and trains none twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cua_jax.train.buffer import RolloutBuffer, RolloutGroup


class RolloutFeeder:
    """The rollout threads of async mode and their buffer.

    `start(workers, collect)`: thread w loops `collect(draw, worker)` over the draws it claims
    (first any left unfinished by a restored state, then fresh numbers) and puts the groups
    into the buffer. An exception in a thread is kept and raised to the learner by `take`.
    """

    def __init__(self, staleness_window: int, capacity: int):
        self.buffer = RolloutBuffer(staleness_window, capacity)
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        # Guards the draw accounting; held while a group moves from waiting into the buffer,
        # so a state_dict never sees a group in both places.
        self._lock = threading.Lock()
        self.next_draw = 0
        self._redo: list[int] = []  # draws a restored state left unfinished, collected first
        self._collecting: set[int] = set()
        self._waiting: dict[int, list[RolloutGroup]] = {}
        self.collected: list[int] = []  # draws collected by this feeder's threads, in order
        self.blocked_s = 0.0  # seconds the threads together waited for room in the buffer (rollout idle time)

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The accounting and every collected group not yet taken (call between learner steps)."""
        with self._lock:
            return {"next_draw": self.next_draw,
                    "unfinished_draws": sorted(self._collecting | set(self._redo)),
                    "waiting": {d: list(groups) for d, groups in self._waiting.items() if groups},
                    "buffer": self.buffer.snapshot(),
                    "dropped_stale_groups": self.buffer.dropped_stale_groups,
                    "dropped_stale_episodes": self.buffer.dropped_stale_episodes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Before `start`: the saved groups go back into the buffer (then the waiting ones are
        put first by the threads), the unfinished draws are collected again first."""
        if self._threads:
            raise RuntimeError("load the feeder's state before starting its threads")
        with self._lock:
            self.next_draw = int(state["next_draw"])
            self._redo = list(state["unfinished_draws"])
            self._waiting = {int(d): list(groups) for d, groups in state["waiting"].items()}
            self.buffer.restore(state["buffer"], state["dropped_stale_groups"], state["dropped_stale_episodes"])

    # -- threads ----------------------------------------------------------------------------

    def start(self, workers: Sequence[Any], collect: Callable[[int, Any], tuple[list[RolloutGroup], Any]]) -> None:
        self._stop.clear()
        for w, worker in enumerate(workers):
            thread = threading.Thread(target=self._loop, args=(worker, collect), daemon=True, name=f"rollout-{w}")
            thread.start()
            self._threads.append(thread)

    def _claim(self) -> tuple[int, list[RolloutGroup] | None]:
        """(draw, its groups when already collected by a restored state, else None)."""
        with self._lock:
            if self._waiting:
                draw = min(self._waiting)
                return draw, self._waiting[draw]
            if self._redo:
                draw = self._redo.pop(0)
            else:
                draw, self.next_draw = self.next_draw, self.next_draw + 1
            self._collecting.add(draw)
            return draw, None

    def _loop(self, worker: Any, collect) -> None:
        try:
            while not self._stop.is_set():
                draw, groups = self._claim()
                if groups is None:
                    groups, _ = collect(draw, worker)
                    with self._lock:
                        self._collecting.discard(draw)
                        self._waiting[draw] = list(groups)
                        self.collected.append(draw)
                self._put_waiting(draw)
        except RuntimeError as error:
            if not self._stop.is_set():  # a worker shut down under a stopping run is expected
                self._error = error
        except BaseException as error:  # noqa: BLE001 - surfaced to the learner thread
            self._error = error

    def _put_waiting(self, draw: int) -> None:
        """Moves draw's waiting groups into the buffer, one at a time, as room appears."""
        while not self._stop.is_set():
            started = time.perf_counter()
            with self._lock:
                waiting = self._waiting.get(draw)
                if not waiting:
                    self._waiting.pop(draw, None)
                    return
                try:
                    self.buffer.put(waiting[0], timeout=0.2)
                except TimeoutError:
                    pass
                else:
                    waiting.pop(0)
                    continue
            time.sleep(0.05)  # let the learner take groups (and a state_dict in) while the buffer is full
            self.blocked_s += time.perf_counter() - started

    def take(self, num_groups: int, version: int, timeout_s: float) -> tuple[list[RolloutGroup], float]:
        """`num_groups` whole groups fresh enough for policy `version`, and the seconds waited;
        raises a rollout thread's error, or TimeoutError after `timeout_s`."""
        t0 = time.perf_counter()
        while True:
            if self._error is not None:
                raise RuntimeError("a rollout thread failed") from self._error
            try:
                groups = self.buffer.take(num_groups, version, timeout=1.0)
                return groups, time.perf_counter() - t0
            except TimeoutError:
                if time.perf_counter() - t0 > timeout_s:
                    raise

    def stop(self) -> None:
        self._stop.set()
        self.buffer.close()
        for thread in self._threads:
            thread.join()
        self._threads = []
