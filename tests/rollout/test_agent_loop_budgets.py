"""The agent loop's episode budgets and banned vision placeholders, against real MiniWoB++
capsules (system Chromium) and the real JAX sampler.

* `max_response_tokens`: per-turn generation budgets shrink to what the episode has left,
  and an exhausted budget ends the episode NO_VERDICT ("response_tokens").
* `max_observation_tokens`: long observation texts are cut with a visible marker, before
  the context renders them, so prompts still grow by token diffs.
* A policy whose likeliest tokens are vision placeholders: unmasked, its reply fails the
  episode; with `reserved_token_ids` banned in the JAX sampler it never emits one.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.context.segment import WholeTrajectory
from cua_jax.envs import actions as A
from cua_jax.rollout.agent_loop import (
    OBSERVATION_TRUNCATED_MARKER,
    RESERVED_TOKENS,
    AgentConfig,
    AgentLoop,
    GenerationBatcher,
    reserved_token_ids,
    truncate_observation,
)
from cua_jax.rollout.engine import FinishReason, GenerationRequest, RolloutEngine, SamplingConfig
from cua_jax.types import EpisodeStatus
from tests.support.agent_loop import LONG_TIME_LIMIT_S, FixedReplyEngine, assert_items_equal, run, with_envs


class SamplingRecorder(RolloutEngine):
    """Passes every call to `engine` and keeps each call's new-token budget and generations."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.calls = []  # (sampling.max_new_tokens, requests, generations) per call
        self._lock = threading.Lock()

    def generate(self, requests, sampling):
        generations = self.engine.generate(requests, sampling)
        with self._lock:
            self.calls.append((sampling.max_new_tokens, list(requests), generations))
        return generations

    def update_weights(self, params, version):
        self.engine.update_weights(params, version)

    def health(self):
        return self.engine.health()


@pytest.fixture(scope="module")
def placeholder_policy(renderer):
    """A tiny random Qwen3-VL whose next token is, with near certainty, <|image_pad|> or
    <|vision_start|>: its final norm keeps only hidden dimension 0, and only those two
    tokens read that dimension (with opposite signs), so one of them gets a logit of
    |h_0| * 200 and every other token 0."""
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(), rngs=nnx.Rngs(0))
    text = model.language_model
    norm = np.zeros(text.model.norm.weight.shape, np.float32)
    norm[0] = 1.0
    text.model.norm.weight[...] = norm
    vocab = renderer.tokenizer.get_vocab()
    head = np.zeros(text.lm_head.kernel.shape, np.float32)
    head[0, vocab["<|image_pad|>"]] = 200.0
    head[0, vocab["<|vision_start|>"]] = -200.0
    text.lm_head.kernel[...] = head
    return model


def test_batch_is_sampled_with_its_largest_budget_and_each_reply_cut_to_its_own():
    """Three requests with budgets 5, 16 and the default (16) in one engine call: the engine
    is asked for 16 tokens; a 20-token reply is cut to 5 and 16 (LENGTH), a 3-token reply
    with its stop token is left whole."""
    long_reply, short_reply = list(range(100, 120)), [7, 8, 9]
    engine = SamplingRecorder(FixedReplyEngine([long_reply, short_reply]))
    request = GenerationRequest(np.arange(1, 6))

    async def one_batch(budgets):
        batcher = GenerationBatcher(engine, SamplingConfig(max_new_tokens=16), max_wait_s=None)
        with batcher.episode(), batcher.episode(), batcher.episode():
            return await asyncio.gather(*(batcher.generate(request, budget) for budget in budgets))

    cut = run(one_batch([5, 16, None]))
    assert [len(g.token_ids) for g in cut] == [5, 16, 16]
    assert all(g.finish_reason is FinishReason.LENGTH for g in cut)
    np.testing.assert_array_equal(cut[0].token_ids, long_reply[:5])
    assert len(cut[0].logprobs) == 5
    whole = run(one_batch([2, 4, 3]))
    assert [budget for budget, _, _ in engine.calls] == [16, 4]
    assert [g.token_ids.tolist() for g in whole] == [[7, 8], short_reply, short_reply]
    assert [g.finish_reason for g in whole] == [FinishReason.LENGTH, FinishReason.STOP, FinishReason.STOP]
    with pytest.raises(ValueError, match=r"max_new_tokens must lie in \[1, 16\]"):
        run(one_batch([17]))


def test_config_rejects_empty_budgets():
    with pytest.raises(ValueError, match="max_response_tokens"):
        AgentConfig(max_response_tokens=0)
    with pytest.raises(ValueError, match="max_observation_tokens"):
        AgentConfig(max_observation_tokens=-1)
    assert AgentConfig().max_response_tokens is None and AgentConfig().max_observation_tokens is None


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=80), cap=st.integers(1, 12))
def test_truncated_observation_is_a_marked_token_prefix(renderer, text, cap):
    tokenizer = renderer.tokenizer
    out, truncated = truncate_observation(text, tokenizer, cap)
    count = len(tokenizer.encode(text, add_special_tokens=False))
    assert truncated == (count > cap)
    if not truncated:
        assert out == text
        return
    assert out.endswith(OBSERVATION_TRUNCATED_MARKER)
    kept = out[: -len(OBSERVATION_TRUNCATED_MARKER)]
    assert text.startswith(kept) and len(kept) < len(text)
    assert len(tokenizer.encode(kept, add_special_tokens=False)) <= cap


