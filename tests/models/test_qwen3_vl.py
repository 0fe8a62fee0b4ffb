"""Qwen3-VL against transformers' PyTorch Qwen3VLForConditionalGeneration (float32, CPU).

One tiny random checkpoint (`tiny_qwen3_vl_config`) is written by transformers'
save_pretrained and loaded by cua_jax; prompts are rendered by the shipped tokenizer's chat
template and images go through `Qwen2VLImageProcessorPil`, as in a rollout.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from cua_jax.context.tokenizer import load_tokenizer, special_token_ids
from cua_jax.models.qwen3 import Qwen3ForCausalLM
from cua_jax.models.qwen3_vl import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    export_qwen3_vl,
    load_qwen3_vl,
    qwen3_vl_key_table,
    rope_index,
    tiny_qwen3_vl_config,
)
from cua_jax.models.vision import ImageGrid
from tests.support.qwen3_vl import hf_logits, our_logits, screenshot, vl_forward, vl_inputs

TOL = 1e-4


@pytest.fixture(scope="module")
def config():
    return tiny_qwen3_vl_config()


@pytest.fixture(scope="module")
def hf_vl_dir(tmp_path_factory, config):
    """(directory, torch model): transformers' Qwen3-VL of the tiny config, weights spread out."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**config.to_hf_dict())).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    directory = tmp_path_factory.mktemp("hf_qwen3_vl")
    model.save_pretrained(directory)
    return directory, model


@pytest.fixture(scope="module")
def ours(hf_vl_dir):
    model, _ = load_qwen3_vl(hf_vl_dir[0])
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


CASES = {
    # One MiniWoB-sized screenshot (160 wide, 210 high).
    "one_image": ([["IMG", "Click the submit button."]], [(210, 160)]),
    # Two images of different sizes in one conversation, plus a second, text-only row (left-padded).
    "two_images": (
        [["Before:", "IMG", "after:", "IMG", "what changed?"], ["Just text here."]],
        [(210, 160), (100, 130)],
    ),
    "text_only": ([["Type hello into the box."], ["Scroll down."]], []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, hf_vl_dir, ours, config, tokenizer):
    conversations, sizes = CASES[case]
    images = [screenshot(h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    ids, mask, pixel_values, grid = vl_inputs(tokenizer, conversations, images)
    if case == "two_images":
        assert len(set(grid)) == 2
    ref = hf_logits(hf_vl_dir[1], config, ids, mask, pixel_values, grid)
    got = our_logits(ours, config, ids, mask, pixel_values, grid)
    real = mask.astype(bool)  # padding rows hold no prediction in either model
    assert ref[real].std() > 0.5  # the comparison is not between near-constants
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)


def test_image_pixels_reach_the_logits(ours, config, tokenizer):
    ids, mask, px, grid = vl_inputs(tokenizer, [["IMG", "Click."]], [screenshot(210, 160, 0)])
    base = our_logits(ours, config, ids, mask, px, grid)
    other = our_logits(ours, config, ids, mask, px[::-1].copy(), grid)
    assert np.abs(base - other).max() > 1e-2


def test_text_only_equals_text_model(ours, config, tokenizer):
    """Without images, Qwen3-VL computes exactly what its Qwen3 language model computes."""
    text_model = Qwen3ForCausalLM(config.text, rngs=nnx.Rngs(1))
    nnx.update(text_model, nnx.state(ours.language_model))
    ids, segments, _, _ = vl_inputs(tokenizer, CASES["text_only"][0], [])  # left-padded rows
    positions, _ = rope_index(
        ids, None, image_token_id=config.image_token_id, spatial_merge_size=2, attention_mask=segments
    )
    vl = vl_forward(ours, jnp.asarray(ids, jnp.int32), jnp.asarray(segments, jnp.int32), jnp.asarray(positions), {})
    text = nnx.jit(lambda m, i, s, p: m(i, positions=p, segment_ids=s)[0])(
        text_model, jnp.asarray(ids, jnp.int32), jnp.asarray(segments, jnp.int32), jnp.asarray(positions[0])
    )
    np.testing.assert_array_equal(np.asarray(vl), np.asarray(text))


def test_export_round_trip(hf_vl_dir, ours, config, tokenizer, tmp_path):
    import transformers

    export_qwen3_vl(ours, tmp_path)
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    ids, mask, px, grid = vl_inputs(tokenizer, [["IMG", "Where is OK?"]], [screenshot(210, 160, 5)])
    ref = hf_logits(hf_vl_dir[1], config, ids, mask, px, grid)
    np.testing.assert_array_equal(hf_logits(reloaded, config, ids, mask, px, grid), ref)
    ours_again, config_again = load_qwen3_vl(tmp_path)
    assert config_again == config
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(ours)), nnx.to_flat_state(nnx.state(ours_again))):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(path))


