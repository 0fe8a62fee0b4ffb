# Single job: the vision side the image models share (the tower, its config section, the vision-language base).
"""The Qwen3-VL vision tower in Flax NNX, its config.json section, and `VisionLanguageModel`,
what Qwen3-VL and Qwen3.5's image models share (the tower, its freeze filter, head and cache).

Matches transformers' `Qwen3VLVisionModel`: a patch embedding over
temporal_patch_size x patch_size x patch_size pixel cubes, a learned square table
of positional embeddings bilinearly resampled to each image's patch grid, vision
blocks (pre-LayerNorm, bidirectional attention inside each frame, 2-D axial
rotary), a patch merger that concatenates each spatial_merge_size^2 block of
patches and projects it to the text width, and DeepStack mergers that do the same
to the hidden states of selected vision blocks.

Patches arrive as the image processor emits them (`Qwen2VLImageProcessorPil`):
`pixel_values` is [N, C * T * P * P], rows in spatial-merge-block order, and
`grid_thw` gives each image's (t, h, w) patch grid. The grid is static data (an
`ImageGrid`, or a tuple of triples): everything derived from it (positions, interpolation
taps, attention segments) is a compile-time constant, so one compiled tower
serves every batch with the same image layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cua_jax.models.layers import axis_metadata, checkpointed
from cua_jax.models.rope import apply_rotary

GridTHW = tuple[tuple[int, int, int], ...]


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class ImageGrid:
    """The (t, h, w) patch grid of each image, as static data.

    Registered as a leafless pytree: passed through `jax.jit` (e.g. inside a dict of model
    inputs) it stays a compile-time constant instead of becoming traced integers.
    """

    thw: GridTHW

    @classmethod
    def of(cls, grid_thw: Any) -> ImageGrid:
        """From an ImageGrid, an [num_images, 3] array or nested sequence."""
        return grid_thw if isinstance(grid_thw, ImageGrid) else cls(normalize_grid(grid_thw))


def bucket_count(n: int) -> int:
    """The padded image count for n images: 0 for none, else the next power of two (padding
    images keep the set of compiled image shapes small)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def pad_image_count(patches: list[np.ndarray], grids: list[tuple[int, int, int]]) -> None:
    """Appends blank copies of the last image to `patches` (each [t*h*w, D]) and its grid to
    `grids` (in place) until they hold `bucket_count` images."""
    for _ in range(bucket_count(len(grids)) - len(grids)):
        patches.append(np.zeros_like(patches[-1]))
        grids.append(grids[-1])


def image_content_key(image: np.ndarray) -> bytes:
    """A key equal for screenshots with equal pixels and shape (what lets a group's shared
    first screenshot be processed and encoded once)."""
    import hashlib

    image = np.ascontiguousarray(image)
    return hashlib.sha1(image.tobytes() + str(image.shape).encode()).digest()


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Shape of the vision tower; field names follow HF's `Qwen3VLVisionConfig`."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6

    def __post_init__(self):
        head_dim, rem = divmod(self.hidden_size, self.num_heads)
        if rem or head_dim % 4:
            raise ValueError(
                f"vision hidden_size {self.hidden_size} / num_heads {self.num_heads} must give a head_dim "
                "divisible by 4 (the 2-D rotary splits it into h and w halves of cos/sin pairs)"
            )
        side = math.isqrt(self.num_position_embeddings)
        if side * side != self.num_position_embeddings:
            raise ValueError(
                f"num_position_embeddings {self.num_position_embeddings} must be a perfect square "
                "(the learned positional table is a square grid)"
            )
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"deepstack_visual_indexes {bad} are outside the {self.depth} vision blocks")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported vision hidden_act {self.hidden_act!r}; known: {sorted(_ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened pixel cube, C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_hidden_size(self) -> int:
        """Width of a spatial_merge_size^2 block of concatenated patches."""
        return self.hidden_size * self.spatial_merge_size**2

    def check_image_token_width(self, text_hidden_size: int) -> None:
        """A ValueError unless the image tokens are as wide as the text model's embeddings, which
        they replace."""
        if self.out_hidden_size != text_hidden_size:
            raise ValueError(
                f"vision out_hidden_size {self.out_hidden_size} must equal text hidden_size "
                f"{text_hidden_size} (image tokens replace text embeddings)"
            )

    @classmethod
    def from_hf_dict(cls, v: Mapping[str, Any], *, deepstack: bool) -> VisionConfig:
        """From a config.json's vision_config; `deepstack` False for a tower without DeepStack
        mergers (Qwen3.5), whose indexes are then empty whatever the file says."""
        rope = dict(v.get("rope_parameters") or {})
        return cls(
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
            deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", ())) if deepstack else (),
            rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 10000.0))),
            hidden_act=v.get("hidden_act", "gelu_pytorch_tanh"),
        )

    def to_hf_dict(self, model_type: str, *, deepstack: bool) -> dict[str, Any]:
        """The config.json's vision_config; `deepstack` writes deepstack_visual_indexes."""
        out = {
            "model_type": model_type,
            "depth": self.depth,
            "hidden_size": self.hidden_size,
            "hidden_act": self.hidden_act,
            "intermediate_size": self.intermediate_size,
            "num_heads": self.num_heads,
            "in_channels": self.in_channels,
            "patch_size": self.patch_size,
            "spatial_merge_size": self.spatial_merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "out_hidden_size": self.out_hidden_size,
            "num_position_embeddings": self.num_position_embeddings,
        }
        if deepstack:
            out["deepstack_visual_indexes"] = list(self.deepstack_visual_indexes)
        out["rope_parameters"] = {"rope_type": "axial", "rope_theta": self.rope_theta}
        return out


