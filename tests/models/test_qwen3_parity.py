"""Qwen3 logits against transformers' PyTorch Qwen3ForCausalLM (float32, CPU), and the
forward's own invariants: padding, packing, KV cache, inputs_embeds, layer hooks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from cua_jax.models.qwen3 import load_qwen3

TOL = 1e-4


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def test_logits_match_transformers(hf_qwen3_dir, our_qwen3, token_batch, jit_forward, pad_right):
    _, hf = hf_qwen3_dir
    model, _ = our_qwen3
    ours = jit_forward(model, *pad_right(token_batch, token_batch.shape[1]))
    ref = torch_logits(hf, token_batch)
    assert ref.std() > 0.5  # logits spread out: the comparison is not between near-constants
    np.testing.assert_allclose(np.asarray(ours), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "overrides, length",
    [
        (dict(tie_word_embeddings=True, attention_bias=True), 12),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0}), 12),
        (
            dict(
                max_position_embeddings=64,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            ),
            12,
        ),
        # dynamic NTK only changes frequencies past max_position_embeddings: run longer than it.
        (
            dict(
                max_position_embeddings=8,
                rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
            ),
            12,
        ),
    ],
    ids=["tied-bias", "linear", "yarn", "dynamic"],
)
def test_config_variants_match_transformers(tmp_path, overrides, length, make_hf_qwen3):
    hf = make_hf_qwen3(seed=1, num_hidden_layers=1, **overrides)
    hf.save_pretrained(tmp_path)
    model, config = load_qwen3(tmp_path)
    assert config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert config.rope.rope_type == hf.config.rope_parameters["rope_type"]
    ids = np.random.RandomState(2).randint(0, 512, size=(2, length))
    ours, _ = model(jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(ours), torch_logits(hf, ids), atol=TOL, rtol=0)


def test_left_padding_and_packing_match_separate_sequences(our_qwen3, jit_forward, pad_right):
    model, _ = our_qwen3
    a, b = [5, 6, 7, 8], [9, 10, 11]
    alone = np.asarray(jit_forward(model, *pad_right([a, b], 12)))
    # row 0: a and b packed (segments 1 and 2, positions restarting); row 1: a left-padded
    ids = np.asarray([a + b + [0] * 5, [0] * 8 + a], np.int32)
    segments = np.asarray([[1] * 4 + [2] * 3 + [0] * 5, [0] * 8 + [1] * 4], np.int32)
    positions = np.asarray([[0, 1, 2, 3, 0, 1, 2] + [0] * 5, [0] * 8 + [0, 1, 2, 3]], np.int32)
    mixed = np.asarray(jit_forward(model, ids, segments, positions))
    np.testing.assert_allclose(mixed[0, :4], alone[0, :4], atol=TOL, rtol=0)
    np.testing.assert_allclose(mixed[0, 4:7], alone[1, :3], atol=TOL, rtol=0)
    np.testing.assert_allclose(mixed[1, 8:], alone[0, :4], atol=TOL, rtol=0)
    assert np.isfinite(mixed).all()  # fully padded query rows stay finite


def test_kv_cache_prefill_then_decode_equals_full_forward(our_qwen3, token_batch, jit_forward, pad_right):
    model, _ = our_qwen3
    ids = jnp.asarray(token_batch)
    full = jit_forward(model, *pad_right(token_batch, ids.shape[1]))
    step = nnx.jit(lambda m, ids, cache: m(ids, kv_cache=cache))
    cache = model.init_cache(ids.shape[0], 16)
    prefill, cache = step(model, ids[:, :8], cache)
    steps = [prefill]
    for t in range(8, ids.shape[1]):
        logits, cache = step(model, ids[:, t : t + 1], cache)
        steps.append(logits)
    assert int(cache.end) == ids.shape[1]
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), np.asarray(full), atol=TOL, rtol=0)


def test_inputs_embeds_and_layer_hook(our_qwen3, token_batch):
    model, config = our_qwen3
    ids = jnp.asarray(token_batch)
    base, _ = model(ids)
    embeds = model.model.embed_tokens(ids)
    from_embeds, _ = model(inputs_embeds=embeds)
    np.testing.assert_allclose(np.asarray(from_embeds), np.asarray(base), atol=1e-6, rtol=0)

    seen = []
    extra = jax.random.normal(jax.random.key(0), embeds.shape) * 0.5

    def hook(i, hidden):
        seen.append(i)
        return hidden + extra if i == 0 else hidden

    hooked, _ = model(ids, after_layer=hook)
    assert seen == list(range(config.num_hidden_layers))
    # adding after layer 0 is the same as feeding layer 1 the sum: run layer by layer by hand
    cos, sin = model.model.rotary_cos_sin(jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
    from cua_jax.models.layers import attention_mask

    slots = jnp.arange(ids.shape[1])
    segments = jnp.ones(ids.shape, jnp.int32)
    mask = attention_mask(segments, slots, segments, slots)
    x = embeds
    for i, layer in enumerate(model.model.layers):
        x, _ = layer(x, cos, sin, mask)
        if i == 0:
            x = x + extra
    manual = model.logits(model.model.norm(x))
    np.testing.assert_allclose(np.asarray(hooked), np.asarray(manual), atol=1e-5, rtol=0)
    assert np.abs(np.asarray(hooked) - np.asarray(base)).max() > 1e-2


def test_exactly_one_of_ids_and_embeds(our_qwen3):
    model, _ = our_qwen3
    with pytest.raises(ValueError, match="exactly one"):
        model()


def test_query_chunked_attention_gives_same_logits_and_gradients(hf_qwen3_dir, token_batch):
    ids = jnp.asarray(token_batch)

    @nnx.jit
    def loss_and_grads(model):
        def loss(m):
            return jnp.mean(jax.nn.logsumexp(m(ids)[0], axis=-1))

        return nnx.value_and_grad(loss)(model)

    whole, _ = load_qwen3(hf_qwen3_dir[0], attention_query_chunk=0)
    chunked, _ = load_qwen3(hf_qwen3_dir[0], attention_query_chunk=5)  # 12 queries: blocks 5, 5, 2
    (loss_w, grads_w), (loss_c, grads_c) = loss_and_grads(whole), loss_and_grads(chunked)
    np.testing.assert_allclose(float(loss_c), float(loss_w), rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5), grads_c, grads_w
    )
