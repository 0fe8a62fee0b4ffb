"""Layers and helpers the decoders share (Qwen3, Qwen3-VL's language model, Qwen3.5, the vision tower).

`RMSNorm`, `MLP` (SwiGLU), `token_embedding`, `decoder_inputs` (a forward pass's embedded
inputs, segments and attention mask), `linear` (a projection whose parameters carry logical axis names),
attention pieces (`attention_mask`, `dot_product_attention`, `write_kv_cache`, `cached_attention`,
`SharedPrefix` and `prefix_attention`: a prefix several cached rows continue, attended once), `project`
(a linear layer as one 2-D matmul), `checkpointed` (rematerialised module calls),
`OutputHead` (a causal LM's logits) and `scatter_rows` (image tokens placed at their
placeholders). Layers that take a config read only the fields `Qwen3Config` and
`Qwen3_5TextConfig` share (hidden_size, intermediate_size, dtype, param_dtype).

Conventions: linear kernels are [in, out] (the transpose of torch's [out, in]); every
parameter carries logical axis names (metadata `out_sharding`, applied by
cua_jax.models.sharding); large activations are constrained by logical name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx, struct

if TYPE_CHECKING:  # annotations only: the Qwen3 package imports these layers
    from cua_jax.models.qwen3.config import Qwen3Config

from cua_jax.models.sharding import constrain

BATCH, LENGTH, EMBED = "activation_batch", "activation_length", "activation_embed"
INIT = nnx.initializers.normal(stddev=0.02)


def axis_metadata(*names: str | None) -> dict:
    # eager_sharding off: placement is decided by the loader / init_sharded from the
    # rules, so building a model needs no mesh.
    return {"out_sharding": names, "eager_sharding": False}


def linear(cfg: Qwen3Config, n_in: int, n_out: int, names: tuple[str, str], bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=INIT,
        kernel_metadata=axis_metadata(*names),
        bias_metadata=axis_metadata(names[1]),
        rngs=rngs,
    )


def token_embedding(cfg: Qwen3Config, rngs: nnx.Rngs) -> nnx.Embed:
    """A decoder's [vocab, embed] token embedding table."""
    return nnx.Embed(
        cfg.vocab_size,
        cfg.hidden_size,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        embedding_init=nnx.with_partitioning(INIT, ("vocab", "embed"), eager_sharding=False),
        rngs=rngs,
    )


