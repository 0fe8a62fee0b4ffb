"""Rows of a decoding cache moved between batches: the one place that knows a cache's layout.

A decoding cache (`qwen3.KVCache`, `qwen3_5.HybridCache`) holds, per row, attention keys and
values in slots ([B, S, K, D] per attention layer, with segment ids [B, S]; slot order is
causal order, empty slots have segment 0) and, for hybrid models, a recurrent state per linear
layer (a conv window and a delta-rule state). Two operations reuse computed rows elsewhere:

* `take_rows(cache, index, capacity)`: rows picked (and repeated) by index, with room for more
  slots. The learner runs a group's shared prompt once and continues every member from it;
  gradients through the gather sum over the members.
* `CachedRows` + `compact_rows` / `fill_rows`: the sampler's prefix cache. `compact_rows` moves
  each row's occupied slots to the front (causal order kept) and stacks the layers, so one
  array per row holds what a later batch needs; `fill_rows` writes such rows into the first
  slots of a fresh cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def _recurrent_fields(cache) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """(conv windows, delta-rule states) of a hybrid cache; empty for attention-only caches."""
    return tuple(getattr(cache, "conv_states", ())), tuple(getattr(cache, "recurrent_states", ()))


def has_recurrent_state(cache) -> bool:
    """Whether rows of `cache` carry a recurrent state (a cached row then serves only a
    continuation from its exact end: the state of a shorter prefix is gone)."""
    return bool(_recurrent_fields(cache)[0])


def take_rows(cache, index: jax.Array, capacity: int | None = None):
    """The cache of rows `index` (int [B']) of `cache`, its slot axis padded with empty slots to
    `capacity` (None: unchanged); `end` stays. Differentiable (the gather's gradient sums)."""
    extra = 0 if capacity is None else capacity - cache.segment_ids.shape[1]
    if extra < 0:
        raise ValueError(f"capacity {capacity} is below the cache's {cache.segment_ids.shape[1]} slots")

    def slots(x):
        x = x[index]
        return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)) if extra else x

    fields = dict(
        keys=tuple(map(slots, cache.keys)), values=tuple(map(slots, cache.values)), segment_ids=slots(cache.segment_ids)
    )
    conv, recurrent = _recurrent_fields(cache)
    if conv:
        fields.update(conv_states=tuple(x[index] for x in conv), recurrent_states=tuple(x[index] for x in recurrent))
    return cache.replace(**fields)


@struct.dataclass
class CachedRows:
    """Cached rows in a stacked layout (B rows; La attention layers, Ll linear layers).

    kv: [B, La, 2, C, K, D] keys (index 0) and values (1), occupied slots first, or None (no
    attention layer). lengths: int32 [B], the slots of each row to use (the rest are ignored).
    conv: [B, Ll, K_conv - 1, C_conv] and recurrent: [B, Ll, Hv, Dk, Dv] (float32), the state
    after the row's last token, or None (no linear layer).
    """

    kv: jax.Array | None
    lengths: jax.Array
    conv: jax.Array | None = None
    recurrent: jax.Array | None = None


def compact_rows(cache) -> CachedRows:
    """Every row of `cache` with its occupied slots moved to the front, in slot order (lengths:
    the occupied slots of each row). Jit-able."""
    occupied = cache.segment_ids != 0
    order = jnp.argsort(~occupied, axis=1, stable=True)  # occupied slots first, order kept
    kv = None
    if cache.keys:
        pick = lambda x: jnp.take_along_axis(x, order[:, :, None, None], axis=1)
        kv = jnp.stack([jnp.stack([pick(k), pick(v)], axis=1) for k, v in zip(cache.keys, cache.values)], axis=1)
    conv, recurrent = _recurrent_fields(cache)
    return CachedRows(
        kv,
        jnp.sum(occupied, axis=1).astype(jnp.int32),
        jnp.stack(conv, axis=1) if conv else None,
        jnp.stack(recurrent, axis=1) if recurrent else None,
    )


def fill_rows(cache, rows: CachedRows):
    """`cache` (fresh: nothing written) with `rows` in its first C slots (C = rows.kv's slot
    count; slot s of row b occupied iff s < lengths[b]) and the recurrent states replaced; its
    next write goes to slot C. Jit-able."""
    c = 0 if rows.kv is None else rows.kv.shape[3]
    fields = {}
    if rows.kv is not None:
        fields["keys"] = tuple(k.at[:, :c].set(rows.kv[:, i, 0].astype(k.dtype)) for i, k in enumerate(cache.keys))
        fields["values"] = tuple(v.at[:, :c].set(rows.kv[:, i, 1].astype(v.dtype)) for i, v in enumerate(cache.values))
    occupied = (jnp.arange(c)[None, :] < rows.lengths[:, None]).astype(jnp.int32)
    fields["segment_ids"] = cache.segment_ids.at[:, :c].set(occupied)
    fields["end"] = jnp.asarray(c, jnp.int32)
    conv, recurrent = _recurrent_fields(cache)
    if conv:
        fields["conv_states"] = tuple(rows.conv[:, i].astype(x.dtype) for i, x in enumerate(conv))
        fields["recurrent_states"] = tuple(rows.recurrent[:, i].astype(x.dtype) for i, x in enumerate(recurrent))
    return cache.replace(**fields)
