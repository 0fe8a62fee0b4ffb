"""Qwen3-VL's pure math: multimodal position ids, interleaved M-RoPE tables, the vision
tower's grid helpers and segment attention, against numpy references and transformers' code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.qwen3_vl import (
    decode_positions,
    rope_index,
    text_positions,
)
from cua_jax.models.rope import mrope_axis_of_frequency, mrope_cos_sin, rope_cos_sin
from cua_jax.models.vision import (
    attention_segment_runs,
    position_embedding_taps,
    segment_attention,
    vision_rotary_cos_sin,
    vision_rotary_positions,
)

IMAGE = 9
MERGE = 2
SETTINGS = settings(max_examples=25, deadline=None)


def grid_strategy():
    side = st.integers(1, 6).map(lambda n: n * MERGE)
    return st.tuples(st.integers(1, 2), side, side)


@st.composite
def multimodal_batch(draw):
    """Rows of text runs and image runs (each image a run of its merged token count), left-padded."""
    rows, grids = [], []
    for _ in range(draw(st.integers(1, 3))):
        row = []
        for _ in range(draw(st.integers(0, 3))):
            row += draw(st.lists(st.integers(10, 50), min_size=1, max_size=4))
            if draw(st.booleans()):
                t, h, w = draw(grid_strategy())
                grids.append((t, h, w))
                row += [IMAGE] * (t * h * w // MERGE**2)
        rows.append(row or [11])
    length = max(map(len, rows)) + draw(st.integers(0, 3))
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask, tuple(grids)


def hf_get_rope_index(ids, mask, grids):
    """transformers' Qwen3VLModel.get_rope_index, called unbound on a stand-in config."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    this = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE)))
    this.get_vision_position_ids = lambda *a, **k: Qwen3VLModel.get_vision_position_ids(this, *a, **k)
    pos, deltas = Qwen3VLModel.get_rope_index(
        this,
        torch.as_tensor(ids),
        mm_token_type_ids=torch.as_tensor((ids == IMAGE).astype(np.int64)),
        image_grid_thw=torch.as_tensor(grids).reshape(-1, 3) if grids else None,
        attention_mask=torch.as_tensor(mask),
    )
    return pos.numpy(), deltas.numpy().reshape(-1)


@SETTINGS
@given(multimodal_batch())
def test_rope_index_matches_transformers(batch):
    ids, mask, grids = batch
    pos, deltas = rope_index(ids, grids, image_token_id=IMAGE, spatial_merge_size=MERGE, attention_mask=mask)
    ref_pos, ref_deltas = hf_get_rope_index(ids, mask, grids)
    np.testing.assert_array_equal(pos, ref_pos)
    np.testing.assert_array_equal(deltas, ref_deltas)


@SETTINGS
@given(multimodal_batch())
def test_rope_index_properties(batch):
    ids, mask, grids = batch
    pos, deltas = rope_index(ids, grids, image_token_id=IMAGE, spatial_merge_size=MERGE, attention_mask=mask)
    text = (ids != IMAGE) & (mask == 1)
    assert (pos[0][text] == pos[1][text]).all() and (pos[0][text] == pos[2][text]).all()
    assert (pos[:, mask == 0] == 0).all()
    # The next token continues right after the largest position: real count + delta.
    for row in range(ids.shape[0]):
        assert mask[row].sum() + deltas[row] == pos[:, row].max() + 1
    if not grids:
        np.testing.assert_array_equal(pos, text_positions(mask))
        assert (deltas == 0).all()


def test_rope_index_rejects_mismatched_images():
    ids = np.array([[1, IMAGE, IMAGE, IMAGE, 2]])
    with pytest.raises(ValueError, match="does not match image grid"):
        rope_index(ids, ((1, 2, 2),), image_token_id=IMAGE, spatial_merge_size=MERGE)
    with pytest.raises(ValueError, match="more images"):
        rope_index(np.array([[1, 2]]), ((1, 2, 2),), image_token_id=IMAGE, spatial_merge_size=MERGE)
    with pytest.raises(ValueError, match="more image-token runs"):
        rope_index(np.array([[1, IMAGE, 2]]), None, image_token_id=IMAGE, spatial_merge_size=MERGE)


def test_decode_positions_continue_prompt():
    pos = decode_positions(jnp.array([5, 7]), jnp.array([-3, 0]))
    assert pos.shape == (3, 2, 1)
    np.testing.assert_array_equal(np.asarray(pos)[:, :, 0], [[2, 7]] * 3)


def mrope_reference(positions, inv_freq, section):
    """Loop-by-frequency numpy statement of interleaved M-RoPE."""
    f = len(inv_freq)
    angles = np.zeros(positions.shape[1:] + (f,), np.float64)
    for j in range(f):
        axis = 1 if (j % 3 == 1 and j < 3 * section[1]) else 2 if (j % 3 == 2 and j < 3 * section[2]) else 0
        angles[..., j] = positions[axis] * inv_freq[j]
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb), np.sin(emb)


