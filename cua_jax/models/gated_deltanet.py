"""Gated DeltaNet (Qwen3.5's linear attention) and its causal convolution, as pure functions.

The gated delta rule keeps, per head, a state S [Dk, Dv] that every token first decays and
then corrects towards its value:

    S_t = exp(g_t) S_{t-1}
    S_t = S_t + k_t (beta_t (v_t - S_t^T k_t))^T
    o_t = S_t^T q_t

with decay g_t <= 0 (log space) and learning rate beta_t in (0, 1). Two forms compute it:

* `gated_delta_rule_recurrent`: the token-by-token scan above (decoding, and the reference);
* `gated_delta_rule_chunked`: the chunked parallel form for training and prefill. Inside a
  chunk of C tokens the corrections are found at once with the UT transform (the inverse of a
  unit lower triangular matrix, `unit_lower_triangular_inverse`), and only the chunk boundaries
  are scanned, so the work is matmuls of size C instead of T sequential rank-1 updates.

Both take an initial state and return the final one, so a prefill by either form continues
with decode steps by the recurrent form. q and k are used as given: the model L2-normalises
them and scales q by Dk^-0.5 before calling (`l2_normalize`).

`causal_conv1d` is the depthwise causal convolution in front of the rule, with its state (the
last K - 1 inputs) carried between calls.

Shapes: B batch, T tokens, H heads, Dk key dim, Dv value dim, C conv channels, K kernel width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def unit_lower_triangular_inverse(m: jax.Array) -> jax.Array:
    """The inverse of unit lower triangular matrices m [..., n, n] (only the strictly lower part
    of m is read), by recursive 2 x 2 block inversion: log2(n) levels of batched matmuls.

    Used instead of a LAPACK triangular solve: on XLA:CPU, concurrent batched trsm calls wait on
    each other's work in the intra-op thread pool and can deadlock a pool of 2 threads, and
    matmuls suit accelerators better."""
    n = m.shape[-1]
    size = 1 << (n - 1).bit_length()
    eye = jnp.eye(size, dtype=m.dtype)
    padded = jnp.pad(m, [(0, 0)] * (m.ndim - 2) + [(0, size - n), (0, size - n)])
    padded = jnp.where(jnp.tril(jnp.ones((size, size), bool), -1), padded, eye)
    return _unit_lower_inverse_pow2(padded)[..., :n, :n]


def _unit_lower_inverse_pow2(m: jax.Array) -> jax.Array:
    n = m.shape[-1]
    if n == 1:
        return jnp.ones_like(m)
    h = n // 2
    # [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]]; A and D inverted together.
    inverses = _unit_lower_inverse_pow2(jnp.stack([m[..., :h, :h], m[..., h:, h:]]))
    a_inv, d_inv = inverses[0], inverses[1]
    lower_left = -jnp.matmul(d_inv, jnp.matmul(m[..., h:, :h], a_inv))
    top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], axis=-1)
    return jnp.concatenate([top, jnp.concatenate([lower_left, d_inv], axis=-1)], axis=-2)


def _zero_state(q: jax.Array, v: jax.Array) -> jax.Array:
    b, _, h, dk = q.shape
    return jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)


def gated_delta_rule_recurrent(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, initial_state: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule, one token at a time.

    q, k [B, T, H, Dk]; v [B, T, H, Dv]; g (log decay, <= 0), beta [B, T, H];
    initial_state [B, H, Dk, Dv] (default zeros). Returns (out [B, T, H, Dv] float32,
    final state [B, H, Dk, Dv] float32). Computed in float32.
    """
    state = _zero_state(q, v) if initial_state is None else initial_state.astype(jnp.float32)
    f32 = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)  # time-major for the scan

    def step(state, inputs):
        q_t, k_t, v_t, g_t, beta_t = inputs  # [B, H, D..] / [B, H]
        state = state * jnp.exp(g_t)[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v_t - predicted) * beta_t[..., None]
        state = state + k_t[..., :, None] * delta[..., None, :]
        return state, jnp.einsum("bhkv,bhk->bhv", state, q_t)

    state, out = jax.lax.scan(step, state, (f32(q), f32(k), f32(v), f32(g), f32(beta)))
    return jnp.moveaxis(out, 0, 1), state


