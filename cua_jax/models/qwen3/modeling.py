"""Qwen3 decoder in Flax NNX, computing what transformers' `Qwen3ForCausalLM` computes.

Building blocks (reused by Qwen3-VL's language model): `Attention` (grouped-query, QK-norm,
rotary from caller-supplied cos/sin, optional KV cache), `DecoderLayer`, `Qwen3Model`
(embeddings + layers + final norm) and `Qwen3ForCausalLM` (+ LM head, tied or untied); the
layers other models share (`RMSNorm`, `MLP`, ...) are in `cua_jax.models.layers`.

Layout conventions:
  * Linear kernels are [in, out] (the transpose of torch's [out, in]).
  * Every parameter carries logical axis names (metadata `out_sharding`, applied by
    cua_jax.models.sharding); large activations are constrained by logical name.
  * Attention visibility comes from `segment_ids` int32 [B, T] (0 = padding, equal
    ids attend to each other causally; several ids per row = packed sequences) and the
    KV cache's slots; there is no separate boolean attention mask argument.

Shapes: B batch, T new tokens, S attended slots (T, or the cache length), E hidden,
H query heads, K key/value heads, D head_dim, V vocab, I intermediate.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from cua_jax.models.layers import (
    BATCH,
    EMBED,
    LENGTH,
    MLP,
    OutputHead,
    RMSNorm,
    SharedPrefix,
    cached_attention,
    checkpointed,
    decoder_inputs,
    linear,
    project,
    token_embedding,
)
from cua_jax.models.qwen3.config import Qwen3Config
from cua_jax.models.rope import apply_rotary, dynamic_ntk_inv_freq, rope_cos_sin, rope_inv_freq
from cua_jax.models.sharding import constrain

# Per-layer hook: after_layer(layer_index, hidden [B, T, E]) -> hidden. Qwen3-VL's
# DeepStack adds visual features to the hidden states after the first layers this way.
AfterLayerHook = Callable[[int, jax.Array], jax.Array]


@struct.dataclass
class KVCache:
    """Keys/values of every layer for a batch, at fixed capacity S (static shapes).

    keys, values: one [B, S, K, D] array per layer. segment_ids int32 [B, S]: the
    segment of the token held in each slot, 0 for an empty slot. end int32 []: the next
    slot to write; all rows write the same slot, so prompts of different lengths are
    left-padded (padding slots keep segment 0 and are never attended). prefix: keys and
    values several rows continue, held once (`cua_jax.models.layers.SharedPrefix`), or None.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    segment_ids: jax.Array
    end: jax.Array
    prefix: SharedPrefix | None = None

    @property
    def capacity(self) -> int:
        return self.segment_ids.shape[1]


def init_kv_cache(
    num_layers: int, num_kv_heads: int, head_dim: int, batch: int, capacity: int, dtype=jnp.float32
) -> KVCache:
    """An empty cache of `capacity` slots per row."""
    shape = (batch, capacity, num_kv_heads, head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
    return KVCache(
        keys=zeros,
        values=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        segment_ids=jnp.zeros((batch, capacity), jnp.int32),
        end=jnp.zeros((), jnp.int32),
    )


class Attention(nnx.Module):
    """Grouped-query self-attention with QK-norm (RMSNorm over head_dim before RoPE)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.query_chunk = cfg.attention_query_chunk
        e, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = linear(cfg, e, self.num_heads * hd, ("embed", "q_heads"), cfg.attention_bias, rngs)
        self.k_proj = linear(cfg, e, self.num_kv_heads * hd, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.v_proj = linear(cfg, e, self.num_kv_heads * hd, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.o_proj = linear(cfg, self.num_heads * hd, e, ("q_heads", "embed"), cfg.attention_bias, rngs)
        norm_kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, axis_name="head_dim")
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, **norm_kw)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, **norm_kw)

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        cache: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B, T, E]; cos/sin [B, T, D]; mask bool [B, T, S].

        cache: (keys [B, S, K, D], values [B, S, K, D], write slot int32 [], the rows' shared
        prefix (`SharedPrefix.layer`) or None) or None; the new keys/values are written at the
        slot and attention runs over the prefix, then all S slots (`cached_attention`).
        Returns (out [B, T, E], (keys, values) updated, or None without a cache).
        """
        b, t, _ = x.shape
        q = self.q_norm(project(self.q_proj, x).reshape(b, t, self.num_heads, self.head_dim))
        k = self.k_norm(project(self.k_proj, x).reshape(b, t, self.num_kv_heads, self.head_dim))
        v = project(self.v_proj, x).reshape(b, t, self.num_kv_heads, self.head_dim)
        q = constrain(apply_rotary(q, cos, sin), (BATCH, LENGTH, "activation_heads", None))
        k = constrain(apply_rotary(k, cos, sin), (BATCH, LENGTH, "activation_kv_heads", None))
        out, new_cache = cached_attention(q, k, v, mask, cache, self.head_dim**-0.5, self.query_chunk)
        out = constrain(out, (BATCH, LENGTH, "activation_heads", None))
        return project(self.o_proj, out.reshape(b, t, self.num_heads * self.head_dim)), new_cache


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        norm_kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm_kw)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm_kw)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache=None):
        """Same arguments as `Attention.__call__`; returns (x [B, T, E], cache update)."""
        attn, new_cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, (BATCH, LENGTH, EMBED)), new_cache


