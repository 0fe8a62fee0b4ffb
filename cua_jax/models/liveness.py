"""The processes of a multi-host run watching each other: a process that dies stops the others
with one error naming it (process index and host), instead of a hang in a collective.

What JAX does alone (jax 0.10, measured with two CPU processes over gloo): a survivor waits in
the collective its dead peer never joins (gloo fails it at once with "Connection closed by peer
[address]", naming no process; NCCL waits), until the coordination service, in process 0, has
missed the dead process's heartbeats for `heartbeat_timeout_seconds` and aborts every other
process from a C++ thread (a fatal log and a stack trace; Python cannot catch it, and jaxlib's
missed-heartbeat callback cannot take a Python function: it dies of std::bad_cast).

So each process runs a `ProcessWatchdog` (started by `sharding.initialize_distributed` when the
run has more than one process): a daemon thread that, every `interval_s`, writes a beat under
its own key of the coordination service's key-value store and reads every other process's.
A process whose beat has not changed for `timeout_s` (config.mesh.heartbeat_timeout_s), or that
exited without finishing, is lost: the watchdog prints one error naming it (and its host, which
every process writes to the store when it starts) and ends this process at once with exit
status `PROCESS_LOST_EXIT`, whatever the main thread is waiting in. JAX's own heartbeat timeout
is set to twice `timeout_s` (`jax_heartbeat_timeout_s`), a backstop the watchdog comes before.
A process that stops because of another writes that (its key becomes "lost ..."), so every
survivor names the same process. The main thread's side is `guard_process`: around a process's
work, a JAX runtime error (a collective that lost its peer) waits for the watchdog's verdict
before it propagates, and a normal end marks the process done, so that the others (process 0
writing the run's records after the last collective) do not count it lost.

The death of process 0 is the exception: it hosts the coordination service, and JAX's client in
every other process aborts the moment its connection resets ("Failed to send RPC to coordination
service. Either the leader task was preempted/died..."), before any watchdog can speak; the
watchdog's start line in each process's log names the coordinator's address for that case.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

PROCESS_LOST_EXIT = 75  # EX_TEMPFAIL: relaunch every process with --resume
_BEATS = "cua_jax/liveness/"
_HOSTS = "cua_jax/hosts/"
_DONE, _EXITED, _LOST = "done", "exited", "lost "

_log = logging.getLogger(__name__)


def heartbeat_interval(timeout_s: float) -> float:
    """Seconds between a watchdog's beats: a tenth of the timeout, between 0.2 and 5."""
    return min(5.0, max(0.2, timeout_s / 10))


def jax_heartbeat_timeout_s(timeout_s: float) -> int:
    """JAX's own heartbeat timeout (jax.distributed.initialize's heartbeat_timeout_seconds, whole
    seconds) for a watchdog timeout: twice it, so the watchdog names the lost process first."""
    return max(2, math.ceil(2 * timeout_s))


@dataclasses.dataclass
class _Peer:
    value: str | None
    changed: float  # clock time its beat last changed (or the watchdog started)
    done: bool = False


