"""Asynchronous mode's rollout side: one thread per rollout worker, each drawing tasks and
running groups with whatever policy version its engine holds, into a `RolloutBuffer` the
learner takes whole groups from (the buffer drops groups older than the staleness window).

Draws are numbered 0, 1, 2, ... across all threads (a draw's tasks come from the key of its
number), and every draw is accounted for at all times: being collected, collected with groups
waiting for room in the buffer, in the buffer, or taken by the learner.

Two ways to collect. Draw at a time (the default): a thread runs a draw's groups together on
its worker (`collect`) and starts the next draw when all have ended. Streaming
(max_episodes_in_flight > 0, `RolloutWorker.submit_group`): a thread keeps up to that many
episodes in flight on its worker, starting a draw's groups whenever there is room, and each
group goes to the buffer as soon as its own last episode ends, so one slow episode holds up
its group only; every group in flight shares the worker's generation batcher. Its state
records the requests of groups still running, which a resumed run starts again first. `state_dict` (taken by
the learner between its steps) holds the next draw number, the draws being collected, the
waiting groups and the buffer's groups; a feeder built from it (`load_state_dict`) puts the
saved groups back first and collects the unfinished draws again, so a resumed asynchronous
run loses no episode and trains none twice.

Coordinated (config.train.coordinated): every process runs a feeder of its own over its share
of every draw (`GroupCollector.draw_share`: no collective in a rollout thread), and the learner
steps of all processes take their shares together (`take_agreed`). Each process's
`state_dict` goes into the checkpoint (`Trainer.save`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cua_jax.train.buffer import RolloutBuffer, RolloutGroup
from cua_jax.train.coordinated import ProcessGroup


class RolloutFeeder:
    """The rollout threads of async mode and their buffer.

    `start(workers, collect)`: thread w loops `collect(draw, worker)` over the draws it claims
    (first any left unfinished by a restored state, then fresh numbers) and puts the groups
    into the buffer. An exception in a thread is kept and raised to the learner by `take`.
    """

    def __init__(self, staleness_window: int, capacity: int, max_episodes_in_flight: int = 0):
        self.buffer = RolloutBuffer(staleness_window, capacity)
        # Streaming (> 0): each worker keeps up to this many episodes in flight, groups started
        # one at a time and buffered as each one's last episode ends (`_stream_loop`).
        self.max_episodes_in_flight = int(max_episodes_in_flight)
        self._outstanding: dict[int, list[tuple]] = {}  # streaming: draw -> its groups' requests still running
        self._redo_requests: list[tuple[int, tuple]] = []  # streaming: (draw, request) to run again first
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
            return {
                "next_draw": self.next_draw,
                "unfinished_draws": sorted(self._collecting | set(self._redo)),
                "unfinished_requests": [(d, r) for d, requests in sorted(self._outstanding.items()) for r in requests]
                + list(self._redo_requests),
                "waiting": {d: list(groups) for d, groups in self._waiting.items() if groups},
                "buffer": self.buffer.snapshot(),
                "dropped_stale_groups": self.buffer.dropped_stale_groups,
                "dropped_stale_episodes": self.buffer.dropped_stale_episodes,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Before `start`: the saved groups go back into the buffer (then the waiting ones are
        put first by the threads), the unfinished draws are collected again first."""
        if self._threads:
            raise RuntimeError("load the feeder's state before starting its threads")
        with self._lock:
            self.next_draw = int(state["next_draw"])
            self._redo = list(state["unfinished_draws"])
            self._redo_requests = [(int(d), tuple(r)) for d, r in state.get("unfinished_requests", [])]
            self._waiting = {int(d): list(groups) for d, groups in state["waiting"].items()}
            self.buffer.restore(state["buffer"], state["dropped_stale_groups"], state["dropped_stale_episodes"])

    # -- threads ----------------------------------------------------------------------------

    def start(
        self,
        workers: Sequence[Any],
        collect: Callable[[int, Any], tuple[list[RolloutGroup], Any]],
        collector: Any = None,
        group_size: int = 0,
    ) -> None:
        """Streaming (max_episodes_in_flight > 0) needs the `GroupCollector` and the group size."""
        self._stop.clear()
        for w, worker in enumerate(workers):
            if self.max_episodes_in_flight:
                target, args = self._stream_loop, (worker, collector, group_size)
            else:
                target, args = self._loop, (worker, collect)
            thread = threading.Thread(target=target, args=args, daemon=True, name=f"rollout-{w}")
            thread.start()
            self._threads.append(thread)

    def _stream_loop(self, worker: Any, collector: Any, n: int) -> None:
        """Streaming: keeps up to max_episodes_in_flight episodes running on `worker`; a draw's
        groups start as soon as there is room, each is buffered when its last episode ends."""
        in_flight = [0]
        try:
            while not self._stop.is_set():
                self._move_waiting()
                with self._lock:
                    waiting = sum(len(groups) for groups in self._waiting.values())
                    room = (
                        in_flight[0] + n * collector.settings.rollout.batch_tasks <= self.max_episodes_in_flight
                        or not in_flight[0]
                    ) and waiting < self.buffer.capacity
                    if self._redo_requests:
                        started = [self._redo_requests.pop(0)]
                    elif room:
                        if self._redo:  # a draw-at-a-time run's unfinished draw, resumed streaming
                            draw = self._redo.pop(0)
                        else:
                            draw, self.next_draw = self.next_draw, self.next_draw + 1
                        started = [(draw, r) for r in collector.draw_requests(draw)]
                    else:
                        started = []
                    for draw, request in started:
                        self._outstanding.setdefault(draw, []).append(request)
                        in_flight[0] += n
                if not started:
                    time.sleep(0.05)
                    continue
                for draw, request in started:
                    future = worker.submit_group(request, n)
                    future.add_done_callback(
                        lambda f, d=draw, r=request: self._group_done(f, d, r, collector, n, in_flight)
                    )
        except BaseException as error:  # noqa: BLE001 - surfaced to the learner thread
            if not self._stop.is_set():
                self._error = error

    def _group_done(self, future, draw: int, request: tuple, collector: Any, n: int, in_flight: list[int]) -> None:
        """A streamed group ended (on the worker's event loop: never blocks)."""
        try:
            group = collector.finish_group(request, future.result())
        except BaseException as error:  # noqa: BLE001 - surfaced to the learner thread
            if not self._stop.is_set():
                self._error = error
            return
        with self._lock:
            self._waiting.setdefault(draw, []).append(group)
            self._outstanding[draw].remove(request)
            if not self._outstanding[draw]:
                del self._outstanding[draw]
                self.collected.append(draw)
            in_flight[0] -= n

    def _move_waiting(self) -> None:
        """Streaming: moves finished groups into the buffer, oldest draw first, while it has room."""
        started = time.perf_counter()
        with self._lock:
            for draw in sorted(self._waiting):
                waiting = self._waiting[draw]
                while waiting:
                    try:
                        self.buffer.put(waiting[0], timeout=0.01)
                    except TimeoutError:
                        self.blocked_s += time.perf_counter() - started
                        return
                    waiting.pop(0)
                if draw not in self._outstanding:
                    del self._waiting[draw]

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

    def take_agreed(
        self, num_groups: int, version: int, processes: ProcessGroup, timeout_s: float, poll_s: float = 0.5
    ) -> tuple[list[RolloutGroup], float]:
        """A coordinated run's `take` (a collective: every process calls it at every step):
        this process's `num_groups` whole groups fresh enough for the global policy `version`,
        taken once every process holds its own. Until then the processes exchange, every
        `poll_s` seconds, whether each holds its groups, so none waits inside a collective on
        another's rollouts: all take together, or all raise together (a rollout thread's error
        on any process, RuntimeError naming it; TimeoutError once any waited `timeout_s`).
        Returns the groups and the seconds waited."""
        t0 = time.perf_counter()
        while True:
            ready = self._error is None and self.buffer.wait_fresh(num_groups, version, poll_s)
            waited = time.perf_counter() - t0
            error = None if self._error is None else f"{type(self._error).__name__}: {self._error}"
            states = processes.exchange((ready, error, not ready and waited > timeout_s))
            failed = [f"process {p}: {e}" for p, (_, e, _) in enumerate(states) if e is not None]
            if failed:
                raise RuntimeError(f"a rollout thread failed ({'; '.join(failed)})") from self._error
            if all(r for r, _, _ in states):
                return self.buffer.take(num_groups, version, timeout=0), waited
            if any(late for _, _, late in states):
                late = [p for p, (_, _, t) in enumerate(states) if t]
                raise TimeoutError(f"process(es) {late} waited {timeout_s}s for their fresh groups")

    def stop(self) -> None:
        self._stop.set()
        self.buffer.close()
        for thread in self._threads:
            thread.join()
        self._threads = []
