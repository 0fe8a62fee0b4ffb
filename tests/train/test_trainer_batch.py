"""The trainer's pure pieces: Wilson intervals, the trend slope, quarantine + advantages + the mini-batch plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.eval.intervals import difference_interval, paired_difference_interval, slope_interval, wilson_interval
from cua_jax.rollout.agent_loop import Rollout
from cua_jax.train.groups import draw_group_seeds, group_from_rollouts, prepare_batch, quarantine_kind
from cua_jax.train.settings import TrainSettings
from cua_jax.types import Episode, EpisodeStatus, Fault, FaultKind, TrainingItem, Turn
from experiments.configs.base import base_config


def wilson_reference(k, n, z):
    """Wilson's interval written out in numpy (the textbook form)."""
    p = k / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return centre - half, centre + half


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_matches_reference_and_holds_the_estimate(kn):
    k, n = kn
    low, high = wilson_interval(k, n, 0.95)
    ref_low, ref_high = wilson_reference(k, n, 1.959963984540054)
    assert low == pytest.approx(max(ref_low, 0.0), abs=1e-12) and high == pytest.approx(min(ref_high, 1.0), abs=1e-12)
    assert 0.0 <= low <= k / n <= high <= 1.0
    wider_low, wider_high = wilson_interval(k, n, 0.99)
    assert wider_low <= low + 1e-12 and wider_high >= high - 1e-12


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 10)[0] == 0.0
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(3, 2)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        # Newcombe (1998), Table II, method 10 (hybrid score without continuity correction).
        ((48, 80), (56, 70), (0.0524, 0.3339)),
        ((3, 10), (9, 10), (0.1705, 0.8090)),
        ((0, 29), (5, 56), (-0.0381, 0.1926)),
    ],
)
def test_difference_interval_matches_newcombes_published_values(a, b, expected):
    difference, low, high = difference_interval(*a, *b, confidence=0.95)
    assert difference == pytest.approx(b[0] / b[1] - a[0] / a[1])
    assert (round(low, 4), round(high, 4)) == expected


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
)
def test_difference_interval_holds_the_estimate_and_is_antisymmetric(a, b):
    difference, low, high = difference_interval(*a, *b)
    assert -1.0 <= low <= difference <= high <= 1.0
    swapped, swapped_low, swapped_high = difference_interval(*b, *a)
    assert swapped == pytest.approx(-difference)
    assert (swapped_low, swapped_high) == pytest.approx((-high, -low))
    # The interval of a difference is wider than either rate's own interval's half-width.
    assert high - low >= max(np.diff(wilson_interval(*a))[0], np.diff(wilson_interval(*b))[0]) - 1e-12


def paired_reference(table, z):
    """Newcombe's paired square-and-add interval for p_row - p_col of a 2x2 numpy table
    (rows: first outcome success / failure; columns: second), written from the paper."""
    n = table.sum()
    p1, p2 = table[0].sum() / n, table[:, 0].sum() / n
    l1, u1 = wilson_reference(table[0].sum(), n, z)
    l2, u2 = wilson_reference(table[:, 0].sum(), n, z)
    margins = np.prod([table[0].sum(), table[1].sum(), table[:, 0].sum(), table[:, 1].sum()], dtype=np.float64)
    a = table[0, 0] * table[1, 1] - table[0, 1] * table[1, 0]
    psi = (
        0.0
        if margins == 0
        else (a - n / 2) / np.sqrt(margins)
        if a > n / 2
        else 0.0
        if a >= 0
        else a / np.sqrt(margins)
    )
    d = p1 - p2
    low = d - np.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    high = d + np.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    return d, low, high


def test_paired_difference_interval_matches_the_published_value():
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8: complete
    # response before / after consolidation therapy (Cavo et al., 2012), table [[59, 6], [16, 80]]:
    # p_before - p_after = -0.0621, Newcombe square-and-add 95% CI (-0.1186, -0.0046).
    difference, low, high = paired_difference_interval(59, 6, 16, 80)
    assert (round(difference, 4), round(low, 4), round(high, 4)) == (0.0621, 0.0046, 0.1186)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=4, max_size=4).filter(lambda c: sum(c) > 0))
