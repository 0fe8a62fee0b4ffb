"""Rotary position embeddings (RoPE), as pure functions.

The split is: `rope_inv_freq` gives the per-frequency inverse wavelengths for a config
(default / linear / dynamic-NTK / yarn, exactly as transformers computes them);
`rope_cos_sin` turns positions into cos/sin tables; `apply_rotary` rotates queries and
keys given any cos/sin. Multimodal RoPE (Qwen3-VL, Qwen3.5: `mrope_cos_sin`) builds its
cos/sin from 3-axis positions and reuses `apply_rotary` unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.models.configs import RopeConfig


def _default_inv_freq(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))


def rope_inv_freq(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies float32 [head_dim // 2] and the cos/sin scaling factor.

    "dynamic" returns the frequencies for sequences within max_position_embeddings;
    longer sequences go through `dynamic_ntk_inv_freq`.
    """
    dim = head_dim
    if rope.rope_type in ("default", "dynamic"):
        return _default_inv_freq(rope.rope_theta, dim), 1.0
    if rope.rope_type == "linear":
        return _default_inv_freq(rope.rope_theta, dim) / rope.factor, 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope, dim, max_position_embeddings)
    raise ValueError(f"unsupported rope_type {rope.rope_type!r}")


def dynamic_ntk_inv_freq(
    rope: RopeConfig, head_dim: int, max_position_embeddings: int, seq_len: jax.Array
) -> jax.Array:
    """Dynamic-NTK frequencies for a (traced) sequence length: the base grows once
    seq_len exceeds max_position_embeddings (transformers' `_compute_dynamic_ntk_parameters`)."""
    dim = head_dim
    seq_len = jnp.maximum(seq_len.astype(jnp.float32), float(max_position_embeddings))
    base = rope.rope_theta * ((rope.factor * seq_len / max_position_embeddings) - (rope.factor - 1)) ** (
        dim / (dim - 2)
    )
    return 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def _yarn_inv_freq(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    base = rope.rope_theta
    original_max = rope.original_max_position_embeddings
    factor = rope.factor if rope.factor is not None else max_position_embeddings / original_max

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rope.beta_fast or 32
    beta_slow = rope.beta_slow or 1

    def correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoids a zero-width ramp, as transformers does
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(positions: jax.Array, inv_freq: jax.Array, scaling: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 [..., head_dim] for integer positions [...].

    Frequencies are laid out twice ([f, f]), matching the rotate-half convention.
    """
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, H, D] by cos/sin [B, T, D] (rotate-half convention, as HF)."""
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def mrope_axis_of_frequency(mrope_section: Sequence[int]) -> np.ndarray:
    """Which position axis (0 = t, 1 = h, 2 = w) drives each rotary frequency: int [sum(sections)].

    Interleaved layout: frequency j uses h when j % 3 == 1 and j < 3 * sections[1], w when
    j % 3 == 2 and j < 3 * sections[2], else t.
    """
    n = int(sum(mrope_section))
    j = np.arange(n)
    axis = np.zeros(n, np.int32)
    axis[(j % 3 == 1) & (j < 3 * mrope_section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * mrope_section[2])] = 2
    return axis


def mrope_cos_sin(
    positions: jax.Array, inv_freq: jax.Array, mrope_section: Sequence[int], scaling: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 [B, L, 2 * F] for 3-axis positions int [3, B, L] and inv_freq [F].

    Each frequency takes its angle from the axis `mrope_axis_of_frequency` assigns it; the
    frequencies are laid out twice ([f, f]) for the rotate-half convention.
    """
    axis = jnp.asarray(mrope_axis_of_frequency(mrope_section))
    pos = positions.astype(jnp.float32)  # [3, B, L]
    picked = jnp.take(pos, axis, axis=0)  # [F, B, L]: the driving axis' position per frequency
    freqs = jnp.moveaxis(picked, 0, -1) * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling
