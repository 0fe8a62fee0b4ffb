"""The pure pieces of the decoder against numpy references: RoPE tables and rotation,
RMSNorm, the segment/causal attention mask, grouped-query attention, attention after a shared
prefix; config parsing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.configs import RopeConfig
from cua_jax.models.layers import RMSNorm, attention_mask, dot_product_attention, prefix_attention, project
from cua_jax.models.qwen3 import Qwen3Config, tiny_qwen3_config
from cua_jax.models.rope import apply_rotary, rope_cos_sin, rope_inv_freq

small = settings(max_examples=10, deadline=None)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 3.0},
        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 512},
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 8.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
    ],
    ids=["default", "linear", "yarn", "yarn-mscale"],
)
def test_inv_freq_matches_transformers(rope):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.Qwen3Config(
        head_dim=64, hidden_size=256, num_attention_heads=4, max_position_embeddings=2048, rope_parameters=dict(rope)
    )
    if rope["rope_type"] == "default":
        ref = 1.0 / (rope["rope_theta"] ** (np.arange(0, 64, 2) / 64)), 1.0
    else:
        inv, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
        ref = inv.numpy(), scale
    ours = rope_inv_freq(RopeConfig.from_hf_dict(hf.to_dict()), 64, 2048)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
    assert ours[1] == pytest.approx(ref[1])


def numpy_rotary(x, positions, inv_freq):
    angles = positions[..., None] * inv_freq  # [B, T, D/2]
    cos, sin = np.cos(angles)[:, :, None, :], np.sin(angles)[:, :, None, :]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@jax.jit
def _rotate(x, positions, inv_freq):
    cos, sin = rope_cos_sin(positions, inv_freq)
    return apply_rotary(x, cos, sin)


@small
@given(seed=st.integers(0, 2**31 - 1), theta=st.sampled_from([1e4, 1e6]))
def test_rotary_matches_numpy_and_preserves_norm(seed, theta):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    positions = rng.integers(0, 1000, (2, 5))
    inv_freq = (1.0 / theta ** (np.arange(0, 8, 2) / 8)).astype(np.float32)
    ours = np.asarray(_rotate(jnp.asarray(x), jnp.asarray(positions), jnp.asarray(inv_freq)))
    np.testing.assert_allclose(ours, numpy_rotary(x, positions, inv_freq), atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


@small
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_rms_norm_matches_numpy(seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 16)) * scale).astype(np.float32)
    norm = RMSNorm(16, 1e-6)
    norm.weight[...] = jnp.asarray(rng.standard_normal(16), jnp.float32)
    ours = np.asarray(jax.jit(lambda n, x: n(x))(norm, jnp.asarray(x)))
    xd = x.astype(np.float64)
    ref = np.asarray(norm.weight[...]) * xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def numpy_attention(q, k, v, mask, scale):
    h, kv = q.shape[2], k.shape[2]
    k = np.repeat(k, h // kv, axis=2)
    v = np.repeat(v, h // kv, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) * scale
    s = np.where(mask[:, None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


@small
@given(seed=st.integers(0, 2**31 - 1), groups=st.sampled_from([1, 2, 4]))
def test_grouped_attention_and_mask_match_numpy(seed, groups):
    rng = np.random.default_rng(seed)
    t = 6
    segments = np.sort(rng.integers(1, 3, (2, t)), axis=1)  # packed: segment 1 then 2
    slots = np.arange(t)
    mask = np.asarray(
        attention_mask(jnp.asarray(segments), jnp.asarray(slots), jnp.asarray(segments), jnp.asarray(slots))
    )
    ref_mask = (slots[None, None, :] <= slots[None, :, None]) & (segments[:, :, None] == segments[:, None, :])
    np.testing.assert_array_equal(mask, ref_mask)
    q = rng.standard_normal((2, t, 2 * groups, 8)).astype(np.float32)
    k = rng.standard_normal((2, t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((2, t, 2, 8)).astype(np.float32)
    ref = numpy_attention(q, k, v, mask, 0.35)
    for query_chunk in (0, 4):  # 4 does not divide 6: the padded last block is dropped
        ours = jax.jit(dot_product_attention, static_argnums=(4, 5))(q, k, v, jnp.asarray(mask), 0.35, query_chunk)
        np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-5)


@small
@given(
    seed=st.integers(0, 2**31 - 1),
    groups=st.sampled_from([1, 2]),
    prefix_lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    members=st.lists(st.integers(-1, 2), min_size=4, max_size=4),
)
def test_attention_after_a_shared_prefix_is_attention_over_prefix_then_own_slots(seed, groups, prefix_lengths, members):
    # Rows b continue prefix members[b] (-1: none); each row attends [prefix[:length]; own slots].
    rng = np.random.default_rng(seed)
    b, t, s, p, kh, d = 4, 2, 5, 9, 2, 8
    g = len(prefix_lengths)
    members = [m if m < g else -1 for m in members]
    rows_of = [[row for row in range(b) if members[row] == i] for i in range(g)]
    r = max(1, *(len(x) for x in rows_of))
    table = np.full((g, r), -1, np.int32)
    slot = np.full(b, -1, np.int32)
    for i, rows in enumerate(rows_of):
        table[i, : len(rows)] = rows
        slot[rows] = i * r + np.arange(len(rows))
    q = rng.standard_normal((b, t, kh * groups, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, s, kh, d)).astype(np.float32) for _ in range(2))
    pk, pv = (rng.standard_normal((g, p, kh, d)).astype(np.float32) for _ in range(2))
    mask = rng.random((b, t, s)) < 0.6
    mask[0, 0] = False  # a query that sees none of its own slots
    prefix = (pk, pv, np.asarray(prefix_lengths, np.int32), table, slot)
    ours = np.asarray(jax.jit(prefix_attention, static_argnums=(5,))(q, k, v, mask, prefix, 0.35))
    for row in range(b):
        n = prefix_lengths[members[row]] if members[row] >= 0 else 0
        keys = np.concatenate([pk[members[row], :n], k[row]]) if n else k[row]
        values = np.concatenate([pv[members[row], :n], v[row]]) if n else v[row]
        seen = np.concatenate([np.ones((t, n), bool), mask[row]], axis=1)
        blind = ~seen.any(axis=1)  # fully masked: the values' mean (dot_product_attention's rule)
        ref = numpy_attention(q[row : row + 1], keys[None], values[None], seen[None] | blind[None, :, None], 0.35)[0]
        ref[blind] = np.repeat(values.mean(0), groups, axis=0)
        np.testing.assert_allclose(ours[row], ref, atol=1e-5)


def test_fully_masked_query_attends_uniformly_and_grad_is_finite():
    # A padding query sees no slot: it gets the mean of the values, and no NaN reaches the gradient.
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 3, 2, 8)), jnp.float32) for _ in range(3))
    mask = jnp.asarray([[[True, False, False], [True, True, False], [False, False, False]]])
    out = jax.jit(dot_product_attention, static_argnums=(4,))(q, k, v, mask, 0.35)
    np.testing.assert_allclose(np.asarray(out[0, 2]), np.asarray(v[0].mean(0)), atol=1e-6)
    grad = jax.grad(lambda q: jnp.sum(dot_product_attention(q, k, v, mask, 0.35)))(q)
    assert np.isfinite(np.asarray(grad)).all()


def test_project_is_the_linear_layer_over_the_last_axis():
    from flax import nnx

    linear = nnx.Linear(8, 5, use_bias=True, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 8)), jnp.float32)
    ref = np.einsum("bte,eo->bto", np.asarray(x), np.asarray(linear.kernel[...])) + np.asarray(linear.bias[...])
    out = nnx.jit(project)(linear, x)
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)


def test_config_round_trips_through_hf_dict_and_rejects_bad_input():
    import transformers

    cfg = tiny_qwen3_config(rope=RopeConfig(rope_type="yarn", factor=2.0, original_max_position_embeddings=1024))
    assert Qwen3Config.from_hf_dict(cfg.to_hf_dict()) == cfg
    hf = transformers.Qwen3Config(**{k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures", "dtype")})
    assert Qwen3Config.from_hf_dict(hf.to_dict()) == cfg
    legacy = {
        **cfg.to_hf_dict(),
        "rope_parameters": None,
        "rope_theta": 5e5,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    assert Qwen3Config.from_hf_dict(legacy).rope == RopeConfig(rope_theta=5e5, rope_type="linear", factor=2.0)
    with pytest.raises(ValueError, match="lacks required fields \\['vocab_size'\\]"):
        Qwen3Config.from_hf_dict({k: v for k, v in cfg.to_hf_dict().items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="unsupported rope_type 'longrope'"):
        RopeConfig.from_hf_dict({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}})
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        tiny_qwen3_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="sliding-window"):
        Qwen3Config.from_hf_dict({**cfg.to_hf_dict(), "use_sliding_window": True})
