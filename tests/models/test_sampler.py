"""The KV-cache sampler: greedy equals transformers' generate, logprobs equal the scoring
function's under the sampling distribution, stop tokens, filters against numpy, banned
tokens never sampled and scored the same way by the learner's scoring function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cua_jax.models.sampler import Sampler, SamplingParams, sample_tokens, sampling_log_probs
from cua_jax.models.scoring import score_sequences_jit, token_logprobs_from_hidden

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
            )[0, len(prompt) :].tolist()
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
    return np.asarray(logp[0, len(prompt) :]), np.asarray(entropy[0, len(prompt) :])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_scoring_logprobs(our_qwen3, sampler, temperature):
    model, _ = our_qwen3
    out = sampler.generate(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=NEW), jax.random.key(1))
    for prompt, tokens, logprobs in zip(PROMPTS, out.tokens, out.logprobs):
        assert len(tokens) == NEW
        scored, entropy = score(model, prompt, tokens, temperature)
        np.testing.assert_allclose(logprobs, scored, atol=1e-5, rtol=0)
        assert (entropy > 0).all()


def numpy_filtered_log_probs(logits, temperature, top_k, top_p, banned=()):
    """Reference: banned tokens out, temperature, then top-k (ties kept), then the top-p
    nucleus, renormalised."""
    z = logits.astype(np.float64) / temperature
    z[:, list(banned)] = -np.inf
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


_sample = jax.jit(sample_tokens, static_argnames=("greedy", "top_k", "apply_top_p"))


def _padded(banned, size):
    """The ids of `banned` as int32 [size] (repeats fill it), so every example shares one shape."""
    ids = sorted(banned)
    return jnp.asarray((ids * size)[:size], jnp.int32)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    banned=st.sets(st.integers(0, 15), min_size=1, max_size=12),
    greedy=st.booleans(),
    temperature=st.floats(0.3, 2.0),
    top_k=st.sampled_from([0, 2, 5]),
    top_p=st.floats(0.1, 1.0),
)
def test_banned_tokens_are_never_sampled_and_logprobs_are_renormalised(seed, banned, greedy, temperature, top_k, top_p):
    """Banned tokens hold the largest logits, yet no row draws one; each logprob is the
    numpy reference's: the filtered distribution renormalised over the allowed tokens
    (greedy: the plain model distribution over them)."""
    banned = tuple(sorted(banned))
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((1, 16)) * 2).astype(np.float32)
    logits[0, list(banned)] += 8.0  # unmasked, a banned token would win nearly every draw
    rows = np.repeat(logits, 64, axis=0)
    if greedy:
        ref = numpy_filtered_log_probs(logits, 1.0, 0, 1.0, banned)
    else:
        z = logits.astype(np.float64) / temperature
        z[:, list(banned)] = -np.inf
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        sorted_p = -np.sort(-p, axis=-1)
        assume(np.abs(np.cumsum(sorted_p, axis=-1) - sorted_p - top_p).min() > 1e-4)  # float32 vs float64 at the edge
        ref = numpy_filtered_log_probs(logits, temperature, top_k, top_p, banned)
    tokens, logprobs = _sample(
        jax.random.key(seed),
        jnp.asarray(rows),
        temperature,
        top_p,
        greedy=greedy,
        top_k=top_k,
        apply_top_p=top_p < 1.0,
        banned_token_ids=_padded(banned, 12),
    )
    tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
    assert not np.isin(tokens, banned).any()
    picked = ref[0, tokens]
    assert np.isfinite(picked).all()
    np.testing.assert_allclose(logprobs, picked, atol=1e-4, rtol=1e-5)
    if greedy:
        assert (tokens == np.argmax(ref[0])).all()


_scored = jax.jit(token_logprobs_from_hidden, static_argnames=("seq_chunk", "vocab_chunk"))


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    banned=st.sets(st.integers(0, 23), min_size=1, max_size=10),
    vocab_chunk=st.sampled_from([3, 8, 64]),
    temperature=st.sampled_from([0.6, 1.0]),
)
def test_scoring_with_banned_tokens_matches_numpy(seed, banned, vocab_chunk, temperature):
    """The learner's chunked scoring with banned ids: logprobs and entropy of the softmax
    over the allowed tokens (whole vocabulary chunks may be banned); a banned target gets
    its logit minus the allowed log-normaliser (finite)."""
    banned = tuple(sorted(banned | {0, 1, 2}))  # ids 0-2 form a whole chunk when vocab_chunk is 3
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = (rng.standard_normal((8, 24)) * 2).astype(np.float32)
    targets = rng.integers(0, 24, (2, 5))
    logp, ent = _scored(
        jnp.asarray(hidden),
        jnp.asarray(w),
        jnp.asarray(targets),
        temperature=temperature,
        seq_chunk=4,
        vocab_chunk=vocab_chunk,
        banned_token_ids=_padded(banned, 13),
    )
    logits = hidden.astype(np.float64) @ w.astype(np.float64) / temperature
    allowed = np.delete(logits, banned, axis=-1)
    log_z = np.log(np.exp(allowed - allowed.max(-1, keepdims=True)).sum(-1)) + allowed.max(-1)
    ref_logp = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_z
    p = np.exp(allowed - log_z[..., None])
    ref_ent = -(p * (allowed - log_z[..., None])).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), ref_logp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), ref_ent, atol=2e-5, rtol=1e-5)


def test_scoring_gradient_with_banned_tokens_equals_the_allowed_softmax_gradient():
    """Gradients through the chunked banned scoring (a whole chunk banned) equal those of a
    plain softmax over the allowed columns: finite, as the learner needs."""
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((2, 5, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((8, 24)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 24, (2, 5)))
    banned = (0, 1, 2, 5)
    allowed = np.setdiff1d(np.arange(24), banned)

    def chunked(h, w):
        logp, ent = token_logprobs_from_hidden(h, w, targets, seq_chunk=4, vocab_chunk=3, banned_token_ids=banned)
        return jnp.sum(logp) + jnp.sum(ent)

    def whole(h, w):
        logits = jnp.einsum("bte,ev->btv", h, w)
        log_z = jax.scipy.special.logsumexp(logits[..., allowed], axis=-1)
        logp = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_z
        log_p = logits[..., allowed] - log_z[..., None]
        return jnp.sum(logp) - jnp.sum(jnp.exp(log_p) * log_p)

    for ours, ref in zip(jax.jit(jax.grad(chunked, (0, 1)))(hidden, w), jax.jit(jax.grad(whole, (0, 1)))(hidden, w)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-5, rtol=1e-5)


def test_banned_sampling_agrees_with_banned_scoring(our_qwen3, sampler, greedy, pad_right):
    """The tokens greedy decoding picks first, banned: sampling never draws them, and the
    sampled logprobs equal the scoring function's with the same ids banned (the learner's
    recomputation), while full-vocabulary scoring disagrees."""
    model, _ = our_qwen3
    banned = tuple(sorted({int(tokens[0]) for tokens in greedy.tokens}))
    out = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, banned_token_ids=banned), jax.random.key(3))
    for tokens in out.tokens:
        assert len(tokens) == NEW and not np.isin(tokens, banned).any()
    sequences = [list(prompt) + tokens.tolist() for prompt, tokens in zip(PROMPTS, out.tokens)]
    ids, segments, _ = pad_right(sequences, 32)

    def scored(banned_token_ids):
        logp, _ = score_sequences_jit(
            model,
            jnp.asarray(ids),
            jnp.asarray(segments),
            seq_chunk=8,
            vocab_chunk=128,
            banned_token_ids=banned_token_ids,
        )
        return [np.asarray(logp[row, len(prompt) : len(prompt) + NEW]) for row, prompt in enumerate(PROMPTS)]

    for logprobs, masked in zip(out.logprobs, scored(banned)):
        np.testing.assert_allclose(logprobs, masked, atol=1e-5, rtol=0)
    gap = max(np.abs(full - logprobs).max() for logprobs, full in zip(out.logprobs, scored(())))
    assert gap > 1e-3  # the banned tokens carry real mass: the mask matters


def test_bad_requests_are_refused(sampler):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1, 2], []], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match="prompt length 17 exceeds"):
        sampler.generate([list(range(3, 20))], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="banned_token_ids must be non-negative"):
        SamplingParams(banned_token_ids=(3, -1))
    assert SamplingParams(banned_token_ids=[7, 3, 7]).banned_token_ids == (3, 7)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.generate([[1, 2]], SamplingParams(max_new_tokens=NEW, banned_token_ids=(10**6,)), jax.random.key(0))


def test_a_seeded_prompt_samples_the_same_in_any_batch(our_qwen3, sampler):
    """row_seeds: a prompt with a seed draws from its own stream, so neither its row nor its
    batch-mates change what it samples; unseeded rows still draw from the call's key."""
    model, _ = our_qwen3
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW)
    alone = sampler.generate([PROMPTS[2]], params, jax.random.key(0), row_seeds=[7])
    batched = sampler.generate(PROMPTS[::-1], params, jax.random.key(5), row_seeds=[7, None, 11])
    assert batched.tokens[0].tolist() == alone.tokens[0].tolist()
    np.testing.assert_allclose(batched.logprobs[0], alone.logprobs[0], atol=1e-5, rtol=0)
    scored, _ = score(model, PROMPTS[2], alone.tokens[0], 1.0)
    np.testing.assert_allclose(alone.logprobs[0], scored, atol=1e-5, rtol=0)
    # Another seed is another stream; the unseeded row follows the call's key.
    other = sampler.generate([PROMPTS[2]], params, jax.random.key(0), row_seeds=[8])
    assert other.tokens[0].tolist() != alone.tokens[0].tolist()
    again = sampler.generate(PROMPTS[::-1], params, jax.random.key(5), row_seeds=[7, None, 11])
    assert [t.tolist() for t in again.tokens] == [t.tolist() for t in batched.tokens]
    moved = sampler.generate(PROMPTS[::-1], params, jax.random.key(6), row_seeds=[7, None, 11])
    assert moved.tokens[2].tolist() == batched.tokens[2].tolist()  # seeded
    assert moved.tokens[1].tolist() != batched.tokens[1].tolist()  # the call's key
    with pytest.raises(ValueError, match="row_seeds has 1 entries for 3 prompts"):
        sampler.generate(PROMPTS, params, jax.random.key(0), row_seeds=[1])
