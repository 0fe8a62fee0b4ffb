"""Gated DeltaNet math: the chunked and recurrent forms against a numpy reference and each other,
the causal convolution against torch's conv1d, state carry-over between calls."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.gated_deltanet import (
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    l2_normalize,
    unit_lower_triangular_inverse,
)

SETTINGS = settings(max_examples=12, deadline=None)
recurrent = jax.jit(gated_delta_rule_recurrent)
chunked = jax.jit(gated_delta_rule_chunked, static_argnames=("chunk_size",))


def reference_rule(q, k, v, g, beta, state=None):
    """The gated delta rule token by token in float64 numpy."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    s = np.zeros((b, h, dk, dv)) if state is None else np.array(state, np.float64)
    out = np.zeros((b, t, h, dv))
    for i in range(t):
        s = s * np.exp(g[:, i])[..., None, None]
        predicted = np.einsum("bhkv,bhk->bhv", s, k[:, i])
        delta = (v[:, i] - predicted) * beta[:, i][..., None]
        s = s + k[:, i][..., :, None] * delta[..., None, :]
        out[:, i] = np.einsum("bhkv,bhk->bhv", s, q[:, i])
    return out, s


def random_inputs(seed, b, t, h, dk, dv, with_state=False):
    rng = np.random.default_rng(seed)
    q = np.asarray(l2_normalize(jnp.asarray(rng.normal(size=(b, t, h, dk))))) * dk**-0.5
    k = np.asarray(l2_normalize(jnp.asarray(rng.normal(size=(b, t, h, dk)))))
    v = rng.normal(size=(b, t, h, dv))
    g = -rng.uniform(0.0, 2.0, size=(b, t, h))
    beta = rng.uniform(0.0, 1.0, size=(b, t, h))
    state = rng.normal(size=(b, h, dk, dv)) if with_state else None
    return [np.asarray(x, np.float32) if x is not None else None for x in (q, k, v, g, beta, state)]


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    t=st.sampled_from([1, 5, 16, 23]),
    chunk=st.sampled_from([4, 8]),
    with_state=st.booleans(),
)
def test_chunked_equals_recurrent_equals_reference(seed, t, chunk, with_state):
    q, k, v, g, beta, state = random_inputs(seed, 2, t, 3, 8, 6, with_state)
    ref_out, ref_state = reference_rule(q, k, v, g, beta, state)
    rec_out, rec_state = recurrent(q, k, v, g, beta, state)
    chk_out, chk_state = chunked(q, k, v, g, beta, state, chunk_size=chunk)
    np.testing.assert_allclose(rec_out, ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(rec_state, ref_state, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(chk_out, ref_out, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(chk_state, ref_state, atol=1e-4, rtol=1e-4)


def test_prefill_then_decode_continues_the_state():
    q, k, v, g, beta, _ = random_inputs(3, 1, 20, 2, 8, 8)
    full_out, full_state = chunked(q, k, v, g, beta, chunk_size=8)
    out, state = chunked(q[:, :13], k[:, :13], v[:, :13], g[:, :13], beta[:, :13], chunk_size=8)
    steps = [out]
    for i in range(13, 20):
        o, state = recurrent(
            q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], g[:, i : i + 1], beta[:, i : i + 1], state
        )
        steps.append(o)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full_out, atol=1e-5)
    np.testing.assert_allclose(state, full_state, atol=1e-5)


def test_matches_transformers_chunked_kernel():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state = random_inputs(7, 2, 37, 2, 16, 8, with_state=True)
    # transformers normalises and scales inside its kernel; feed it the raw (unit) vectors.
    expected, expected_state = torch_chunk_gated_delta_rule(
        *(torch.tensor(x) for x in (q * 16**0.5, k, v, g, beta)),
        initial_state=torch.tensor(state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        chunk_size=16,
    )
    out, final = chunked(q, k, v, g, beta, state, chunk_size=16)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(final, expected_state.numpy(), atol=1e-5)


@jax.jit
def _conv(x, w, state):
    return causal_conv1d(x, w, state)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), split=st.integers(1, 9))
def test_causal_conv1d_matches_torch_and_carries_its_window(seed, split):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 10, 6)).astype(np.float32)
    w = rng.normal(size=(6, 4)).astype(np.float32)
    expected = torch.nn.functional.conv1d(
        torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w)[:, None], padding=3, groups=6
    )[:, :, :10]
    expected = torch.nn.functional.silu(expected).transpose(1, 2).numpy()
    out, _ = _conv(x, w, jnp.zeros((2, 3, 6)))
    np.testing.assert_allclose(out, expected, atol=1e-5)
    first, state = _conv(x[:, :split], w, jnp.zeros((2, 3, 6)))
    second, _ = causal_conv1d(x[:, split:], w, state)
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), expected, atol=1e-5)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 3, 8, 13]))
def test_unit_lower_triangular_inverse_matches_numpy(seed, n):
    m = np.random.default_rng(seed).uniform(-1, 1, size=(2, n, n)).astype(np.float32)
    unit_lower = np.tril(m, -1) + np.eye(n, dtype=np.float32)
    got = jax.jit(unit_lower_triangular_inverse)(m)  # the upper part and diagonal of m are ignored
    expected = np.linalg.inv(unit_lower.astype(np.float64))
    np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max(), rtol=1e-4)