class Qwen3Model(nnx.Module):
    """Token embeddings, decoder layers and the final norm (HF `Qwen3Model`)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = token_embedding(cfg, rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype)

    def rotary_cos_sin(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """cos, sin float32 [B, T, D] for text positions int [B, T] under the config's RoPE."""
        cfg = self.config
        inv_freq, scaling = rope_inv_freq(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        if cfg.rope.rope_type == "dynamic":
            inv_freq = dynamic_ntk_inv_freq(cfg.rope, cfg.head_dim, cfg.max_position_embeddings, jnp.max(positions) + 1)
        return rope_cos_sin(positions, inv_freq, scaling)

    def __call__(
        self,
        input_ids: jax.Array | None = None,
        *,
        inputs_embeds: jax.Array | None = None,
        positions: jax.Array | None = None,
        position_embeddings: tuple[jax.Array, jax.Array] | None = None,
        segment_ids: jax.Array | None = None,
        kv_cache: KVCache | None = None,
        after_layer: AfterLayerHook | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states [B, T, E] and the updated cache.

        input_ids int [B, T] or inputs_embeds [B, T, E] (exactly one).
        positions int [B, T]: RoPE positions; default arange(T) from the cache's end.
        position_embeddings: (cos, sin) [B, T, D] precomputed by the caller (e.g.
          multimodal RoPE); overrides `positions`.
        segment_ids int [B, T]: 0 = padding; default all ones.
        kv_cache: attend to and append to this cache (T new tokens written at cache.end).
        after_layer: hook applied to the hidden states after each decoder layer.
        """
        x, segment_ids, start, mask, cache_segments = decoder_inputs(
            self.embed_tokens, self.config.dtype, input_ids, inputs_embeds, segment_ids, kv_cache
        )
        b, t = x.shape[:2]
        if position_embeddings is None:
            if positions is None:
                positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
            position_embeddings = self.rotary_cos_sin(positions)
        cos, sin = position_embeddings
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None
            if kv_cache is not None:
                prefix = None if kv_cache.prefix is None else kv_cache.prefix.layer(i)
                layer_cache = (kv_cache.keys[i], kv_cache.values[i], start, prefix)
            if self.config.remat:
                x, update = checkpointed(layer, x, cos, sin, mask, layer_cache)
            else:
                x, update = layer(x, cos, sin, mask, layer_cache)
            if update is not None:
                new_keys.append(update[0])
                new_values.append(update[1])
            if after_layer is not None:
                x = after_layer(i, x)
        x = self.norm(x)
        new_cache = None
        if kv_cache is not None:
            new_cache = KVCache(tuple(new_keys), tuple(new_values), cache_segments, start + t, kv_cache.prefix)
        return x, new_cache


class Qwen3ForCausalLM(OutputHead, nnx.Module):
    """`Qwen3Model` plus the LM head (the embedding matrix when tie_word_embeddings)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = cfg
        self.model = Qwen3Model(cfg, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = linear(cfg, cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), False, rngs)

    def hidden_states(self, input_ids=None, **kwargs) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states; arguments as `Qwen3Model.__call__`."""
        return self.model(input_ids, **kwargs)

    def __call__(self, input_ids=None, **kwargs) -> tuple[jax.Array, KVCache | None]:
        """(logits float32 [B, T, V], updated cache); arguments as `Qwen3Model.__call__`."""
        hidden, cache = self.model(input_ids, **kwargs)
        return self.logits(hidden), cache

    def init_cache(self, batch: int, capacity: int, dtype=None) -> KVCache:
        cfg = self.config
        return init_kv_cache(
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, batch, capacity, dtype or cfg.dtype
        )