class ProcessWatchdog:
    """The watchdog of process `index` of `count` (module doc), over `client`: the coordination
    service's key-value client (jax.distributed's `global_state.client`; tests pass a fake with
    key_value_set(key, value, allow_overwrite) and key_value_dir_get(prefix)).

    on_lost: called with the error message when a process is lost (default: print it and end
    this process with PROCESS_LOST_EXIT). clock: monotonic seconds."""

    def __init__(
        self,
        client: Any,
        index: int,
        count: int,
        timeout_s: float,
        *,
        host: str | None = None,
        interval_s: float | None = None,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.client, self.index, self.count, self.timeout_s = client, index, count, float(timeout_s)
        self.interval_s = heartbeat_interval(timeout_s) if interval_s is None else interval_s
        self.host = host or socket.gethostname()
        self.hosts: dict[int, str] = {index: self.host}
        self.on_lost = on_lost or _exit_lost
        self.clock = clock
        now = clock()
        self._peers = {p: _Peer(None, now) for p in range(count) if p != index}
        self._last_answer = now
        self._round_start: float | None = None  # clock time the last answered round began
        self._beats = 0
        self.verdict: str | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False

    # -- the store ------------------------------------------------------------------------

    def _set(self, value: str) -> None:
        self.client.key_value_set(f"{_BEATS}{self.index}", value, allow_overwrite=True)

    def _read(self, prefix: str) -> dict[int, str]:
        out = {}
        for key, value in self.client.key_value_dir_get(prefix):
            tail = key.rsplit("/", 1)[-1]
            if tail.isdigit():
                out[int(tail)] = value
        return out

    def _name(self, process: int) -> str:
        host = self.hosts.get(process)
        return f"process {process} of {self.count}" + (f" (host {host})" if host else "")

    # -- one round ------------------------------------------------------------------------

    def check(self) -> str | None:
        """One round: writes this process's beat, reads the others'. Returns the verdict (the
        error message naming the lost process) or None while every process is alive."""
        now = self.clock()
        try:
            self._set(f"beat {self._beats}")
            self._beats += 1
            beats = self._read(_BEATS)
            if len(self.hosts) < self.count:
                self.hosts.update(self._read(_HOSTS))
        except Exception as error:  # noqa: BLE001 - the coordination service does not answer (any RPC error)
            silent = now - self._last_answer
            if self.index != 0 and silent > self.timeout_s:
                return (
                    f"{self._name(0)}, which runs the coordination service, has not answered for {silent:.0f} s "
                    f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
                )
            return None
        self._last_answer = now
        verdict = None
        with self._changed:
            self._round_start = now
            for p, peer in self._peers.items():
                value = beats.get(p)
                if value != peer.value:
                    peer.value, peer.changed = value, now
                if value == _DONE:
                    peer.done = True
                elif value is not None and value.startswith(_LOST):
                    verdict = verdict or f"{value[len(_LOST) :]} (seen first by process {p})"
                elif value == _EXITED:
                    verdict = verdict or f"{self._name(p)} exited before the run finished (its log has the error)"
                elif not peer.done and now - peer.changed > self.timeout_s:
                    verdict = verdict or (
                        f"{self._name(p)} stopped sending heartbeats {now - peer.changed:.0f} s ago "
                        f"(config.mesh.heartbeat_timeout_s = {self.timeout_s:g}): it was killed, crashed, or its "
                        "host or network went down"
                    )
            self._changed.notify_all()
        return verdict

    def lose(self, verdict: str) -> None:
        """Marks this process as stopping because of `verdict` (so every survivor names the same
        process), then `on_lost` (by default the process ends there; else `verdict` is kept and
        `await_verdict` returns it)."""
        with contextlib.suppress(Exception):
            self._set(_LOST + verdict)
        message = (
            f"{verdict}. Stopping {self._name(self.index)} with exit status {PROCESS_LOST_EXIT}; relaunch every "
            "process with --resume (the same --workdir) to continue from the last checkpoint"
        )
        self.on_lost(message)
        with self._changed:
            self.verdict = verdict
            self._changed.notify_all()

    # -- the thread -----------------------------------------------------------------------

    def start(self) -> ProcessWatchdog:
        """Writes this process's host and first beat, starts the thread, and marks this process
        exited at interpreter exit unless `finish` marked it done."""
        self.client.key_value_set(f"{_HOSTS}{self.index}", self.host, allow_overwrite=True)
        self._thread = threading.Thread(target=self._run, name="cua_jax-process-watchdog", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)  # after jax's own (registered at import): runs before it
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            verdict = self.check()
            if verdict is not None and not self._stop.is_set():
                self.lose(verdict)
                return
            self._stop.wait(self.interval_s)

    def stop(self, final: str | None = None) -> None:
        """Stops the thread; `final` ("done" / "exited") becomes this process's key."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 5)
        if final is not None:
            with contextlib.suppress(Exception):
                self._set(final)

    def finish(self) -> None:
        """This process finished its part of the run: the others no longer watch it."""
        self._finished = True
        self.stop(_DONE)

    def _at_exit(self) -> None:
        if not self._finished and self.verdict is None:
            self.stop(_EXITED)

    def await_verdict(self) -> str | None:
        """After a JAX runtime error in the main thread: waits until the watchdog either finds a
        process lost (the default on_lost ends this process, so this never returns then) or sees
        every other process beat again. Returns the verdict, None when every process is alive
        (the error is this process's own).

        A beat counts only if it changed after a round that began after this call: a round read
        before the error may predate a dead process's last beat."""
        start = self.clock()
        deadline = start + self.timeout_s + 3 * self.interval_s
        base = None
        with self._changed:
            while self.verdict is None and self.clock() < deadline:
                if base is None and self._round_start is not None and self._round_start > start:
                    base = self._round_start
                if base is not None and all(peer.done or peer.changed > base for peer in self._peers.values()):
                    return None
                self._changed.wait(self.interval_s)
        return self.verdict


def _exit_lost(message: str) -> None:
    """Prints the error and ends the process at once: the main thread may be waiting in a
    collective that never completes, and exit handlers would wait on the lost process too."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        os.write(2, f"\nERROR (cua_jax multi-host): {message}\n".encode())
    os._exit(PROCESS_LOST_EXIT)


_WATCHDOG: ProcessWatchdog | None = None


def start_watchdog(client: Any, index: int, count: int, timeout_s: float, coordinator: str | None) -> None:
    """Starts this process's watchdog (once), and logs where every process's error would come from."""
    global _WATCHDOG
    if _WATCHDOG is not None or count < 2:
        return
    _WATCHDOG = ProcessWatchdog(client, index, count, timeout_s).start()
    message = (
        f"multi-host run: process {index} of {count} on host {_WATCHDOG.host}; a process silent for {timeout_s:g} s "
        f"stops the others (exit status {PROCESS_LOST_EXIT}, naming it); process 0 runs the coordination service "
        f"at {coordinator}, and if it dies JAX aborts every other process at once"
    )
    _log.warning(message)


def current_watchdog() -> ProcessWatchdog | None:
    return _WATCHDOG


@contextlib.contextmanager
def guard_process() -> Iterator[None]:
    """Around a multi-host process's work (launch/multihost.py; a no-op without a watchdog): a
    JAX runtime error waits for the watchdog's verdict (a lost process ends this one with the
    error naming it) before it propagates; a normal end marks this process done."""
    try:
        yield
    except Exception as error:
        watchdog = _WATCHDOG
        if watchdog is not None and _is_runtime_error(error):
            watchdog.await_verdict()
        raise
    if _WATCHDOG is not None:
        _WATCHDOG.finish()


def _is_runtime_error(error: BaseException) -> bool:
    import jax

    seen = set()
    while error is not None and id(error) not in seen:  # the error or what it was raised from
        seen.add(id(error))
        if isinstance(error, jax.errors.JaxRuntimeError):
            return True
        error = error.__cause__ or error.__context__
    return False
