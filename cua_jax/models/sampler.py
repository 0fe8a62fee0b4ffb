"""A JAX sampler with a KV cache: prefill + decode under one jit, static shapes by bucketing.

Prompts of different lengths are left-padded to a bucket length P (padding has segment
id 0 and is never attended), so every row writes the same cache slot at each decode
step. The batch is padded to a bucket size with empty rows, and the cache holds P + N
slots for N = the new-token budget rounded up to a bucket, so a handful of shapes
cover all calls and each compiles once.

Reported logprobs: the log-probability of each sampled token under the distribution
it was actually drawn from, i.e. softmax(logits / temperature) restricted to the top-k
and then the top-p nucleus and renormalised. With temperature == 0 (greedy) the token
is the argmax and its logprob is taken under the plain model distribution
(temperature 1, no filtering), which is what a learner scoring at temperature 1 sees.

Randomness: one key per call, from which the whole batch draws; or, with `row_seeds`, one
stream per prompt (`jax.random.key(seed)` split once per decode step), so a seeded prompt
draws the same random numbers whatever batch it shares and wherever it sits in it.

Banned tokens (`SamplingParams.banned_token_ids`, e.g. the vision placeholders a reply must
never hold) get logit -inf before anything else, so they are never sampled and every
logprob above is taken under the distribution renormalised over the allowed tokens; a
learner compares against it by scoring with the same ids banned
(`cua_jax.models.scoring.score_sequences(..., banned_token_ids=...)`).

The model interface (`DecoderLM`): any NNX module with
  hidden_states(input_ids, *, positions, segment_ids, kv_cache, **extras) -> (hidden [B, T, E], cache)
  logits(hidden [..., E]) -> float32 [..., V]
  output_projection() -> [E, V]   (used by cua_jax.models.scoring)
  init_cache(batch, capacity, dtype=None) -> KVCache
Qwen3ForCausalLM is one; Qwen3-VL plugs in its images through `prefill_extras`
(pixel inputs, multimodal positions [3, B, P]) — only the prefill sees extras, decode
steps pass positions [B, 1] (text tokens: the same position on every RoPE axis).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Prompt lengths pad up to the next bucket: steps of 1.5x and 2x alternate above 256, so a
# prompt pays at most ~1.5x its length (each bucket is one compiled program per batch bucket).
DEFAULT_PROMPT_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
                          16384, 24576, 32768)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_NEW_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class DecoderLM(Protocol):
    def hidden_states(self, input_ids=None, **kwargs) -> tuple[jax.Array, Any]: ...

    def logits(self, hidden: jax.Array) -> jax.Array: ...

    def output_projection(self) -> jax.Array: ...

    def init_cache(self, batch: int, capacity: int, dtype=None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off. Generation stops at any of
    `stop_token_ids` (the stop token is included in the output) or after max_new_tokens.
    banned_token_ids are never sampled (see the module doc); kept sorted and unique."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    banned_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "banned_token_ids", normalized_token_ids(self.banned_token_ids, "banned_token_ids"))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass
class SampleOutput:
    """Per prompt: sampled ids int32 [R], their logprobs float32 [R], and why it ended
    ("stop": a stop token, included in `tokens`; "length": max_new_tokens)."""

    tokens: list[np.ndarray]
    logprobs: list[np.ndarray]
    finish_reasons: list[str]


def normalized_token_ids(ids, what: str) -> tuple[int, ...]:
    """`ids` (any iterable of integers) as a sorted tuple of unique non-negative ints."""
    ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{what} must be integer token ids, got {ids.dtype}")
    if (ids < 0).any():
        raise ValueError(f"{what} must be non-negative token ids, got {sorted(int(t) for t in ids[ids < 0])}")
    return tuple(sorted({int(t) for t in ids}))


def ban_tokens(logits: jax.Array, banned_token_ids: tuple[int, ...] | jax.Array) -> jax.Array:
    """logits [..., V] with the columns `banned_token_ids` set to -inf.

    banned_token_ids: a static tuple (checked to lie in [0, V)) or an int array [N] (may be
    traced; ids outside [0, V) are dropped, so check them beforehand).
    """
    if isinstance(banned_token_ids, tuple):
        if not banned_token_ids:
            return logits
        if min(banned_token_ids) < 0 or max(banned_token_ids) >= logits.shape[-1]:
            raise ValueError(f"banned token ids {banned_token_ids} are outside the vocabulary [0, {logits.shape[-1]})")
    ids = jnp.asarray(banned_token_ids, jnp.int32)
    return logits.at[..., ids].set(-jnp.inf, mode="drop")


def sampling_log_probs(logits: jax.Array, temperature, top_p=1.0, *, top_k: int = 0, apply_top_p: bool = True) -> jax.Array:
    """Log-probabilities [B, V] of the distribution sampled from: softmax(logits / T)
    over the top_k largest logits (ties at the k-th kept), then over the smallest set of
    most probable tokens whose mass reaches top_p; -inf elsewhere.

    logits float [B, V]; temperature > 0 and top_p in (0, 1] may be traced scalars;
    top_k (0 = off) and apply_top_p (False skips the sort) are static.
    """
    scaled = logits.astype(jnp.float32) / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if apply_top_p:
        probs = jax.nn.softmax(scaled, axis=-1)
        order = jnp.argsort(-scaled, axis=-1)
        sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < top_p  # the most probable token always stays
        keep = jnp.zeros_like(keep_sorted).at[jnp.arange(scaled.shape[0])[:, None], order].set(keep_sorted)
        scaled = jnp.where(keep, scaled, -jnp.inf)
    return jax.nn.log_softmax(scaled, axis=-1)


@dataclasses.dataclass(frozen=True)
class _StaticSampling:
    """The parts of SamplingParams that change the compiled program."""

    greedy: bool
    top_k: int
    apply_top_p: bool
    stop_token_ids: tuple[int, ...]
    banned_token_ids: tuple[int, ...] = ()


def sample_tokens(
    key: jax.Array, logits: jax.Array, temperature, top_p, *, greedy: bool, top_k: int, apply_top_p: bool,
    banned_token_ids: tuple[int, ...] | jax.Array = (),
) -> tuple[jax.Array, jax.Array]:
    """(token int32 [B], its logprob float32 [B]) for logits [B, V] (see module doc);
    banned_token_ids (`ban_tokens`) are masked out first. key: one key for the batch, or
    keys [B] (one per row: row b's token depends on keys[b] and its own logits only)."""
    logits = ban_tokens(logits, banned_token_ids)
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    else:
        logp = sampling_log_probs(logits, temperature, top_p, top_k=top_k, apply_top_p=apply_top_p)
        if key.ndim == 1:
            token = jax.vmap(jax.random.categorical)(key, logp).astype(jnp.int32)
        else:
            token = jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def _bucket(n: int, buckets: Sequence[int], what: str) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{what} {n} exceeds the largest bucket {buckets[-1]}")


def default_positions(segment_ids: np.ndarray) -> np.ndarray:
    """Text positions [B, P] for left-padded rows: 0, 1, ... over the real tokens, 0 on padding."""
    return np.maximum(np.cumsum(segment_ids != 0, axis=1) - 1, 0).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "new_token_bucket", "cache_dtype"))