def test_config_round_trip_through_transformers(config):
    import transformers

    hf = transformers.Qwen3VLConfig(**config.to_hf_dict())
    assert Qwen3VLConfig.from_hf_dict(hf.to_dict()) == config
    tied = dataclasses.replace(config, text=dataclasses.replace(config.text, tie_word_embeddings=True))
    assert Qwen3VLConfig.from_hf_dict(transformers.Qwen3VLConfig(**tied.to_hf_dict()).to_dict()) == tied
    assert all(m.hf != "lm_head.weight" for m in qwen3_vl_key_table(tied))


def test_tiny_config_matches_shipped_tokenizer(config, tokenizer):
    ids = special_token_ids(tokenizer)
    assert config.text.vocab_size == len(tokenizer)
    assert config.image_token_id == ids["<|image_pad|>"]
    assert config.vision_start_token_id == ids["<|vision_start|>"]
    assert config.vision_end_token_id == ids["<|vision_end|>"]
    assert config.text.eos_token_id == ids["<|im_end|>"]


def test_config_errors_name_the_problem(config):
    with pytest.raises(ValueError, match="mrope_section"):
        dataclasses.replace(config, mrope_section=(10, 10, 10))
    with pytest.raises(ValueError, match="out_hidden_size"):
        dataclasses.replace(config, vision=dataclasses.replace(config.vision, out_hidden_size=64))


def test_image_token_count_mismatch_is_an_error(ours, config, tokenizer):
    ids, mask, px, grid = vl_inputs(tokenizer, [["IMG", "x"]], [screenshot(210, 160, 0)])
    positions, _ = rope_index(ids, grid, image_token_id=config.image_token_id, spatial_merge_size=2)
    ids = ids.copy()
    ids[0, np.flatnonzero(ids[0] == config.image_token_id)[0]] = 5
    with pytest.raises(ValueError, match="image tokens"):
        ours(jnp.asarray(ids), positions=jnp.asarray(positions), pixel_values=jnp.asarray(px), image_grid_thw=grid)
    with pytest.raises(ValueError, match="positions"):
        ours(jnp.asarray(ids), pixel_values=jnp.asarray(px), image_grid_thw=grid)


def test_frozen_vision_tower_gets_zero_gradient(config, tokenizer):
    # One decoder layer and one vision block keep the two gradient compilations small.
    small = dataclasses.replace(
        config,
        text=dataclasses.replace(config.text, num_hidden_layers=1),
        vision=dataclasses.replace(config.vision, depth=1, deepstack_visual_indexes=(0,)),
    )
    ids, mask, px, grid = vl_inputs(tokenizer, [["IMG", "Press enter."]], [screenshot(64, 64, 2)])
    positions, _ = rope_index(ids, grid, image_token_id=small.image_token_id, spatial_merge_size=2)
    inputs = dict(positions=jnp.asarray(positions), pixel_values=jnp.asarray(px), image_grid_thw=ImageGrid.of(grid))
    ids = jnp.asarray(ids, jnp.int32)

    def loss(model):
        logits, _ = model(ids, **inputs)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, ids[..., None], -1)[..., 0])

    grad_fn = nnx.jit(nnx.grad(loss))
    for freeze in (False, True):
        model = Qwen3VLForConditionalGeneration(small, rngs=nnx.Rngs(0), freeze_vision=freeze)
        grads = grad_fn(model)
        vision = [np.abs(np.asarray(g[...])).max() for _, g in nnx.to_flat_state(grads["visual"])]
        text = [np.abs(np.asarray(g[...])).max() for _, g in nnx.to_flat_state(grads["language_model"])]
        assert max(text) > 0
        assert (max(vision) == 0) if freeze else (min(vision) > 0)
        trainable = nnx.state(model, model.trainable_filter())
        assert ("visual" in trainable) != freeze and "language_model" in trainable