# The special token ids a vision-language config carries, as config.json names them.
IMAGE_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_language_hf_parts(
    hf: Mapping[str, Any], config_cls: type, model_name: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """(text_config, vision_config, IMAGE_TOKEN_FIELDS) of a vision-language config.json: the
    text config carrying the top-level tie_word_embeddings (these models keep it there; a text
    config's copy, in older files, is the fallback), each token id absent from the file at
    `config_cls`'s default. A ValueError naming `model_name` when a config is missing."""
    if "text_config" not in hf or "vision_config" not in hf:
        raise ValueError(f"a {model_name} config.json needs 'text_config' and 'vision_config'")
    text_hf = dict(hf["text_config"])
    text_hf["tie_word_embeddings"] = hf.get("tie_word_embeddings", text_hf.get("tie_word_embeddings", False))
    defaults = {field.name: field.default for field in dataclasses.fields(config_cls)}
    token_ids = {name: hf.get(name, defaults[name]) for name in IMAGE_TOKEN_FIELDS}
    return text_hf, dict(hf["vision_config"]), token_ids


def vision_language_hf_dict(
    config: Any,
    architecture: str,
    model_type: str,
    text: dict[str, Any],
    vision: dict[str, Any],
    torch_dtype: str,
) -> dict[str, Any]:
    """The config.json of a vision-language `config` (its special token ids, `text` and
    `vision` as written by their configs, the text's architecture, tie_word_embeddings and dtype
    held at the top level), for transformers' `architecture`."""
    text = {k: v for k, v in text.items() if k not in ("architectures", "tie_word_embeddings", "dtype")}
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **{name: getattr(config, name) for name in IMAGE_TOKEN_FIELDS},
        "tie_word_embeddings": config.text.tie_word_embeddings,
        "dtype": torch_dtype,
        "text_config": text,
        "vision_config": vision,
    }


_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
}


# ---------------------------------------------------------------------------
# Host-side grid arithmetic (numpy; compile-time constants under jit)
# ---------------------------------------------------------------------------


def normalize_grid(grid_thw: Any) -> GridTHW:
    """Turns an ImageGrid, [num_images, 3] array or nested sequence into a tuple of (t, h, w)."""
    if isinstance(grid_thw, ImageGrid):
        return grid_thw.thw
    grid = tuple(tuple(int(v) for v in row) for row in np.asarray(grid_thw).reshape(-1, 3))
    for row in grid:
        if min(row) <= 0:
            raise ValueError(f"image grid {row} has a non-positive extent")
    return grid


def _check_mergeable(grid_thw: GridTHW, merge: int) -> None:
    for t, h, w in grid_thw:
        if h % merge or w % merge:
            raise ValueError(f"image grid (t={t}, h={h}, w={w}) is not divisible by spatial_merge_size {merge}")


