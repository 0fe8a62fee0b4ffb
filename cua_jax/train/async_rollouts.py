"""Asynchronous mode's rollout side: one thread per rollout worker, each drawing tasks and
running groups with whatever policy version its engine holds, into a `RolloutBuffer` the
learner takes whole groups from (the buffer drops groups older than the staleness window)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cua_jax.train.buffer import RolloutBuffer, RolloutGroup


class RolloutFeeder:
    """The rollout threads of async mode and their buffer.

    `start(workers, collect, current_step)`: thread w loops `collect(step_index, worker)` with
    step_index = (current_step() + draw) * len(workers) + w, so rollout draws take their own
    step numbers after every learner step ever taken (never reusing a key), and puts the groups
    into the buffer. An exception in a thread is kept and raised to the learner by `take`.
    """

    def __init__(self, staleness_window: int, capacity: int):
        self.buffer = RolloutBuffer(staleness_window, capacity)
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()

    def start(self, workers: Sequence[Any], collect: Callable[[int, Any], tuple[list[RolloutGroup], Any]],
              current_step: Callable[[], int]) -> None:
        self._stop.clear()
        for w, worker in enumerate(workers):
            thread = threading.Thread(target=self._loop, args=(w, len(workers), worker, collect, current_step),
                                      daemon=True, name=f"rollout-{w}")
            thread.start()
            self._threads.append(thread)

    def _loop(self, w: int, num_workers: int, worker: Any, collect, current_step) -> None:
        draw = 0
        try:
            while not self._stop.is_set():
                step_index = (current_step() + draw) * num_workers + w
                draw += 1
                groups, _ = collect(step_index, worker)
                for group in groups:
                    while not self._stop.is_set():
                        try:
                            self.buffer.put(group, timeout=0.5)
                            break
                        except TimeoutError:
                            continue
        except RuntimeError as error:
            if not self._stop.is_set():  # a worker shut down under a stopping run is expected
                self._error = error
        except BaseException as error:  # noqa: BLE001 - surfaced to the learner thread
            self._error = error

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
