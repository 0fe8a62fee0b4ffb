"""Qwen3.5 with images against transformers' PyTorch Qwen3_5ForConditionalGeneration (float32, CPU).

A tiny random checkpoint (`tiny_qwen3_5_config`, `mtp.*` tensors added) is written by
transformers' save_pretrained and loaded by cua_jax; prompts are rendered by the shipped
tokenizer's chat template, images go through `Qwen2VLImageProcessorPil`, and transformers gets
`mm_token_type_ids` as its processor would give them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from cua_jax.context.tokenizer import build_image_processor, load_tokenizer, special_token_ids
from cua_jax.models.checkpoint import open_checkpoint
from cua_jax.models.qwen3_5 import (
    Qwen3_5ForConditionalGeneration,
    export_qwen3_5,
    image_prefill_extras,
    load_qwen3_5,
    tiny_qwen3_5_config,
)
from cua_jax.models.qwen3_vl import rope_index
from cua_jax.models.sampler import Sampler, SamplingParams
from cua_jax.models.vision import ImageGrid
from tests.support.qwen3_vl import chat_rows

TOL = 1e-4
CHUNK = 8


@pytest.fixture(scope="module")
def config():
    return tiny_qwen3_5_config(chunk_size=CHUNK)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, config):
    import transformers
    from test_qwen3_5_parity import add_mtp_tensors, spread_weights

    model = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(**config.to_hf_dict())).eval()
    spread_weights(model, seed=1)
    directory = tmp_path_factory.mktemp("hf_qwen3_5_vl")
    model.save_pretrained(directory)
    add_mtp_tensors(directory, config.text.hidden_size)
    return directory, model


@pytest.fixture(scope="module")
def ours(hf_dir):
    model, _ = load_qwen3_5(hf_dir[0], chunk_size=CHUNK)
    assert isinstance(model, Qwen3_5ForConditionalGeneration)
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def screenshot(height, width, seed):
    from PIL import Image

    rng = np.random.RandomState(seed)
    base = rng.randint(0, 255, size=(height // 10 + 1, width // 10 + 1, 3)).astype(np.uint8)
    return Image.fromarray(np.kron(base, np.ones((10, 10, 1), np.uint8))[:height, :width])


def images_in(sizes):
    if not sizes:
        return None, ()
    out = build_image_processor()(
        images=[screenshot(h, w, seed=i) for i, (h, w) in enumerate(sizes)], return_tensors="np"
    )
    return out["pixel_values"].astype(np.float32), tuple(map(tuple, out["image_grid_thw"].tolist()))


def hf_kwargs(config, ids, mask, pixel_values, grid):
    kwargs = dict(
        input_ids=torch.as_tensor(ids),
        attention_mask=torch.as_tensor(mask),
        mm_token_type_ids=torch.as_tensor((ids == config.image_token_id).astype(np.int64)),
    )
    if pixel_values is not None:
        kwargs.update(pixel_values=torch.as_tensor(pixel_values), image_grid_thw=torch.as_tensor(grid))
    return kwargs


@nnx.jit
def _forward(model, ids, segment_ids, positions, extras):
    return model(ids, positions=positions, segment_ids=segment_ids, **extras)[0]


def test_logits_match_transformers_with_images_and_padding(hf_dir, ours, config, tokenizer):
    pixel_values, grid = images_in([(210, 160), (100, 130)])
    rows = chat_rows(tokenizer, [["Before:", "IMG", "after:", "IMG", "what changed?"], ["Just text."]], grid)
    length = max(map(len, rows))
    ids = np.full((2, length), special_token_ids(tokenizer)["<|endoftext|>"], np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :], mask[i, length - len(row) :] = row, 1
    with torch.no_grad():
        ref = hf_dir[1](**hf_kwargs(config, ids, mask, pixel_values, grid)).logits.numpy()
    positions, _ = rope_index(
        ids,
        grid,
        image_token_id=config.image_token_id,
        spatial_merge_size=2,
        attention_mask=mask,
        mm_token_type_ids=(ids == config.image_token_id).astype(np.int32),
    )
    extras = dict(pixel_values=jnp.asarray(pixel_values), image_grid_thw=ImageGrid.of(grid))
    got = np.asarray(
        _forward(ours, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions), extras)
    )
    real = mask.astype(bool)
    assert ref[real].std() > 0.5  # the comparison is not between near-constants
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)
    other = _forward(
        ours,
        jnp.asarray(ids, jnp.int32),
        jnp.asarray(mask, jnp.int32),
        jnp.asarray(positions),
        {**extras, "pixel_values": jnp.asarray(pixel_values[::-1].copy())},
    )
    assert np.abs(np.asarray(other) - got).max() > 1e-2  # the pixels reach the logits


def test_greedy_generation_with_an_image_equals_transformers_generate(hf_dir, ours, config, tokenizer):
    pixel_values, grid = images_in([(210, 160)])
    (prompt,) = chat_rows(tokenizer, [["IMG", "Click the submit button."]], grid)
    new = 8
    sampler = Sampler(ours, prompt_buckets=(128,), batch_buckets=(1,), new_token_buckets=(8,))
    out = sampler.generate(
        [prompt],
        SamplingParams(temperature=0, max_new_tokens=new),
        jax.random.key(0),
        prefill_extras=image_prefill_extras(config, pixel_values, grid),
    )
    ids = np.asarray([prompt])
    with torch.no_grad():
        ref = (
            hf_dir[1]
            .generate(
                **hf_kwargs(config, ids, np.ones_like(ids), pixel_values, grid),
                max_new_tokens=new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :]
            .tolist()
        )
    assert out.tokens[0].tolist() == ref


def test_export_round_trip_keeps_every_tensor(hf_dir, ours, tmp_path):
    export_qwen3_5(ours, tmp_path, tokenizer_files=False)
    source, written = open_checkpoint(hf_dir[0]), open_checkpoint(tmp_path)
    assert sorted(source) == sorted(written) and any(k.startswith("mtp.") for k in source)
    for key in source:
        assert np.asarray(source[key].array(key)).tobytes() == np.asarray(written[key].array(key)).tobytes(), key
    import transformers

    assert transformers.Qwen3_5Config.from_pretrained(tmp_path).to_dict()["text_config"]["layer_types"] == list(
        ours.config.text.layer_types
    )