def _block_order_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each patch of one frame, in spatial-merge-block order.

    The processor emits patches block by block: (block_row, block_col, in_row, in_col).
    """
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)


def vision_rotary_positions(grid_thw: GridTHW, merge: int) -> np.ndarray:
    """(row, col) of every patch for the 2-D rotary: int32 [N, 2], N = sum(t * h * w)."""
    _check_mergeable(grid_thw, merge)
    out = []
    for t, h, w in grid_thw:
        rows, cols = _block_order_rows_cols(h, w, merge)
        out.append(np.tile(np.stack([rows, cols], axis=-1), (t, 1)))
    return np.concatenate(out, axis=0).astype(np.int32)


def _bilinear_axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps into a `side`-long table for target positions `index` on an axis of length
    `size`, as `F.interpolate(mode="bilinear", align_corners=True)` resamples (float32 math)."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    weights = np.clip(np.float32(1) - distance, 0, None).astype(np.float32)
    return taps, weights


def position_embedding_taps(
    grid_thw: GridTHW, num_position_embeddings: int, merge: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gather indices and weights that resample the square learned positional table to each grid.

    Returns (indices int32 [N, 4], weights float32 [N, 4]); the embedding of patch n is
    sum_j weights[n, j] * table[indices[n, j]]. Patches are in spatial-merge-block order,
    repeated over the t frames of an image.
    """
    _check_mergeable(grid_thw, merge)
    side = math.isqrt(num_position_embeddings)
    all_idx, all_w = [], []
    for t, h, w in grid_thw:
        rows, cols = _block_order_rows_cols(h, w, merge)
        h_taps, h_w = _bilinear_axis_taps(rows, h, side)
        w_taps, w_w = _bilinear_axis_taps(cols, w, side)
        idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
        all_idx.append(np.tile(idx, (t, 1)))
        all_w.append(np.tile(wts, (t, 1)))
    return np.concatenate(all_idx).astype(np.int32), np.concatenate(all_w).astype(np.float32)


def attention_segment_runs(grid_thw: GridTHW) -> tuple[tuple[int, int], ...]:
    """Runs of equal-length attention segments: ((segment_length, count), ...) in patch order.

    Each frame attends only to itself (HF's cu_seqlens); consecutive frames of the same size
    are batched into one attention call.
    """
    runs: list[list[int]] = []
    for t, h, w in grid_thw:
        for _ in range(t):
            if runs and runs[-1][0] == h * w:
                runs[-1][1] += 1
            else:
                runs.append([h * w, 1])
    return tuple((length, count) for length, count in runs)


