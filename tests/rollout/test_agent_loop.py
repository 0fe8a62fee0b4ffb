"""The multi-turn agent loop against real MiniWoB++ capsules (system Chromium) and real engines.

Engines: the JAX sampler over a tiny random Qwen3-VL (it emits invalid actions, which
exercises the feedback path and the turn budget), and `ScriptedOracleEngine`, a scripted
policy for tests: a RolloutEngine that reads the page's DOM text out of the prompt ids it is
given, asks the MiniWoB oracle for the next action and returns that action's rendered
tokens (logprob 0: a deterministic policy).
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from cua_jax.context.segment import SlidingWindow, WholeTrajectory
from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob import UnknownTaskError, dom_from_text
from cua_jax.envs.prompts import DOM_TEXT_HEADER, INVALID_ACTION_PREFIX
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, turn_sampling_seed
from cua_jax.rollout.engine import RolloutEngine
from cua_jax.types import EpisodeStatus
from tests.support.agent_loop import (
    LONG_TIME_LIMIT_S,
    FixedReplyEngine,
    ScriptedOracleEngine,
    assert_items_equal,
    run,
    with_envs,
)

pytestmark = pytest.mark.browser

# ------------------------------------------------------------------------------------
# Engines used by the tests
# ------------------------------------------------------------------------------------


class RecordingEngine(RolloutEngine):
    """Passes every call to `engine` and keeps each request with the generation it got."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.records = []
        self.batch_sizes = []
        self._lock = threading.Lock()

    def generate(self, requests, sampling):
        generations = self.engine.generate(requests, sampling)
        with self._lock:
            self.records.extend(zip(requests, generations))
            self.batch_sizes.append(len(requests))
        return generations

    def update_weights(self, params, version):
        self.engine.update_weights(params, version)

    def health(self):
        return self.engine.health()


class BrowserKillingEngine(RolloutEngine):
    """Passes calls to `engine`; on call number `kill_at` it first SIGKILLs the shared browser."""

    def __init__(self, engine: RolloutEngine, runtime: CapsuleRuntime, kill_at: int):
        self.engine, self.runtime, self.kill_at = engine, runtime, kill_at
        self.calls = 0
        self.killed_pid = None

    def generate(self, requests, sampling):
        self.calls += 1
        if self.calls == self.kill_at:
            self.killed_pid = self.runtime.backend.browser_pid()
            os.kill(self.killed_pid, signal.SIGKILL)
        return self.engine.generate(requests, sampling)

    def update_weights(self, params, version):
        self.engine.update_weights(params, version)

    def health(self):
        return self.engine.health()


# ------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vl_engine(renderer):
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.rollout.jax_engine import JaxSamplerEngine

    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(), rngs=nnx.Rngs(0))
    return JaxSamplerEngine(model, seed=0, image_processor=renderer.image_processor)


def _response_concat(episode):
    ids = np.concatenate([turn.response_ids for turn in episode.turns])
    logprobs = np.concatenate([turn.response_logprobs for turn in episode.turns])
    return ids, logprobs


def _trained_concat(items):
    """Response tokens of an episode's items in turn order (each response trains in one item)."""
    items = sorted(items, key=lambda item: item.step_indices[0])
    ids = np.concatenate([item.ids[item.loss_mask == 1] for item in items])
    logprobs = np.concatenate([item.rollout_logprobs[item.loss_mask == 1] for item in items])
    return ids, logprobs


# ------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------


def test_config_rejects_impossible_budgets():
    with pytest.raises(ValueError, match="max_turns"):
        AgentConfig(max_turns=0)
    with pytest.raises(ValueError, match="max_context_tokens"):
        AgentConfig(max_new_tokens=64, max_context_tokens=64)


def test_dom_from_text_inverts_dom_to_text(runtime):
    from cua_jax.envs.miniwob import dom_to_text

    env_id = runtime.create("click-checkboxes", seed=5)
    try:
        observation = runtime.observe(env_id)
        assert dom_to_text(dom_from_text(observation.dom_text)) == observation.dom_text
    finally:
        runtime.close(env_id)