def decoder_inputs(
    embed_tokens: nnx.Embed,
    dtype,
    input_ids: jax.Array | None,
    inputs_embeds: jax.Array | None,
    segment_ids: jax.Array | None,
    kv_cache,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """What a decoder's forward pass starts from: (x [B, T, E] embedded from input_ids or
    inputs_embeds cast to `dtype` (exactly one given), segment_ids (default all ones), start (the
    cache's end, or 0), the attention mask, and the cache's segment ids with these T written at
    start (None without a cache)). kv_cache: any cache with `end`, `segment_ids` and `capacity`."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    x = embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds.astype(dtype)
    x = constrain(x, (BATCH, LENGTH, EMBED))
    b, t = x.shape[:2]
    start = kv_cache.end if kv_cache is not None else jnp.zeros((), jnp.int32)
    if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
    q_slots = start + jnp.arange(t, dtype=jnp.int32)
    if kv_cache is None:
        return x, segment_ids, start, attention_mask(segment_ids, q_slots, segment_ids, q_slots), None
    cache_segments = jax.lax.dynamic_update_slice(kv_cache.segment_ids, segment_ids.astype(jnp.int32), (0, start))
    mask = attention_mask(segment_ids, q_slots, cache_segments, jnp.arange(kv_cache.capacity, dtype=jnp.int32))
    return x, segment_ids, start, mask, cache_segments


def attention_mask(
    q_segment_ids: jax.Array, q_slots: jax.Array, kv_segment_ids: jax.Array, kv_slots: jax.Array
) -> jax.Array:
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


# Masked attention scores: finite, so a fully masked row stays a (uniform) number, not NaN.
_MASKED = -1e30


@struct.dataclass
class SharedPrefix:
    """Keys and values of prefixes that several rows of a decoding batch continue, held once
    (cascade attention): G prefixes of up to P slots, each continued by up to R rows.

    keys, values: one [G, P, K, D] per attention layer, a prefix's slots first. lengths int32
    [G]: the occupied slots of each. members int32 [G, R]: the rows continuing each prefix (-1
    pads). slot int32 [B]: row b's place in members flattened (g * R + r), -1 for a row that
    continues none. A member row's own cache holds only what follows its prefix; its
    positions are given by the caller (they continue the prefix's)."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    lengths: jax.Array
    members: jax.Array
    slot: jax.Array

    def layer(self, i: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
        """(keys, values, lengths, members, slot) of attention layer i (`prefix_attention`'s)."""
        return self.keys[i], self.values[i], self.lengths, self.members, self.slot


def _softmax_parts(scores: jax.Array, keep: jax.Array, values: jax.Array, spec: str):
    """(max, sum of exp, exp-weighted values) of float32 scores [..., S] where `keep`: the pieces
    of a softmax over S that another part's merge by log-sum-exp (`prefix_attention`)."""
    scores = jnp.where(keep, scores, _MASKED)
    top = jnp.max(scores, axis=-1)
    weights = jnp.exp(scores - top[..., None])
    return top, jnp.sum(weights, axis=-1), jnp.einsum(spec, weights, values.astype(jnp.float32))


def prefix_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, prefix: tuple, scale: float
) -> jax.Array:
    """Grouped-query attention of q [B, T, H, D] over each row's shared prefix (`SharedPrefix.layer`)
    followed by its own slots k/v [B, S, K, D] under mask bool [B, T, S]: the result of attending
    the concatenation [prefix[:length]; own slots], computed with each prefix's keys and values
    read once for all its rows (the members' queries gathered per prefix, the two parts' softmaxes
    merged by their log-sum-exp). Scores and softmax in float32; a row outside every prefix
    attends its own slots alone (a fully masked one: uniform, as `dot_product_attention`)."""
    pk, pv, lengths, members, slot = prefix
    b, t, h, d = q.shape
    kh = k.shape[2]
    g, r = members.shape
    f32 = jnp.float32
    qg = q.reshape(b, t, kh, h // kh, d).astype(f32)
    own = jnp.einsum("btkqd,bskd->bkqts", qg, k.astype(f32)) * scale
    own_max, own_sum, own_out = _softmax_parts(own, mask[:, None, None], v, "bkqts,bskd->bkqtd")
    pre = jnp.einsum("grtkqd,gskd->grkqts", qg[jnp.maximum(members, 0)], pk.astype(f32)) * scale
    valid = jnp.arange(pk.shape[1])[None, :] < lengths[:, None]  # [G, P]
    pre_max, pre_sum, pre_out = _softmax_parts(pre, valid[:, None, None, None, None, :], pv, "grkqts,gskd->grkqtd")
    # Back to rows: row b reads its member entry; a row outside every prefix gets weight 0.
    rows = lambda x: x.reshape(g * r, *x.shape[2:])[jnp.maximum(slot, 0)]
    inside = (slot >= 0).reshape(b, 1, 1, 1)
    pre_max = jnp.where(inside, rows(pre_max), _MASKED)
    top = jnp.maximum(own_max, pre_max)
    w_own = jnp.exp(own_max - top)
    w_pre = jnp.where(inside, jnp.exp(pre_max - top), 0.0)
    out = (w_own[..., None] * own_out + w_pre[..., None] * rows(pre_out)) / (w_own * own_sum + w_pre * rows(pre_sum))[
        ..., None
    ]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def cached_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, cache: tuple | None, scale: float, query_chunk: int = 0
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """An attention layer's core: the new k/v written to the cache (`write_kv_cache`), then
    attention over it, after the rows' shared prefix where the cache has one. cache: None,
    (keys, values, write slot) or (keys, values, write slot, `SharedPrefix.layer(i)` or None).
    Returns (out [B, T, H, D], (keys, values) updated, or None without a cache)."""
    k, v, new_cache = write_kv_cache(k, v, cache, q.dtype)
    prefix = cache[3] if cache is not None and len(cache) > 3 else None
    if prefix is None:
        return dot_product_attention(q, k, v, mask, scale, query_chunk), new_cache
    return prefix_attention(q, k, v, mask, prefix, scale), new_cache


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
        self.weight = nnx.Param(jnp.ones((size,), param_dtype), **axis_metadata(axis_name))

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
    cache_k, cache_v, slot = cache[:3]
    zero = jnp.zeros((), jnp.int32)
    k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), (zero, slot, zero, zero))
    v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), (zero, slot, zero, zero))
    k = constrain(k, ("cache_batch", "cache_length", "cache_kv_heads", None))
    v = constrain(v, ("cache_batch", "cache_length", "cache_kv_heads", None))
    return k.astype(dtype), v.astype(dtype), (k, v)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). x [B, T, E] -> [B, T, E]."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.gate_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size, ("embed", "mlp"), False, rngs)
        self.up_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size, ("embed", "mlp"), False, rngs)
        self.down_proj = linear(cfg, cfg.intermediate_size, cfg.hidden_size, ("mlp", "embed"), False, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(project(self.gate_proj, x)) * project(self.up_proj, x)
        h = constrain(h, (BATCH, LENGTH, "activation_mlp"))
        return project(self.down_proj, h)


def checkpointed(module: nnx.Module, *args, **static):
    """module(*args, **static) under jax.checkpoint: the backward pass recomputes the
    module's forward from `args` instead of keeping its activations (attention scores, MLP
    hidden) alive. `args` are arrays (or None); `static` holds Python values such as shapes.
    The module's state is only read, never written back (its layers hold no mutable state)."""
    graphdef, state = nnx.split(module)

    def run(state, *args):
        return nnx.merge(graphdef, state)(*args, **static)

    return jax.checkpoint(run)(state, *args)


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


def scatter_rows(mask: jax.Array, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row i of `rows` for the i-th True of `mask` (row-major over [B, T]), as HF's masked_scatter.

    mask bool [B, T]; rows [M, E]. Returns (gathered [B, T, E] (garbage where mask is False),
    mask[..., None]).
    """
    index = jnp.cumsum(mask.reshape(-1)) - 1
    index = jnp.clip(index, 0, rows.shape[0] - 1).reshape(mask.shape)
    return rows[index], mask[..., None]
