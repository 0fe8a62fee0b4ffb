"""Per-token log-probabilities and entropies of given sequences, for the learner.

Full logits [B, T, V] in float32 are the largest tensor of a forward pass (8k tokens x
152k vocab = 5 GB per sequence), so they are never built: the final hidden states are
projected chunk by chunk over the sequence (`seq_chunk` positions at a time) and, inside
a chunk, over the vocabulary (`vocab_chunk` columns at a time) with an online
log-sum-exp. Each sequence chunk is rematerialised in the backward pass, so memory stays
bounded for gradients too. Small problems (logits of at most UNCHUNKED_LOGITS_BYTES, e.g. a
tiny vocabulary) are scored in one chunk without remat: bounding memory is moot there, and
the remat's extra LM-head forward would be pure cost.

Alignment: out[:, t] describes the prediction of ids[:, t] from ids[:, :t]; position 0,
padding (segment 0) and the first token of each packed segment get 0, as they have no
prediction. This matches `TrainingItem.rollout_logprobs`, aligned with `ids`.

Banned tokens: with `banned_token_ids` (the ids a sampler masked to -inf, see
`cua_jax.models.sampler`), the log-normaliser and the entropy run over the allowed tokens
only, so a sampled token's logprob is the one the masked sampler reported. A banned
target (only ever a prompt token, e.g. an image placeholder, never a trained one) gets its
logit minus that normaliser: finite, so masked-out positions cannot turn a loss into NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from cua_jax.models.cache_rows import take_rows
from cua_jax.models.vision import ImageGrid

# score_sequences' default: full logits up to this size are built at once (one chunk, no remat).
UNCHUNKED_LOGITS_BYTES = 64 << 20


def _chunk_stats(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    inv_temperature: jax.Array,
    vocab_chunk: int,
    banned: jax.Array | None = None,
):
    """For h [B, C, E], w [E, V], targets [B, C]: (target logprob, entropy), each [B, C],
    of softmax(h @ w * inv_temperature) normalised over the columns < V that are not in
    `banned` (int [N], or None: none)."""
    e, v = w.shape
    n = -(-v // vocab_chunk)
    # Scaling h [B, C, E] rather than the logits [B, C, V]: E multiplies instead of V.
    h = h * inv_temperature.astype(h.dtype)
    padded = n * vocab_chunk != v
    w = jnp.pad(w, ((0, 0), (0, n * vocab_chunk - v)))
    w_chunks = w.reshape(e, n, vocab_chunk).transpose(1, 0, 2)
    b, c = targets.shape
    init = (
        jnp.full((b, c), -jnp.inf, jnp.float32),  # running max
        jnp.zeros((b, c), jnp.float32),  # sum exp(l - max)
        jnp.zeros((b, c), jnp.float32),  # sum exp(l - max) * l
        jnp.zeros((b, c), jnp.float32),  # target logit
    )

    def step(carry, inputs):
        m, s, u, tgt = carry
        w_c, index = inputs
        logits = jnp.einsum("bce,ev->bcv", h, w_c.astype(h.dtype), preferred_element_type=jnp.float32)
        local = targets - index * vocab_chunk
        in_chunk = (local >= 0) & (local < vocab_chunk)
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, vocab_chunk - 1)[..., None], axis=-1)[..., 0]
        # Masking costs a pass over [B, C, vocab_chunk]; only padded or banned columns need it.
        masked = padded or banned is not None
        if masked:
            column = index * vocab_chunk + jnp.arange(vocab_chunk)
            allowed = column < v
            if banned is not None:
                allowed = allowed & ~jnp.isin(column, banned)
            logits = jnp.where(allowed, logits, -jnp.inf)
        new_m = jnp.maximum(m, jnp.max(logits, axis=-1))
        # A chunk with no allowed column (all banned) leaves the running max at -inf.
        shift = new_m if banned is None else jnp.where(jnp.isfinite(new_m), new_m, 0.0)
        p = jnp.exp(logits - shift[..., None])
        finite_logits = jnp.where(allowed, logits, 0.0) if masked else logits
        rescale = jnp.exp(m - shift)
        s = s * rescale + jnp.sum(p, axis=-1)
        u = u * rescale + jnp.sum(p * finite_logits, axis=-1)
        tgt = jnp.where(in_chunk, picked, tgt)
        return (new_m, s, u, tgt), None

    if n == 1:  # no loop: XLA fuses the single chunk with its neighbours
        m, s, u, tgt = step(init, (w_chunks[0], jnp.zeros((), jnp.int32)))[0]
    else:
        (m, s, u, tgt), _ = jax.lax.scan(step, init, (w_chunks, jnp.arange(n)))
    log_z = m + jnp.log(s)
    return tgt - log_z, log_z - u / s


def token_logprobs_from_hidden(
    hidden: jax.Array,
    output_projection: jax.Array,
    targets: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    seq_chunk: int = 256,
    vocab_chunk: int = 32768,
    banned_token_ids: tuple[int, ...] | jax.Array = (),
    unchunked_logits_bytes: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """log softmax(hidden @ W / temperature)[target] and the entropy of that softmax.

    hidden [B, T, E] (the state that predicts targets[:, t]); output_projection W [E, V];
    targets int [B, T]; banned_token_ids: columns left out of the softmax (module doc), a
    static tuple (checked to lie in [0, V)) or an int array [N] (may be traced).
    seq_chunk: at most this many positions per sequence chunk; chunks are balanced (equal
    sizes, less than one position of padding per chunk). unchunked_logits_bytes: when the
    float32 logits [B, T, V] take at most this many bytes, the sequence is one chunk and
    nothing is rematerialised (remat only pays when it bounds memory).
    Returns (logprobs, entropy), float32 [B, T].
    """
    b, t, e = hidden.shape
    vocab = output_projection.shape[1]
    n = 1 if 4 * b * t * vocab <= unchunked_logits_bytes else -(-t // seq_chunk)
    chunk = -(-t // n)
    pad = n * chunk - t
    vocab_chunk = min(vocab_chunk, vocab)
    banned = None
    if isinstance(banned_token_ids, tuple | list):
        if any(not 0 <= int(t) < vocab for t in banned_token_ids):
            raise ValueError(f"banned_token_ids {tuple(banned_token_ids)} must lie in the vocabulary [0, {vocab})")
        if banned_token_ids:
            banned = jnp.asarray(banned_token_ids, jnp.int32)
    else:
        banned = jnp.asarray(banned_token_ids, jnp.int32).reshape(-1)
    stats = functools.partial(_chunk_stats, vocab_chunk=vocab_chunk)
    inv_temperature = 1.0 / jnp.asarray(temperature, jnp.float32)
    if n == 1:
        # One chunk: rematerialising it would add a forward of the LM head and save no memory.
        return stats(hidden, output_projection, targets, inv_temperature, banned=banned)
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    h_chunks = hidden.reshape(b, n, chunk, e).transpose(1, 0, 2, 3)
    t_chunks = targets.reshape(b, n, chunk).transpose(1, 0, 2)
    stats = jax.checkpoint(stats)
    logp, ent = jax.lax.map(
        lambda xs: stats(xs[0], output_projection, xs[1], inv_temperature, banned=banned), (h_chunks, t_chunks)
    )
    logp = logp.transpose(1, 0, 2).reshape(b, n * chunk)[:, :t]
    ent = ent.transpose(1, 0, 2).reshape(b, n * chunk)[:, :t]
    return logp, ent


def image_model_inputs(pixel_values, image_grid, image_features) -> dict:
    """The image keyword arguments of a model's forward: encoded features when a frozen tower
    already ran, else patches and their grid, else nothing (text-only rows)."""
    if image_features is not None:
        return {"image_features": image_features}
    if pixel_values is None:
        return {}
    return {"pixel_values": pixel_values, "image_grid_thw": image_grid}


@struct.dataclass
class SharedPrefix:
    """Prompt prefixes that rows of a batch continue: each row's tokens follow its prefix row's.

    ids / segment_ids: int32 [G, Lp], left-padded (segment 0 on padding; a row of padding only
    is an empty prefix); positions: int32 [G, Lp] or [3, G, Lp] (multimodal), the positions the
    tokens have in their whole sequences; index: int32 [B], the prefix row of each batch row.
    pixel_values [N, D] / image_grid: the prefix rows' images (None without any), or
    image_features: the same encoded by a frozen tower (the models' `image_features` input).
    """

    ids: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    index: jax.Array
    pixel_values: jax.Array | None = None
    image_grid: ImageGrid | None = struct.field(pytree_node=False, default=None)
    image_features: tuple | None = None

    def model_inputs(self) -> dict:
        return image_model_inputs(self.pixel_values, self.image_grid, self.image_features)


def prefixed_hidden_states(
    model, ids: jax.Array, segment_ids: jax.Array, positions: jax.Array, prefix: SharedPrefix, **model_inputs
) -> jax.Array:
    """Final hidden states [B, T] of rows that continue `prefix`'s rows: each prefix row runs
    through the model once (G rows, not B), and every batch row attends to its prefix row's keys
    and values (and, for a hybrid model, starts from its recurrent state) as a decoding cache.
    positions are the rows' positions in their whole sequences. The gradient reaching a prefix
    row is the sum over the rows that continue it, so the result and its gradients are those
    of the rows run whole."""
    g, lp = prefix.ids.shape
    cache = model.init_cache(g, lp)
    _, cache = model.hidden_states(
        prefix.ids, positions=prefix.positions, segment_ids=prefix.segment_ids, kv_cache=cache, **prefix.model_inputs()
    )
    cache = take_rows(cache, prefix.index, capacity=lp + ids.shape[1])
    hidden, _ = model.hidden_states(ids, positions=positions, segment_ids=segment_ids, kv_cache=cache, **model_inputs)
    return hidden


def score_sequences(
    model,
    ids: jax.Array,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    *,
    temperature: float = 1.0,
    seq_chunk: int = 256,
    vocab_chunk: int = 32768,
    banned_token_ids: tuple[int, ...] = (),
    unchunked_logits_bytes: int = UNCHUNKED_LOGITS_BYTES,
    prefix: SharedPrefix | None = None,
    **model_inputs,
) -> tuple[jax.Array, jax.Array]:
    """(logprobs, entropy) float32 [B, T] of `ids` int [B, T] under `model` (a DecoderLM
    with `hidden_states` and `output_projection`), aligned with ids (see module doc).

    segment_ids int [B, T] (0 = padding, several ids = packed sequences), positions and
    model_inputs (e.g. image inputs) go to the model's forward. banned_token_ids (static):
    the sampler's banned ids, left out of every softmax (module doc). unchunked_logits_bytes
    (static): see `token_logprobs_from_hidden`. prefix: the rows continue these prefix rows
    (`prefixed_hidden_states`; one sequence per row): position 0 of a row, whose prediction
    sits in its prefix, gets 0 like the first token of a sequence. Differentiable.
    """
    if segment_ids is None:
        segment_ids = jnp.ones(ids.shape, jnp.int32)
    if prefix is None:
        hidden, _ = model.hidden_states(ids, positions=positions, segment_ids=segment_ids, **model_inputs)
    else:
        hidden = prefixed_hidden_states(model, ids, segment_ids, positions, prefix, **model_inputs)
    logp, ent = token_logprobs_from_hidden(
        hidden[:, :-1],
        model.output_projection(),
        ids[:, 1:],
        temperature=temperature,
        seq_chunk=seq_chunk,
        vocab_chunk=vocab_chunk,
        banned_token_ids=banned_token_ids,
        unchunked_logits_bytes=unchunked_logits_bytes,
    )
    valid = (segment_ids[:, 1:] != 0) & (segment_ids[:, 1:] == segment_ids[:, :-1])
    zeros = jnp.zeros((ids.shape[0], 1), jnp.float32)
    logp = jnp.concatenate([zeros, jnp.where(valid, logp, 0.0)], axis=1)
    ent = jnp.concatenate([zeros, jnp.where(valid, ent, 0.0)], axis=1)
    return logp, ent


score_sequences_jit = nnx.jit(
    score_sequences, static_argnames=("seq_chunk", "vocab_chunk", "banned_token_ids", "unchunked_logits_bytes")
)
