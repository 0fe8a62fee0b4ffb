"""Qwen3.5 in Flax NNX: hybrid Gated DeltaNet / gated full attention, text and vision-language.

Computes what transformers' `Qwen3_5ForCausalLM` and `Qwen3_5ForConditionalGeneration` compute:

* `layer_types` picks each decoder layer's token mixer: "linear_attention" (Gated DeltaNet: a
  causal depthwise conv over the q/k/v projection, then the gated delta rule of
  `cua_jax.models.gated_deltanet`, an RMSNorm gated by silu(z) and an output projection) or
  "full_attention" (grouped-query attention whose query projection also yields a per-channel
  output gate, sigmoid(gate) * attention, with QK-norm and partial rotary on the first
  head_dim * partial_rotary_factor channels);
* the RMSNorms of the residual stream and of q/k are zero-centred (x * (1 + w));
* rotary positions are 3-axis interleaved M-RoPE (text tokens have equal t/h/w positions);
* the vision tower is Qwen3-VL's without DeepStack (`cua_jax.models.vision.VisionTower`).

Sequences: `segment_ids` 0 marks padding; every row holds one sequence (left- or
right-padded). Padding tokens enter the linear-attention layers as zeros, so they leave the
conv window and the recurrent state untouched. Rows packing several sequences are not
supported (the recurrent state would flow across them).

Decoding state (`HybridCache`): keys/values of the full-attention layers, and for each
linear-attention layer its conv window [B, K - 1, C] and delta-rule state [B, Hv, Dk, Dv]. A
call with T > 1 new tokens runs the chunked form from the cached state, T == 1 the recurrent
form; `cua_jax.models.sampler.Sampler` drives it through the same `DecoderLM` interface as Qwen3.

Configs are in `config`, checkpoint tables and loading in `params`.

Shapes: B batch, T new tokens, S cache slots, E hidden, H/K query/KV heads, D head_dim,
Hv/Hk linear value/key heads, Dk/Dv their dims, C = 2 * Hk * Dk + Hv * Dv conv channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from cua_jax.models import checkpoint
from cua_jax.models.gated_deltanet import (
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    l2_normalize,
)
from cua_jax.models.layers import (  # a Qwen3_5TextConfig has the fields these read
    BATCH,
    EMBED,
    INIT,
    LENGTH,
    MLP,
    OutputHead,
    SharedPrefix,
    axis_metadata,
    cached_attention,
    checkpointed,
    decoder_inputs,
    linear,
    project,
    scatter_rows,
    token_embedding,
)
from cua_jax.models.qwen3_5.config import CheckpointTensorSpec, Qwen3_5Config, Qwen3_5TextConfig
from cua_jax.models.qwen3_vl import image_prefill_extras as vl_extras
from cua_jax.models.rope import apply_rotary, mrope_cos_sin
from cua_jax.models.sharding import constrain
from cua_jax.models.vision import (
    GridTHW,
    ImageGrid,
    VisionLanguageModel,
    merged_token_counts,
    normalize_grid,
)

# ---------------------------------------------------------------------------
# Decoding state
# ---------------------------------------------------------------------------


@struct.dataclass
class HybridCache:
    """Decoding state of a Qwen3.5 at fixed capacity S.

    keys, values: one [B, S, K, D] array per full-attention layer (in layer order);
    conv_states: one [B, K_conv - 1, C] window per linear-attention layer; recurrent_states:
    one float32 [B, Hv, Dk, Dv] delta-rule state per linear-attention layer. segment_ids int32
    [B, S], end int32 [] and prefix (the full-attention layers' shared prefix) as
    `cua_jax.models.qwen3.KVCache`.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    conv_states: tuple[jax.Array, ...]
    recurrent_states: tuple[jax.Array, ...]
    segment_ids: jax.Array
    end: jax.Array
    prefix: SharedPrefix | None = None

    @property
    def capacity(self) -> int:
        return self.segment_ids.shape[1]


def init_hybrid_cache(cfg: Qwen3_5TextConfig, batch: int, capacity: int, dtype=None) -> HybridCache:
    """An empty cache of `capacity` slots per row; dtype of keys, values and conv windows
    (default the compute dtype; delta-rule states are always float32)."""
    dtype = dtype or cfg.dtype
    n_full = cfg.layer_types.count("full_attention")
    n_linear = cfg.layer_types.count("linear_attention")
    kv = (batch, capacity, cfg.num_key_value_heads, cfg.head_dim)
    return HybridCache(
        keys=tuple(jnp.zeros(kv, dtype) for _ in range(n_full)),
        values=tuple(jnp.zeros(kv, dtype) for _ in range(n_full)),
        conv_states=tuple(
            jnp.zeros((batch, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), dtype) for _ in range(n_linear)
        ),
        recurrent_states=tuple(
            jnp.zeros(
                (batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim), jnp.float32
            )
            for _ in range(n_linear)
        ),
        segment_ids=jnp.zeros((batch, capacity), jnp.int32),
        end=jnp.zeros((), jnp.int32),
    )


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


class ZeroCenteredRMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * (1 + w), in float32 (HF `Qwen3_5RMSNorm`; w starts at 0)."""

    def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32, axis_name: str = "norm"):
        self.eps = eps
        self.weight = nnx.Param(jnp.zeros((size,), param_dtype), **axis_metadata(axis_name))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """y = w * rmsnorm(x) * silu(gate) over the last axis (HF `Qwen3_5RMSNormGated`; w starts at 1)."""

    def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((size,), param_dtype), **axis_metadata("head_dim"))

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        dtype = x.dtype
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...] * xf.astype(dtype)
        return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(dtype)


class GatedAttention(nnx.Module):
    """Grouped-query attention with an output gate: q_proj yields [query | gate] per head; the
    attention output is multiplied by sigmoid(gate) before o_proj. QK-norm (zero-centred) and
    rotary on the first `rotary_dim` channels of each head."""

    def __init__(self, cfg: Qwen3_5TextConfig, *, rngs: nnx.Rngs):
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.query_chunk = cfg.attention_query_chunk
        e, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = linear(cfg, e, self.num_heads * d * 2, ("embed", "q_heads"), cfg.attention_bias, rngs)
        self.k_proj = linear(cfg, e, self.num_kv_heads * d, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.v_proj = linear(cfg, e, self.num_kv_heads * d, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.o_proj = linear(cfg, self.num_heads * d, e, ("q_heads", "embed"), cfg.attention_bias, rngs)
        self.q_norm = ZeroCenteredRMSNorm(d, cfg.rms_norm_eps, param_dtype=cfg.param_dtype, axis_name="head_dim")
        self.k_norm = ZeroCenteredRMSNorm(d, cfg.rms_norm_eps, param_dtype=cfg.param_dtype, axis_name="head_dim")

    def _rotate(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        r = self.rotary_dim
        return jnp.concatenate([apply_rotary(x[..., :r], cos, sin), x[..., r:]], axis=-1)

    def __call__(self, x, cos, sin, mask, cache=None):
        """x [B, T, E]; cos/sin [B, T, rotary_dim]; mask bool [B, T, S]; cache (keys, values, slot)
        or None, as `cua_jax.models.qwen3.Attention`. Returns (out [B, T, E], (keys, values) or None)."""
        b, t, _ = x.shape
        h, kh, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_and_gate = project(self.q_proj, x).reshape(b, t, h, 2 * d)
        q, gate = q_and_gate[..., :d], q_and_gate[..., d:].reshape(b, t, h * d)
        q = self._rotate(self.q_norm(q), cos, sin)
        k = self._rotate(self.k_norm(project(self.k_proj, x).reshape(b, t, kh, d)), cos, sin)
        v = project(self.v_proj, x).reshape(b, t, kh, d)
        q = constrain(q, (BATCH, LENGTH, "activation_heads", None))
        k = constrain(k, (BATCH, LENGTH, "activation_kv_heads", None))
        out, new_cache = cached_attention(q, k, v, mask, cache, d**-0.5, self.query_chunk)
        out = out.reshape(b, t, h * d) * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        return project(self.o_proj, out), new_cache


class GatedDeltaNet(nnx.Module):
    """Qwen3.5's linear attention (HF `Qwen3_5GatedDeltaNet`).

    in_proj_qkv -> causal conv (+ SiLU) -> split into q, k [Hk, Dk] and v [Hv, Dv]; q and k
    L2-normalised (q also scaled by Dk^-0.5) and repeated to Hv heads; beta = sigmoid(in_proj_b x),
    g = -exp(A_log) * softplus(in_proj_a x + dt_bias); the gated delta rule; GatedRMSNorm with
    gate in_proj_z x; out_proj.
    """

    def __init__(self, cfg: Qwen3_5TextConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        e, hv = cfg.hidden_size, cfg.linear_num_value_heads
        self.in_proj_qkv = linear(cfg, e, cfg.conv_dim, ("embed", "linear_conv"), False, rngs)
        self.in_proj_z = linear(cfg, e, cfg.linear_value_dim, ("embed", "linear_heads"), False, rngs)
        self.in_proj_b = linear(cfg, e, hv, ("embed", "linear_heads"), False, rngs)
        self.in_proj_a = linear(cfg, e, hv, ("embed", "linear_heads"), False, rngs)
        self.out_proj = linear(cfg, cfg.linear_value_dim, e, ("linear_heads", "embed"), False, rngs)
        # Stored as torch's Conv1d weight [C, 1, K] so the checkpoint maps without reshaping.
        self.conv1d = nnx.Param(
            INIT(rngs.params(), (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim), cfg.param_dtype),
            **axis_metadata("linear_conv", None, None),
        )
        self.dt_bias = nnx.Param(jnp.ones((hv,), cfg.param_dtype), **axis_metadata("linear_heads"))
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = nnx.Param(jnp.log(a).astype(cfg.param_dtype), **axis_metadata("linear_heads"))
        self.norm = GatedRMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps, param_dtype=cfg.param_dtype)

    def __call__(self, x: jax.Array, conv_state=None, recurrent_state=None, keep=None):
        """x [B, T, E] (padding rows already zeroed); conv_state [B, K - 1, C] and recurrent_state
        [B, Hv, Dk, Dv] from the cache, or None (a fresh sequence); keep bool [B, T, 1] (None: no
        padding): padding leaves both states as they were, wherever it sits in the row (before
        the real tokens: the conv window skips it; anywhere: no decay, no update).
        Returns (out [B, T, E], new conv state, new recurrent state)."""
        cfg = self.cfg
        b, t, _ = x.shape
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        leading = None
        if keep is not None and conv_state is not None:
            real = keep[..., 0]
            leading = jnp.where(jnp.any(real, axis=1), jnp.argmax(real, axis=1), t)
        mixed, conv_state = causal_conv1d(project(self.in_proj_qkv, x), self.conv1d[...][:, 0], conv_state, leading)
        kd = cfg.linear_key_dim
        q = l2_normalize(mixed[..., :kd].reshape(b, t, hk, dk)) * dk**-0.5
        k = l2_normalize(mixed[..., kd : 2 * kd].reshape(b, t, hk, dk))
        v = mixed[..., 2 * kd :].reshape(b, t, hv, dv)
        if hv != hk:
            q, k = jnp.repeat(q, hv // hk, axis=2), jnp.repeat(k, hv // hk, axis=2)
        beta = jax.nn.sigmoid(project(self.in_proj_b, x).astype(jnp.float32))
        a = project(self.in_proj_a, x).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
        if keep is not None:  # padding: no decay and no write (k is not zero after a cached conv window)
            g = jnp.where(keep, g, 0.0)
            beta = jnp.where(keep, beta, 0.0)
        if t == 1 and recurrent_state is not None:
            out, recurrent_state = gated_delta_rule_recurrent(q, k, v, g, beta, recurrent_state)
        else:
            out, recurrent_state = gated_delta_rule_chunked(q, k, v, g, beta, recurrent_state, cfg.chunk_size)
        z = project(self.in_proj_z, x).reshape(b, t, hv, dv)
        out = self.norm(out.astype(x.dtype), z).reshape(b, t, hv * dv)
        return project(self.out_proj, out), conv_state, recurrent_state


class DecoderLayer(nnx.Module):
    """Pre-norm block whose token mixer is `GatedDeltaNet` or `GatedAttention` by layer type."""

    def __init__(self, cfg: Qwen3_5TextConfig, layer_type: str, *, rngs: nnx.Rngs):
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
        else:
            self.self_attn = GatedAttention(cfg, rngs=rngs)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=cfg.param_dtype)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, param_dtype=cfg.param_dtype
        )
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask, keep, state=None):
        """x [B, T, E]; cos/sin, mask as `GatedAttention`; keep bool [B, T, 1] (False at padding).
        state: a full-attention layer's (keys, values, slot), a linear one's (conv, recurrent),
        or None. Returns (x, new state or None)."""
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            conv, recurrent = state if state is not None else (None, None)
            mixed, conv, recurrent = self.linear_attn(jnp.where(keep, h, 0).astype(h.dtype), conv, recurrent, keep)
            new_state = (conv, recurrent) if state is not None else None
        else:
            mixed, new_state = self.self_attn(h, cos, sin, mask, state)
        x = x + mixed
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, (BATCH, LENGTH, EMBED)), new_state


class Qwen3_5TextModel(nnx.Module):
    """Token embeddings, hybrid decoder layers and the final norm (HF `Qwen3_5TextModel`)."""

    def __init__(self, cfg: Qwen3_5TextConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = token_embedding(cfg, rngs)
        self.layers = nnx.List([DecoderLayer(cfg, kind, rngs=rngs) for kind in cfg.layer_types])
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=cfg.param_dtype)

    def rotary_cos_sin(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """cos, sin float32 [B, T, rotary_dim] for positions int [3, B, T] or [B, T] (all axes equal)."""
        cfg = self.config
        if positions.ndim == 2:
            positions = jnp.broadcast_to(positions[None], (3, *positions.shape))
        if positions.ndim != 3 or positions.shape[0] != 3:
            raise ValueError(f"positions must be [3, B, T] or [B, T], got shape {positions.shape}")
        dim = cfg.rotary_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        return mrope_cos_sin(positions, inv_freq, cfg.mrope_section)

    def __call__(
        self,
        input_ids=None,
        *,
        inputs_embeds=None,
        positions=None,
        segment_ids=None,
        kv_cache: HybridCache | None = None,
    ) -> tuple[jax.Array, HybridCache | None]:
        """Final-normed hidden states [B, T, E] and the updated cache.

        input_ids int [B, T] or inputs_embeds [B, T, E] (exactly one); positions int [B, T] or
        [3, B, T] (default 0.. from the cache's end); segment_ids int [B, T] (0 = padding,
        default all ones; one sequence per row); kv_cache: continue from and update this state.
        """
        cfg = self.config
        x, segment_ids, start, mask, cache_segments = decoder_inputs(
            self.embed_tokens, cfg.dtype, input_ids, inputs_embeds, segment_ids, kv_cache
        )
        b, t = x.shape[:2]
        if positions is None:
            positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        cos, sin = self.rotary_cos_sin(positions)
        keep = (segment_ids != 0)[..., None]
        keys, values, convs, recurrents = [], [], [], []
        full_i = linear_i = 0
        for layer in self.layers:
            state = None
            if kv_cache is not None and layer.layer_type == "full_attention":
                prefix = None if kv_cache.prefix is None else kv_cache.prefix.layer(full_i)
                state = (kv_cache.keys[full_i], kv_cache.values[full_i], start, prefix)
            elif kv_cache is not None:
                state = (kv_cache.conv_states[linear_i], kv_cache.recurrent_states[linear_i])
            if cfg.remat:
                x, update = checkpointed(layer, x, cos, sin, mask, keep, state)
            else:
                x, update = layer(x, cos, sin, mask, keep, state)
            if layer.layer_type == "full_attention":
                full_i += 1
                if update is not None:
                    keys.append(update[0])
                    values.append(update[1])
            else:
                linear_i += 1
                if update is not None:
                    convs.append(update[0])
                    recurrents.append(constrain(update[1], ("cache_batch", None, None, None)))
        x = self.norm(x)
        new_cache = None
        if kv_cache is not None:
            new_cache = HybridCache(
                tuple(keys), tuple(values), tuple(convs), tuple(recurrents), cache_segments, start + t, kv_cache.prefix
            )
        return x, new_cache


class CheckpointTensor(nnx.Variable):
    """A checkpoint tensor the model keeps but never computes with or trains (the `mtp.*`
    weights): loaded and exported verbatim, outside the optimizer's `nnx.Param` filter."""


class CheckpointTensors(nnx.Module):
    """The `mtp.*` tensors of a checkpoint, in `specs` order (`tensors[i]` is `specs[i].key`)."""

    def __init__(self, specs: Sequence[CheckpointTensorSpec]):
        self.tensors = nnx.List(
            [
                CheckpointTensor(
                    jnp.zeros(s.shape, np.dtype(checkpoint.SAFETENSORS_DTYPES[s.dtype])),
                    out_sharding=(None,) * len(s.shape),
                    eager_sharding=False,
                )
                for s in specs
            ]
        )


class Qwen3_5ForCausalLM(OutputHead, nnx.Module):
    """`Qwen3_5TextModel` plus the LM head (the embedding matrix when tied) and the kept `mtp.*`
    tensors. Implements the sampler/scorer `DecoderLM` interface."""

    def __init__(self, cfg: Qwen3_5TextConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.model = Qwen3_5TextModel(cfg, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = linear(cfg, cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), False, rngs)
        if cfg.mtp_tensors:
            self.mtp = CheckpointTensors(cfg.mtp_tensors)

    def hidden_states(self, input_ids=None, **kwargs) -> tuple[jax.Array, HybridCache | None]:
        return self.model(input_ids, **kwargs)

    def __call__(self, input_ids=None, **kwargs) -> tuple[jax.Array, HybridCache | None]:
        """(logits float32 [B, T, V], updated cache); arguments as `Qwen3_5TextModel.__call__`."""
        hidden, cache = self.model(input_ids, **kwargs)
        return self.logits(hidden), cache

    def init_cache(self, batch: int, capacity: int, dtype=None) -> HybridCache:
        return init_hybrid_cache(self.config, batch, capacity, dtype)


class Qwen3_5ForConditionalGeneration(VisionLanguageModel):
    """Qwen3.5 with images: `visual` (VisionTower without DeepStack) + `language_model`
    (Qwen3_5ForCausalLM). Each `image_token_id` placeholder is replaced, in order, by one merged
    image token; positions are Qwen3-VL's multimodal ones (`cua_jax.models.qwen3_vl.rope_index`).

    freeze_vision and the sampler interface as `Qwen3VLForConditionalGeneration`.
    """

    def __init__(self, config: Qwen3_5Config, *, rngs: nnx.Rngs, freeze_vision: bool = False):
        super().__init__(config, rngs=rngs, freeze_vision=freeze_vision)
        self.language_model = Qwen3_5ForCausalLM(config.text, rngs=rngs)

    def encode_images(self, pixel_values: jax.Array, image_grid_thw) -> tuple[jax.Array, tuple[()]]:
        """(image tokens [M, E], no DeepStack features) for the images' patches."""
        embeds, _ = self.visual(pixel_values, ImageGrid.of(image_grid_thw))
        return (jax.lax.stop_gradient(embeds) if self.freeze_vision else embeds), ()

    def hidden_states(
        self,
        input_ids,
        *,
        positions=None,
        segment_ids=None,
        kv_cache=None,
        pixel_values=None,
        image_grid_thw: ImageGrid | GridTHW | None = None,
        image_features=None,
    ) -> tuple[jax.Array, HybridCache | None]:
        """Final-normed hidden states [B, T, E] and the updated cache; arguments as
        `Qwen3VLForConditionalGeneration.hidden_states` (positions [3, B, T] from `rope_index`
        are required with images; image_features: (tokens [B, T, E], ()), no DeepStack)."""
        cfg = self.config
        if (pixel_values is None) != (image_grid_thw is None):
            raise ValueError("pass pixel_values and image_grid_thw together")
        if pixel_values is not None and image_features is not None:
            raise ValueError("pass the images as pixel_values or as image_features, not both")
        embeds = self.language_model.model.embed_tokens(input_ids)
        if image_features is not None:
            if positions is None or positions.ndim != 3:
                raise ValueError("with images, pass positions [3, B, T] built by rope_index")
            keep = (input_ids == cfg.image_token_id)[..., None]
            embeds = jnp.where(keep, image_features[0].astype(embeds.dtype), embeds)
        elif pixel_values is not None:
            if positions is None or positions.ndim != 3:
                raise ValueError("with images, pass positions [3, B, T] built by rope_index")
            mask = input_ids == cfg.image_token_id
            n_image_tokens = sum(merged_token_counts(normalize_grid(image_grid_thw), cfg.vision.spatial_merge_size))
            if not isinstance(mask, jax.core.Tracer) and int(jnp.sum(mask)) != n_image_tokens:
                raise ValueError(
                    f"input_ids hold {int(jnp.sum(mask))} image tokens but the images give "
                    f"{n_image_tokens} (grids {normalize_grid(image_grid_thw)})"
                )
            image_embeds, _ = self.encode_images(pixel_values, image_grid_thw)
            gathered, keep = scatter_rows(mask, image_embeds.astype(embeds.dtype))
            embeds = jnp.where(keep, gathered, embeds)
        return self.language_model.model(
            inputs_embeds=embeds, positions=positions, segment_ids=segment_ids, kv_cache=kv_cache
        )


def image_prefill_extras(config: Qwen3_5Config, pixel_values, image_grid_thw):
    """A `prefill_extras` callable for `Sampler.generate` (as Qwen3-VL's)."""

    return vl_extras(config, pixel_values, image_grid_thw)
