"""The KV-cache sampler: greedy equals transformers' generate, logprobs equal the scoring
function's under the sampling distribution, stop tokens, filters against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cua_jax.models.sampler import Sampler, SamplingParams, sampling_log_probs
from cua_jax.models.scoring import score_sequences_jit

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [100, 200, 300, 400, 500, 3, 4, 5, 6, 7, 8]]
NEW = 10


@pytest.fixture(scope="module")
def sampler(our_qwen3):
    return Sampler(our_qwen3[0], prompt_buckets=(16,), new_token_buckets=(16,), batch_buckets=(4,))


@pytest.fixture(scope="module")
def greedy(sampler):
    return sampler.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=NEW), jax.random.key(0))


def test_greedy_equals_transformers_generate(hf_qwen3_dir, greedy):
    _, hf = hf_qwen3_dir
    for prompt, tokens, reason in zip(PROMPTS, greedy.tokens, greedy.finish_reasons):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt):].tolist()
        assert tokens.tolist() == ref
        assert reason == "length"


def test_stop_tokens_end_rows_and_are_kept(sampler, greedy):
    stop = int(greedy.tokens[0][3])
    out = sampler.generate(
        PROMPTS, SamplingParams(temperature=0, max_new_tokens=NEW, stop_token_ids=(stop,)), jax.random.key(0)
    )
    for full, tokens, reason in zip(greedy.tokens, out.tokens, out.finish_reasons):
        hits = np.flatnonzero(full == stop)
        end = hits[0] + 1 if len(hits) else NEW
        assert tokens.tolist() == full[:end].tolist()
        assert reason == ("stop" if len(hits) else "length")


def score(model, prompt, tokens, temperature):
    seq = jnp.asarray([list(prompt) + [int(t) for t in tokens]], jnp.int32)
    logp, entropy = score_sequences_jit(model, seq, temperature=temperature, seq_chunk=8, vocab_chunk=128)
    return np.asarray(logp[0, len(prompt):]), np.asarray(entropy[0, len(prompt):])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_scoring_logprobs(our_qwen3, sampler, temperature):
    model, _ = our_qwen3
    out = sampler.generate(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=NEW), jax.random.key(1))
    for prompt, tokens, logprobs in zip(PROMPTS, out.tokens, out.logprobs):
        assert len(tokens) == NEW
        scored, entropy = score(model, prompt, tokens, temperature)
        np.testing.assert_allclose(logprobs, scored, atol=1e-5, rtol=0)
        assert (entropy > 0).all()


def numpy_filtered_log_probs(logits, temperature, top_k, top_p):
    """Reference: temperature, then top-k (ties kept), then the top-p nucleus, renormalised."""
    z = logits.astype(np.float64) / temperature
    if top_k:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    keep = np.zeros_like(z, bool)
    for row in range(z.shape[0]):
        order = np.argsort(-z[row], kind="stable")
        before = np.cumsum(p[row, order]) - p[row, order]
        keep[row, order[before < top_p]] = True
    z = np.where(keep, z, -np.inf)
    return z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)


def test_filtered_sampling_logprobs_are_those_of_the_filtered_distribution(our_qwen3, sampler, jit_forward, pad_right):
    model, _ = our_qwen3
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.8, max_new_tokens=NEW)
    out = sampler.generate(PROMPTS, params, jax.random.key(2))
    for prompt, tokens, logprobs in zip(PROMPTS, out.tokens, out.logprobs):
        seq = list(prompt) + tokens.tolist()
        logits = np.asarray(jit_forward(model, *pad_right([seq], 32)))[0, len(prompt) - 1 : len(seq) - 1]
        ref = numpy_filtered_log_probs(logits, params.temperature, params.top_k, params.top_p)
        picked = ref[np.arange(len(tokens)), tokens]
        assert np.isfinite(picked).all()  # every sampled token lies inside the filtered support
        np.testing.assert_allclose(logprobs, picked, atol=1e-5, rtol=0)


_filtered = jax.jit(sampling_log_probs, static_argnames=("top_k", "apply_top_p"))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    temperature=st.floats(0.2, 2.0),
    top_k=st.sampled_from([0, 1, 3, 16]),
    top_p=st.floats(0.05, 1.0),
)
def test_sampling_log_probs_match_numpy(seed, temperature, top_k, top_p):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((3, 16)) * 3).astype(np.float32)
    logits[0, :4] = logits[0, 0]  # ties
    # float32 vs float64 cumulative mass may disagree when it lands on top_p itself
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    before = np.cumsum(-np.sort(-p, axis=-1), axis=-1) - (-np.sort(-p, axis=-1))
    assume(np.abs(before - top_p).min() > 1e-4)
    ours = np.asarray(_filtered(jnp.asarray(logits), temperature, top_p, top_k=top_k, apply_top_p=True))
    ref = numpy_filtered_log_probs(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref))
    np.testing.assert_allclose(ours[np.isfinite(ref)], ref[np.isfinite(ref)], atol=1e-4, rtol=1e-5)


def test_bad_requests_are_refused(sampler):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1, 2], []], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match="prompt length 17 exceeds"):
        sampler.generate([list(range(3, 20))], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