def merged_token_counts(grid_thw: GridTHW, merge: int) -> tuple[int, ...]:
    """Number of LLM tokens each image occupies: t * h * w / merge^2."""
    return tuple(t * h * w // merge**2 for t, h, w in grid_thw)


# ---------------------------------------------------------------------------
# Parameters with logical axis names
# ---------------------------------------------------------------------------


# Vision parameters' logical axes and their default placement: the tower's width is
# FSDP-sharded and its wide dimensions tensor-sharded, like the text decoder's.
VISION_RULES = {
    "vision_patch": None,
    "vision_positions": None,
    "vision_embed": "fsdp",
    "vision_qkv": "tensor",
    "vision_mlp": "tensor",
    "vision_merged": "fsdp",
    "vision_merged_mlp": "tensor",
}


def _linear(d_in: int, d_out: int, axes: tuple[str, str], rngs: nnx.Rngs, dtype, param_dtype) -> nnx.Linear:
    """Linear layer with bias, kernel [in, out] carrying logical axes (in_axis, out_axis)."""
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=True,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=jax.nn.initializers.normal(0.02),
        kernel_metadata=axis_metadata(*axes),
        bias_metadata=axis_metadata(axes[1]),
        rngs=rngs,
    )


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm semantics (biased variance, statistics in float32)."""

    def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), **axis_metadata("norm"))
        self.bias = nnx.Param(jnp.zeros((dim,), param_dtype), **axis_metadata("norm"))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(x.dtype)


# ---------------------------------------------------------------------------
# Rotary and attention
# ---------------------------------------------------------------------------


def vision_rotary_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Axial 2-D rotary tables.

    positions: int [N, 2] (row, col). Returns cos, sin float32 [N, head_dim], laid out
    [h freqs | w freqs | h freqs | w freqs] with head_dim / 4 frequencies per axis.
    """
    spatial_dim = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, spatial_dim, 2, dtype=jnp.float32) / spatial_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [N, 2, head_dim/4]
    freqs = freqs.reshape(freqs.shape[0], -1)  # [N, head_dim/2]: h then w
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_vision_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [N, heads, head_dim]; cos, sin: [N, head_dim]. Rotation in float32 (as HF's vision
    attention does), result in x.dtype."""
    rotated = apply_rotary(x.astype(jnp.float32)[None], cos[None], sin[None])[0]
    return rotated.astype(x.dtype)


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, runs: tuple[tuple[int, int], ...]) -> jax.Array:
    """Bidirectional softmax attention inside each segment.

    q, k, v: [N, heads, head_dim], N = sum(length * count over runs). Returns [N, heads, head_dim].
    Memory is bounded by the largest segment, not by N^2.
    """
    scale = q.shape[-1] ** -0.5
    outs, start = [], 0
    for length, count in runs:
        n = length * count
        qs, ks, vs = (a[start : start + n].reshape(count, length, *a.shape[1:]) for a in (q, k, v))
        logits = jnp.einsum("sqhd,skhd->shqk", qs, ks) * scale
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
        outs.append(jnp.einsum("shqk,skhd->sqhd", probs, vs).reshape(n, *q.shape[1:]))
        start += n
    return jnp.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class PatchEmbed(nnx.Module):
    """Conv3d with stride == kernel over pre-cut pixel cubes, i.e. one contraction per patch.

    kernel [P, P, T, C, hidden] is the axis reversal of torch's Conv3d weight
    [hidden, C, T, P, P] (so the checkpoint key table maps it with a plain transpose).
    """

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.cfg = cfg
        self.dtype = dtype
        p, t, c, d = cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size
        init = jax.nn.initializers.normal(0.02)
        self.kernel = nnx.Param(
            init(rngs.params(), (p, p, t, c, d), param_dtype),
            **axis_metadata("vision_patch", "vision_patch", "vision_patch", "vision_patch", "vision_embed"),
        )
        self.bias = nnx.Param(jnp.zeros((d,), param_dtype), **axis_metadata("vision_embed"))

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        """pixel_values [N, C * T * P * P] (torch's C, T, P_h, P_w flattening) -> [N, hidden]."""
        cfg = self.cfg
        x = pixel_values.astype(self.dtype).reshape(
            -1, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size
        )
        y = jnp.einsum("ncthw,whtcd->nd", x, self.kernel[...].astype(self.dtype))
        return y + self.bias[...].astype(self.dtype)


class VisionAttention(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.num_heads = cfg.num_heads
        d = cfg.hidden_size
        self.qkv = _linear(d, 3 * d, ("vision_embed", "vision_qkv"), rngs, dtype, param_dtype)
        self.proj = _linear(d, d, ("vision_qkv", "vision_embed"), rngs, dtype, param_dtype)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, runs) -> jax.Array:
        """x [N, hidden], cos/sin [N, head_dim], runs from `attention_segment_runs`."""
        n = x.shape[0]
        qkv = self.qkv(x).reshape(n, 3, self.num_heads, -1)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q, k = apply_vision_rotary(q, cos, sin), apply_vision_rotary(k, cos, sin)
        return self.proj(segment_attention(q, k, v, runs).reshape(n, -1))


class VisionMLP(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.linear_fc1 = _linear(
            cfg.hidden_size, cfg.intermediate_size, ("vision_embed", "vision_mlp"), rngs, dtype, param_dtype
        )
        self.linear_fc2 = _linear(
            cfg.intermediate_size, cfg.hidden_size, ("vision_mlp", "vision_embed"), rngs, dtype, param_dtype
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nnx.Module):
    """Pre-LayerNorm block: x + attn(norm1(x)), then + mlp(norm2(.))."""

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.norm1 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, param_dtype=param_dtype)
        self.norm2 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, param_dtype=param_dtype)
        self.attn = VisionAttention(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.mlp = VisionMLP(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x, cos, sin, runs):
        x = x + self.attn(self.norm1(x), cos, sin, runs)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """Concatenates each spatial_merge_size^2 block of patches and projects it to the text width.

    `postshuffle_norm` (the DeepStack mergers) normalises the concatenated block; the main
    merger normalises each patch before concatenation.
    """

    def __init__(self, cfg: VisionConfig, *, postshuffle_norm: bool, rngs: nnx.Rngs, dtype, param_dtype):
        self.postshuffle_norm = postshuffle_norm
        self.merged = cfg.merged_hidden_size
        self.norm = LayerNorm(
            self.merged if postshuffle_norm else cfg.hidden_size, eps=cfg.layer_norm_eps, param_dtype=param_dtype
        )
        self.linear_fc1 = _linear(
            self.merged, self.merged, ("vision_merged", "vision_merged_mlp"), rngs, dtype, param_dtype
        )
        self.linear_fc2 = _linear(
            self.merged, cfg.out_hidden_size, ("vision_merged_mlp", "embed"), rngs, dtype, param_dtype
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [N, hidden] -> [N / merge^2, out_hidden]."""
        if self.postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged))
        else:
            x = self.norm(x).reshape(-1, self.merged)
        return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class VisionTower(nnx.Module):
    """Pixels to LLM-width image tokens plus DeepStack features.

    remat: rematerialise each vision block in the backward pass (`Qwen3Config.remat`).

    __call__(pixel_values [N, C*T*P*P], grid_thw static tuple of (t, h, w)) returns
    (image_embeds [M, out_hidden], deepstack tuple of len(deepstack_visual_indexes) arrays
    [M, out_hidden]), M = N / spatial_merge_size^2, images concatenated in grid order.
    """

    def __init__(
        self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32, remat: bool = False
    ):
        self.cfg = cfg
        self.dtype = dtype
        self.remat = remat
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.patch_embed = PatchEmbed(cfg, **kw)
        self.pos_embed = nnx.Param(
            jax.nn.initializers.normal(0.02)(
                rngs.params(), (cfg.num_position_embeddings, cfg.hidden_size), param_dtype
            ),
            **axis_metadata("vision_positions", "vision_embed"),
        )
        self.blocks = nnx.List([VisionBlock(cfg, **kw) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg, postshuffle_norm=False, **kw)
        self.deepstack_merger_list = nnx.List(
            [PatchMerger(cfg, postshuffle_norm=True, **kw) for _ in cfg.deepstack_visual_indexes]
        )

    def __call__(
        self, pixel_values: jax.Array, grid_thw: ImageGrid | GridTHW
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        cfg = self.cfg
        grid_thw = normalize_grid(grid_thw)
        n_patches = sum(t * h * w for t, h, w in grid_thw)
        if pixel_values.shape != (n_patches, cfg.patch_dim):
            raise ValueError(
                f"pixel_values has shape {pixel_values.shape}, but grid_thw {grid_thw} needs "
                f"({n_patches}, {cfg.patch_dim}) (C * temporal_patch_size * patch_size^2 per patch)"
            )
        merge = cfg.spatial_merge_size
        tap_idx, tap_w = position_embedding_taps(grid_thw, cfg.num_position_embeddings, merge)
        positions = vision_rotary_positions(grid_thw, merge)
        runs = attention_segment_runs(grid_thw)

        x = self.patch_embed(pixel_values)
        pos = (self.pos_embed[...][jnp.asarray(tap_idx)] * jnp.asarray(tap_w)[:, :, None]).sum(1)
        x = x + pos.astype(x.dtype)
        cos, sin = vision_rotary_cos_sin(jnp.asarray(positions), cfg.head_dim, cfg.rope_theta)

        deepstack = []
        for layer, block in enumerate(self.blocks):
            x = checkpointed(block, x, cos, sin, runs=runs) if self.remat else block(x, cos, sin, runs)
            if layer in cfg.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(layer)]
                deepstack.append(merger(x))
        return self.merger(x), tuple(deepstack)


class VisionLanguageModel(nnx.Module):
    """What a vision-language model shares: `visual` (a VisionTower in its text model's dtypes
    and remat), the `language_model` a subclass sets after calling this `__init__` (a causal LM
    with the sampler/scorer interface, to which the output head and cache delegate), and
    `freeze_vision`: `trainable_filter()` then leaves the tower's parameters out of the optimizer
    (the subclass's `encode_images` stops their gradient)."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs, freeze_vision: bool = False):
        self.config = config
        self.freeze_vision = freeze_vision
        self.visual = VisionTower(
            config.vision,
            rngs=rngs,
            dtype=config.text.dtype,
            param_dtype=config.text.param_dtype,
            remat=config.text.remat,
        )

    def trainable_filter(self) -> nnx.filterlib.Filter:
        """The parameters the optimizer updates: all, or all but the vision tower when frozen."""
        if self.freeze_vision:
            return nnx.All(nnx.Param, nnx.Not(nnx.PathContains("visual")))
        return nnx.Param

    def output_projection(self) -> jax.Array:
        """The [E, V] matrix mapping final hidden states to logits."""
        return self.language_model.output_projection()

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., E] -> logits float32 [..., V]."""
        return self.language_model.logits(hidden)

    def init_cache(self, batch: int, capacity: int, dtype=None):
        return self.language_model.init_cache(batch, capacity, dtype)

    def __call__(self, input_ids: jax.Array, **kwargs):
        """(logits float32 [B, T, V], updated cache); arguments as the subclass's `hidden_states`."""
        hidden, cache = self.hidden_states(input_ids, **kwargs)
        return self.logits(hidden), cache
