"""Qwen3-VL parity helpers: prompts with images rendered as a rollout renders them, and the
logits of transformers' model and of ours on them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from cua_jax.context.tokenizer import build_image_processor, special_token_ids
from cua_jax.models.qwen3_vl import rope_index
from cua_jax.models.vision import ImageGrid


def screenshot(height, width, seed):
    from PIL import Image

    rng = np.random.RandomState(seed)
    base = rng.randint(0, 255, size=(height // 10 + 1, width // 10 + 1, 3)).astype(np.uint8)
    return Image.fromarray(np.kron(base, np.ones((10, 10, 1), np.uint8))[:height, :width])


def chat_rows(tokenizer, conversations, grid, merge=2):
    """Chat-rendered token rows with each image placeholder expanded to its merged token count.
    conversations: per row, user-turn items (strings, or "IMG" for the next image); grid: the
    images' (t, h, w) patch grids in order; merge: the processor's spatial merge size."""
    image_pad = special_token_ids(tokenizer)["<|image_pad|>"]
    counts = iter(t * h * w // merge**2 for t, h, w in grid)
    rows = []
    for items in conversations:
        content = [{"type": "image"} if item == "IMG" else {"type": "text", "text": item} for item in items]
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = list(ids["input_ids"]) if isinstance(ids, dict) else list(ids)
        rows.append([t for tok in ids for t in ([tok] * next(counts) if tok == image_pad else [tok])])
    return rows


def vl_inputs(tokenizer, conversations, images):
    """Chat-rendered, image-expanded, left-padded ids with HF-style mask, pixels and grids.

    conversations: one list of user-turn items per row (strings, or "IMG" for the next image).
    """
    processor = build_image_processor()
    merge = processor.merge_size
    pixel_values, grid = None, ()
    if images:
        out = processor(images=images, return_tensors="np")
        pixel_values, grid = out["pixel_values"].astype(np.float32), tuple(map(tuple, out["image_grid_thw"].tolist()))
    rows = chat_rows(tokenizer, conversations, grid, merge)
    length = max(map(len, rows))
    pad = special_token_ids(tokenizer)["<|endoftext|>"]
    ids = np.full((len(rows), length), pad, np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask, pixel_values, grid


def hf_logits(model, config, ids, mask, pixel_values, grid):
    kwargs = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if pixel_values is not None:
        kwargs.update(
            pixel_values=torch.as_tensor(pixel_values),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == config.image_token_id).astype(np.int64)),
        )
    with torch.no_grad():
        return model(**kwargs).logits.numpy()


@nnx.jit
def vl_forward(model, ids, segment_ids, positions, extras):
    logits, _ = model(ids, positions=positions, segment_ids=segment_ids, **extras)
    return logits


def our_logits(model, config, ids, mask, pixel_values, grid):
    positions, _ = rope_index(
        ids,
        grid or None,
        image_token_id=config.image_token_id,
        spatial_merge_size=config.vision.spatial_merge_size,
        attention_mask=mask,
    )
    extras = {}
    if pixel_values is not None:
        extras = dict(pixel_values=jnp.asarray(pixel_values), image_grid_thw=ImageGrid.of(grid))
    return np.asarray(
        vl_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions), extras)
    )
