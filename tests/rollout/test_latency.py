"""The injected-latency wrapper: the log-normal delay law, its seeded streams, and a wrapped
real MiniWoB++ capsule (system Chromium) stepped to success by the scripted oracle."""

from __future__ import annotations

import asyncio
import math
import pickle
from statistics import NormalDist

import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.rollout.latency import (
    DELAY_INFO_KEY,
    DelaySampler,
    LatencyEnvironment,
    LatencyWrapper,
    LogNormalDelay,
    lognormal_quantile,
)

PROPERTY = settings(max_examples=40, deadline=None)

# Fixed shape, and the distribution's parameters traced: one compilation for every example.
PROBABILITIES = hnp.arrays(np.float32, (16,), elements=st.floats(0.001953125, 0.998046875, width=32))
MEDIANS = st.floats(1e-3, 30.0)
SIGMAS = st.floats(0.0, 2.0)
CAP_FACTORS = st.one_of(st.just(math.inf), st.floats(1.0, 50.0))

quantile_jit = jax.jit(lognormal_quantile)


def quantile_reference(q, median_s, sigma, max_s):
    """numpy / standard-library reference: min(median * exp(sigma * Phi^-1(q)), max)."""
    inv_cdf = NormalDist().inv_cdf
    return np.asarray([min(median_s * math.exp(sigma * inv_cdf(float(p))), max_s) for p in q])


@PROPERTY
@given(q=PROBABILITIES, median_s=MEDIANS, sigma=SIGMAS, cap_factor=CAP_FACTORS)
def test_quantile_matches_the_reference(q, median_s, sigma, cap_factor):
    max_s = median_s * cap_factor
    got = np.asarray(quantile_jit(q, median_s, sigma, max_s))
    np.testing.assert_allclose(got, quantile_reference(q, median_s, sigma, max_s), rtol=2e-4)
    # Monotone in q, the median at q = 1/2, never above the cap.
    order = np.argsort(q, kind="stable")
    assert np.all(np.diff(got[order]) >= 0)
    assert got.max() <= max_s * (1 + 1e-6)
    np.testing.assert_allclose(float(quantile_jit(0.5, median_s, sigma, max_s)), median_s, rtol=1e-5)


@PROPERTY
@given(
    median_s=MEDIANS,
    sigma=st.one_of(st.just(0.0), st.floats(0.05, 2.0)),
    cap_factor=CAP_FACTORS,
    seed=st.integers(0, 2**32 - 1),
)
def test_seeded_draws_follow_the_quantile_function(median_s, sigma, cap_factor, seed):
    """The empirical CDF of 20,000 draws at the predicted quantiles is within the DKW band
    (P(sup |F_n - F| > 0.02) <= 2 exp(-2 n 0.02^2) ~ 2e-7)."""
    distribution = LogNormalDelay(median_s, sigma, None if math.isinf(cap_factor) else median_s * cap_factor)
    draws = distribution.sample(np.random.default_rng(seed), size=20_000)
    assert draws.shape == (20_000,) and np.all(draws > 0) and np.all(draws <= distribution.cap_s)
    probabilities = np.asarray([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99], np.float32)
    quantiles = distribution.quantile(probabilities).astype(np.float64)
    below_cap = quantiles < distribution.cap_s * (1 - 1e-4)  # past the cap all mass sits at the cap
    empirical = (draws[:, None] <= quantiles[None, :] * (1 + 1e-6)).mean(axis=0)
    if sigma == 0:  # a point mass at the median: every draw equals it
        np.testing.assert_allclose(draws, median_s)
        return
    np.testing.assert_array_less(np.abs(empirical - probabilities)[below_cap], 0.02)


def test_sampler_streams_are_fixed_by_their_seed():
    distribution = LogNormalDelay(0.5, 1.0, max_s=20.0)
    a, b, c = DelaySampler(distribution, (7, 0)), DelaySampler(distribution, (7, 0)), DelaySampler(distribution, (7, 1))
    stream_a = [a.draw() for _ in range(50)]
    assert stream_a == [b.draw() for _ in range(50)]
    assert stream_a != [c.draw() for _ in range(50)]
    assert len(set(stream_a)) == 50 and all(0 < d <= 20.0 for d in stream_a)


