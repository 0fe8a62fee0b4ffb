"""The processes' watchdog (cua_jax/models/liveness.py) over a fake coordination-service store:
which process a verdict names, and when. tests/launch/test_multihost_coordinated.py kills a real
process of a real two-process run."""

from __future__ import annotations

import threading
import time

import pytest

from cua_jax.models.liveness import (
    ProcessWatchdog,
    heartbeat_interval,
    jax_heartbeat_timeout_s,
)


class Store:
    """The coordination service's key-value store as the watchdog uses it."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.down = False
        self.lock = threading.Lock()

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        with self.lock:
            assert allow_overwrite or key not in self.values
            self.values[key] = value

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        with self.lock:
            return [(k, v) for k, v in sorted(self.values.items()) if k.startswith(prefix)]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _processes(count=3, timeout=10.0):
    store, clock, lost = Store(), Clock(), []
    watchdogs = [
        ProcessWatchdog(store, p, count, timeout, host=f"node-{p}", on_lost=lost.append, clock=clock)
        for p in range(count)
    ]
    for w in watchdogs:  # what start() writes before its thread runs
        store.key_value_set(f"cua_jax/hosts/{w.index}", w.host, allow_overwrite=True)
    return store, clock, lost, watchdogs


def test_a_process_whose_beats_stop_is_named_with_its_host_after_the_timeout():
    _, clock, _, (w0, w1, w2) = _processes()
    for _ in range(5):
        assert [w.check() for w in (w0, w1, w2)] == [None, None, None]
        clock.now += 3
    # Process 2 stops beating: its last beat stays for the timeout, then both others name it.
    for _ in range(3):
        assert w0.check() is None and w1.check() is None
        clock.now += 3
    clock.now += 1.5
    for w in (w0, w1):
        verdict = w.check()
        assert verdict.startswith("process 2 of 3 (host node-2) stopped sending heartbeats 10 s ago"), verdict
        assert "config.mesh.heartbeat_timeout_s = 10" in verdict


def test_a_process_that_finished_is_not_lost_and_one_that_exited_early_is():
    _, clock, _, (w0, w1, w2) = _processes()
    assert [w.check() for w in (w0, w1, w2)] == [None, None, None]
    w1.finish()  # process 1 ended its part of the run: no more beats
    clock.now += 100
    assert w0.check() is None and w2.check() is None
    w2._at_exit()  # process 2 exits without finishing (an error of its own)
    verdict = w0.check()
    assert verdict == "process 2 of 3 (host node-2) exited before the run finished (its log has the error)"


def test_every_survivor_names_the_process_the_first_one_found_lost():
    store, clock, lost, (w0, w1, w2) = _processes()
    assert [w.check() for w in (w0, w1, w2)] == [None, None, None]
    w0.lose("process 2 of 3 (host node-2) stopped sending heartbeats 10 s ago")
    assert lost == [
        "process 2 of 3 (host node-2) stopped sending heartbeats 10 s ago. Stopping process 0 of 3 (host node-0) "
        "with exit status 75; relaunch every process with --resume (the same --workdir) to continue from the last "
        "checkpoint"
    ]
    assert store.values["cua_jax/liveness/0"].startswith("lost process 2 of 3")
    assert w1.check() == "process 2 of 3 (host node-2) stopped sending heartbeats 10 s ago (seen first by process 0)"


def test_a_coordination_service_that_stops_answering_names_process_0():
    store, clock, _, (w0, w1, _) = _processes()
    assert w0.check() is None and w1.check() is None
    store.down = True
    clock.now += 5
    assert w1.check() is None  # within the timeout: a slow answer is no verdict
    clock.now += 6
    verdict = w1.check()
    assert verdict.startswith("process 0 of 3 (host node-0), which runs the coordination service, has not answered")
    assert w0.check() is None  # process 0 hosts it: its own calls failing name no one


def test_after_a_runtime_error_the_main_thread_waits_for_the_verdict_or_fresh_beats():
    """Real threads: with every process alive the wait ends after a beat or two (the error is
    this process's own); with one stopped it ends with the verdict naming it."""
    store, lost = Store(), []
    watchdogs = [
        ProcessWatchdog(store, p, 3, 1.0, host=f"h{p}", interval_s=0.05, on_lost=lost.append) for p in range(3)
    ]
    for w in watchdogs:
        w.start()
    try:
        time.sleep(0.2)
        start = time.monotonic()
        assert watchdogs[0].await_verdict() is None
        assert time.monotonic() - start < 0.8
        watchdogs[2].stop()  # silent from now on, as a killed process
        start = time.monotonic()
        verdict = watchdogs[0].await_verdict()
        assert verdict.startswith("process 2 of 3 (host h2) stopped sending heartbeats"), verdict
        assert 0.8 < time.monotonic() - start < 3
        assert any(message.startswith("process 2 of 3 (host h2)") for message in lost)
    finally:
        for w in watchdogs:
            w.stop()


def test_intervals_and_jax_backstop():
    assert heartbeat_interval(100) == 5 and heartbeat_interval(10) == 1 and heartbeat_interval(1) == 0.2
    assert (
        jax_heartbeat_timeout_s(100) == 200 and jax_heartbeat_timeout_s(10) == 20 and jax_heartbeat_timeout_s(0.5) == 2
    )
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ProcessWatchdog(Store(), 0, 2, 0)
