"""Task pool: EMA pass-rate updates (ScaleCUA eq. 1), per-task statistics, state round-trips."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.tasks.pool import (
    GroupOutcome,
    PoolTask,
    TaskPool,
    ema_update,
    load_state,
    save_state,
)
from cua_jax.types import Episode, EpisodeStatus

NUM_TASKS = 16


def make_pool(n: int = NUM_TASKS) -> TaskPool:
    return TaskPool([PoolTask(f"t{i}", f"d{i % 3}", i % 4, i % 5 != 0, {"kind": "test", "seed": i}) for i in range(n)])


def ema_reference(p, rate, observed, alpha):
    p = np.asarray(p, np.float64)
    out = p.copy()
    for i in range(p.shape[0]):
        if observed[i]:
            out[i] = rate[i] if np.isnan(p[i]) else (1 - alpha) * p[i] + alpha * rate[i]
    return out


unit = st.floats(0.0, 1.0, allow_nan=False, width=32)


@settings(max_examples=50, deadline=None)
@given(
    p=st.lists(st.one_of(unit, st.just(float("nan"))), min_size=NUM_TASKS, max_size=NUM_TASKS),
    rate=st.lists(unit, min_size=NUM_TASKS, max_size=NUM_TASKS),
    observed=st.lists(st.booleans(), min_size=NUM_TASKS, max_size=NUM_TASKS),
    alpha=st.floats(0.01, 1.0),
)
def test_ema_update_matches_eq1(p, rate, observed, alpha):
    p32, rate32 = np.array(p, np.float32), np.array(rate, np.float32)
    got = np.asarray(jax.jit(ema_update)(p32, rate32, np.array(observed), alpha))
    want = ema_reference(p32, rate32, observed, alpha)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(
    rounds=st.lists(
        st.lists(
            st.tuples(st.integers(0, NUM_TASKS - 1), st.integers(0, 8), st.integers(0, 8)),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=4,
    ),
    alpha=st.floats(0.05, 1.0),
)
def test_pool_records_outcomes_with_ema(rounds, alpha):
    """Counts add up; each round moves every observed task once by eq. 1 with its pooled rate;
    a task's first estimate is its first rate; groups with attempts == 0 change nothing."""
    pool = make_pool()
    p = np.full(NUM_TASKS, np.nan)
    successes, attempts = np.zeros(NUM_TASKS, int), np.zeros(NUM_TASKS, int)
    for groups in rounds:
        outcomes = [GroupOutcome(f"t{i}", min(s, a), a) for i, s, a in groups]
        pool.record_outcomes(outcomes, alpha)
        s_round, a_round = np.zeros(NUM_TASKS, int), np.zeros(NUM_TASKS, int)
        for o in outcomes:
            k = int(o.task_id[1:])
            s_round[k] += o.successes
            a_round[k] += o.attempts
        successes += s_round
        attempts += a_round
        rate = np.divide(s_round, a_round, out=np.zeros(NUM_TASKS), where=a_round > 0)
        p = ema_reference(p, rate, a_round > 0, alpha)
    np.testing.assert_array_equal(pool.successes, successes)
    np.testing.assert_array_equal(pool.attempts, attempts)
    np.testing.assert_allclose(pool.pass_rate, p, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_ema_update_of_one_task_by_hand():
    pool = make_pool()
    pool.record_outcomes([GroupOutcome("t1", 2, 8)], alpha=0.2)
    assert pool.pass_rate[1] == pytest.approx(0.25)  # first estimate: the observed rate
    pool.record_outcomes([GroupOutcome("t1", 8, 8), GroupOutcome("t2", 0, 0)], alpha=0.2)
    assert pool.pass_rate[1] == pytest.approx(0.8 * 0.25 + 0.2 * 1.0)
    assert np.isnan(pool.pass_rate[2])  # all-quarantined group: no estimate yet
    assert pool.attempts[1] == 16 and pool.successes[1] == 10


def test_pool_state_round_trips_through_save_and_restore(tmp_path):
    """Statistics and the replay cache survive a save/restore; a dataclass trajectory (an
    Episode) comes back as itself, with its replay count."""
    pool = make_pool()
    pool.record_outcomes([GroupOutcome("t3", 1, 8), GroupOutcome("t4", 0, 4)], alpha=0.2)
    pool.mark_sampled(np.array([3, 4]), step=7)
    pool.active[5] = False
    episode = Episode("e0", "t3", 0, "do it", turns=[], reward=1.0, status=EpisodeStatus.SUCCESS)
    pool.cache_success(3, episode, step=7, capacity=2)
    pool.cache_success(3, ("other",), step=7, capacity=2)
    assert pool.take_replay(3, max_replays=2) is episode

    save_state(tmp_path / "pool.pkl", pool.state_dict())
    restored = make_pool()
    restored.load_state_dict(load_state(tmp_path / "pool.pkl"))
    for name in ("attempts", "successes", "pass_rate", "last_step_sampled", "active"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(pool, name))
    entries = restored.replay_cache[3]
    assert isinstance(entries[0].trajectory, Episode) and entries[0].trajectory == episode
    assert [(e.replays, e.step_cached) for e in entries] == [(1, 7), (0, 7)]