def test_wrapper_pickles_and_gives_each_environment_its_own_stream():
    wrapper = LatencyWrapper(0.5, 1.0, max_s=20.0, seed=3, delay_reset=True)
    envs = [wrapper(None) for _ in range(2)]
    assert [e.sampler.seed for e in envs] == [(3, 0), (3, 1)] and all(e.delay_reset for e in envs)
    copy = pickle.loads(pickle.dumps(wrapper))
    assert repr(copy) == repr(wrapper)
    assert copy(None).sampler.seed == (3, 2)  # continues the count it was pickled at
    assert wrapper(None).sampler.seed == (3, 2)


@pytest.mark.parametrize(
    "args, field",
    [
        ((0.0, 1.0), "median_s"),
        ((float("nan"), 1.0), "median_s"),
        ((1.0, -0.1), "sigma"),
        ((1.0, float("inf")), "sigma"),
        ((1.0, 1.0, 0.5), "max_s"),
    ],
)
def test_bad_parameters_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        LogNormalDelay(*args)


# ------------------------------------------------------------------------------------
# A wrapped real MiniWoB++ capsule
# ------------------------------------------------------------------------------------


@pytest.mark.browser
def test_wrapped_miniwob_environment_steps_to_success_with_recorded_delays():
    from cua_jax.environments.capsule_env import MiniWoBEnvironment
    from cua_jax.envs.capsules import CapsuleRuntime
    from cua_jax.envs.miniwob_oracle import oracle_action
    from cua_jax.types import EpisodeStatus

    wrapper = LatencyWrapper(0.02, 1.0, max_s=0.5, seed=11, delay_reset=True)

    async def episode(env: LatencyEnvironment, task: str, seed: int):
        inner = env.env
        reset = await env.reset(task, seed)
        assert reset.instruction and reset.observation.images[0].shape == (210, 160, 3)
        transitions = []
        for _ in range(6):
            page = await inner._call(inner.runtime.aobserve(inner.env_id))
            transitions.append(await env.step(oracle_action(page)))
            if transitions[-1].done:
                return transitions
        raise AssertionError(f"{task} seed {seed}: the oracle did not finish in 6 steps")

    async def body(runtime):
        envs = [wrapper(MiniWoBEnvironment(runtime, time_limit_s=600.0)) for _ in range(2)]
        try:
            # Two concurrent episodes on one loop (their delays overlap), then one more on a reused capsule.
            runs = await asyncio.gather(episode(envs[0], "click-button", 3), episode(envs[1], "enter-text", 4))
            runs.append(await episode(envs[0], "focus-text", 5))
        finally:
            await asyncio.gather(*(env.close() for env in envs))
        return envs, runs

    with CapsuleRuntime(include_dom_text=False, seed=0) as runtime:
        envs, runs = asyncio.run(body(runtime))

    for transitions in runs:
        last = transitions[-1]
        assert last.outcome.status is EpisodeStatus.SUCCESS and last.reward == 1.0
        assert last.info["raw_reward"] > 0  # the environment's own info passes through
        assert all(t.observation is not None for t in transitions[:-1])
    assert [e.resets for e in envs] == [2, 1]
    assert [e.steps for e in envs] == [len(runs[0]) + len(runs[2]), len(runs[1])]
    # The recorded delays are the seeded streams' draws: a reset's draw, then one per step.
    for env, episodes in ((envs[0], (runs[0], runs[2])), (envs[1], (runs[1],))):
        replay = DelaySampler(wrapper.distribution, env.sampler.seed)
        expected_total = 0.0
        for transitions in episodes:
            expected_total += replay.draw()  # the reset
            for transition in transitions:
                delay = replay.draw()
                assert transition.info[DELAY_INFO_KEY] == delay
                expected_total += delay
        assert env.delay_s == pytest.approx(expected_total)
