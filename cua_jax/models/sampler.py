# Single job: sampling replies from a decoder (bucketed prefill and decode over a KV cache, prefix reuse).
"""A JAX sampler with a KV cache: prefill, then decode, static shapes by bucketing.

Prompts of different lengths are left-padded to a bucket length P (padding has segment
id 0 and is never attended), so every row writes the same cache slot at each decode
step. The batch is padded to a bucket size with empty rows, and the cache holds P + N
slots for N = the new-token budget rounded up to a bucket, so a handful of shapes
cover all calls and each compiles once. Images are encoded, prompts prefilled and replies
decoded by separate compiled programs (stages the profiler times: `cua_jax.observe.timeline`).

Cached prompts (`Sampler.sample` with a `PrefixCache`): a row may start from the keys and
values of a sequence computed before (a previous turn's prompt and reply, or a prompt part
the batch shares). The cache is sized to a prompt bucket of what it must hold; its last N + D
slots take the new tokens (left-padded) and the decoded ones, and each row's cached slots fill
the slots before them from the first (a shorter row leaves the rest empty): empty slots have
segment 0 and are never attended, and positions are given per token, so a row computes what
its unpadded prompt would. A hybrid model's rows also start from their
recurrent state, and padding before the new tokens leaves that state untouched.

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
  init_cache(batch, capacity, dtype=None) -> KVCache (or qwen3_5.HybridCache)
Qwen3ForCausalLM is one; Qwen3-VL plugs in its images through `prefill_extras`
(pixel inputs, multimodal positions [3, B, P]) or, on the cached path, through
`encode_images` and the `image_features` input — only the prefill sees images, decode
steps pass positions [B, 1] (text tokens: the same position on every RoPE axis).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cua_jax.models.cache_rows import CachedRows, compact_rows, fill_rows, has_recurrent_state
from cua_jax.models.layers import SharedPrefix
from cua_jax.models.qwen3_vl import image_features
from cua_jax.models.vision import ImageGrid, bucket_count, pad_image_count
from cua_jax.observe import timeline

# Prompt lengths pad up to the next bucket: steps of 1.5x and 2x alternate above 256, so a
# prompt pays at most ~1.5x its length (each bucket is one compiled program per batch bucket).
# The longest reach a 61k context (evaluation with YaRN, config.eval.rope_scaling).
DEFAULT_PROMPT_BUCKETS = (
    16,
    32,
    64,
    128,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
    12288,
    16384,
    24576,
    32768,
    49152,
    65536,
)
# Batch sizes pad to powers of two. A padding row costs a row's compute, but each size is one more
# compiled prefill and decode per prompt and cache bucket, and a multi-turn rollout's later turns
# come in every size (the episodes still running): fewer sizes, fewer compilations mid-run.
DEFAULT_BATCH_BUCKETS = tuple(2**i for i in range(9))
DEFAULT_NEW_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# A batch's shared prefixes (shared_prefix_attention) pad coarser: their count to a power of two,
# the rows continuing each to at least 8 (a GRPO group), their length to a power of two. A
# prefix costs its keys and values once per step, so padding them is cheap, while every further
# (count, rows, length) combination is one more compiled prefill and decode per batch shape.
PREFIX_COUNT_BUCKETS = tuple(2**i for i in range(9))
PREFIX_ROW_BUCKETS = tuple(2**i for i in range(3, 9))
PREFIX_LENGTH_BUCKETS = tuple(2**i for i in range(7, 17))


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


def sampling_log_probs(
    logits: jax.Array, temperature, top_p=1.0, *, top_k: int = 0, apply_top_p: bool = True
) -> jax.Array:
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
    key: jax.Array,
    logits: jax.Array,
    temperature,
    top_p,
    *,
    greedy: bool,
    top_k: int,
    apply_top_p: bool,
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


# ---------------------------------------------------------------------------------------------
# The compiled stages: image encoding, prefill (after cached rows), decode, cache compaction
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _encode_images(graphdef, state, pixel_values, grid):
    return nnx.merge(graphdef, state).encode_images(pixel_values, grid)


@functools.partial(jax.jit, static_argnames=("image_token_id",))
def _layout_images(ids, token_rows, tokens, deepstack, *, image_token_id):
    return image_features(ids, image_token_id, tokens[token_rows], tuple(d[token_rows] for d in deepstack))


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity", "cache_dtype"))
def _prefill(graphdef, state, ids, segment_ids, positions, model_inputs, cached, prefix, *, capacity: int, cache_dtype):
    """ids [B, N] (left-padded) prefilled after `cached` (CachedRows, or None) in a fresh cache of
    `capacity` slots, the rows of `prefix` ((kv [G, La, 2, P, K, D], lengths [G], members [G, R],
    slot [B]) as `SharedPrefix`, or None) continuing their shared prefix. Returns (cache, last
    logits [B, V], next text position [B])."""
    model = nnx.merge(graphdef, state)
    batch, length = ids.shape
    cache = model.init_cache(batch, capacity, cache_dtype)
    if cached is not None:
        cache = fill_rows(cache, cached)
    if prefix is not None:
        kv, lengths, members, slot = prefix
        layers = range(kv.shape[1])
        cache = cache.replace(
            prefix=SharedPrefix(
                tuple(kv[:, i, 0] for i in layers), tuple(kv[:, i, 1] for i in layers), lengths, members, slot
            )
        )
    hidden, cache = model.hidden_states(
        ids, positions=positions, segment_ids=segment_ids, kv_cache=cache, **model_inputs
    )
    # The next text position continues after the largest prompt position (for multimodal
    # positions too, where image tokens advance positions by less than one per token; the
    # prompt's last token, never an image's, holds it).
    next_pos = jnp.max(positions.reshape(-1, batch, length), axis=(0, 2)) + 1
    return cache, model.logits(hidden[:, -1]), next_pos


def _rows_where(rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """a where rows (bool [B]) else b, for arrays [B, ...]."""
    return jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b)


@functools.partial(
    jax.jit, static_argnames=("graphdef", "static", "new_token_bucket", "keep_final_state"), donate_argnames=("cache",)
)
def _decode(
    graphdef,
    state,
    cache,
    last_logits,
    next_pos,
    done,
    key,
    max_new_tokens,
    temperature,
    top_p,
    *,
    static: _StaticSampling,
    new_token_bucket: int,
    keep_final_state: bool,
):
    """Samples up to max_new_tokens tokens per row from the prefilled `cache`. Returns (tokens
    [B, bucket], logprobs [B, bucket], steps, cache). keep_final_state: a recurrent state is
    kept as it was after each row's last real token (stop token included), not after the
    steps other rows still ran."""
    model = nnx.merge(graphdef, state)
    batch = last_logits.shape[0]
    stop = jnp.asarray(static.stop_token_ids or (-1,), jnp.int32)
    tokens = jnp.zeros((batch, new_token_bucket), jnp.int32)
    logprobs = jnp.zeros((batch, new_token_bucket), jnp.float32)
    saved = (cache.conv_states, cache.recurrent_states) if keep_final_state else ()

    def cond(carry):
        step, done = carry[0], carry[6]
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, cache, last_logits, key, tokens, logprobs, done, next_pos, saved = carry
        if key.ndim == 1:  # one stream per row
            pairs = jax.vmap(jax.random.split)(key)
            key, sub = pairs[:, 0], pairs[:, 1]
        else:
            key, sub = jax.random.split(key)
        token, logp = sample_tokens(
            sub,
            last_logits,
            temperature,
            top_p,
            greedy=static.greedy,
            top_k=static.top_k,
            apply_top_p=static.apply_top_p,
            banned_token_ids=static.banned_token_ids,
        )
        finished = done  # rows that ended before this step: their token is padding
        token = jnp.where(done, 0, token)
        logp = jnp.where(done, 0.0, logp)
        tokens = tokens.at[:, step].set(token)
        logprobs = logprobs.at[:, step].set(logp)
        done = done | jnp.isin(token, stop)
        hidden, cache = model.hidden_states(
            token[:, None], positions=next_pos[:, None], segment_ids=jnp.ones((batch, 1), jnp.int32), kv_cache=cache
        )
        if saved:
            saved = jax.tree.map(
                lambda old, new: _rows_where(finished, old, new), saved, (cache.conv_states, cache.recurrent_states)
            )
        return step + 1, cache, model.logits(hidden[:, -1]), key, tokens, logprobs, done, next_pos + 1, saved

    carry = (jnp.zeros((), jnp.int32), cache, last_logits, key, tokens, logprobs, done, next_pos, saved)
    step, cache, _, _, tokens, logprobs, _, _, saved = jax.lax.while_loop(cond, body, carry)
    if saved:
        cache = cache.replace(conv_states=saved[0], recurrent_states=saved[1])
    return tokens, logprobs, step, cache


_compact = jax.jit(compact_rows)


def _fit_slots(kv: jax.Array, slots: int) -> jax.Array:
    """A cache entry's kv [La, 2, S, K, D] cut or padded (empty slots) to `slots` slots."""
    if kv.shape[2] >= slots:
        return kv[:, :, :slots]
    return jnp.pad(kv, ((0, 0), (0, 0), (0, slots - kv.shape[2]), (0, 0), (0, 0)))