def test_tiny_model_group_runs_concurrently_with_exact_tokens(runtime, renderer, tiny_vl_engine):
    """A group of 2 on click-button: invalid actions are fed back, the turn budget ends it
    NO_VERDICT, and turns and items hold the engine's exact ids and logprobs."""
    tiny_vl_engine.update_weights(tiny_vl_engine.model, version=3)
    engine = RecordingEngine(tiny_vl_engine)
    segmenter = SlidingWindow(renderer, keep=0, min_removal=1)
    config = AgentConfig(
        max_turns=2, max_new_tokens=16, max_context_tokens=4096, no_verdict_reward=-0.2, seed=0, batch_wait_s=None
    )
    loop = AgentLoop(engine, segmenter, config)

    rollouts = run(
        with_envs(
            runtime,
            2,
            lambda envs: loop.run_group(envs, "click-button", seed=11, group_id=7),
            time_limit_s=LONG_TIME_LIMIT_S,
        )
    )

    assert [r.episode.episode_id for r in rollouts] == ["click-button/g7/e0", "click-button/g7/e1"]
    assert sum(len(r.episode.turns) for r in rollouts) == len(engine.records)
    # batch_wait_s=None: each turn of the group is one batched engine call.
    assert engine.batch_sizes == [2, 2]
    for rollout in rollouts:
        episode = rollout.episode
        # A random tiny model never writes a valid tool call: every turn is invalid.
        assert episode.status is EpisodeStatus.NO_VERDICT
        assert episode.reward == pytest.approx(-0.2)
        assert episode.info["budget"] == "turns" and episode.num_turns == 2
        assert episode.instruction.startswith("Click on the")
        assert episode.policy_version == 3 and episode.info["policy_versions"] == [3]
        for t, turn in enumerate(episode.turns):
            assert turn.action is None and turn.info["invalid_action"]
            assert turn.images[0].shape == (210, 160, 3)
            # The engine's own generation for this turn: same ids, same logprobs, bit for bit.
            matches = [
                g
                for _, g in engine.records
                if np.array_equal(g.token_ids, turn.response_ids) and np.array_equal(g.logprobs, turn.response_logprobs)
            ]
            assert matches, f"turn {t} holds tokens the engine did not produce"
            if t > 0:
                previous = episode.turns[t - 1].info["invalid_action"]
                assert turn.observation_text.startswith(INVALID_ACTION_PREFIX + previous)
            assert DOM_TEXT_HEADER in turn.observation_text
        # Sliding window K=0, Delta=1: turn 1 has 2 screenshots > K + Delta, so two items.
        assert len(rollout.items) == 2
        trained_ids, trained_logprobs = _trained_concat(rollout.items)
        response_ids, response_logprobs = _response_concat(episode)
        np.testing.assert_array_equal(trained_ids, response_ids)
        np.testing.assert_array_equal(trained_logprobs, response_logprobs)
        assert sum(int(item.loss_mask.sum()) for item in rollout.items) == episode.info["response_tokens"]
        assert_items_equal(rollout.items, segmenter.segment(episode))
        assert episode.info["env_seconds"] > 0 and episode.info["generation_seconds"] > 0
        assert episode.info["invalid_actions"] == 2
    # The prompts the engine saw were exactly the context's (token-in, token-out).
    for request, _ in engine.records:
        assert request.images and request.images[-1].shape == (210, 160, 3)


def test_seed_per_turn_samples_an_episode_the_same_in_any_batch(runtime, renderer, tiny_vl_engine):
    """seed_per_turn: each request carries turn_sampling_seed(seed, episode id, env seed, turn),
    so an episode alone samples what it sampled batched with its group (common random
    numbers across evaluations), while the group's episodes still differ."""
    engine = RecordingEngine(tiny_vl_engine)
    config = AgentConfig(
        max_turns=2, max_new_tokens=16, max_context_tokens=4096, seed=3, seed_per_turn=True, batch_wait_s=None
    )
    loop = AgentLoop(engine, SlidingWindow(renderer, keep=0, min_removal=1), config)

    def group(size):
        return run(
            with_envs(
                runtime,
                size,
                lambda envs: loop.run_group(envs, "click-button", seed=11, group_id=7),
                time_limit_s=LONG_TIME_LIMIT_S,
            )
        )

    pair = group(2)
    assert engine.batch_sizes == [2, 2]
    alone = group(1)
    first, second = pair[0].episode, pair[1].episode
    assert first.episode_id == alone[0].episode.episode_id == "click-button/g7/e0"
    for _t, (batched, single) in enumerate(zip(first.turns, alone[0].episode.turns, strict=True)):
        np.testing.assert_array_equal(batched.response_ids, single.response_ids)
        np.testing.assert_allclose(batched.response_logprobs, single.response_logprobs, atol=1e-5, rtol=0)
    assert not np.array_equal(first.turns[0].response_ids, second.turns[0].response_ids)
    seeds = sorted(request.seed for request, _ in engine.records[:4])
    assert seeds == sorted(turn_sampling_seed(3, f"click-button/g7/e{k}", 11, t) for k in range(2) for t in range(2))
    assert turn_sampling_seed(3, "click-button/g7/e0", 11, 0) != turn_sampling_seed(4, "click-button/g7/e0", 11, 0)


