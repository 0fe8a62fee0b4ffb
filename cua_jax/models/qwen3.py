"""Qwen3 decoder in Flax NNX, computing what transformers' `Qwen3ForCausalLM` computes.

Building blocks (reused by Qwen3-VL's language model): `RMSNorm`, `MLP` (SwiGLU),
`Attention` (grouped-query, QK-norm, rotary from caller-supplied cos/sin, optional KV
cache), `DecoderLayer`, `Qwen3Model` (embeddings + layers + final norm) and
`Qwen3ForCausalLM` (+ LM head, tied or untied).

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

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from cua_jax.models.configs import Qwen3Config
from cua_jax.models.rope import apply_rotary, dynamic_ntk_inv_freq, rope_cos_sin, rope_inv_freq
from cua_jax.models.sharding import constrain

BATCH, LENGTH, EMBED = "activation_batch", "activation_length", "activation_embed"
_INIT = nnx.initializers.normal(stddev=0.02)

# Per-layer hook: after_layer(layer_index, hidden [B, T, E]) -> hidden. Qwen3-VL's
# DeepStack adds visual features to the hidden states after the first layers this way.
AfterLayerHook = Callable[[int, jax.Array], jax.Array]


def _meta(*names: str | None) -> dict:
    # eager_sharding off: placement is decided by the loader / init_sharded from the
    # rules, so building a model needs no mesh.
    return {"out_sharding": names, "eager_sharding": False}


def _linear(cfg: Qwen3Config, n_in: int, n_out: int, names: tuple[str, str], bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_INIT,
        kernel_metadata=_meta(*names),
        bias_metadata=_meta(names[1]),
        rngs=rngs,
    )


@struct.dataclass
class KVCache:
    """Keys/values of every layer for a batch, at fixed capacity S (static shapes).

    keys, values: one [B, S, K, D] array per layer. segment_ids int32 [B, S]: the
    segment of the token held in each slot, 0 for an empty slot. end int32 []: the next
    slot to write; all rows write the same slot, so prompts of different lengths are
    left-padded (padding slots keep segment 0 and are never attended).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    segment_ids: jax.Array
    end: jax.Array

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


def attention_mask(q_segment_ids: jax.Array, q_slots: jax.Array, kv_segment_ids: jax.Array, kv_slots: jax.Array) -> jax.Array:
    """bool [B, T, S]: query t sees slot s iff s is not after t, both are in the same
    segment, and s is not padding. q_slots int [T], kv_slots int [S]."""
    causal = kv_slots[None, None, :] <= q_slots[None, :, None]
    same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    return causal & same & (kv_segment_ids[:, None, :] != 0)


def dot_product_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, query_chunk: int = 0
) -> jax.Array:
    """Grouped-query attention. q [B, T, H, D], k/v [B, S, K, D], mask bool [B, T, S]
    -> [B, T, H, D]. Scores and softmax in float32; a fully masked row (padding query)
    gets a uniform distribution instead of NaN (masked scores are a large finite negative).

    query_chunk > 0 processes `query_chunk` queries at a time, each block rematerialised
    in the backward pass, so score memory is [B, H, query_chunk, S] instead of
    [B, H, T, S] (long training sequences); the result is the same.
    """
    b, t, h, d = q.shape
    if query_chunk and t > query_chunk:
        n = -(-t // query_chunk)
        pad = n * query_chunk - t
        q_blocks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, query_chunk, h, d)
        m_blocks = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(b, n, query_chunk, mask.shape[-1])
        block = jax.checkpoint(lambda qm: dot_product_attention(qm[0], k, v, qm[1], scale))
        out = jax.lax.map(block, (q_blocks.swapaxes(0, 1), m_blocks.swapaxes(0, 1)))
        return out.swapaxes(0, 1).reshape(b, n * query_chunk, h, d)[:, :t]
    # jax.nn.dot_product_attention: XLA's own lowering (cuDNN's fused kernel where the
    # platform has one); on CPU it lays out the grouped heads with fewer copies than an
    # einsum over [B, K, G, T, S] (model_step benchmark: the train step 3-5% faster).
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale, implementation=None)


def project(linear: nnx.Linear, x: jax.Array) -> jax.Array:
    """`linear` over the last axis of x [..., n_in] as one 2-D matmul [N, n_in] @ [n_in, n_out].

    Same result as linear(x); on XLA:CPU the backward pass of a 3-D dot_general gets its
    weight-gradient operand transposed in memory (fused into the preceding elementwise
    ops), and the 2-D form avoids that: the SwiGLU block's forward + backward at batch
    4 x 128, hidden 256 took 7.5 ms in 3-D and 4.7 ms in 2-D. Leading
    axes are batch-major and the length axis is never sharded, so flattening them keeps
    the batch sharding."""
    return linear(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


class RMSNorm(nnx.Module):
    """y = w * x / sqrt(mean(x^2) + eps), normalised in float32 (HF Qwen3RMSNorm)."""

    def __init__(self, size: int, eps: float, *, dtype=jnp.float32, param_dtype=jnp.float32, axis_name: str = "norm"):
        self.eps = eps
        self.dtype = dtype
        self.weight = nnx.Param(jnp.ones((size,), param_dtype), **_meta(axis_name))

    def __call__(self, x: jax.Array) -> jax.Array:
        input_dtype = x.dtype
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (self.weight[...] * xf.astype(input_dtype)).astype(input_dtype)


def write_kv_cache(k: jax.Array, v: jax.Array, cache: tuple | None, dtype) -> tuple[jax.Array, jax.Array, tuple | None]:
    """(keys, values, new cache) for attention: without a cache, k and v [B, T, K, D] as they
    are and None; with (keys [B, S, K, D], values, write slot int32 []), k and v written at the
    slot, and attention runs over all S slots (cast to `dtype`)."""
    if cache is None:
        return k, v, None
    cache_k, cache_v, slot = cache
    zero = jnp.zeros((), jnp.int32)
    k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), (zero, slot, zero, zero))
    v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), (zero, slot, zero, zero))
    k = constrain(k, ("cache_batch", "cache_length", "cache_kv_heads", None))
    v = constrain(v, ("cache_batch", "cache_length", "cache_kv_heads", None))
    return k.astype(dtype), v.astype(dtype), (k, v)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). x [B, T, E] -> [B, T, E]."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.gate_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, ("embed", "mlp"), False, rngs)
        self.up_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, ("embed", "mlp"), False, rngs)
        self.down_proj = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, ("mlp", "embed"), False, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(project(self.gate_proj, x)) * project(self.up_proj, x)
        h = constrain(h, (BATCH, LENGTH, "activation_mlp"))
        return project(self.down_proj, h)