# ---------------------------------------------------------------------------------------------
# Prompts as the cached path takes them, and the prefix cache
# ---------------------------------------------------------------------------------------------


def image_runs(ids: np.ndarray, image_token_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of `image_token_id` in ids int [P], in order."""
    on = np.concatenate([[0], (np.asarray(ids) == image_token_id).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(on))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


@dataclasses.dataclass(frozen=True)
class PromptImage:
    """One image of a prompt: its placeholder run [start, end) in the ids, its patch grid
    (t, h, w), a content key (equal keys mean equal patches) and its processed patches
    [t*h*w, D], computed only when the image has to be encoded."""

    start: int
    end: int
    grid: tuple[int, int, int]
    key: bytes
    patches: Callable[[], np.ndarray]


@dataclasses.dataclass(frozen=True)
class PromptInput:
    """A prompt for `Sampler.sample`: ids int32 [P]; positions int32 [P] or [3, P] (multimodal;
    None: 0 .. P-1); its images in placeholder order."""

    ids: np.ndarray
    positions: np.ndarray | None = None
    images: tuple[PromptImage, ...] = ()

    def runs(self, end: int) -> tuple[tuple[int, int, bytes], ...]:
        """(start, end, key) of the image runs inside ids[:end]."""
        return tuple((im.start, im.end, im.key) for im in self.images if im.end <= end)

    def positions_array(self) -> np.ndarray:
        if self.positions is not None:
            return np.asarray(self.positions, np.int32)
        return np.arange(len(self.ids), dtype=np.int32)


@dataclasses.dataclass(eq=False)
class CacheEntry:
    """The cached slots of one token sequence: tokens int32 [n] (what slots [0, n) hold), the
    image runs inside them ((start, end, key)), and the arrays: kv [La, 2, S, K, D] (S >= n
    slots, or None), conv / recurrent states after token n (hybrid models, else None).

    With a parent (a sequence decoded after a shared prefix, `Sampler(shared_prefix_attention=
    True)`), the first parent_length tokens' keys and values are the parent's, held once for all
    the rows that continued it, and kv holds the slots of tokens [parent_length, n) only."""

    tokens: np.ndarray
    images: tuple[tuple[int, int, bytes], ...]
    kv: jax.Array | None
    conv: jax.Array | None = None
    recurrent: jax.Array | None = None
    used: bool = False
    parent: CacheEntry | None = None
    parent_length: int = 0

    @property
    def slots(self) -> int:
        """The slots this entry's own arrays hold (a parent's are counted once, by the cache)."""
        return len(self.tokens) - self.parent_length if self.kv is None else int(self.kv.shape[2])


class PrefixCache:
    """A sampler's cached prompt prefixes, found by content (vLLM's automatic prefix caching, by
    whole sequences): after a generation each row's prompt + reply is kept, and a later prompt
    that begins with a kept sequence (a multi-turn episode's next turn: the previous context,
    the reply, the observation's diff) prefills only what follows it.

    A match is the longest common token prefix with a kept sequence, shortened so that every
    image run in it is whole and holds the same image (keys), and ending before the prompt's
    last token (whose logits start the reply). `exact`: a kept sequence serves only prompts
    that extend all of it (models with a recurrent state, which cannot be cut back).

    max_slots bounds the slots kept over all entries and the parents they hold on to (each once);
    past it, entries already matched go first (the episode moved on from them), oldest first, then
    the oldest. `clear()` drops everything:
    a cache holds one policy version's keys and values (the engine clears it on every weight
    update). Not thread-safe: the engine calls it under its lock.
    """

    def __init__(self, max_slots: int, exact: bool = False):
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.max_slots = int(max_slots)
        self.exact = exact
        self.entries: list[CacheEntry] = []

    @property
    def slots(self) -> int:
        held = {id(e): e for entry in self.entries for e in (entry, entry.parent) if e is not None}
        return sum(entry.slots for entry in held.values())

    def clear(self) -> None:
        self.entries = []

    def usable_length(self, entry: CacheEntry, prompt: PromptInput, limit: int) -> int:
        """How many of `prompt`'s first tokens (at most `limit`) `entry` holds (class doc)."""
        n = min(len(entry.tokens), limit)
        differs = np.flatnonzero(entry.tokens[:n] != prompt.ids[:n])
        m = int(differs[0]) if len(differs) else n
        runs = {(start, end): key for start, end, key in prompt.runs(len(prompt.ids))}
        for start, end, key in entry.images:
            if start >= m:
                break
            if end > m or runs.get((start, end)) != key:
                m = start
                break
        for start, end in runs:  # a prompt image cut by the match is encoded whole, after it
            if start < m < end:
                m = start
        if self.exact and m != len(entry.tokens):
            return 0
        return m

    def match(self, prompt: PromptInput, limit: int) -> tuple[CacheEntry | None, int]:
        """The entry holding most of prompt.ids[:limit] and how many tokens (None, 0 without one)."""
        best, length = None, 0
        for entry in self.entries:
            m = self.usable_length(entry, prompt, limit)
            if m > length or (m == length and m > 0):
                best, length = entry, m
        return best, length

    def add(self, entry: CacheEntry) -> None:
        self.entries.append(entry)
        while self.slots > self.max_slots and self.entries:
            victim = next((e for e in self.entries if e.used), self.entries[0])
            self.entries.remove(victim)


