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
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cua_jax.models import checkpoint
from cua_jax.models.configs import Qwen3Config, RopeConfig, tiny_qwen3_config
from cua_jax.models.qwen3 import KVCache, Qwen3ForCausalLM
from cua_jax.models.layers import scatter_rows
from cua_jax.models.rope import mrope_cos_sin, rope_inv_freq
from cua_jax.models.sharding import DEFAULT_RULES
from cua_jax.models.vision import (
    VISION_RULES,
    GridTHW,
    ImageGrid,
    VisionConfig,
    VisionTower,
    merged_token_counts,
    normalize_grid,
)

# Sharding rules covering the text decoder's and the vision tower's logical axes.
QWEN3_VL_RULES: Mapping[str, Any] = {**DEFAULT_RULES, **VISION_RULES}


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
    """HF `Qwen3VLConfig`: a Qwen3 text config, a vision config, M-RoPE sections and the
    special token ids. `mrope_section` (t, h, w) counts rotary frequencies per axis and sums
    to text.head_dim // 2."""

    text: Qwen3Config
    vision: VisionConfig
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self):
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.text.head_dim // 2:
            raise ValueError(
                f"mrope_section {self.mrope_section} must have 3 entries summing to head_dim // 2 = "
                f"{self.text.head_dim // 2}"
            )
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(
                f"vision out_hidden_size {self.vision.out_hidden_size} must equal text hidden_size "
                f"{self.text.hidden_size} (image tokens replace text embeddings)"
            )
        if self.text.rope.rope_type == "dynamic":
            raise ValueError("dynamic-NTK rope is not supported with multimodal RoPE")
        if len(self.vision.deepstack_visual_indexes) > self.text.num_hidden_layers:
            raise ValueError(
                f"{len(self.vision.deepstack_visual_indexes)} DeepStack features but only "
                f"{self.text.num_hidden_layers} decoder layers to inject them into"
            )

    @property
    def tie_word_embeddings(self) -> bool:
        return self.text.tie_word_embeddings

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **text_overrides: Any) -> "Qwen3VLConfig":
        """From a Qwen3-VL config.json dict; `text_overrides` set dtype, param_dtype, ...."""
        if "text_config" not in hf or "vision_config" not in hf:
            raise ValueError("a Qwen3-VL config.json needs 'text_config' and 'vision_config'")
        text_hf = dict(hf["text_config"])
        rope_params = dict(text_hf.get("rope_parameters") or text_hf.get("rope_scaling") or {})
        mrope = rope_params.get("mrope_section", [24, 20, 20])
        if rope_params.get("mrope_interleaved") is False:
            raise ValueError("only interleaved M-RoPE (Qwen3-VL) is supported, config has mrope_interleaved=false")
        # Qwen3-VL keeps tie_word_embeddings at the top level; the text config's copy (older files) is ignored.
        text_hf["tie_word_embeddings"] = hf.get("tie_word_embeddings", text_hf.get("tie_word_embeddings", False))
        text = Qwen3Config.from_hf_dict(text_hf, **text_overrides)
        v = dict(hf["vision_config"])
        vision_rope = dict(v.get("rope_parameters") or {})
        vision = VisionConfig(
            depth=v["depth"],
            hidden_size=v["hidden_size"],
            intermediate_size=v["intermediate_size"],
            num_heads=v["num_heads"],
            in_channels=v.get("in_channels", 3),
            patch_size=v.get("patch_size", 16),
            temporal_patch_size=v.get("temporal_patch_size", 2),
            spatial_merge_size=v.get("spatial_merge_size", 2),
            out_hidden_size=v["out_hidden_size"],
            num_position_embeddings=v["num_position_embeddings"],
            deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", ())),
            rope_theta=float(vision_rope.get("rope_theta", v.get("rope_theta", 10000.0))),
            hidden_act=v.get("hidden_act", "gelu_pytorch_tanh"),
        )
        return cls(
            text=text,
            vision=vision,
            mrope_section=tuple(int(x) for x in mrope),
            image_token_id=hf.get("image_token_id", 151655),
            video_token_id=hf.get("video_token_id", 151656),
            vision_start_token_id=hf.get("vision_start_token_id", 151652),
            vision_end_token_id=hf.get("vision_end_token_id", 151653),
        )

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """The config.json dict transformers' `Qwen3VLForConditionalGeneration` loads."""
        text = self.text.to_hf_dict(torch_dtype)
        for key in ("architectures", "use_sliding_window", "tie_word_embeddings", "dtype"):
            text.pop(key, None)
        text["model_type"] = "qwen3_vl_text"
        text["rope_parameters"] = {
            **self.text.rope.to_hf_dict(),
            "mrope_section": list(self.mrope_section),
            "mrope_interleaved": True,
        }
        v = self.vision
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.text.tie_word_embeddings,
            "dtype": torch_dtype,
            "text_config": text,
            "vision_config": {
                "model_type": "qwen3_vl_vision",
                "depth": v.depth,
                "hidden_size": v.hidden_size,
                "hidden_act": v.hidden_act,
                "intermediate_size": v.intermediate_size,
                "num_heads": v.num_heads,
                "in_channels": v.in_channels,
                "patch_size": v.patch_size,
                "spatial_merge_size": v.spatial_merge_size,
                "temporal_patch_size": v.temporal_patch_size,
                "out_hidden_size": v.out_hidden_size,
                "num_position_embeddings": v.num_position_embeddings,
                "deepstack_visual_indexes": list(v.deepstack_visual_indexes),
                "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
            },
        }