class Attention(nnx.Module):
    """Grouped-query self-attention with QK-norm (RMSNorm over head_dim before RoPE)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.query_chunk = cfg.attention_query_chunk
        e, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = _linear(cfg, e, self.num_heads * hd, ("embed", "q_heads"), cfg.attention_bias, rngs)
        self.k_proj = _linear(cfg, e, self.num_kv_heads * hd, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.v_proj = _linear(cfg, e, self.num_kv_heads * hd, ("embed", "kv_heads"), cfg.attention_bias, rngs)
        self.o_proj = _linear(cfg, self.num_heads * hd, e, ("q_heads", "embed"), cfg.attention_bias, rngs)
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

        cache: (keys [B, S, K, D], values [B, S, K, D], write slot int32 []) or None; the
        new keys/values are written at the slot and attention runs over all S slots.
        Returns (out [B, T, E], (keys, values) updated, or None without a cache).
        """
        b, t, _ = x.shape
        q = self.q_norm(project(self.q_proj, x).reshape(b, t, self.num_heads, self.head_dim))
        k = self.k_norm(project(self.k_proj, x).reshape(b, t, self.num_kv_heads, self.head_dim))
        v = project(self.v_proj, x).reshape(b, t, self.num_kv_heads, self.head_dim)
        q = constrain(apply_rotary(q, cos, sin), (BATCH, LENGTH, "activation_heads", None))
        k = constrain(apply_rotary(k, cos, sin), (BATCH, LENGTH, "activation_kv_heads", None))
        k, v, new_cache = write_kv_cache(k, v, cache, q.dtype)
        out = dot_product_attention(q, k, v, mask, self.head_dim**-0.5, self.query_chunk)
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


def checkpointed(module: nnx.Module, *args, **static):
    """module(*args, **static) under jax.checkpoint: the backward pass recomputes the
    module's forward from `args` instead of keeping its activations (attention scores, MLP
    hidden) alive. `args` are arrays (or None); `static` holds Python values such as shapes.
    The module's state is only read, never written back (its layers hold no mutable state)."""
    graphdef, state = nnx.split(module)

    def run(state, *args):
        return nnx.merge(graphdef, state)(*args, **static)

    return jax.checkpoint(run)(state, *args)


class Qwen3Model(nnx.Module):
    """Token embeddings, decoder layers and the final norm (HF `Qwen3Model`)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = nnx.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=nnx.with_partitioning(_INIT, ("vocab", "embed"), eager_sharding=False),
            rngs=rngs,
        )
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
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds.astype(self.config.dtype)
        x = constrain(x, (BATCH, LENGTH, EMBED))
        b, t = x.shape[:2]
        start = kv_cache.end if kv_cache is not None else jnp.zeros((), jnp.int32)
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        if position_embeddings is None:
            if positions is None:
                positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
            position_embeddings = self.rotary_cos_sin(positions)
        cos, sin = position_embeddings
        q_slots = start + jnp.arange(t, dtype=jnp.int32)
        if kv_cache is None:
            mask = attention_mask(segment_ids, q_slots, segment_ids, q_slots)
        else:
            cache_segments = jax.lax.dynamic_update_slice(kv_cache.segment_ids, segment_ids.astype(jnp.int32), (0, start))
            mask = attention_mask(segment_ids, q_slots, cache_segments, jnp.arange(kv_cache.capacity, dtype=jnp.int32))
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None if kv_cache is None else (kv_cache.keys[i], kv_cache.values[i], start)
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
            new_cache = KVCache(tuple(new_keys), tuple(new_values), cache_segments, start + t)
        return x, new_cache


class OutputHead:
    """The logits of a causal LM whose `config` has tie_word_embeddings and dtype, with
    `model.embed_tokens` and, untied, `lm_head` (Qwen3 and Qwen3.5 alike)."""

    def output_projection(self) -> jax.Array:
        """The [E, V] matrix mapping final hidden states to logits."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., E] -> logits float32 [..., V]."""
        w = self.output_projection().astype(self.config.dtype)
        out = jnp.einsum("...e,ev->...v", hidden, w, preferred_element_type=jnp.float32)
        if out.ndim == 3:
            out = constrain(out, (BATCH, LENGTH, "activation_vocab"))
        return out


class Qwen3ForCausalLM(OutputHead, nnx.Module):
    """`Qwen3Model` plus the LM head (the embedding matrix when tie_word_embeddings)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = cfg
        self.model = Qwen3Model(cfg, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), False, rngs)


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
