"""Where the wall time of a run goes: named stages recorded as intervals, and token counters.

The stages of one training update run concurrently: environments step in browser processes
while the engine generates in a worker thread and the event loop renders prompts. A sum of
per-stage durations therefore over-counts the wall time. A `Timeline` keeps every stage's
intervals and `Timeline.breakdown` partitions a wall-clock window among them: at each instant
the highest-priority stage active then gets the time (device work before engine-side Python,
before the agent loop's Python, before waiting on environments), and instants with no stage
active are "other". The parts add up to the window exactly.

Recording is off unless a timeline is active (`recording(timeline)`, as the rl_step benchmark
does): `span(stage)` and `count(name, n)` then cost one global read. Only the process that
activated the timeline records (a Ray actor's work is not seen).

    with recording(Timeline()) as timeline:
        ...                                  # code that calls span("prefill"), count(...)
    timeline.breakdown(t0, t1)               # {"prefill": s, ..., "other": s}
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

# Stages in attribution order (first wins an instant where several are active). Device stages
# first: their time is the engine's or the learner's; engine-side and agent-loop Python next;
# environments last (waiting on a browser while nothing else runs).
STAGES = (
    "compile",  # tracing + XLA compilation (a new shape)
    "vision",
    "prefill",
    "decode",  # the rollout engine's device work
    "forward_backward",
    "reference",
    "old_logprobs",
    "optimizer",  # the learner's device work
    "sync",  # weight sync to the engines
    "engine_host",  # the engine's Python: images, batches, caches
    "learner_host",  # advantages, images, batching
    "agent_host",  # the agent loop's Python: prompts, parsing
    "env",  # environment reset, step, screenshot
)


class Timeline:
    """Intervals per stage (perf_counter seconds), windows (named phases such as a training
    step's rollout and learning, which the stages are attributed within) and counters;
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.intervals: list[tuple[str, float, float]] = []
        self.windows: list[tuple[str, float, float]] = []
        self.counters: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.windows.append((name, start, time.perf_counter()))

    def add(self, stage: str, start: float, end: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown timeline stage {stage!r}; stages are {STAGES}")
        with self._lock:
            self.intervals.append((stage, start, end))

    def count(self, name: str, n: float) -> None:
        with self._lock:
            self.counters[name] += n

    @contextlib.contextmanager
    def span(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, start, time.perf_counter())

    def breakdown(self, start: float, end: float, priority: Sequence[str] = STAGES) -> dict[str, float]:
        """The window [start, end] partitioned among the stages (module doc): seconds per stage
        plus "other" (no stage active); the values add up to end - start."""
        rank = {stage: i for i, stage in enumerate(priority)}
        events: list[tuple[float, int, int]] = []  # (time, +1 / -1, stage rank)
        with self._lock:
            intervals = list(self.intervals)
        for stage, a, b in intervals:
            a, b = max(a, start), min(b, end)
            if b > a:
                events += [(a, 1, rank[stage]), (b, -1, rank[stage])]
        events.sort()
        active = [0] * len(priority)
        out = dict.fromkeys(list(priority) + ["other"], 0.0)
        now = start
        for t, delta, r in events:
            if t > now:
                top = next((i for i, n in enumerate(active) if n > 0), None)
                out["other" if top is None else priority[top]] += t - now
                now = t
            active[r] += delta
        out["other"] += max(0.0, end - now)
        return out


_ACTIVE: Timeline | None = None


@contextlib.contextmanager
def recording(timeline: Timeline) -> Iterator[Timeline]:
    """Makes `timeline` the one `span` and `count` record into, for the block."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, timeline
    try:
        yield timeline
    finally:
        _ACTIVE = previous


# Tracing, lowering and XLA's compilation of a program for a new shape.
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_compile_listener_installed = False


def record_compilation() -> None:
    """Records XLA compilations on the active timeline as "compile" intervals (once per process;
    a compilation's interval ends when JAX reports its duration)."""
    global _compile_listener_installed
    if _compile_listener_installed:
        return
    import jax

    def listener(event: str, duration_s: float, **_) -> None:
        timeline = _ACTIVE
        if timeline is not None and event in _COMPILE_EVENTS:
            end = time.perf_counter()
            timeline.add("compile", end - duration_s, end)

    jax.monitoring.register_event_duration_secs_listener(listener)
    _compile_listener_installed = True


def active() -> Timeline | None:
    return _ACTIVE


def span(stage: str):
    """A context manager recording the block as `stage` on the active timeline (none: no-op)."""
    timeline = _ACTIVE
    return timeline.span(stage) if timeline is not None else contextlib.nullcontext()


def window(name: str):
    """A context manager recording the block as a window `name` on the active timeline."""
    timeline = _ACTIVE
    return timeline.window(name) if timeline is not None else contextlib.nullcontext()


def settle(outputs):
    """`outputs` (arrays, or a pytree of them), waited for only while a timeline records: a
    stage's span then ends when its device work does, not when it was dispatched; otherwise
    dispatch stays asynchronous."""
    if _ACTIVE is not None:
        import jax

        jax.block_until_ready(outputs)
    return outputs


def count(name: str, n: float) -> None:
    """Adds n to the active timeline's counter `name` (none active: nothing)."""
    timeline = _ACTIVE
    if timeline is not None:
        timeline.count(name, n)
