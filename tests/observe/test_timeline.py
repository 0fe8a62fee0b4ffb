"""cua_jax.observe.timeline: a window's breakdown partitions it among the stages (the first
active stage in priority order owns each instant, "other" where none is), against a reference
that classifies every elementary segment between interval boundaries."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.observe import timeline as T

intervals = st.lists(st.tuples(st.sampled_from(T.STAGES), st.floats(0, 10), st.floats(0, 10)), max_size=12)


def reference(spans, start, end):
    cuts = sorted({start, end, *(x for _, a, b in spans for x in (a, b) if start < x < end)})
    out = dict.fromkeys(list(T.STAGES) + ["other"], 0.0)
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        active = [T.STAGES.index(s) for s, x, y in spans if x <= mid < y]
        out[T.STAGES[min(active)] if active else "other"] += b - a
    return out


@settings(max_examples=200, deadline=None)
@given(intervals, st.floats(0, 5), st.floats(5, 10))
def test_breakdown_partitions_the_window_by_stage_priority(raw, start, end):
    timeline = T.Timeline()
    spans = [(stage, min(a, b), max(a, b)) for stage, a, b in raw]
    for stage, a, b in spans:
        timeline.add(stage, a, b)
    got = timeline.breakdown(start, end)
    assert sum(got.values()) == pytest.approx(end - start, abs=1e-9)
    want = reference(spans, start, end)
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=1e-9)


def test_recording_scopes_spans_counters_and_settle():
    assert T.active() is None
    with T.span("env"):  # nothing records outside `recording`
        T.count("x", 1)
    timeline = T.Timeline()
    with T.recording(timeline):
        with T.span("prefill"):
            T.count("sampler/prefill_tokens", 5)
        assert T.settle([np.ones(2)])[0].sum() == 2
    assert [stage for stage, _, _ in timeline.intervals] == ["prefill"]
    assert timeline.counters == {"sampler/prefill_tokens": 5}
    with pytest.raises(ValueError, match="unknown timeline stage 'nope'"):
        timeline.add("nope", 0.0, 1.0)
