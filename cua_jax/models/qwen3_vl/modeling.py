"""Qwen3-VL in Flax NNX: vision tower + Qwen3 text decoder with DeepStack and interleaved M-RoPE.

Matches transformers' `Qwen3VLForConditionalGeneration` (images; videos are not supported):

* image tokens: each `image_token_id` placeholder in `input_ids` is replaced, in order, by
  one merged image token from the vision tower (`cua_jax.models.vision.VisionTower`);
* DeepStack: the vision tower's k-th DeepStack feature is added to the hidden states at
  image-token positions right after decoder layer k;
* multimodal RoPE: every token has a (t, h, w) position. Text tokens have t = h = w (so
  text-only input reduces exactly to the Qwen3 text model); an image's tokens get
  t = start, h = start + row, w = start + col, and the next text token resumes at
  start + max(rows, cols). The rotary frequencies are shared between the three axes in
  the interleaved layout [t, h, w, t, h, w, ..., t, t] given by `mrope_section`.

Position ids are host-side data (`rope_index`, numpy), like the token ids they are built
from: the model takes them as a [3, B, L] int array. Decoding continues them with the
per-sequence `rope_deltas` (`decode_positions`).

Configs are in `config`, checkpoint tables and loading in `params`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cua_jax.models.layers import scatter_rows
from cua_jax.models.qwen3 import KVCache, Qwen3ForCausalLM
from cua_jax.models.qwen3_vl.config import Qwen3VLConfig
from cua_jax.models.rope import mrope_cos_sin, rope_inv_freq
from cua_jax.models.vision import (
    GridTHW,
    ImageGrid,
    VisionLanguageModel,
    merged_token_counts,
    normalize_grid,
)

# ---------------------------------------------------------------------------
# Multimodal position ids (host-side, numpy)
# ---------------------------------------------------------------------------


def rope_index(
    input_ids: np.ndarray,
    image_grid_thw: GridTHW | np.ndarray | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
    attention_mask: np.ndarray | None = None,
    mm_token_type_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """3-axis M-RoPE position ids and rope deltas, as HF's `Qwen3VLModel.get_rope_index`.

    input_ids: int [B, L]; image_grid_thw: (t, h, w) per image, in order of appearance across
    the batch (row-major); attention_mask: 0/1 [B, L] (padding gets position 0 and is skipped);
    mm_token_type_ids: 1 at image tokens, 0 elsewhere [B, L] (default: input_ids == image_token_id).

    Returns positions int32 [3, B, L] and rope_deltas int32 [B]: max position + 1 - number of
    real tokens, so a token appended at real index i (0-based) has position i + delta on all axes.
    Raises ValueError when a run of image tokens does not match the size of its image grid.
    """
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {input_ids.shape}")
    b, length = input_ids.shape
    token_types = (
        (input_ids == image_token_id).astype(np.int32) if mm_token_type_ids is None else np.asarray(mm_token_type_ids)
    )
    if np.any((token_types != 0) & (token_types != 1)):
        raise ValueError("mm_token_type_ids holds values other than 0 (text) and 1 (image); videos are not supported")
    mask = np.ones((b, length), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids = iter(normalize_grid(image_grid_thw) if image_grid_thw is not None else ())
    positions = np.zeros((3, b, length), np.int32)
    deltas = np.zeros((b,), np.int32)
    for row in range(b):
        types = token_types[row][mask[row]]
        pieces, current = [], 0
        for kind, group in itertools.groupby(types.tolist()):
            n = len(list(group))
            if kind == 0:
                pieces.append(np.broadcast_to(np.arange(current, current + n), (3, n)))
                current += n
                continue
            grid = next(grids, None)
            if grid is None:
                raise ValueError(f"sequence {row} has more image-token runs than image_grid_thw has images")
            t, h, w = grid
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            if t * gh * gw != n:
                raise ValueError(
                    f"sequence {row}: a run of {n} image tokens does not match image grid {grid} "
                    f"({t * gh * gw} tokens after {spatial_merge_size}x{spatial_merge_size} merging)"
                )
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            pieces.append(np.stack([tt, hh, ww]).reshape(3, -1) + current)
            current += max(h, w) // spatial_merge_size
        if pieces:
            seq_pos = np.concatenate(pieces, axis=1)
            positions[:, row, mask[row]] = seq_pos
            deltas[row] = seq_pos.max() + 1 - seq_pos.shape[1]
    if next(grids, None) is not None:
        raise ValueError("image_grid_thw has more images than the input_ids have image-token runs")
    return positions, deltas


def text_positions(attention_mask: np.ndarray) -> np.ndarray:
    """Positions int32 [3, B, L] for text-only input: index among real tokens, 0 at padding."""
    mask = np.asarray(attention_mask).astype(np.int32)
    pos = np.where(mask > 0, np.cumsum(mask, axis=-1) - 1, 0).astype(np.int32)
    return np.broadcast_to(pos, (3, *pos.shape)).copy()


def decode_positions(num_real_before: jax.Array, rope_deltas: jax.Array) -> jax.Array:
    """Positions int32 [3, B, 1] for one new token per sequence during decoding.

    num_real_before: int [B], real (non-pad) tokens already in the sequence; rope_deltas: int [B]
    from `rope_index` (0 for text-only). The three axes coincide after the prompt.
    """
    pos = (num_real_before + rope_deltas).astype(jnp.int32)[:, None]
    return jnp.broadcast_to(pos[None], (3, *pos.shape))


# ---------------------------------------------------------------------------
# Interleaved multimodal RoPE
# ---------------------------------------------------------------------------


def text_rope_tables(cfg: Qwen3VLConfig) -> tuple[np.ndarray, float]:
    """inv_freq float32 [head_dim // 2] and cos/sin scaling of the text decoder's rotary."""
    return rope_inv_freq(cfg.text.rope, cfg.text.head_dim, cfg.text.max_position_embeddings)


def image_token_counts(cfg: Qwen3VLConfig, image_grid_thw: GridTHW) -> tuple[int, ...]:
    """Placeholder tokens each image needs in input_ids."""
    return merged_token_counts(normalize_grid(image_grid_thw), cfg.vision.spatial_merge_size)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def image_features(
    input_ids: jax.Array, image_token_id: int, tokens: jax.Array, deepstack: Sequence[jax.Array] = ()
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The `image_features` model input for input_ids int [B, T]: merged image tokens [M, E] (and
    DeepStack features, each [M, E]) in placeholder order, row-major over the batch, laid out
    as [B, T, E] arrays (row i of `tokens` at the i-th placeholder; rows past the placeholders
    are left over, so M may be padded)."""
    mask = input_ids == image_token_id
    return scatter_rows(mask, tokens)[0], tuple(scatter_rows(mask, d)[0] for d in deepstack)


class Qwen3VLForConditionalGeneration(VisionLanguageModel):
    """Qwen3-VL: `visual` (VisionTower) + `language_model` (Qwen3ForCausalLM, its decoder and LM head).

    freeze_vision: the vision tower's outputs are wrapped in stop_gradient (no gradient and no
    backward computation reaches it) and `trainable_filter()` excludes its parameters from the
    optimizer, as ScaleCUA trains with the ViT frozen.

    Implements the sampler/scorer model interface (`hidden_states`, `logits`,
    `output_projection`, `init_cache`); images enter as the extra inputs `pixel_values` and
    `image_grid_thw` (an `ImageGrid`, static under jit).
    """

    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs, freeze_vision: bool = False):
        super().__init__(config, rngs=rngs, freeze_vision=freeze_vision)
        self.language_model = Qwen3ForCausalLM(config.text, rngs=rngs)

    # -- pieces ----------------------------------------------------------------------------

    def encode_images(self, pixel_values: jax.Array, image_grid_thw) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """(image tokens [M, E], DeepStack features, each [M, E]) for the images' patches."""
        embeds, deepstack = self.visual(pixel_values, ImageGrid.of(image_grid_thw))
        if self.freeze_vision:
            embeds = jax.lax.stop_gradient(embeds)
            deepstack = tuple(jax.lax.stop_gradient(d) for d in deepstack)
        return embeds, deepstack

    def rotary_cos_sin(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """cos, sin float32 [B, T, head_dim] for positions int [3, B, T] (or [B, T]: all axes equal)."""
        if positions.ndim == 2:
            positions = jnp.broadcast_to(positions[None], (3, *positions.shape))
        if positions.ndim != 3 or positions.shape[0] != 3:
            raise ValueError(f"positions must be [3, B, T] or [B, T], got shape {positions.shape}")
        inv_freq, scaling = text_rope_tables(self.config)
        return mrope_cos_sin(positions, inv_freq, self.config.mrope_section, scaling)

    def _inject_images(self, input_ids, embeds, pixel_values, image_grid_thw):
        """Image tokens in place of the placeholders of embeds [B, T, E], and the DeepStack hook
        that adds vision block k's features at the same positions after decoder layer k."""
        cfg = self.config
        mask = input_ids == cfg.image_token_id
        n_image_tokens = sum(image_token_counts(cfg, image_grid_thw))
        if not isinstance(mask, jax.core.Tracer) and int(jnp.sum(mask)) != n_image_tokens:
            raise ValueError(
                f"input_ids hold {int(jnp.sum(mask))} image tokens but the images give {n_image_tokens} "
                f"(grids {normalize_grid(image_grid_thw)}, {cfg.vision.spatial_merge_size}x"
                f"{cfg.vision.spatial_merge_size} merging)"
            )
        image_embeds, deepstack = self.encode_images(pixel_values, image_grid_thw)
        gathered, keep = scatter_rows(mask, image_embeds.astype(embeds.dtype))
        placed = tuple(scatter_rows(mask, d)[0] for d in deepstack)
        return self._place_image_features(input_ids, embeds, (gathered, placed))

    def _place_image_features(self, input_ids, embeds, image_features):
        """embeds [B, T, E] with image_features' tokens at the placeholders, and the DeepStack hook.

        image_features: (tokens [B, T, E], DeepStack features: one [B, T, E] per injected layer),
        aligned with input_ids and read only at its placeholders (anything elsewhere)."""
        keep = (input_ids == self.config.image_token_id)[..., None]
        tokens, deepstack = image_features
        embeds = jnp.where(keep, tokens.astype(embeds.dtype), embeds)

        def deepstack_hook(layer: int, x: jax.Array) -> jax.Array:
            if layer >= len(deepstack):
                return x
            return x + jnp.where(keep, deepstack[layer].astype(x.dtype), 0)

        return embeds, deepstack_hook

    # -- forward ---------------------------------------------------------------------------

    def hidden_states(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        kv_cache: KVCache | None = None,
        pixel_values: jax.Array | None = None,
        image_grid_thw: ImageGrid | GridTHW | None = None,
        image_features: tuple[jax.Array, tuple[jax.Array, ...]] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states [B, T, E] and the updated cache.

        input_ids int [B, T], with `image_token_id` placeholders where image tokens go.
        positions int [3, B, T] from `rope_index` (required with images), or [B, T] / None for
          text (None: 0.. from the cache's end, as the text model).
        segment_ids int [B, T]: 0 = padding (default all ones); kv_cache as Qwen3Model.
        pixel_values [N, C*T*P*P] and image_grid_thw (t, h, w) per image: the images, in the
          order their placeholder runs appear (row-major over the batch). The number of
          placeholders must equal the image tokens (checked when input_ids is concrete).
        image_features: instead of pixel_values, the images already encoded and laid out over
          input_ids: (tokens [B, T, E], one DeepStack feature [B, T, E] per injected layer), read
          at the placeholders (`place_image_tokens` builds them from `encode_images`' output).
        """
        text_model = self.language_model.model
        if (pixel_values is None) != (image_grid_thw is None):
            raise ValueError("pass pixel_values and image_grid_thw together")
        if pixel_values is not None and image_features is not None:
            raise ValueError("pass the images as pixel_values or as image_features, not both")
        embeds = text_model.embed_tokens(input_ids)
        after_layer = None
        if pixel_values is not None or image_features is not None:
            if positions is None or positions.ndim != 3:
                raise ValueError("with images, pass positions [3, B, T] built by rope_index")
            if image_features is not None:
                embeds, after_layer = self._place_image_features(input_ids, embeds, image_features)
            else:
                embeds, after_layer = self._inject_images(input_ids, embeds, pixel_values, image_grid_thw)
        if positions is None:
            b, t = input_ids.shape
            start = kv_cache.end if kv_cache is not None else jnp.zeros((), jnp.int32)
            positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        return text_model(
            inputs_embeds=embeds,
            position_embeddings=self.rotary_cos_sin(positions),
            segment_ids=segment_ids,
            kv_cache=kv_cache,
            after_layer=after_layer,
        )


# ---------------------------------------------------------------------------
# Sampling with images
# ---------------------------------------------------------------------------


def image_prefill_extras(config: Qwen3VLConfig, pixel_values: np.ndarray | None, image_grid_thw: Any):
    """A `prefill_extras` callable for `cua_jax.models.sampler.Sampler.generate`.

    Given the sampler's padded prompt ids and segment ids, it returns the images' model inputs
    and the multimodal positions [3, B, P] (padding skipped, so left-padding and empty batch
    rows are fine). pixel_values [N, C*T*P*P] and image_grid_thw hold the images of all
    prompts, in prompt order; None for text-only prompts.
    """
    grid = ImageGrid.of(image_grid_thw) if image_grid_thw is not None else None

    def extras(padded_ids: np.ndarray, segment_ids: np.ndarray) -> dict[str, Any]:
        positions, _ = rope_index(
            padded_ids,
            grid.thw if grid is not None else None,
            image_token_id=config.image_token_id,
            spatial_merge_size=config.vision.spatial_merge_size,
            attention_mask=segment_ids != 0,
        )
        out: dict[str, Any] = {"positions": positions}
        if grid is not None:
            out.update(pixel_values=jnp.asarray(pixel_values), image_grid_thw=grid)
        return out

    return extras