def test_scripted_oracle_policy_earns_reward(runtime, renderer):
    """The oracle through the loop solves click-button (1 turn) and enter-text (3 turns)."""
    for task, turns in (("click-button", 1), ("enter-text", 3)):
        engine = ScriptedOracleEngine(renderer.tokenizer, task, renderer.end_of_turn_id)
        segmenter = SlidingWindow(renderer, keep=1, min_removal=1)
        loop = AgentLoop(engine, segmenter, AgentConfig(max_turns=6, max_new_tokens=64))
        rollouts = run(
            with_envs(
                runtime,
                2,
                lambda envs: loop.run_group(envs, task, seed=3, group_id=1),  # noqa: B023 - awaited within this iteration
                time_limit_s=LONG_TIME_LIMIT_S,
            )
        )
        for rollout in rollouts:
            episode = rollout.episode
            assert episode.status is EpisodeStatus.SUCCESS, (task, episode.info)
            assert episode.reward == 1.0 and episode.turns[-1].reward == 1.0
            assert episode.num_turns == turns
            assert all(turn.action is not None for turn in episode.turns)
            trained_ids, _ = _trained_concat(rollout.items)
            np.testing.assert_array_equal(trained_ids, _response_concat(episode)[0])
            assert_items_equal(rollout.items, segmenter.segment(episode))


def test_token_budget_ends_no_verdict(runtime, renderer):
    """A context budget that fits turn 0's prompt + response but not turn 1's ends the episode."""
    engine = ScriptedOracleEngine(renderer.tokenizer, "enter-text", renderer.end_of_turn_id)
    segmenter = WholeTrajectory(renderer)
    free = AgentLoop(engine, segmenter, AgentConfig(max_turns=6, max_new_tokens=64))
    first = run(with_envs(runtime, 1, lambda envs: free.run_episode(envs[0], "enter-text", seed=9)))
    assert first.episode.status is EpisodeStatus.SUCCESS and first.episode.num_turns == 3
    budget = first.episode.info["prompt_tokens"][0] + 64

    tight = AgentLoop(engine, segmenter, AgentConfig(max_turns=6, max_new_tokens=64, max_context_tokens=budget))
    rollout = run(with_envs(runtime, 1, lambda envs: tight.run_episode(envs[0], "enter-text", seed=9)))
    episode = rollout.episode
    assert episode.status is EpisodeStatus.NO_VERDICT and episode.info["budget"] == "tokens"
    assert episode.num_turns == 1
    np.testing.assert_array_equal(episode.turns[0].response_ids, first.episode.turns[0].response_ids)
    assert_items_equal(rollout.items, segmenter.segment(episode))


def _reply_ids(renderer, text):
    ids = renderer.tokenizer.encode(text, add_special_tokens=False)
    return [*ids, renderer.end_of_turn_id]


def test_declared_fail_ends_with_the_verifiers_verdict(runtime, renderer):
    """A declared FAIL ends the MiniWoB episode; MiniWoB's JS scores it (raw reward -1): FAILURE."""
    engine = FixedReplyEngine([_reply_ids(renderer, "Cannot do it.\n" + A.render_action(A.Fail()))])
    loop = AgentLoop(engine, WholeTrajectory(renderer), AgentConfig(max_turns=4, max_new_tokens=64))
    rollout = run(with_envs(runtime, 1, lambda envs: loop.run_episode(envs[0], "click-button", seed=2)))
    episode = rollout.episode
    assert episode.status is EpisodeStatus.FAILURE and episode.reward == 0.0
    assert episode.num_turns == 1 and episode.turns[0].action == A.Fail()
    assert episode.turns[0].info["raw_reward"] == -1.0
    assert "FAIL" in episode.turns[0].info["miniwob_reason"]