def _tiny_tokenizer_special_ids() -> dict[str, int]:
    """Ids of Qwen's added tokens in the shipped tiny tokenizer (they follow the BPE vocabulary in order)."""
    from cua_jax.context.tokenizer import QWEN_ADDED_TOKENS, VOCAB_SIZE

    first = VOCAB_SIZE - len(QWEN_ADDED_TOKENS)
    return {content: first + i for i, (content, _) in enumerate(QWEN_ADDED_TOKENS)}


def tiny_qwen3_vl_config(**text_overrides: Any) -> Qwen3VLConfig:
    """A small random-init Qwen3-VL for tests and the embedded default run (item 6).

    Text: `tiny_qwen3_config` (hidden 128, 4 heads / 2 KV heads of head_dim 64) with 3 layers
    and the shipped tiny tokenizer's 4096-token vocabulary and special ids. Vision: Qwen3-VL's
    patch geometry (16 px patches, 2 frames, 2x2 merge), width 64, 2 heads, 3 blocks, DeepStack
    from blocks 0 and 1 into decoder layers 0 and 1, a 16x16 learned positional grid (a 160x210
    MiniWoB screenshot is a 14x10 patch grid, 35 image tokens).
    """
    from cua_jax.context.tokenizer import VOCAB_SIZE

    ids = _tiny_tokenizer_special_ids()
    text = dict(
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=3,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope=RopeConfig(rope_theta=10000.0),
    )
    text.update(text_overrides)
    return Qwen3VLConfig(
        text=tiny_qwen3_config(**text),
        vision=VisionConfig(
            depth=3,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=128,
            num_position_embeddings=256,
            deepstack_visual_indexes=(0, 1),
        ),
        mrope_section=(12, 10, 10),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
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
    token_types = (input_ids == image_token_id).astype(np.int32) if mm_token_type_ids is None else np.asarray(mm_token_type_ids)
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


def image_features(input_ids: jax.Array, image_token_id: int, tokens: jax.Array,
                   deepstack: Sequence[jax.Array] = ()) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The `image_features` model input for input_ids int [B, T]: merged image tokens [M, E] (and
    DeepStack features, each [M, E]) in placeholder order, row-major over the batch, laid out
    as [B, T, E] arrays (row i of `tokens` at the i-th placeholder; rows past the placeholders
    are left over, so M may be padded)."""
    mask = input_ids == image_token_id
    return scatter_rows(mask, tokens)[0], tuple(scatter_rows(mask, d)[0] for d in deepstack)


class Qwen3VLForConditionalGeneration(nnx.Module):
    """Qwen3-VL: `visual` (VisionTower) + `language_model` (Qwen3ForCausalLM, its decoder and LM head).

    freeze_vision: the vision tower's outputs are wrapped in stop_gradient (no gradient and no
    backward computation reaches it) and `trainable_filter()` excludes its parameters from the
    optimizer, as ScaleCUA trains with the ViT frozen.

    Implements the sampler/scorer model interface (`hidden_states`, `logits`,
    `output_projection`, `init_cache`); images enter as the extra inputs `pixel_values` and
    `image_grid_thw` (an `ImageGrid`, static under jit).
    """

    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs, freeze_vision: bool = False):
        self.config = config
        self.freeze_vision = freeze_vision
        self.visual = VisionTower(config.vision, rngs=rngs, dtype=config.text.dtype,
                                  param_dtype=config.text.param_dtype, remat=config.text.remat)
        self.language_model = Qwen3ForCausalLM(config.text, rngs=rngs)

    # -- parameter groups ------------------------------------------------------------------

    def trainable_filter(self) -> nnx.filterlib.Filter:
        """The parameters the optimizer updates: all, or all but the vision tower when frozen."""
        if self.freeze_vision:
            return nnx.All(nnx.Param, nnx.Not(nnx.PathContains("visual")))
        return nnx.Param

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

    def output_projection(self) -> jax.Array:
        """The [E, V] matrix mapping final hidden states to logits."""
        return self.language_model.output_projection()

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., E] -> logits float32 [..., V]."""
        return self.language_model.logits(hidden)

    def init_cache(self, batch: int, capacity: int, dtype=None) -> KVCache:
        return self.language_model.init_cache(batch, capacity, dtype)

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

    def __call__(self, input_ids: jax.Array, **kwargs) -> tuple[jax.Array, KVCache | None]:
        """(logits float32 [B, T, V], updated cache); arguments as `hidden_states`."""
        hidden, cache = self.hidden_states(input_ids, **kwargs)
        return self.logits(hidden), cache


# ---------------------------------------------------------------------------
# Checkpoint I/O
# ---------------------------------------------------------------------------