_mrope_jit = jax.jit(mrope_cos_sin, static_argnums=2)


@SETTINGS
@given(st.sampled_from([(12, 10, 10), (24, 20, 20), (4, 2, 2)]), st.integers(0, 2**31 - 1))
def test_mrope_cos_sin_matches_reference(section, seed):
    positions = np.random.RandomState(seed).randint(0, 500, size=(3, 2, 9))  # one shape: one compile per section
    dim = 2 * sum(section)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    cos, sin = _mrope_jit(jnp.asarray(positions), jnp.asarray(inv_freq), section)
    ref_cos, ref_sin = mrope_reference(positions, inv_freq.astype(np.float64), section)
    np.testing.assert_allclose(np.asarray(cos), ref_cos, atol=2e-4)
    np.testing.assert_allclose(np.asarray(sin), ref_sin, atol=2e-4)
    # Equal axes reduce to the 1-D RoPE of the text model.
    same = np.broadcast_to(positions[:1], positions.shape)
    cos_1d, sin_1d = rope_cos_sin(jnp.asarray(positions[0]), inv_freq)
    cos_eq, sin_eq = _mrope_jit(jnp.asarray(same), jnp.asarray(inv_freq), section)
    np.testing.assert_allclose(np.asarray(cos_eq), np.asarray(cos_1d), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin_eq), np.asarray(sin_1d), atol=1e-6)


def test_mrope_axis_layout_is_interleaved():
    np.testing.assert_array_equal(mrope_axis_of_frequency((3, 2, 2)), [0, 1, 2, 0, 1, 2, 0])


def test_mrope_matches_transformers_rotary():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    section = (12, 10, 10)
    hf_cfg = Qwen3VLTextConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": list(section),
            "mrope_interleaved": True,
        },
    )
    positions = np.random.RandomState(0).randint(0, 300, size=(3, 2, 17))
    cos, sin = Qwen3VLTextRotaryEmbedding(hf_cfg)(torch.zeros(1), torch.as_tensor(positions))
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, 64, 2, dtype=np.float32) / 64))
    ours_cos, ours_sin = mrope_cos_sin(jnp.asarray(positions), inv_freq, section)
    np.testing.assert_allclose(np.asarray(ours_cos), cos.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours_sin), sin.numpy(), atol=1e-5)


@SETTINGS
@given(st.lists(grid_strategy(), min_size=1, max_size=3), st.sampled_from([16, 64, 256, 2304]))
def test_vision_grid_helpers_match_transformers(grids, num_positions):
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

    grid_t = torch.as_tensor(grids)
    ref_idx, ref_w = get_vision_interpolation_indices_and_weights(
        grid_t,
        num_grid_per_side=int(num_positions**0.5),
        mode="bilinear",
        align_corners=True,
        spatial_merge_size=MERGE,
    )
    idx, w = position_embedding_taps(tuple(grids), num_positions, MERGE)
    np.testing.assert_array_equal(idx, ref_idx.numpy())
    np.testing.assert_allclose(w, ref_w.numpy(), atol=1e-7)
    np.testing.assert_array_equal(
        vision_rotary_positions(tuple(grids), MERGE), get_vision_position_ids(grid_t, MERGE).numpy()
    )
    runs = attention_segment_runs(tuple(grids))
    assert sum(n * c for n, c in runs) == sum(t * h * w for t, h, w in grids)


def test_vision_rotary_matches_transformers():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding

    cfg = Qwen3VLVisionConfig(hidden_size=64, num_heads=2)
    positions = vision_rotary_positions(((1, 6, 4), (2, 2, 2)), MERGE)
    cos, sin = Qwen3VLVisionRotaryEmbedding(cfg)(torch.zeros(1), torch.as_tensor(positions).long())
    ours_cos, ours_sin = vision_rotary_cos_sin(jnp.asarray(positions), 32, 10000.0)
    np.testing.assert_allclose(np.asarray(ours_cos), cos.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.asarray(ours_sin), sin.numpy(), atol=1e-6)


def segment_attention_reference(q, k, v, runs):
    """Full softmax attention with a block-diagonal mask, in float64 numpy."""
    seg = np.concatenate([np.repeat(np.arange(c) + 1000 * i, n) for i, (n, c) in enumerate(runs)])
    logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(seg[None, :, None] == seg[None, None, :], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, v)


_segment_attention_jit = jax.jit(segment_attention, static_argnums=3)


@SETTINGS
@given(st.sampled_from([((4, 3),), ((4, 1), (6, 2), (4, 1)), ((12, 1),)]), st.integers(0, 2**31 - 1))
def test_segment_attention_matches_reference(runs, seed):
    n = sum(length * count for length, count in runs)
    q, k, v = np.random.RandomState(seed).normal(size=(3, n, 2, 8)).astype(np.float32)
    got = _segment_attention_jit(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), runs)
    np.testing.assert_allclose(np.asarray(got), segment_attention_reference(q, k, v, runs), atol=1e-5)
