"""Group-relative advantages, quarantine, terminal scoring and STEPO against numpy references."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    STATUS_CODES,
    AdvantageConfig,
    broadcast_to_items,
    dr_grpo,
    episode_advantages,
    group_stats,
    grpo,
    rloo,
    score_terminal_rewards,
    stepo_item_advantages,
    token_advantages,
    valid_from_status,
)
from cua_jax.types import EpisodeStatus

PROPERTY = settings(max_examples=40, deadline=None)

# Fixed shapes, so each jitted function compiles once for all hypothesis examples.
NUM_EPISODES, NUM_GROUPS, NUM_ITEMS, SEQ_LEN = 12, 4, 16, 6

# A reward grid with ties, so degenerate and lone-success groups are common.
REWARDS = hnp.arrays(np.float32, (NUM_EPISODES,), elements=st.sampled_from([0.0, 1.0, -0.2, 0.5, 0.25, 2.0]))
GROUP_IDS = hnp.arrays(np.int32, (NUM_EPISODES,), elements=st.integers(0, NUM_GROUPS - 1))
VALID = hnp.arrays(bool, (NUM_EPISODES,))
STATUS = hnp.arrays(np.int32, (NUM_EPISODES,), elements=st.sampled_from(sorted(STATUS_CODES.values())))


def jit_estimator(fn, config=None):
    return jax.jit(functools.partial(fn, num_groups=NUM_GROUPS, config=config))


JITTED_ESTIMATORS = {name: jit_estimator(fn) for name, fn in ADVANTAGE_ESTIMATORS.items()}
group_stats_jit = jax.jit(functools.partial(group_stats, num_groups=NUM_GROUPS))
score_terminal_rewards_jit = jax.jit(score_terminal_rewards)
valid_from_status_jit = jax.jit(valid_from_status)
episode_advantages_jit = {
    name: jax.jit(functools.partial(episode_advantages, num_groups=NUM_GROUPS, config=AdvantageConfig(estimator=name)))
    for name in ADVANTAGE_ESTIMATORS
}
stepo_item_advantages_jit = jax.jit(stepo_item_advantages)
broadcast_to_items_jit = jax.jit(broadcast_to_items)
token_advantages_jit = jax.jit(token_advantages)


def reference_advantages(kind, rewards, group_ids, valid, std_eps=1e-6):
    """Per-group loops in float64: quarantine first, then the estimator on what is left."""
    rewards = np.asarray(rewards, np.float64)
    out = np.zeros_like(rewards)
    for g in np.unique(group_ids):
        members = np.flatnonzero((group_ids == g) & valid)
        r = rewards[members]
        if len(r) < 2 or np.all(r == r[0]):
            continue  # one outcome class: no signal
        if kind == "grpo":
            out[members] = (r - r.mean()) / (r.std() + std_eps)
        elif kind == "dr_grpo":
            out[members] = r - r.mean()
        elif kind == "rloo":
            out[members] = [r[i] - np.delete(r, i).mean() for i in range(len(r))]
    return out


@PROPERTY
@given(rewards=REWARDS, group_ids=GROUP_IDS, valid=VALID, kind=st.sampled_from(sorted(ADVANTAGE_ESTIMATORS)))
def test_estimators_match_reference_and_sum_to_zero_per_group(rewards, group_ids, valid, kind):
    got = np.asarray(JITTED_ESTIMATORS[kind](rewards, group_ids, valid=valid))
    want = reference_advantages(kind, rewards, group_ids, valid)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got[~valid] == 0)
    for g in range(NUM_GROUPS):
        np.testing.assert_allclose(got[group_ids == g].sum(), 0.0, atol=1e-4)


@pytest.mark.parametrize("n", [2, 3, 8, 32])
def test_lone_success_gets_sqrt_n_minus_1(n):
    # CANOPY App. B: population std, so +sqrt(n-1) for the success and -1/sqrt(n-1) per failure.
    rewards = jnp.zeros(n).at[0].set(1.0)
    adv = jax.jit(functools.partial(grpo, num_groups=1, config=AdvantageConfig(std_eps=0.0)))(
        rewards, jnp.zeros(n, jnp.int32)
    )
    np.testing.assert_allclose(adv[0], np.sqrt(n - 1), rtol=1e-5)
    np.testing.assert_allclose(adv[1:], -1 / np.sqrt(n - 1), rtol=1e-5)


def test_degenerate_groups_get_exactly_zero():
    # Three equal non-representable rewards: the float mean is not exactly 0.1, yet A must be 0.
    # Padded to the module's fixed shape (group 3, all 2.0) to reuse the compiled estimators.
    rewards = jnp.full(NUM_EPISODES, 2.0).at[:6].set(jnp.array([0.1, 0.1, 0.1, 1.0, 1.0, 0.7]))
    group_ids = jnp.full(NUM_EPISODES, 3).at[:6].set(jnp.array([0, 0, 0, 1, 1, 2]))
    for fn in JITTED_ESTIMATORS.values():
        adv = fn(rewards, group_ids)
        assert np.all(np.asarray(adv) == 0.0)


def test_quarantine_before_standardisation_differs_from_masking_after():
    # One success, one genuine failure, one infrastructure crash scored 0 (a false negative).
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 0.0])
    group_ids = jnp.array([0, 0, 0, 1, 1])
    valid = jnp.array([True, True, False, True, False])
    config = AdvantageConfig(std_eps=0.0)
    grpo_jit = jax.jit(functools.partial(grpo, num_groups=2, config=config))
    quarantine_first = np.asarray(grpo_jit(rewards, group_ids, valid=valid))
    mask_after = np.asarray(grpo_jit(rewards, group_ids)) * np.asarray(valid)
    # Group 0 standardises over {1, 0}: +-1, not over the crash-polluted {1, 0, 0}.
    np.testing.assert_allclose(quarantine_first[:3], [1.0, -1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(mask_after[:3], [np.sqrt(2), -1 / np.sqrt(2), 0.0], rtol=1e-6)
    # Group 1 is left with one outcome class: zero advantage, where masking after still pushes.
    np.testing.assert_array_equal(quarantine_first[3:], [0.0, 0.0])
    assert mask_after[3] > 0


def test_rloo_matches_scaled_dr_grpo():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.5])
    group_ids = jnp.zeros(4, jnp.int32)
    rloo_jit = jax.jit(functools.partial(rloo, num_groups=1))
    dr_grpo_jit = jax.jit(functools.partial(dr_grpo, num_groups=1))
    np.testing.assert_allclose(
        rloo_jit(rewards, group_ids), 4 / 3 * np.asarray(dr_grpo_jit(rewards, group_ids)), rtol=1e-6
    )


def reference_group_stats(rewards, group_ids, valid):
    count, mean, std, degenerate = (np.zeros(NUM_GROUPS) for _ in range(4))
    for g in range(NUM_GROUPS):
        r = np.asarray(rewards, np.float64)[(group_ids == g) & valid]
        count[g] = len(r)
        if len(r):
            mean[g], std[g] = r.mean(), r.std()
        degenerate[g] = len(r) < 2 or np.all(r == r[0])
    return count, mean, std, degenerate.astype(bool)


@PROPERTY
@given(rewards=REWARDS, group_ids=GROUP_IDS, valid=VALID)
def test_group_stats_matches_reference(rewards, group_ids, valid):
    got = group_stats_jit(rewards, group_ids, valid=valid)
    count, mean, std, degenerate = reference_group_stats(rewards, group_ids, valid)
    np.testing.assert_array_equal(got.count, count)
    np.testing.assert_allclose(got.mean, mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.std, std, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.degenerate, degenerate)


def test_nan_reward_of_a_quarantined_episode_does_not_leak():
    rewards = jnp.array([1.0, 0.0, jnp.nan])
    adv = JITTED_ESTIMATORS["grpo"](
        jnp.pad(rewards, (0, NUM_EPISODES - 3)),
        jnp.zeros(NUM_EPISODES, jnp.int32).at[3:].set(1),
        valid=jnp.arange(NUM_EPISODES) != 2,
    )
    assert np.all(np.isfinite(adv))
    np.testing.assert_allclose(adv[:3], [1.0, -1.0, 0.0], rtol=1e-5)


@PROPERTY
@given(rewards=REWARDS, status=STATUS, nv=st.sampled_from([-0.2, -1.0, 0.0]))
def test_score_terminal_rewards_and_valid_from_status(rewards, status, nv):
    scored = score_terminal_rewards_jit(rewards, status, nv)
    no_verdict = status == STATUS_CODES[EpisodeStatus.NO_VERDICT]
    np.testing.assert_allclose(scored, np.where(no_verdict, np.float32(nv), rewards))
    valid = valid_from_status_jit(status)
    np.testing.assert_array_equal(valid, status != STATUS_CODES[EpisodeStatus.QUARANTINED])


@PROPERTY
@given(
    rewards=REWARDS,
    status=STATUS,
    group_ids=GROUP_IDS,
    padding=VALID,
    kind=st.sampled_from(sorted(ADVANTAGE_ESTIMATORS)),
)
def test_episode_advantages_is_score_then_quarantine_then_estimate(rewards, status, group_ids, padding, kind):
    got = episode_advantages_jit[kind](rewards, status, group_ids, valid=padding)
    scored = np.where(status == STATUS_CODES[EpisodeStatus.NO_VERDICT], np.float32(-0.2), rewards)
    keep = (status != STATUS_CODES[EpisodeStatus.QUARANTINED]) & padding
    np.testing.assert_allclose(got, reference_advantages(kind, scored, group_ids, keep), rtol=1e-5, atol=1e-5)


NEGATIVE_SCALES = (0.0, 0.25)
episode_advantages_scaled_jit = {
    scale: jax.jit(
        functools.partial(
            episode_advantages, num_groups=NUM_GROUPS, config=AdvantageConfig(estimator="dr_grpo", negative_scale=scale)
        )
    )
    for scale in NEGATIVE_SCALES
}


@PROPERTY
@given(rewards=REWARDS, status=STATUS, group_ids=GROUP_IDS, scale=st.sampled_from(NEGATIVE_SCALES))
def test_negative_scale_shrinks_only_the_advantages_below_the_group_mean(rewards, status, group_ids, scale):
    got = np.asarray(episode_advantages_scaled_jit[scale](rewards, status, group_ids))
    scored = np.where(status == STATUS_CODES[EpisodeStatus.NO_VERDICT], np.float32(-0.2), rewards)
    keep = status != STATUS_CODES[EpisodeStatus.QUARANTINED]
    want = reference_advantages("dr_grpo", scored, group_ids, keep)
    want = np.where(want < 0, want * scale, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if scale == 0.0:
        assert np.all(got >= 0)


def test_advantage_config_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="unknown.*grpo"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(ValueError, match="std_eps"):
        AdvantageConfig(std_eps=-1.0)
    with pytest.raises(ValueError, match="negative_scale"):
        AdvantageConfig(negative_scale=1.5)


def test_group_stats_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="matching 1-D"):
        group_stats(jnp.zeros(3), jnp.zeros(4, jnp.int32), 2)
    with pytest.raises(ValueError, match="valid mask shape"):
        grpo(jnp.zeros(3), jnp.zeros(3, jnp.int32), 2, valid=jnp.ones(4, bool))
    with pytest.raises(ValueError, match=r"group_stats: group_ids must lie in \[0, 2\)"):
        grpo(jnp.zeros(3), jnp.array([0, 1, 2]), 2)


# No subnormals: XLA on CPU flushes them to zero.
FINITE_ADVANTAGE = st.floats(-3, 3, width=32, allow_subnormal=False)
TRAJECTORY_ADVANTAGES = hnp.arrays(np.float32, (NUM_EPISODES,), elements=FINITE_ADVANTAGE)
ITEM_EPISODE = hnp.arrays(np.int32, (NUM_ITEMS,), elements=st.integers(0, NUM_EPISODES - 1))
ITEM_VALID = hnp.arrays(bool, (NUM_ITEMS,))


@PROPERTY
@given(adv=TRAJECTORY_ADVANTAGES, item_episode=ITEM_EPISODE, item_valid=ITEM_VALID)
def test_stepo_items_sum_to_their_trajectory_advantage(adv, item_episode, item_valid):
    got = np.asarray(stepo_item_advantages_jit(adv, item_episode, item_valid))
    want = np.zeros(NUM_ITEMS)
    for b in range(NUM_ITEMS):
        if item_valid[b]:
            steps = np.sum((item_episode == item_episode[b]) & item_valid)
            want[b] = adv[item_episode[b]] / steps
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for e in range(NUM_EPISODES):
        items = (item_episode == e) & item_valid
        if items.any():
            np.testing.assert_allclose(got[items].sum(), adv[e], rtol=1e-5, atol=1e-6)


@PROPERTY
@given(
    rewards=REWARDS,
    group_ids=GROUP_IDS,
    extra_items=hnp.arrays(np.int32, (NUM_ITEMS - NUM_EPISODES,), elements=st.integers(0, NUM_EPISODES - 1)),
)
def test_stepo_items_of_a_group_sum_to_zero(rewards, group_ids, extra_items):
    # Every episode has at least one step item; some have several.
    item_episode = np.concatenate([np.arange(NUM_EPISODES, dtype=np.int32), extra_items])
    adv = JITTED_ESTIMATORS["grpo"](rewards, group_ids)
    stepo = np.asarray(stepo_item_advantages_jit(adv, item_episode))
    for g in range(NUM_GROUPS):
        np.testing.assert_allclose(stepo[group_ids[item_episode] == g].sum(), 0.0, atol=1e-4)


def test_plain_broadcast_breaks_the_zero_sum_that_stepo_keeps():
    # A 1-step success and a 3-step failure: copying A to every step weights the failure 3x.
    adv = jnp.array([1.0, -1.0])
    item_episode = jnp.array([0, 1, 1, 1])
    np.testing.assert_allclose(np.sum(broadcast_to_items_jit(adv, item_episode)), -2.0)
    np.testing.assert_allclose(np.sum(stepo_item_advantages_jit(adv, item_episode)), 0.0, atol=1e-7)


@PROPERTY
@given(adv=TRAJECTORY_ADVANTAGES, item_episode=ITEM_EPISODE, item_valid=ITEM_VALID)
def test_broadcast_to_items_copies_the_trajectory_advantage(adv, item_episode, item_valid):
    got = broadcast_to_items_jit(adv, item_episode, item_valid)
    np.testing.assert_array_equal(got, np.where(item_valid, adv[item_episode], 0.0))


@PROPERTY
@given(
    item_adv=hnp.arrays(np.float32, (NUM_ITEMS,), elements=FINITE_ADVANTAGE),
    mask=hnp.arrays(np.int32, (NUM_ITEMS, SEQ_LEN), elements=st.integers(0, 1)),
)
def test_token_advantages_lie_on_the_loss_mask(item_adv, mask):
    got = token_advantages_jit(item_adv, mask)
    want = np.array([[item_adv[b] if mask[b, t] else 0.0 for t in range(SEQ_LEN)] for b in range(NUM_ITEMS)])
    np.testing.assert_array_equal(got, want)


def test_item_functions_reject_bad_shapes():
    with pytest.raises(ValueError, match="stepo_item_advantages: item_episode must be 1-D"):
        stepo_item_advantages(jnp.zeros(3), jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(ValueError, match=r"broadcast_to_items: item_episode must lie in \[0, 3\)"):
        broadcast_to_items(jnp.zeros(3), jnp.array([0, 3]))
    with pytest.raises(ValueError, match=r"loss_mask .* must be \[B, T\]"):
        token_advantages(jnp.zeros(3), jnp.zeros((4, 5)))
