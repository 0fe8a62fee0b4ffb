"""Chunked per-token logprobs and entropies against a numpy reference, gradients against
the unchunked computation, and the sequence alignment of `score_sequences`."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.scoring import score_sequences_jit, token_logprobs_from_hidden


def numpy_logprobs_entropy(hidden, w, targets, temperature):
    logits = hidden.astype(np.float64) @ w.astype(np.float64) / temperature
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, -(np.exp(logp) * logp).sum(-1)


_chunked = jax.jit(token_logprobs_from_hidden, static_argnames=("seq_chunk", "vocab_chunk"))


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 9),
    vocab=st.sampled_from([7, 16, 33]),
    seq_chunk=st.sampled_from([1, 4, 16]),
    vocab_chunk=st.sampled_from([5, 16, 64]),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
)
def test_chunked_logprobs_and_entropy_match_numpy(seed, length, vocab, seq_chunk, vocab_chunk, temperature):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((2, length, 8)).astype(np.float32)
    w = (rng.standard_normal((8, vocab)) * 2).astype(np.float32)
    targets = rng.integers(0, vocab, (2, length))
    logp, ent = _chunked(
        jnp.asarray(hidden),
        jnp.asarray(w),
        jnp.asarray(targets),
        temperature=temperature,
        seq_chunk=seq_chunk,
        vocab_chunk=vocab_chunk,
    )
    ref_logp, ref_ent = numpy_logprobs_entropy(hidden, w, targets, temperature)
    np.testing.assert_allclose(np.asarray(logp), ref_logp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), ref_ent, atol=2e-5, rtol=1e-5)


def test_chunked_gradient_equals_unchunked():
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((2, 10, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((8, 40)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 40, (2, 10)))

    def loss(h, w, seq_chunk, vocab_chunk):
        logp, ent = token_logprobs_from_hidden(h, w, targets, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk)
        return jnp.sum(logp) + 0.1 * jnp.sum(ent)

    chunked = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2, 3))(hidden, w, 3, 16)
    whole = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2, 3))(hidden, w, 10, 40)
    for a, b in zip(chunked, whole):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_score_sequences_alignment_with_packing(our_qwen3, jit_forward):
    model, _ = our_qwen3
    ids = np.asarray([[5, 6, 7, 8, 9, 10, 11, 0]], np.int32)
    segments = np.asarray([[1, 1, 1, 1, 2, 2, 2, 0]], np.int32)
    positions = np.asarray([[0, 1, 2, 3, 0, 1, 2, 0]], np.int32)
    logp, ent = score_sequences_jit(
        model, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(positions), seq_chunk=4, vocab_chunk=128
    )
    logits = np.asarray(jit_forward(model, ids, segments, positions))[0].astype(np.float64)
    ref = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    expected = np.zeros(8)
    for t in (1, 2, 3, 5, 6):  # not the first token of a segment, not padding
        expected[t] = ref[t - 1, ids[0, t]]
    np.testing.assert_allclose(np.asarray(logp[0]), expected, atol=1e-5, rtol=0)
    assert np.asarray(ent[0])[[0, 4, 7]].tolist() == [0.0, 0.0, 0.0]