def vision_key_rules(hf_prefix: str = "model.visual.", our_prefix: str = "visual.") -> list[checkpoint.KeyRule]:
    """The vision tower's table (placeholders {block} and {merger})."""
    h, o = hf_prefix, our_prefix
    R = checkpoint.KeyRule

    def linear(hf: str, ours: str) -> list[checkpoint.KeyRule]:
        return [R(f"{hf}.weight", f"{ours}.kernel", transpose=True), R(f"{hf}.bias", f"{ours}.bias")]

    def norm(hf: str, ours: str) -> list[checkpoint.KeyRule]:
        return [R(f"{hf}.weight", f"{ours}.scale"), R(f"{hf}.bias", f"{ours}.bias")]

    # The patch kernel is stored as the axis reversal of torch's Conv3d weight: a transpose.
    rules = linear(f"{h}patch_embed.proj", f"{o}patch_embed") + [R(f"{h}pos_embed.weight", f"{o}pos_embed")]
    blk_h, blk_o = f"{h}blocks.{{block}}.", f"{o}blocks.{{block}}."
    rules += norm(f"{blk_h}norm1", f"{blk_o}norm1") + norm(f"{blk_h}norm2", f"{blk_o}norm2")
    rules += linear(f"{blk_h}attn.qkv", f"{blk_o}attn.qkv") + linear(f"{blk_h}attn.proj", f"{blk_o}attn.proj")
    rules += linear(f"{blk_h}mlp.linear_fc1", f"{blk_o}mlp.linear_fc1")
    rules += linear(f"{blk_h}mlp.linear_fc2", f"{blk_o}mlp.linear_fc2")
    for hf_merger, our_merger in ((f"{h}merger", f"{o}merger"),
                                  (f"{h}deepstack_merger_list.{{merger}}", f"{o}deepstack_merger_list.{{merger}}")):
        rules += norm(f"{hf_merger}.norm", f"{our_merger}.norm")
        rules += linear(f"{hf_merger}.linear_fc1", f"{our_merger}.linear_fc1")
        rules += linear(f"{hf_merger}.linear_fc2", f"{our_merger}.linear_fc2")
    return rules


def qwen3_vl_key_table(config: Qwen3VLConfig) -> list[checkpoint.KeyMapping]:
    """HF `Qwen3VLForConditionalGeneration` keys <-> our parameter paths, for load and export."""
    text = checkpoint.qwen3_key_rules(
        "model.language_model.", "language_model.model.",
        tie_word_embeddings=config.text.tie_word_embeddings, attention_bias=config.text.attention_bias,
    )
    # The LM head sits at the top level in HF and inside our language model.
    text = [checkpoint.KeyRule(r.hf, "language_model." + r.ours, r.transpose) if r.hf == "lm_head.weight" else r
            for r in text]
    counts = {
        "layer": config.text.num_hidden_layers,
        "block": config.vision.depth,
        "merger": len(config.vision.deepstack_visual_indexes),
    }
    return checkpoint.expand_key_table(text + vision_key_rules(), counts)


def load_qwen3_vl(directory, *, mesh=None, rules: Mapping[str, Any] = QWEN3_VL_RULES, freeze_vision: bool = False,
                  **text_overrides) -> tuple[Qwen3VLForConditionalGeneration, Qwen3VLConfig]:
    """(model, config) for the Qwen3-VL checkpoint in `directory`, parameters placed on `mesh`.

    text_overrides set non-HF fields such as dtype / param_dtype.
    """
    config = Qwen3VLConfig.from_hf_dict(checkpoint.read_hf_config(directory), **text_overrides)
    tied = config.text.tie_word_embeddings
    model = checkpoint.load_hf_checkpoint(
        directory,
        lambda: Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0), freeze_vision=freeze_vision),
        qwen3_vl_key_table(config),
        mesh=mesh,
        rules=rules,
        ignore_hf_keys=lambda k: k.endswith("inv_freq") or (tied and k == "lm_head.weight"),
    )
    return model, config


def export_qwen3_vl(model: Qwen3VLForConditionalGeneration, directory, **kwargs):
    """Writes a Qwen3-VL as a HF directory (config, safetensors, tokenizer and processor files);
    kwargs as `checkpoint.export_hf_checkpoint`."""
    config = model.config
    torch_dtype = kwargs.get("dtype") or np.dtype(config.text.param_dtype).name
    hf_config = config.to_hf_dict(torch_dtype="bfloat16" if torch_dtype in ("bf16", "bfloat16") else str(torch_dtype))
    return checkpoint.export_hf_checkpoint(model, directory, qwen3_vl_key_table(config), hf_config, **kwargs)


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
            padded_ids, grid.thw if grid is not None else None, image_token_id=config.image_token_id,
            spatial_merge_size=config.vision.spatial_merge_size, attention_mask=segment_ids != 0,
        )
        out: dict[str, Any] = {"positions": positions}
        if grid is not None:
            out.update(pixel_values=jnp.asarray(pixel_values), image_grid_thw=grid)
        return out

    return extras