def gated_delta_rule_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule in chunks of `chunk_size` tokens; same arguments and results as
    `gated_delta_rule_recurrent` (equal up to float rounding).

    T is zero-padded to a multiple of chunk_size; padded tokens have k = v = 0 and g = 0, so
    they change neither the outputs nor the final state.
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (-t) % c
    n = (t + pad) // c

    def chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...] float32
        x = x.astype(jnp.float32)
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = jnp.moveaxis(x, 2, 1)
        return x.reshape(b, h, n, c, *x.shape[3:])

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta)
    decay = jnp.cumsum(g, axis=-1)  # [B, H, N, C]: log decay from the chunk start to each token
    lower = jnp.tril(jnp.ones((c, c), bool))
    # exp(decay_i - decay_j) for j <= i, 0 above the diagonal (masked before exp: it would overflow).
    pairwise = jnp.exp(jnp.where(lower, decay[..., :, None] - decay[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    # UT transform: (I + strictly_lower(diag(beta) K K^T * pairwise)) X = rhs, solved for the
    # corrected values and for the keys that read the state carried in from earlier chunks.
    system = jnp.einsum("...id,...jd->...ij", k_beta, k) * pairwise
    rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(decay)[..., None]], axis=-1)
    solved = jnp.matmul(unit_lower_triangular_inverse(system), rhs)
    values, state_keys = solved[..., :dv], solved[..., dv:]
    intra = jnp.einsum("...id,...jd->...ij", q, k) * pairwise  # within-chunk attention, diagonal included
    q_decayed = q * jnp.exp(decay)[..., None]
    k_to_end = k * jnp.exp(decay[..., -1:] - decay)[..., None]  # each key's decay to the chunk's end
    chunk_decay = jnp.exp(decay[..., -1])  # [B, H, N]

    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    chunk_major = lambda x: jnp.moveaxis(x, 2, 0)

    def step(state, inputs):
        values_n, state_keys_n, intra_n, q_n, k_n, decay_n = inputs
        new_values = values_n - jnp.einsum("bhck,bhkv->bhcv", state_keys_n, state)
        out = jnp.einsum("bhck,bhkv->bhcv", q_n, state) + jnp.einsum("bhij,bhjv->bhiv", intra_n, new_values)
        state = state * decay_n[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_n, new_values)
        return state, out

    inputs = tuple(map(chunk_major, (values, state_keys, intra, q_decayed, k_to_end, chunk_decay)))
    state, out = jax.lax.scan(step, state, inputs)  # out [N, B, H, C, Dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
    return jnp.moveaxis(out, 1, 2), state


def causal_conv1d(
    x: jax.Array, weight: jax.Array, state: jax.Array | None = None, leading_padding: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal convolution followed by SiLU, with a carried input window.

    x [B, T, C]; weight [C, K] (torch's Conv1d weight [C, 1, K] squeezed); state [B, K - 1, C]:
    the K - 1 inputs before x (default zeros, the start of a sequence). Output t is
    silu(sum_j weight[:, j] * window[t + j]) over window = concat(state, x). Returns
    (out [B, T, C] in x's dtype, new state [B, K - 1, C]: the last K - 1 inputs of the window).

    leading_padding int [B] (None: none): row b's first p_b inputs are padding (a left-padded
    batch continuing from a cached state). The window is then [p_b zeros, state, the real
    inputs], so the state sits right before the first real input: the real outputs and the new
    state are those of the unpadded row (outputs at padding are meaningless).
    """
    b, t, ch = x.shape
    kernel = weight.shape[1]
    if state is None:
        state = jnp.zeros((b, kernel - 1, ch), x.dtype)
    window = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, K - 1 + T, C]
    if leading_padding is not None:
        # Source index in concat(state, x) of each window slot: padding, then the state, then x.
        i = jnp.arange(kernel - 1 + t)[None, :]
        p = jnp.asarray(leading_padding, jnp.int32)[:, None]
        source = jnp.where(i < p, 0, jnp.where(i < p + kernel - 1, i - p, i))
        window = jnp.take_along_axis(window, source[..., None], axis=1)
        window = jnp.where((i < p)[..., None], jnp.zeros((), window.dtype), window)
    w = weight.astype(jnp.float32)
    acc = sum(window[:, j : j + t].astype(jnp.float32) * w[:, j] for j in range(kernel))
    return jax.nn.silu(acc).astype(x.dtype), window[:, t:]