def _generate(
    graphdef, state, ids, segment_ids, positions, extras, key, max_new_tokens, temperature, top_p,
    *, static: _StaticSampling, new_token_bucket: int, cache_dtype,
):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = ids.shape
    cache = model.init_cache(batch, prompt_len + new_token_bucket, cache_dtype)
    hidden, cache = model.hidden_states(ids, positions=positions, segment_ids=segment_ids, kv_cache=cache, **extras)
    last_logits = model.logits(hidden[:, -1])
    # The next text position continues after the largest prompt position (for multimodal
    # positions too, where image tokens advance positions by less than one per token).
    next_pos = jnp.max(positions.reshape(-1, batch, prompt_len), axis=(0, 2)) + 1
    stop = jnp.asarray(static.stop_token_ids or (-1,), jnp.int32)
    done = jnp.all(segment_ids == 0, axis=1)  # batch-padding rows are finished from the start
    tokens = jnp.zeros((batch, new_token_bucket), jnp.int32)
    logprobs = jnp.zeros((batch, new_token_bucket), jnp.float32)

    def cond(carry):
        step, _, _, _, _, _, done, _ = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, cache, last_logits, key, tokens, logprobs, done, next_pos = carry
        if key.ndim == 1:  # one stream per row
            pairs = jax.vmap(jax.random.split)(key)
            key, sub = pairs[:, 0], pairs[:, 1]
        else:
            key, sub = jax.random.split(key)
        token, logp = sample_tokens(
            sub, last_logits, temperature, top_p,
            greedy=static.greedy, top_k=static.top_k, apply_top_p=static.apply_top_p,
            banned_token_ids=static.banned_token_ids,
        )
        token = jnp.where(done, 0, token)
        logp = jnp.where(done, 0.0, logp)
        tokens = tokens.at[:, step].set(token)
        logprobs = logprobs.at[:, step].set(logp)
        done = done | jnp.isin(token, stop)
        hidden, cache = model.hidden_states(
            token[:, None], positions=next_pos[:, None], segment_ids=jnp.ones((batch, 1), jnp.int32), kv_cache=cache
        )
        return step + 1, cache, model.logits(hidden[:, -1]), key, tokens, logprobs, done, next_pos + 1

    carry = (jnp.zeros((), jnp.int32), cache, last_logits, key, tokens, logprobs, done, next_pos)
    step, _, _, _, tokens, logprobs, _, _ = jax.lax.while_loop(cond, body, carry)
    return tokens, logprobs, step