@dataclasses.dataclass
class _Row:
    """One prompt of a batch on the cached path: its target tokens (the prompt, or the prompt
    without its last token when only the shared part is prefilled) and its cache match."""

    prompt: PromptInput
    target: int
    entry: CacheEntry | None
    cached: int


class Sampler:
    """Samples continuations of token-id prompts from a `DecoderLM`.

    prompt/batch/new-token buckets bound the set of compiled shapes; cache_dtype defaults
    to the model's compute dtype. For a model sharded over a mesh, call `generate` inside
    `cua_jax.models.sharding.use_mesh(mesh)` so the cache and activations are sharded too.
    The model's current parameters are read at every call (weight updates need no rebuild).

    Two entry points: `generate` (token-id prompts, images through `prefill_extras`) and
    `sample` (`PromptInput`s), which can skip computing what was computed before: with a
    `PrefixCache`, a prompt continues a kept sequence's keys and values (incremental prefill
    across turns), and with share_prompts the part of a prompt that several prompts of the
    batch share is prefilled once and copied to each (a GRPO group's common first prompt,
    its screenshot encoded once). With shared_prefix_attention, rows of a batch that continue the
    same cached prefix (a group's members after its shared prompt) attend it as one shared
    prefix (`cua_jax.models.layers.prefix_attention`) instead of each holding a copy in its own
    cache rows: decoding reads a prefix's keys and values once per step, not once per member.
    Results equal the uncached ones up to float rounding. `stats` counts the work done.
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
        shared_prefix_attention: bool = False,
    ):
        self.model = model
        self.shared_prefix_attention = bool(shared_prefix_attention)
        self.prompt_buckets = tuple(sorted(prompt_buckets))
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.new_token_buckets = tuple(sorted(new_token_buckets))
        self.cache_dtype = cache_dtype
        self.pad_id = pad_id
        self.stats: collections.Counter = collections.Counter()

    # -- the plain path: token ids, images through prefill_extras --------------------------------

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
            ids[row, p - len(prompt) :] = np.asarray(prompt, np.int32)
            segments[row, p - len(prompt) :] = 1
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
        extras = dict(prefill_extras(ids, segments)) if prefill_extras is not None else {}
        positions = extras.pop("positions", None)
        if positions is None:
            positions = default_positions(segments)
        n_bucket = _bucket(params.max_new_tokens, self.new_token_buckets, "max_new_tokens")
        graphdef, state = nnx.split(self.model)
        with timeline.span("prefill"):
            cache, last_logits, next_pos = _prefill(
                graphdef,
                state,
                jnp.asarray(ids),
                jnp.asarray(segments),
                jnp.asarray(positions, jnp.int32),
                extras,
                None,
                None,
                capacity=ids.shape[1] + n_bucket,
                cache_dtype=self.cache_dtype,
            )
            timeline.settle(last_logits)
        self._count(prompt_tokens=int(segments.sum()), prefill_tokens=int(segments.sum()), prompts=len(prompts))
        done = jnp.asarray(segments.sum(axis=1) == 0)  # batch-padding rows are finished from the start
        out, _, _ = self._decode(
            cache,
            last_logits,
            next_pos,
            done,
            len(prompts),
            params,
            self._keys(key, row_seeds, len(prompts), ids.shape[0]),
            graphdef,
            state,
        )
        return out

    # -- shared pieces -------------------------------------------------------------------------

    def _count(self, **counts: int) -> None:
        for name, n in counts.items():
            self.stats[name] += n
            timeline.count("sampler/" + name, n)

    @staticmethod
    def _keys(key: jax.Array, row_seeds, n: int, batch: int) -> jax.Array:
        if row_seeds is None:
            return key
        if len(row_seeds) != n:
            raise ValueError(f"row_seeds has {len(row_seeds)} entries for {n} prompts")
        seeds = list(row_seeds) + [None] * (batch - n)
        return jnp.stack(
            [
                jax.random.fold_in(key, row) if seed is None else jax.random.key(int(seed))
                for row, seed in enumerate(seeds)
            ]
        )

    def _decode(
        self,
        cache,
        last_logits,
        next_pos,
        done,
        n: int,
        params: SamplingParams,
        key,
        graphdef,
        state,
        keep_final_state: bool = False,
    ):
        """Decodes from a prefilled cache; (SampleOutput of the first n rows, the cache, steps)."""
        n_bucket = _bucket(params.max_new_tokens, self.new_token_buckets, "max_new_tokens")
        stop_ids = tuple(int(t) for t in params.stop_token_ids)
        # One compiled program per bucket and filter kind: the token budget, temperature
        # and top_p travel as traced scalars.
        static = _StaticSampling(
            params.temperature == 0, params.top_k, params.top_p < 1.0, stop_ids, params.banned_token_ids
        )
        with timeline.span("decode"):
            tokens, logprobs, steps, cache = _decode(
                graphdef,
                state,
                cache,
                last_logits,
                next_pos,
                done,
                key,
                jnp.asarray(params.max_new_tokens, jnp.int32),
                jnp.asarray(max(params.temperature, 1e-6), jnp.float32),
                jnp.asarray(params.top_p, jnp.float32),
                static=static,
                new_token_bucket=n_bucket,
                keep_final_state=keep_final_state,
            )
            tokens, logprobs, steps = np.asarray(tokens), np.asarray(logprobs), int(steps)
        stops = set(stop_ids)
        out_tokens, out_logprobs, reasons = [], [], []
        for row in range(n):
            row_tokens = tokens[row, :steps]
            end, reason = len(row_tokens), "length"
            for i, t in enumerate(row_tokens):
                if int(t) in stops:
                    end, reason = i + 1, "stop"
                    break
            out_tokens.append(row_tokens[:end].copy())
            out_logprobs.append(logprobs[row, :end].copy())
            reasons.append(reason)
        self._count(generated_tokens=sum(len(t) for t in out_tokens), decode_steps=steps)
        return SampleOutput(out_tokens, out_logprobs, reasons), cache, steps

    # -- the cached path -----------------------------------------------------------------------

    def sample(
        self,
        prompts: Sequence[PromptInput],
        params: SamplingParams,
        key: jax.Array,
        *,
        row_seeds: Sequence[int | None] | None = None,
        cache: PrefixCache | None = None,
        share_prompts: bool = False,
    ) -> SampleOutput:
        """Samples one continuation per prompt (as `generate`; row_seeds likewise), computing
        only what `cache` does not hold (see the class doc). With `cache`, every row's prompt +
        reply is kept in it afterwards. share_prompts: rows whose prompts agree on all but their
        last token have that part prefilled once (kept in `cache`, or for this call only)."""
        if not prompts:
            raise ValueError("no prompts to sample from")
        for i, prompt in enumerate(prompts):
            if len(prompt.ids) == 0:
                raise ValueError(f"prompt {i} is empty")
        work = cache
        if work is None and share_prompts:
            work = PrefixCache(max_slots=2**62, exact=self.recurrent)
        graphdef, state = nnx.split(self.model)
        if share_prompts:
            self._prefill_shared(prompts, work, graphdef, state)
        rows = [
            _Row(p, len(p.ids), *(work.match(p, len(p.ids) - 1) if work is not None else (None, 0))) for p in prompts
        ]
        for row in rows:
            if row.entry is not None:
                row.entry.used = True
        self._count(
            prompts=len(rows), prompt_tokens=sum(len(p.ids) for p in prompts), cached_tokens=sum(r.cached for r in rows)
        )
        batch, prefilled, parents = self._prefill_rows(
            rows, graphdef, state, decode_tokens=params.max_new_tokens, share_images=share_prompts
        )
        keep = cache is not None and self.recurrent
        out, kv, _ = self._decode(
            *prefilled,
            len(rows),
            params,
            self._keys(key, row_seeds, len(rows), batch),
            graphdef,
            state,
            keep_final_state=keep,
        )
        if cache is not None:
            sequences = [np.concatenate([p.ids, t]).astype(np.int32) for p, t in zip(prompts, out.tokens)]
            self._keep(cache, kv, sequences, prompts, parents)
        return out

    @functools.cached_property
    def recurrent(self) -> bool:
        """Whether the model's cache rows carry a recurrent state (a `PrefixCache` of it is exact)."""
        return has_recurrent_state(jax.eval_shape(lambda: self.model.init_cache(1, 1, self.cache_dtype)))

    def _prefill_shared(self, prompts: Sequence[PromptInput], work: PrefixCache, graphdef, state) -> None:
        """Prefills once, into `work`, the all-but-last tokens that several prompts share and
        `work` does not hold yet (one representative each)."""
        groups: dict[tuple, list[int]] = collections.defaultdict(list)
        for i, prompt in enumerate(prompts):
            cut = len(prompt.ids) - 1
            if cut > 0:
                groups[(prompt.ids[:cut].tobytes(), prompt.runs(cut))].append(i)
        rows = []
        for members in groups.values():
            prompt = prompts[members[0]]
            cut = len(prompt.ids) - 1
            entry, cached = work.match(prompt, cut)
            if len(members) > 1 and cached < cut:
                if entry is not None:
                    entry.used = True
                rows.append(_Row(prompt, cut, entry, cached))
        if not rows:
            return
        self._count(shared_prompts=len(rows))
        _, (cache, _, _, _), parents = self._prefill_rows(rows, graphdef, state, decode_tokens=0, share_images=True)
        self._keep(work, cache, [r.prompt.ids[: r.target] for r in rows], [r.prompt for r in rows], parents)

    def _prefill_rows(self, rows: Sequence[_Row], graphdef, state, decode_tokens: int, share_images: bool):
        """Prefills each row's target[cached:] after its cached slots, in a cache with room for
        decode_tokens more. Returns (batch size, (cache, last logits, next positions, done), each
        row's shared prefix: (entry, length) or None)."""
        n = len(rows)
        batch = _bucket(n, self.batch_buckets, "batch size")
        new = [r.target - r.cached for r in rows]
        length = _bucket(max(new), self.prompt_buckets, "prompt length")
        groups = self._prefix_groups(rows) if self.shared_prefix_attention else []
        parents: list[tuple[CacheEntry, int] | None] = [None] * n
        for entry, prefix_length, members in groups:
            for b in members:
                parents[b] = (entry, prefix_length)
        # A row continuing a shared prefix holds only its cached slots after the prefix.
        own = [r.cached - (p[1] if p else 0) for r, p in zip(rows, parents)]
        cached = max(own)
        decode = _bucket(decode_tokens, self.new_token_buckets, "max_new_tokens") if decode_tokens else 0
        # The cache's size is a bucket of what it must hold; the cached rows get the slots before
        # the new tokens (empty where a row holds less). So the compiled prefill and decode depend
        # on (batch, new-token bucket, cache bucket), not on the cached length too.
        capacity = length + decode
        if cached:
            capacity = _bucket(cached + length + decode, self.prompt_buckets, "cache length")
        slots = capacity - length - decode
        multimodal = any(r.prompt.positions is not None and np.ndim(r.prompt.positions) == 2 for r in rows)
        ids = np.full((batch, length), self.pad_id, np.int32)
        segments = np.zeros((batch, length), np.int32)
        positions = np.zeros((3, batch, length) if multimodal else (batch, length), np.int32)
        for b, (row, k) in enumerate(zip(rows, new)):
            ids[b, length - k :] = row.prompt.ids[row.cached : row.target]
            segments[b, length - k :] = 1
            pos = row.prompt.positions_array()
            if multimodal and pos.ndim == 1:
                pos = np.broadcast_to(pos, (3, len(pos)))
            positions[..., b, length - k :] = pos[..., row.cached : row.target]
        model_inputs = self._image_inputs(rows, ids, graphdef, state, share_images)
        # A hybrid model's rows start from their entry's recurrent state, shared prefix or not.
        continuing = cached or (groups and self.recurrent)
        cached_rows = self._cached_rows(rows, batch, slots, own) if continuing else None
        prefix = self._shared_prefix(groups, batch) if groups else None
        if groups:
            self._count(shared_prefixes=len(groups), shared_prefix_rows=sum(p is not None for p in parents))
        self._count(prefill_tokens=sum(new), prefill_calls=1)
        with timeline.span("prefill"):
            cache, last_logits, next_pos = _prefill(
                graphdef,
                state,
                jnp.asarray(ids),
                jnp.asarray(segments),
                jnp.asarray(positions),
                model_inputs,
                cached_rows,
                prefix,
                capacity=capacity,
                cache_dtype=self.cache_dtype,
            )
            timeline.settle(last_logits)
        done = jnp.asarray(np.arange(batch) >= n)  # batch-padding rows are finished from the start
        return batch, (cache, last_logits, next_pos, done), parents

    def _image_inputs(
        self, rows: Sequence[_Row], ids: np.ndarray, graphdef, state, share_images: bool
    ) -> dict[str, Any]:
        """The `image_features` of the images in the rows' new tokens, encoded once per
        occurrence, or with share_images once per distinct image (by key) and placed at every
        run that shows it."""
        placed = [
            (b, im)
            for b, row in enumerate(rows)
            for im in row.prompt.images
            if row.cached <= im.start and im.end <= row.target
        ]
        if not placed:
            return {}
        if not hasattr(self.model, "encode_images"):
            raise ValueError(f"{type(self.model).__name__} is text-only; the prompts hold images")

        # Each distinct image once when prompts are shared (share_images); else each occurrence.
        unique: dict[Any, PromptImage] = {}
        for n, (_, im) in enumerate(placed):
            unique.setdefault(im.key if share_images else n, im)
        merge = self.model.config.vision.spatial_merge_size
        offsets, start = {}, 0
        for k, im in unique.items():
            offsets[k] = start
            t, h, w = im.grid
            start += t * (h // merge) * (w // merge)
        placed_keys = [im.key if share_images else n for n, (_, im) in enumerate(placed)]
        self._count(images=len(placed), images_encoded=len(unique))
        with timeline.span("vision"):
            patches = [np.asarray(im.patches(), np.float32) for im in unique.values()]
            grids = [tuple(int(x) for x in im.grid) for im in unique.values()]
            pad_image_count(patches, grids)
            tokens, deepstack = _encode_images(
                graphdef, state, jnp.asarray(np.concatenate(patches)), ImageGrid(tuple(grids))
            )
            # Row-major over the padded ids: rows in order, runs left to right.
            order = sorted(range(len(placed)), key=lambda n: (placed[n][0], placed[n][1].start))
            token_rows = np.concatenate(
                [offsets[placed_keys[n]] + np.arange(placed[n][1].end - placed[n][1].start) for n in order]
            )
            token_rows = np.pad(token_rows, (0, bucket_count(len(token_rows)) - len(token_rows)))
            features = _layout_images(
                jnp.asarray(ids),
                jnp.asarray(token_rows, jnp.int32),
                tokens,
                deepstack,
                image_token_id=int(self.model.config.image_token_id),
            )
            timeline.settle(features)
        return {"image_features": features}

    def _prefix_groups(self, rows: Sequence[_Row]) -> list[tuple[CacheEntry, int, list[int]]]:
        """(entry, length, rows) for each shared prefix the rows continue: an entry's parent (up to
        its parent_length), and an entry without one that several rows continue (up to what they use)."""
        by_prefix: dict[tuple[int, int], tuple[CacheEntry, list[int]]] = {}
        for b, row in enumerate(rows):
            entry = row.entry
            if entry is None or not row.cached or entry.kv is None:
                continue
            prefix, length = (
                (entry.parent, min(entry.parent_length, row.cached)) if entry.parent else (entry, row.cached)
            )
            by_prefix.setdefault((id(prefix), length), (prefix, []))[1].append(b)
        return [
            (prefix, length, members)
            for (_, length), (prefix, members) in by_prefix.items()
            if len(members) > 1 or rows[members[0]].entry.parent is not None
        ]

    def _shared_prefix(self, groups: Sequence[tuple[CacheEntry, int, list[int]]], batch: int):
        """`_prefill`'s prefix: (kv [G, La, 2, P, K, D], lengths [G], members [G, R], slot [batch])."""
        g = _bucket(len(groups), PREFIX_COUNT_BUCKETS, "shared prefixes")
        r = _bucket(max(len(members) for _, _, members in groups), PREFIX_ROW_BUCKETS, "rows per prefix")
        p = _bucket(max(length for _, length, _ in groups), PREFIX_LENGTH_BUCKETS, "shared prefix length")
        kv = [_fit_slots(entry.kv, p) for entry, _, _ in groups]
        kv = jnp.stack(kv + [jnp.zeros_like(kv[0])] * (g - len(groups)))
        lengths = np.zeros(g, np.int32)
        members = np.full((g, r), -1, np.int32)
        slot = np.full(batch, -1, np.int32)
        for i, (_, length, rows) in enumerate(groups):
            lengths[i] = length
            members[i, : len(rows)] = rows
            slot[rows] = i * r + np.arange(len(rows))
        return kv, jnp.asarray(lengths), jnp.asarray(members), jnp.asarray(slot)

    def _cached_rows(self, rows: Sequence[_Row], batch: int, slots: int, own: Sequence[int]) -> CachedRows:
        """The rows' matched entries as CachedRows of `slots` slots, each row's first own[b] of them
        (the slots an entry holds itself: after its parent's; 0: none; empty rows: nothing
        cached); None for kv when slots is 0."""
        template = next(r.entry for r in rows if r.entry is not None)
        kv = None
        if template.kv is not None and slots:
            empty = jnp.zeros(_fit_slots(template.kv, slots).shape, template.kv.dtype)
            kv = jnp.stack(
                [_fit_slots(rows[b].entry.kv, slots) if b < len(rows) and own[b] else empty for b in range(batch)]
            )
        conv = recurrent = None
        if template.conv is not None:
            zero_conv, zero_rec = jnp.zeros_like(template.conv), jnp.zeros_like(template.recurrent)
            entries = [rows[b].entry if b < len(rows) else None for b in range(batch)]
            conv = jnp.stack([e.conv if e is not None else zero_conv for e in entries])
            recurrent = jnp.stack([e.recurrent if e is not None else zero_rec for e in entries])
        lengths = np.zeros(batch, np.int32)
        lengths[: len(rows)] = own
        return CachedRows(kv, jnp.asarray(lengths), conv, recurrent)

    def _keep(
        self,
        cache: PrefixCache,
        kv,
        sequences: Sequence[np.ndarray],
        prompts: Sequence[PromptInput],
        parents: Sequence[tuple[CacheEntry, int] | None],
    ) -> None:
        """Adds each row's sequence to `cache`: its occupied slots of `kv`, which follow its shared
        prefix (parents[b]: (entry, length), the new entry's parent) where it continued one."""
        compact = _compact(kv)
        capacity = kv.segment_ids.shape[1]
        for b, (tokens, prompt, parent) in enumerate(zip(sequences, prompts, parents)):
            parent_entry, parent_length = parent or (None, 0)
            own = len(tokens) - parent_length
            slots = min(_bucket(own, self.prompt_buckets, "cached sequence length"), capacity)
            cache.add(
                CacheEntry(
                    tokens=np.asarray(tokens, np.int32),
                    images=prompt.runs(len(tokens)),
                    kv=None if compact.kv is None else compact.kv[b, :, :, :slots],
                    conv=None if compact.conv is None else compact.conv[b],
                    recurrent=None if compact.recurrent is None else compact.recurrent[b],
                    parent=parent_entry,
                    parent_length=parent_length,
                )
            )