def test_reply_with_an_image_placeholder_fails_the_episode_without_raising(runtime, renderer):
    """Turn 0 is a valid move; turn 1's reply holds <|image_pad|>: the episode fails at turn 1,
    the reply stays out of the turns and items."""
    move = _reply_ids(renderer, A.render_action(A.MouseMove(10, 10)))
    pad = [renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>"), renderer.end_of_turn_id]
    segmenter = WholeTrajectory(renderer)
    loop = AgentLoop(FixedReplyEngine([move, pad]), segmenter, AgentConfig(max_turns=4, max_new_tokens=64))
    rollout = run(
        with_envs(
            runtime, 1, lambda envs: loop.run_episode(envs[0], "click-button", seed=2), time_limit_s=LONG_TIME_LIMIT_S
        )
    )
    episode = rollout.episode
    assert episode.status is EpisodeStatus.FAILURE and episode.num_turns == 1
    assert "<|image_pad|>" in episode.info["end_reason"]
    np.testing.assert_array_equal(episode.info["rejected_response"]["ids"], pad)
    np.testing.assert_array_equal(_trained_concat(rollout.items)[0], move)
    assert_items_equal(rollout.items, segmenter.segment(episode))


def test_unknown_task_is_an_error_not_a_quarantine(runtime, renderer):
    engine = ScriptedOracleEngine(renderer.tokenizer, "click-button", renderer.end_of_turn_id)
    loop = AgentLoop(engine, WholeTrajectory(renderer))
    with pytest.raises(UnknownTaskError, match="click-buton"):
        run(with_envs(runtime, 1, lambda envs: loop.run_episode(envs[0], "click-buton")))


def test_browser_killed_mid_episode_is_quarantined_then_recovers(renderer):
    """SIGKILL of the shared browser between turns 0 and 1 quarantines both episodes of the
    group with the reason; the next reset builds fresh capsules on the relaunched browser."""
    with CapsuleRuntime(include_dom_text=True, seed=1) as crashing:
        oracle = ScriptedOracleEngine(renderer.tokenizer, "enter-text", renderer.end_of_turn_id)
        engine = BrowserKillingEngine(oracle, crashing, kill_at=2)
        loop = AgentLoop(engine, WholeTrajectory(renderer), AgentConfig(max_turns=6, max_new_tokens=64))

        async def crash_then_recover(envs):
            crashed = await loop.run_group(envs, "enter-text", seed=4)
            recovered = await loop.run_group(envs, "enter-text", seed=4)
            return crashed, recovered

        crashed, recovered = run(with_envs(crashing, 2, crash_then_recover, time_limit_s=LONG_TIME_LIMIT_S))
        assert engine.killed_pid is not None
        for rollout in crashed:
            episode = rollout.episode
            assert episode.status is EpisodeStatus.QUARANTINED
            assert episode.quarantine_reason and episode.reward == 0.0
            assert 1 <= episode.num_turns <= 2
        assert crashing.crashes, "the runtime saw its browser disconnect"
        for rollout in recovered:
            assert rollout.episode.status is EpisodeStatus.SUCCESS


def test_capsule_that_cannot_be_set_up_in_time_is_quarantined(runtime, renderer):
    """A reset the runtime does not finish within its call timeout quarantines the episode
    (setup failed) instead of raising; no turn is played."""
    engine = ScriptedOracleEngine(renderer.tokenizer, "click-button", renderer.end_of_turn_id)
    loop = AgentLoop(engine, WholeTrajectory(renderer))
    default_timeout = runtime.call_timeout_s
    runtime.call_timeout_s = 1e-4  # far below what building a browser context takes
    try:
        rollout = run(with_envs(runtime, 1, lambda envs: loop.run_episode(envs[0], "click-button", seed=1)))
    finally:
        runtime.call_timeout_s = default_timeout
    episode = rollout.episode
    assert episode.status is EpisodeStatus.QUARANTINED and episode.num_turns == 0
    assert episode.quarantine_reason.startswith("setup failed") and rollout.items == []
    assert engine.calls == 0