@pytest.mark.browser
def test_reserved_ids_are_banned_in_the_jax_sampler_and_the_response_budget_ends_the_episode(
    runtime, renderer, placeholder_policy
):
    """Unmasked, the placeholder policy's first reply holds a vision placeholder: FAILURE.
    With the reserved ids banned it never emits one, so it writes until the episode's
    response budget (40 tokens, 16 per turn) is spent: turns get 16, 16 and 8 new tokens,
    then the episode ends NO_VERDICT on the response budget."""
    from cua_jax.rollout.jax_engine import JaxSamplerEngine

    segmenter = WholeTrajectory(renderer)
    config = AgentConfig(max_turns=6, max_new_tokens=16, max_context_tokens=4096, max_response_tokens=40, seed=0)

    def episode_with(engine):
        loop = AgentLoop(engine, segmenter, config)
        return run(
            with_envs(
                runtime,
                1,
                lambda envs: loop.run_episode(envs[0], "click-button", seed=5),
                time_limit_s=LONG_TIME_LIMIT_S,
            )
        )

    unmasked = episode_with(JaxSamplerEngine(placeholder_policy, seed=0, image_processor=renderer.image_processor))
    assert unmasked.episode.status is EpisodeStatus.FAILURE and unmasked.episode.num_turns == 0
    assert any(name in unmasked.episode.info["end_reason"] for name in RESERVED_TOKENS)

    banned = reserved_token_ids(renderer)
    engine = SamplingRecorder(
        JaxSamplerEngine(placeholder_policy, seed=0, image_processor=renderer.image_processor, banned_token_ids=banned)
    )
    rollout = episode_with(engine)
    episode = rollout.episode
    assert [budget for budget, _, _ in engine.calls] == [16, 16, 8]
    assert [len(turn.response_ids) for turn in episode.turns] == [16, 16, 8]
    assert episode.status is EpisodeStatus.NO_VERDICT and episode.info["budget"] == "response_tokens"
    assert episode.info["response_tokens"] == 40 and "budget exhausted" in episode.info["end_reason"]
    for turn in episode.turns:
        assert not np.isin(turn.response_ids, banned).any()
        assert turn.info["finish_reason"] == "length"
        # Uniform over the allowed tokens: every other logit is 0.
        np.testing.assert_allclose(turn.response_logprobs, -np.log(len(renderer.tokenizer) - len(banned)), atol=1e-4)
    assert_items_equal(rollout.items, segmenter.segment(episode))


@pytest.mark.browser
def test_long_observations_are_cut_with_a_marker_and_prompts_stay_token_diffs(runtime, renderer):
    """MiniWoB's DOM text is far longer than 24 tokens: with the cap, every turn's text is
    its uncapped text's first tokens plus the marker, the prompt shows the marker, each
    prompt extends the previous one, and the screenshots are untouched."""
    reply = [
        *renderer.tokenizer.encode(A.render_action(A.MouseMove(5, 5)), add_special_tokens=False),
        renderer.end_of_turn_id,
    ]
    segmenter = WholeTrajectory(renderer)

    def episode_with(config):
        engine = SamplingRecorder(FixedReplyEngine([reply]))
        loop = AgentLoop(engine, segmenter, config)
        rollout = run(
            with_envs(
                runtime,
                1,
                lambda envs: loop.run_episode(envs[0], "click-button", seed=2),
                time_limit_s=LONG_TIME_LIMIT_S,
            )
        )
        return rollout, engine

    free, _ = episode_with(AgentConfig(max_turns=3, max_new_tokens=64))
    capped, engine = episode_with(AgentConfig(max_turns=3, max_new_tokens=64, max_observation_tokens=24))
    assert free.episode.info["truncated_observations"] == 0
    assert capped.episode.info["truncated_observations"] == 3
    assert capped.episode.status is EpisodeStatus.NO_VERDICT and capped.episode.info["budget"] == "turns"
    prompts = [request.prompt_ids for _, requests, _ in engine.calls for request in requests]
    assert len(prompts) == 3
    for t, (full, cut) in enumerate(zip(free.episode.turns, capped.episode.turns)):
        assert cut.observation_text.endswith(OBSERVATION_TRUNCATED_MARKER)
        kept = cut.observation_text[: -len(OBSERVATION_TRUNCATED_MARKER)]
        assert full.observation_text.startswith(kept)
        assert len(renderer.tokenizer.encode(kept, add_special_tokens=False)) <= 24
        assert [image.shape for image in cut.images] == [image.shape for image in full.images]
        assert OBSERVATION_TRUNCATED_MARKER.strip() in renderer.tokenizer.decode(prompts[t].tolist())
        if t:
            np.testing.assert_array_equal(prompts[t][: len(prompts[t - 1])], prompts[t - 1])
    assert_items_equal(capped.items, segmenter.segment(capped.episode))