def test_paired_difference_interval_matches_reference_and_is_antisymmetric(counts):
    both, first_only, second_only, neither = counts
    difference, low, high = paired_difference_interval(*counts)
    ref_d, ref_low, ref_high = paired_reference(
        np.array([[both, first_only], [second_only, neither]]), 1.959963984540054
    )
    # The reference is oriented first - second: negate it.
    assert difference == pytest.approx(-ref_d, abs=1e-12)
    assert low == pytest.approx(max(-ref_high, -1.0), abs=1e-9) and high == pytest.approx(min(-ref_low, 1.0), abs=1e-9)
    assert -1.0 <= low <= difference <= high <= 1.0
    swapped, swapped_low, swapped_high = paired_difference_interval(both, second_only, first_only, neither)
    assert swapped == pytest.approx(-difference) and (swapped_low, swapped_high) == pytest.approx((-high, -low))
    # Agreeing outcomes (positive correlation) make the paired interval no wider than the
    # independent-samples one on the same margins.
    n = sum(counts)
    _, free_low, free_high = difference_interval(both + first_only, n, both + second_only, n)
    if both * neither - first_only * second_only >= 0:
        assert high - low <= free_high - free_low + 1e-12


def test_paired_difference_interval_edges():
    assert paired_difference_interval(0, 0, 0, 0) == (0.0, -1.0, 1.0)
    assert paired_difference_interval(10, 0, 0, 0)[0] == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        paired_difference_interval(1, -1, 0, 0)


def slope_reference(x, y, confidence):
    """OLS in numpy matrix form: beta = (X'X)^-1 X'y, Var(beta) = s^2 (X'X)^-1, t quantile."""
    from scipy.stats import t as student_t

    design = np.stack([np.ones(len(x)), np.asarray(x, np.float64)], axis=1)
    beta, *_ = np.linalg.lstsq(design, np.asarray(y, np.float64), rcond=None)
    residual = np.asarray(y) - design @ beta
    s2 = residual @ residual / (len(x) - 2)
    se = np.sqrt(s2 * np.linalg.inv(design.T @ design)[1, 1])
    half = student_t.ppf(0.5 + confidence / 2, len(x) - 2) * se
    return beta[1], beta[1] - half, beta[1] + half


@settings(max_examples=60, deadline=None)
@given(
    st.integers(3, 80).flatmap(lambda n: st.lists(st.floats(0, 1), min_size=n, max_size=n)),
    st.floats(-0.05, 0.05),
    st.sampled_from([0.8, 0.95]),
)
def test_slope_interval_matches_the_matrix_reference_and_holds_the_slope(values, trend, confidence):
    x = list(range(len(values)))
    y = [v + trend * i for i, v in enumerate(values)]
    slope, low, high = slope_interval(x, y, confidence)
    ref = slope_reference(x, y, confidence)
    assert (slope, low, high) == pytest.approx(ref, abs=1e-9)
    assert low <= slope <= high
    # Shifting y by a constant moves nothing; scaling y scales the slope and its interval.
    assert slope_interval(x, [v + 3.0 for v in y], confidence) == pytest.approx((slope, low, high), abs=1e-9)
    scaled = slope_interval(x, [2 * v for v in y], confidence)
    assert scaled == pytest.approx((2 * slope, 2 * low, 2 * high), abs=1e-9)