class Sampler:
    """Samples continuations of token-id prompts from a `DecoderLM`.

    prompt/batch/new-token buckets bound the set of compiled shapes; cache_dtype defaults
    to the model's compute dtype. For a model sharded over a mesh, call `generate` inside
    `cua_jax.models.sharding.use_mesh(mesh)` so the cache and activations are sharded too.
    The model's current parameters are read at every call (weight updates need no rebuild).
    """

    def __init__(
        self,
        model: DecoderLM,
        *,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        new_token_buckets: Sequence[int] = DEFAULT_NEW_TOKEN_BUCKETS,
        cache_dtype=None,
        pad_id: int = 0,
    ):
        self.model = model
        self.prompt_buckets = tuple(sorted(prompt_buckets))
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.new_token_buckets = tuple(sorted(new_token_buckets))
        self.cache_dtype = cache_dtype
        self.pad_id = pad_id

    def pad_prompts(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded ids and segment ids, int32 [batch bucket, prompt bucket]."""
        if not prompts:
            raise ValueError("no prompts to sample from")
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError(f"prompt {lengths.index(0)} is empty")
        p = _bucket(max(lengths), self.prompt_buckets, "prompt length")
        b = _bucket(len(prompts), self.batch_buckets, "batch size")
        ids = np.full((b, p), self.pad_id, np.int32)
        segments = np.zeros((b, p), np.int32)
        for row, prompt in enumerate(prompts):
            ids[row, p - len(prompt):] = np.asarray(prompt, np.int32)
            segments[row, p - len(prompt):] = 1
        return ids, segments

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        key: jax.Array,
        *,
        prefill_extras: Callable[[np.ndarray, np.ndarray], dict[str, Any]] | None = None,
        row_seeds: Sequence[int | None] | None = None,
    ) -> SampleOutput:
        """Samples one continuation per prompt.

        prefill_extras(padded_ids, segment_ids) -> dict of extra model inputs for the
        prefill (arrays laid out over the padded [B, P] prompt); a "positions" entry
        replaces the default text positions (e.g. [3, B, P] multimodal positions).
        row_seeds: one entry per prompt; a prompt with a seed samples from its own stream
        `jax.random.key(seed)`, one without from `jax.random.fold_in(key, row)` (see the
        module doc). None: the batch draws from `key`.
        """
        ids, segments = self.pad_prompts(prompts)
        if row_seeds is not None:
            if len(row_seeds) != len(prompts):
                raise ValueError(f"row_seeds has {len(row_seeds)} entries for {len(prompts)} prompts")
            seeds = list(row_seeds) + [None] * (ids.shape[0] - len(prompts))
            key = jnp.stack([jax.random.fold_in(key, row) if seed is None else jax.random.key(int(seed))
                             for row, seed in enumerate(seeds)])
        extras = dict(prefill_extras(ids, segments)) if prefill_extras is not None else {}
        positions = extras.pop("positions", None)
        if positions is None:
            positions = default_positions(segments)
        n_bucket = _bucket(params.max_new_tokens, self.new_token_buckets, "max_new_tokens")
        stop_ids = tuple(int(t) for t in params.stop_token_ids)
        # One compiled program per bucket and filter kind: the token budget, temperature
        # and top_p travel as traced scalars.
        static = _StaticSampling(
            params.temperature == 0, params.top_k, params.top_p < 1.0, stop_ids, params.banned_token_ids
        )
        graphdef, state = nnx.split(self.model)
        tokens, logprobs, steps = _generate(
            graphdef,
            state,
            jnp.asarray(ids),
            jnp.asarray(segments),
            jnp.asarray(positions, jnp.int32),
            extras,
            key,
            jnp.asarray(params.max_new_tokens, jnp.int32),
            jnp.asarray(max(params.temperature, 1e-6), jnp.float32),
            jnp.asarray(params.top_p, jnp.float32),
            static=static,
            new_token_bucket=n_bucket,
            cache_dtype=self.cache_dtype,
        )
        tokens, logprobs, steps = np.asarray(tokens), np.asarray(logprobs), int(steps)
        stops = set(stop_ids)
        out_tokens, out_logprobs, reasons = [], [], []
        for row in range(len(prompts)):
            row_tokens = tokens[row, :steps]
            end, reason = len(row_tokens), "length"
            for i, t in enumerate(row_tokens):
                if int(t) in stops:
                    end, reason = i + 1, "stop"
                    break
            out_tokens.append(row_tokens[:end].copy())
            out_logprobs.append(logprobs[row, :end].copy())
            reasons.append(reason)
        return SampleOutput(out_tokens, out_logprobs, reasons)