def test_greedy_sampler_matches_transformers_generate(hf_vl_dir, ours, config, tokenizer):
    from cua_jax.models.qwen3_vl import image_prefill_extras
    from cua_jax.models.sampler import Sampler, SamplingParams

    hf = hf_vl_dir[1]
    conversations = [["IMG", "Open the menu."], ["Look:", "IMG", "and", "IMG", "now?"], ["No image."]]
    images = [screenshot(210, 160, 7), screenshot(64, 96, 8), screenshot(210, 160, 9)]
    ids, mask, px, grid = vl_inputs(tokenizer, conversations, images)
    new_tokens = 6
    pad = special_token_ids(tokenizer)["<|endoftext|>"]
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.as_tensor(mask),
            pixel_values=torch.as_tensor(px),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == config.image_token_id).astype(np.int64)),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
        )[:, ids.shape[1] :].numpy()
    prompts = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]
    sampler = Sampler(ours, prompt_buckets=(128,), batch_buckets=(4,), new_token_buckets=(8,), pad_id=pad)
    out = sampler.generate(
        prompts,
        SamplingParams(temperature=0.0, max_new_tokens=new_tokens),
        jax.random.key(0),
        prefill_extras=image_prefill_extras(config, px, grid),
    )
    np.testing.assert_array_equal(np.stack(out.tokens), ref)

    # The learner's scoring of prompt + response, with positions rebuilt by rope_index over the
    # whole sequence, gives the logprobs the sampler reported (greedy: plain model distribution).
    from cua_jax.models.scoring import score_sequences_jit

    full = np.concatenate([ids, np.stack(out.tokens)], axis=1)
    full_mask = np.concatenate([mask, np.ones((len(prompts), new_tokens), mask.dtype)], axis=1)
    positions, _ = rope_index(
        full, grid, image_token_id=config.image_token_id, spatial_merge_size=2, attention_mask=full_mask
    )
    logp, _ = score_sequences_jit(
        ours,
        jnp.asarray(full, jnp.int32),
        jnp.asarray(full_mask, jnp.int32),
        jnp.asarray(positions),
        pixel_values=jnp.asarray(px),
        image_grid_thw=ImageGrid.of(grid),
    )
    np.testing.assert_allclose(np.asarray(logp)[:, ids.shape[1] :], np.stack(out.logprobs), atol=1e-5, rtol=0)


def test_sharded_forward_matches_one_device(hf_vl_dir, ours, config, tokenizer):
    """fsdp x tensor mesh over 8 CPU devices: same logits as one device (float32, 1e-5)."""
    from cua_jax.models.qwen3_vl import QWEN3_VL_RULES
    from cua_jax.models.sharding import MeshConfig, make_mesh, use_mesh

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    ids, mask, px, grid = vl_inputs(tokenizer, [["IMG", "Find the link."], ["Hi."]], [screenshot(210, 160, 4)])
    expected = our_logits(ours, config, ids, mask, px, grid)
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    sharded, _ = load_qwen3_vl(hf_vl_dir[0], mesh=mesh, rules=QWEN3_VL_RULES)
    kernel = sharded.visual.blocks[0].mlp.linear_fc1.kernel[...]
    assert kernel.addressable_shards[0].data.size == kernel.size // 8  # the vision tower is sharded too
    with use_mesh(mesh, QWEN3_VL_RULES):
        got = our_logits(sharded, config, ids, mask, px, grid)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], expected[real], atol=1e-5, rtol=0)


def test_reads_qwen3_vl_8b_config_layout():
    """The released Qwen3-VL-8B config.json layout (legacy rope_scaling, rope_theta in text_config)."""
    hf = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": False,
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "dtype": "bfloat16",
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 12288,
            "max_position_embeddings": 262144,
            "model_type": "qwen3_vl_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 36,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "use_cache": True,
            "vocab_size": 151936,
        },
        "vision_config": {
            "deepstack_visual_indexes": [8, 16, 24],
            "depth": 27,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 1152,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": 4304,
            "model_type": "qwen3_vl",
            "num_heads": 16,
            "num_position_embeddings": 2304,
            "out_hidden_size": 4096,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }
    cfg = Qwen3VLConfig.from_hf_dict(hf)
    assert cfg.mrope_section == (24, 20, 20) and cfg.text.rope.rope_theta == 5000000
    assert cfg.vision.deepstack_visual_indexes == (8, 16, 24) and cfg.vision.head_dim == 72
    assert cfg.text.num_key_value_heads == 8 and not cfg.tie_word_embeddings
    table = qwen3_vl_key_table(cfg)
    assert len(table) == 3 + 36 * 11 + 3 + 27 * 12 + 4 * 6  # text, vision stem, blocks, 1 + 3 mergers