def test_slope_interval_edges():
    assert slope_interval([0, 1, 2, 3], [1.0, 1.5, 2.0, 2.5]) == pytest.approx((0.5, 0.5, 0.5))  # on a line
    slope, low, high = slope_interval([0, 1], [0.0, 1.0])
    assert slope == 1.0 and (low, high) == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="single value"):
        slope_interval([2, 2, 2], [0.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="at least 2"):
        slope_interval([0], [1.0])


def test_group_seeds_come_from_the_fixed_pages_when_given():
    import jax

    key = jax.random.key(3)
    fixed = draw_group_seeds(key, 64, (7, 100, 12), 1_000_000)
    assert set(fixed) == {7, 100, 12}  # every fixed page drawn over 64 groups, nothing else
    drawn = draw_group_seeds(key, 64, (), 1_000)
    assert all(0 <= seed < 1_000 for seed in drawn) and len(set(drawn)) > 32
    assert draw_group_seeds(key, 64, (), 1_000) == drawn  # a function of the key


def test_quarantine_kind_names_the_fault():
    assert quarantine_kind(Fault(FaultKind.SERVER_UNRESPONSIVE, "capsule env-1: boom")) == "server_unresponsive"
    assert quarantine_kind(Fault(FaultKind.CONTAINER_EXITED, "status 137")) == "container_exited"
    assert quarantine_kind(None) == "other"


def _rollout(task, group_id, k, status, reward, num_items):
    turns = [Turn("", [], np.asarray([k, t], np.int32), np.zeros(2, np.float32)) for t in range(num_items)]
    episode = Episode(
        f"{task}/g{group_id}/e{k}",
        task,
        group_id,
        "do it",
        turns,
        reward=reward,
        status=status,
        fault=Fault(FaultKind.SETUP_FAILED, "no page") if status is EpisodeStatus.QUARANTINED else None,
        policy_version=3,
    )
    items = [
        TrainingItem(
            np.arange(4, dtype=np.int32),
            np.asarray([0, 0, 1, 1], np.int32),
            np.zeros(4, np.float32),
            [],
            episode.episode_id,
            group_id,
            (t,),
        )
        for t in range(num_items)
    ]
    return Rollout(episode, items)


def _settings(**advantage):
    config = base_config()
    for key, value in advantage.items():
        config.advantage[key] = value
    return TrainSettings.from_config(config)


S, F, Q = EpisodeStatus.SUCCESS, EpisodeStatus.FAILURE, EpisodeStatus.QUARANTINED


def test_quarantined_episode_leaves_its_group_before_advantages():
    groups = [
        group_from_rollouts(
            0, "a", [_rollout("a", 0, 0, S, 1.0, 1), _rollout("a", 0, 1, F, 0.0, 1), _rollout("a", 0, 2, Q, 0.0, 1)]
        ),
        group_from_rollouts(1, "b", [_rollout("b", 1, 0, S, 1.0, 2), _rollout("b", 1, 1, F, 0.0, 1)]),
    ]
    batch = prepare_batch(groups, _settings(), num_minibatches=2, version=4)
    assert batch.metrics["quarantine/setup_failed"] == 1 and batch.metrics["quarantine/total"] == 1
    assert list(batch.quarantined) == ["a/g0/e2"]
    assert "a/g0/e2" not in {item.episode_id for item in batch.items}
    assert sorted(batch.kept_groups[0]) == ["a/g0/e0", "a/g0/e1"]
    # Group a, without its quarantined member, is one success and one failure: +-1 (GRPO).
    adv = dict(zip([(i.episode_id, i.step_indices) for i in batch.items], batch.item_advantages))
    assert adv[("a/g0/e0", (0,))] == pytest.approx(1.0, abs=1e-5)
    assert adv[("a/g0/e1", (0,))] == pytest.approx(-1.0, abs=1e-5)
    assert batch.metrics["groups/informative_fraction"] == 1.0 and batch.metrics["policy/lag_mean"] == 1.0
    assert batch.minibatch_groups == [[0], [1]]


def test_stepo_spreads_each_trajectory_over_its_steps():
    groups = [group_from_rollouts(0, "a", [_rollout("a", 0, 0, S, 1.0, 4), _rollout("a", 0, 1, F, 0.0, 1)])]
    batch = prepare_batch(groups, _settings(item_advantages="stepo"), num_minibatches=1, version=0)
    per_episode = {}
    for item, a in zip(batch.items, batch.item_advantages):
        per_episode.setdefault(item.episode_id, []).append(a)
    assert per_episode["a/g0/e0"] == pytest.approx([0.25] * 4, abs=1e-5)
    assert math.fsum(batch.item_advantages) == pytest.approx(0.0, abs=1e-5)


def test_all_quarantined_batch_has_nothing_to_train():
    groups = [group_from_rollouts(0, "a", [_rollout("a", 0, 0, Q, 0.0, 1)])]
    batch = prepare_batch(groups, _settings(), num_minibatches=1, version=0)
    assert batch.items == [] and batch.metrics["quarantine/total"] == 1


def test_faults_an_agent_owns_are_counted_and_stay_in_their_group():
    """An episode that ended with a fault its agent owns (scored as failure) keeps its place in
    the group's advantages and is counted per kind, beside the quarantines."""
    owned = _rollout("a", 0, 1, F, 0.0, 1)
    owned.episode.fault = Fault(FaultKind.JUDGE_TAMPERED, "the judge's output holds 2 verdicts")  # as the loop sets it
    owned.episode.info["end_reason"] = owned.episode.fault.reason
    plain = _rollout("a", 0, 2, F, 0.0, 1)
    plain.episode.info["end_reason"] = "the agent declared done"
    malformed = _rollout("a", 0, 3, F, 0.0, 1)  # as a desktop episode's last turn notes it
    malformed.episode.turns[-1].info["malformed_results"] = ["/cache/out.docx: BadZipFile: File is not a zip file"]
    groups = [group_from_rollouts(0, "a", [_rollout("a", 0, 0, S, 1.0, 1), owned, plain, malformed])]
    batch = prepare_batch(groups, _settings(), num_minibatches=1, version=0)
    assert batch.metrics["agent_fault/judge_tampered"] == 1 and batch.metrics["agent_fault/malformed_result"] == 1
    assert batch.metrics["agent_fault/total"] == 2
    assert batch.metrics["quarantine/total"] == 0
    assert "a/g0/e1" in {item.episode_id for item in batch.items}


def test_quarantine_as_failure_keeps_the_episode_in_its_group_as_a_failure():
    """CANOPY App. G's sensitivity check: the faulted episode stays, scored 0, and is counted
    both as its quarantine kind and as scored_as_failure; the group's own record is untouched."""
    faulted = _rollout("a", 0, 2, Q, 0.0, 1)
    groups = [group_from_rollouts(0, "a", [_rollout("a", 0, 0, S, 1.0, 1), _rollout("a", 0, 1, F, 0.0, 1), faulted])]
    batch = prepare_batch(groups, _settings(quarantine_as_failure=True), num_minibatches=1, version=3)
    assert batch.metrics["quarantine/setup_failed"] == 1 and batch.metrics["quarantine/scored_as_failure"] == 1
    assert batch.metrics["agent_fault/total"] == 0 and batch.quarantined == {}
    assert batch.metrics["episodes/trained"] == 3 and sorted(batch.kept_groups[0]) == ["a/g0/e0", "a/g0/e1", "a/g0/e2"]
    assert batch.episodes["a/g0/e2"].status is F and faulted.episode.status is Q
    # GRPO over rewards (1, 0, 0): mean 1/3, population std sqrt(2)/3.
    adv = {i.episode_id: a for i, a in zip(batch.items, batch.item_advantages)}
    std = math.sqrt(2) / 3
    assert adv["a/g0/e0"] == pytest.approx((2 / 3) / std, abs=1e-4)
    assert adv["a/g0/e2"] == pytest.approx(adv["a/g0/e1"]) == pytest.approx((-1 / 3) / std, abs=1e-4)
    assert batch.metrics["success/rate"] == pytest.approx(1 / 3)


def test_a_replayed_success_keeps_its_own_version_and_does_not_age_its_group():
    """DTAC's AdaPR swap: the group's last failure gives its place to a cached success, renamed
    into the group; the replay keeps the version that sampled it (its true age is logged as
    replay/age_*), while the group's staleness and policy/lag_* stay those of its own episodes."""
    from cua_jax.train.groups import swap_in_replay

    cached = _rollout("a", 0, 5, S, 1.0, 2)
    cached.episode.policy_version = 1
    group = group_from_rollouts(7, "a", [_rollout("a", 7, 0, F, 0.0, 1), _rollout("a", 7, 1, F, 0.0, 1)])
    last_failure = group.episodes[-1].episode_id
    swap_in_replay(group, cached)
    replay = group.episodes[-1]
    assert replay.episode_id == "a/g7/replay" and replay.group_id == 7 and group.replayed
    assert replay.info["replay_of"] == "a/g0/e5" and "replay_of" not in cached.episode.info
    assert replay.policy_version == 1 and cached.episode.episode_id == "a/g0/e5"
    assert last_failure not in group.items and [i.group_id for i in group.items["a/g7/replay"]] == [7, 7]
    assert group.policy_version == 3  # its own episodes' version, not the replay's
    batch = prepare_batch([group], _settings(), num_minibatches=1, version=4)
    assert batch.metrics["replay/age_max"] == batch.metrics["replay/age_mean"] == 3.0
    assert batch.metrics["policy/lag_max"] == 1.0 and batch.metrics["groups/replayed"] == 1.0
    adv = {i.episode_id: a for i, a in zip(batch.items, batch.item_advantages)}
    assert adv["a/g7/replay"] == pytest.approx(1.0, abs=1e-5)


def test_a_stale_replay_is_not_dropped_by_the_staleness_window():
    from cua_jax.train.buffer import RolloutBuffer
    from cua_jax.train.groups import swap_in_replay

    cached = _rollout("a", 0, 5, S, 1.0, 1)
    cached.episode.policy_version = 0
    group = group_from_rollouts(1, "a", [_rollout("a", 1, 0, F, 0.0, 1), _rollout("a", 1, 1, F, 0.0, 1)])
    swap_in_replay(group, cached)
    buffer = RolloutBuffer(staleness_window=1, capacity=4)
    buffer.put(group)
    assert buffer.take(1, current_version=4, timeout=1) == [group] and buffer.dropped_stale_groups == 0
