"""Work done once, results unchanged: the sampler's shared prompts and prefix cache, and the
learner's shared prefix rows, against the full recomputation, for Qwen3, Qwen3-VL and Qwen3.5.

Sampler: seeded requests (every row its own stream) give the same tokens, and logprobs within
1e-5, whether a group's common prompt is prefilled once and an episode's earlier turns come
from the cache or everything is recomputed; over three turns, the third re-rendering earlier
tokens (a sliding window dropping a screenshot). Learner: per-token logprobs within 1e-5 and
gradients with max|dg| <= 1e-5 max|g| per tensor, for the policy-gradient loss (with the KL
reference and recomputed old logprobs) and the supervised loss, with a group's rows split over
micro-batches. The pieces under them: the cached-row layout, the conv window and delta rule
under left padding, the cache's matching rules, `shared_prefix_length`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.gated_deltanet import causal_conv1d
from cua_jax.models.sampler import CacheEntry, PrefixCache, PromptInput
from cua_jax.rl.losses import PolicyLossConfig
from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from cua_jax.train.batching import BatchingConfig, MultimodalPositions, make_minibatches, shared_prefix_length
from cua_jax.train.learner import Learner, LearnerConfig
from cua_jax.types import ImageSpan, TrainingItem

LOGPROB_ATOL = 1e-5
GRAD_RTOL = 1e-5
# Few buckets: few compiled shapes (compilation is most of these tests' time).
BUCKETS = dict(prompt_buckets=(32, 128, 256), batch_buckets=(8,), new_token_buckets=(8,))
# Gated DeltaNet's decay parameters: their gradient sums per-token terms that cancel to ~1e-3
# of their size, and the chunked delta rule rounds each term to ~1e-6 relative (whichever way
# a sequence is cut into chunks: `test_the_chunked_delta_rule_continues_exactly_from_a_carried_state`),
# so cutting a row into prefix and rest moves them by up to ~1e-3 of their largest entry.
DECAY_PARAMETERS = ("A_log", "dt_bias", "in_proj_a")
DECAY_RTOL = 2e-3


# ---------------------------------------------------------------------------------------------
# Models: text, vision-language, hybrid (all with the shipped tiny tokenizer's vocabulary)
# ---------------------------------------------------------------------------------------------


def _sharpen(norm):
    norm.weight[...] = norm.weight[...] * 6.0  # peaked next-token distributions: sampling is not a coin toss


@pytest.fixture(scope="module")
def processor():
    from cua_jax.context.tokenizer import load_processor

    return load_processor()[1]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_vl", "qwen3_5"])
def policy(request):
    """The smallest model of each kind (compilation is most of these tests' time): one text layer
    (Qwen3.5: one linear and one full-attention layer, chunks of 16), a one-block vision tower."""
    from cua_jax.context.tokenizer import VOCAB_SIZE
    from cua_jax.models.vision import VisionConfig

    vision = dict(
        depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128, num_position_embeddings=256
    )
    if request.param == "qwen3":
        from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config

        model = Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=VOCAB_SIZE, num_hidden_layers=1), rngs=nnx.Rngs(0))
        _sharpen(model.model.norm)
    elif request.param == "qwen3_vl":
        from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

        base = tiny_qwen3_vl_config()
        config = dataclasses.replace(
            base,
            text=dataclasses.replace(base.text, num_hidden_layers=1),
            vision=VisionConfig(**vision, deepstack_visual_indexes=(0,)),
        )
        model = Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0))
        _sharpen(model.language_model.model.norm)
    else:
        from cua_jax.models.qwen3_5 import Qwen3_5ForConditionalGeneration, tiny_qwen3_5_config

        config = dataclasses.replace(
            tiny_qwen3_5_config(num_hidden_layers=2, layer_types=("linear_attention", "full_attention"), chunk_size=16),
            vision=VisionConfig(**vision, deepstack_visual_indexes=()),
        )
        model = Qwen3_5ForConditionalGeneration(config, rngs=nnx.Rngs(0))
        _sharpen(model.language_model.model.norm)
    return request.param, model


class Prompts:
    """Token-id prompts for a model kind: text tokens, and (vision-language) a 32 x 48 screenshot run."""

    def __init__(self, kind: str, processor):
        from cua_jax.context.tokenizer import image_grid_thw, load_processor, merged_token_count, special_token_ids

        tokenizer = load_processor()[0]  # the shipped tiny pair: its special ids
        special = special_token_ids(tokenizer)
        self.images = kind != "qwen3"
        self.grid = image_grid_thw(processor, 32, 48)
        self.run = (
            [special["<|vision_start|>"]]
            + [special["<|image_pad|>"]] * merged_token_count(self.grid, 2)
            + [special["<|vision_end|>"]]
        )
        self.rng = np.random.default_rng(0)

    def text(self, n: int) -> list[int]:
        return [int(x) for x in self.rng.integers(10, 3000, n)]

    def image(self) -> np.ndarray:
        return self.rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)

    def observation(self, n: int) -> tuple[list[int], list[np.ndarray]]:
        """n text tokens, then a screenshot when the model takes images."""
        if not self.images:
            return self.text(n), []
        return self.text(n) + self.run + self.text(2), [self.image()]


# ---------------------------------------------------------------------------------------------
# Sampler: shared prompts and the prefix cache
# ---------------------------------------------------------------------------------------------


def _engines(model, processor):
    """Recomputing everything; sharing prompts and caching turns; and the same with a shared
    prefix attended once by the rows continuing it (shared_prefix_attention)."""
    plain = JaxSamplerEngine(nnx.clone(model), image_processor=processor, **BUCKETS)
    fast, cascade = (
        JaxSamplerEngine(
            nnx.clone(model),
            image_processor=processor,
            share_prompts=True,
            prefix_cache_tokens=4096,
            shared_prefix_attention=shared,
            **BUCKETS,
        )
        for shared in (False, True)
    )
    return plain, fast, cascade


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=LOGPROB_ATOL, rtol=0)


def test_shared_prompts_and_cached_turns_sample_what_recomputation_samples(policy, processor):
    kind, model = policy
    plain, fast, cascade = _engines(model, processor)
    make = Prompts(kind, processor)
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    # Two groups (a shared first prompt each) and a lone prompt; every row its own seed.
    firsts = []
    for size in (3, 2, 1):
        ids, images = make.observation(20)
        firsts += [(ids, images)] * size
    requests = [
        GenerationRequest(np.asarray(ids, np.int32), list(images), seed=100 + i)
        for i, (ids, images) in enumerate(firsts)
    ]
    turn1 = plain.generate(requests, sampling)
    _same(turn1, fast.generate(requests, sampling))
    _same(turn1, cascade.generate(requests, sampling))
    stats = fast.stats()
    assert stats["shared_prompts"] == 2 and stats["cached_tokens"] > 0
    # The cascade engine's two groups decode over their prompt held once, not copied per row.
    assert cascade.stats()["shared_prefixes"] == 2 and cascade.stats()["shared_prefix_rows"] == 5
    if make.images:
        assert stats["images_encoded"] < stats["images"] + 6  # each group's screenshot once

    # Turn 2 continues each row (prompt + reply + a new observation): only the new tokens prefill.
    second = []
    for request, reply in zip(requests, turn1):
        obs, images = make.observation(5)
        ids = np.concatenate([request.prompt_ids, reply.token_ids, [7, 8], obs]).astype(np.int32)
        second.append(GenerationRequest(ids, request.images + images, seed=request.seed + 1))
    before = fast.stats()
    turn2 = plain.generate(second, sampling)
    _same(turn2, fast.generate(second, sampling))
    _same(turn2, cascade.generate(second, sampling))
    after = fast.stats()
    # Each row's turn was kept whole (its prefix's slots first), so turn 2 prefilled as little.
    assert cascade.stats()["prefill_tokens"] == after["prefill_tokens"]
    new = after["prefill_tokens"] - before["prefill_tokens"]
    assert new < sum(len(r.prompt_ids) for r in second) / 2

    # Turn 3 drops the first observation's tokens (a sliding window re-rendering the history):
    # the cache serves only what is unchanged, the rest is recomputed, the samples still agree.
    third = []
    for request, reply in zip(second, turn2):
        ids = np.concatenate(
            [request.prompt_ids[:4], request.prompt_ids[len(firsts[0][0]) :], reply.token_ids, [9]]
        ).astype(np.int32)
        third.append(GenerationRequest(ids, request.images[1:], seed=request.seed + 1))
    turn3 = plain.generate(third, sampling)
    _same(turn3, fast.generate(third, sampling))
    _same(turn3, cascade.generate(third, sampling))


def test_a_weight_update_empties_the_cache_and_the_next_samples_follow_the_new_weights(processor):
    from tests.rollout.conftest import perturbed, sharpened_tiny_qwen3

    model = sharpened_tiny_qwen3()
    fast = JaxSamplerEngine(nnx.clone(model), share_prompts=True, prefix_cache_tokens=4096, **BUCKETS)
    requests = [GenerationRequest(np.arange(10, 30, dtype=np.int32), seed=s) for s in (1, 2)]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    fast.generate(requests, sampling)
    assert fast.stats()["cache_entries"] > 0
    new = perturbed(model, seed=3)
    fast.update_weights(nnx.state(new), version=1)
    assert fast.stats()["cache_entries"] == 0
    fresh = JaxSamplerEngine(new, **BUCKETS)
    _same(fresh.generate(requests, sampling), fast.generate(requests, sampling))


def test_a_seeded_row_samples_the_same_whatever_else_shares_its_batch():
    from tests.rollout.conftest import sharpened_tiny_qwen3

    model = sharpened_tiny_qwen3()
    prompt = np.arange(10, 40, dtype=np.int32)
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    alone = JaxSamplerEngine(nnx.clone(model), share_prompts=True, prefix_cache_tokens=4096, **BUCKETS)
    crowded = JaxSamplerEngine(nnx.clone(model), share_prompts=True, prefix_cache_tokens=4096, **BUCKETS)
    mine = GenerationRequest(prompt, seed=7)
    others = [GenerationRequest(prompt, seed=8), GenerationRequest(np.arange(50, 61, dtype=np.int32), seed=9)]
    _same(alone.generate([mine], sampling), crowded.generate(others[:1] + [mine] + others[1:], sampling)[1:2])


def _entry(tokens, images=()):
    return CacheEntry(np.asarray(tokens, np.int32), tuple(images), kv=None)


def test_a_cache_match_keeps_image_runs_whole_and_ends_before_the_last_token():
    cache = PrefixCache(max_slots=1000)
    entry = _entry([1, 2, 9, 9, 9, 3, 4], images=[(2, 5, b"a")])
    cache.add(entry)
    same = PromptInput(np.array([1, 2, 9, 9, 9, 3, 4, 5], np.int32), images=_images([(2, 5, b"a")]))
    assert cache.match(same, len(same.ids) - 1) == (entry, 7)
    other_image = PromptInput(same.ids, images=_images([(2, 5, b"b")]))
    assert cache.match(other_image, 7) == (entry, 2)  # up to the image that differs
    # The prompt's own image run is cut by the common prefix: the match stops before it.
    longer_run = PromptInput(np.array([1, 2, 9, 9, 9, 9, 4], np.int32), images=_images([(2, 6, b"a")]))
    assert cache.match(longer_run, 6)[1] == 2
    assert cache.match(PromptInput(np.array([1, 2, 9], np.int32)), 2)[1] == 2  # never the last token
    exact = PrefixCache(max_slots=1000, exact=True)
    exact.add(entry)
    assert exact.match(
        PromptInput(np.array([1, 2, 9, 9, 9, 3, 5, 6], np.int32), images=_images([(2, 5, b"a")])), 7
    ) == (None, 0)  # a recurrent state cannot be cut back


def test_the_cache_evicts_entries_already_matched_first_then_the_oldest():
    cache = PrefixCache(max_slots=10)
    a, b, c = _entry([1, 2, 3, 4]), _entry([5, 6, 7, 8]), _entry([9, 10, 11, 12])
    cache.add(a)
    cache.add(b)
    b.used = True
    cache.add(c)
    assert cache.entries == [a, c]
    cache.add(_entry([13, 14, 15]))
    assert cache.entries[0] is c


def test_a_parent_counts_once_and_while_an_entry_holds_on_to_it():
    cache = PrefixCache(max_slots=10)
    prompt = _entry([1, 2, 3, 4])
    children = [
        CacheEntry(np.asarray([1, 2, 3, 4] + tail, np.int32), (), kv=None, parent=prompt, parent_length=4)
        for tail in ([5, 6], [7, 8], [9, 10, 11])
    ]
    cache.add(prompt)
    cache.add(children[0])
    cache.add(children[1])
    assert cache.slots == 4 + 2 + 2
    prompt.used = True
    cache.add(children[2])  # 11 slots: the matched prompt goes first, yet its children still hold it
    assert cache.entries == children[1:] and cache.slots == 4 + 2 + 3


def _images(runs):
    from cua_jax.models.sampler import PromptImage

    return tuple(PromptImage(s, e, (1, 2, 2), key, lambda: None) for s, e, key in runs)


# ---------------------------------------------------------------------------------------------
# The pieces: cached rows, conv window and delta rule under padding
# ---------------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(0, 5), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_left_padding_before_new_inputs_leaves_the_conv_window_as_unpadded(kernel, pad, t, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, t, 3)).astype(np.float32)
    w = rng.normal(size=(3, kernel)).astype(np.float32)
    state = rng.normal(size=(1, kernel - 1, 3)).astype(np.float32)
    want, want_state = causal_conv1d(jnp.asarray(x), jnp.asarray(w), jnp.asarray(state))
    padded = np.concatenate([np.full((1, pad, 3), 7.0, np.float32), x], axis=1)  # padding holds junk
    got, got_state = jax.jit(causal_conv1d)(jnp.asarray(padded), jnp.asarray(w), jnp.asarray(state), jnp.asarray([pad]))
    np.testing.assert_allclose(np.asarray(got)[:, pad:], np.asarray(want), atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_state), np.asarray(want_state), atol=1e-6)
    # numpy reference: window = state then x, output t = silu(sum_j w[:, j] window[t + j])
    window = np.concatenate([state, x], axis=1)
    acc = sum(window[:, j : j + t] * w[:, j] for j in range(kernel))
    np.testing.assert_allclose(np.asarray(want), acc / (1 + np.exp(-acc)), atol=1e-5)


def test_compacted_rows_refill_a_cache_and_taken_rows_sum_their_gradients():
    from cua_jax.models.cache_rows import compact_rows, fill_rows, take_rows
    from cua_jax.models.qwen3 import init_kv_cache

    rng = np.random.default_rng(0)
    cache = init_kv_cache(2, 1, 4, batch=2, capacity=6)
    keys = tuple(jnp.asarray(rng.normal(size=(2, 6, 1, 4)), jnp.float32) for _ in range(2))
    segments = jnp.asarray([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0]], jnp.int32)
    cache = cache.replace(keys=keys, values=keys, segment_ids=segments)
    rows = compact_rows(cache)
    np.testing.assert_array_equal(np.asarray(rows.lengths), [3, 4])
    np.testing.assert_array_equal(np.asarray(rows.kv)[0, 0, 0, :3], np.asarray(keys[0])[0, [1, 2, 4]])
    refilled = fill_rows(init_kv_cache(2, 1, 4, batch=2, capacity=9), rows)
    assert int(refilled.end) == 6
    np.testing.assert_array_equal(np.asarray(refilled.segment_ids)[:, :6], [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]])

    index = jnp.asarray([0, 0, 1])
    grad = jax.grad(lambda k: jnp.sum(take_rows(cache.replace(keys=(k, k)), index, capacity=8).keys[0]))(keys[0])
    np.testing.assert_array_equal(np.asarray(grad)[:, 0, 0, 0], [2.0, 1.0])  # row 0 was taken twice


# ---------------------------------------------------------------------------------------------
# Learner: shared prefix rows
# ---------------------------------------------------------------------------------------------


def _prefix_length_reference(items) -> int:
    ids = [list(item.ids) for item in items]
    common = 0
    while all(len(x) > common for x in ids) and len({x[common] for x in ids}) == 1:
        common += 1
    first = min(int(np.flatnonzero(np.asarray(i.loss_mask))[0]) if np.any(i.loss_mask) else len(i) for i in items)
    return max(min(common, first) - 1, 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=4), st.integers(1, 10))
def test_shared_prefix_length_is_the_common_untrained_prefix_less_one(tails, prompt):
    items = []
    for tail in tails:
        ids = np.asarray([5] * prompt + [10 + t for t in tail], np.int32)
        mask = np.asarray([0] * prompt + [int(t == 2) for t in tail], np.int32)
        items.append(TrainingItem(ids, mask, np.zeros(len(ids), np.float32), [], "e", 0, (0,)))
    assert shared_prefix_length(items) == _prefix_length_reference(items)


def _items(kind: str, processor, make: Prompts):
    """Two groups of three items (prompt, reply, observation, reply; one item a single turn) and a
    lone item; with images in the prompt and in later observations for vision models."""
    items, patches = [], {}
    for g, size in enumerate((3, 3, 1)):
        prompt, prompt_images = make.observation(24)
        for e in range(size):
            reply, obs, obs_images = make.text(4 + e), *make.observation(6)
            parts = [(prompt, 0), (reply, 1)] + ([(obs, 0), (make.text(3), 1)] if e != 1 else [])
            ids = np.concatenate([np.asarray(p, np.int32) for p, _ in parts])
            mask = np.concatenate([np.full(len(p), m, np.int32) for p, m in parts])
            images = []
            if make.images:
                runs = np.flatnonzero(np.diff(np.concatenate([[0], (ids == make.run[1]).astype(int)])) == 1)
                ends = np.flatnonzero(np.diff(np.concatenate([(ids == make.run[1]).astype(int), [0]])) == -1) + 1
                screenshots = prompt_images + (obs_images if e != 1 else [])
                for turn, (start, end, image) in enumerate(zip(runs, ends, screenshots)):
                    images.append(ImageSpan(int(start), int(end), turn, 0, make.grid))
                    processed = processor(images=[image], return_tensors="np")
                    patches[(f"g{g}e{e}", turn, 0)] = np.asarray(processed["pixel_values"], np.float32)
            items.append(TrainingItem(ids, mask, -np.ones(len(ids), np.float32), images, f"g{g}e{e}", g, (0, 1)))
    return items, patches


# One objective per model (the passes share one path): the supervised loss on Qwen3; the policy
# gradient with a KL reference and recomputed old logprobs on Qwen3-VL (its tower trained: images
# inside the passes) and Qwen3.5 (frozen tower: images encoded once, outside the passes).
OBJECTIVES = {"qwen3": ("sft", False), "qwen3_vl": ("policy_gradient", False), "qwen3_5": ("policy_gradient", True)}


def test_shared_prefix_rows_give_the_logprobs_and_gradients_of_whole_rows(policy, processor):
    kind, model = policy
    objective, freeze = OBJECTIVES[kind]
    make = Prompts(kind, processor)
    items, patches = _items(kind, processor, make)
    advantages = np.linspace(-1.0, 1.0, len(items)).astype(np.float32)
    multimodal = MultimodalPositions.of(model.config) if kind != "qwen3" else None
    config = LearnerConfig(
        objective=objective, old_logprobs="recompute", freeze_vision=freeze, loss=PolicyLossConfig(kl_coef=0.1)
    )
    results = {}
    for share in (False, True):
        learner = Learner(nnx.clone(model), config)
        if learner.reference_params is not None:  # a reference that differs from the policy
            learner.reference_params = jax.tree.map(lambda x: x * 0.98, learner.reference_params)
        # Rows of 4: the first group's rows fill a micro-batch with one of the second's, so that
        # group's prefix row is repeated in the next micro-batch; one bucket for every row.
        batching = BatchingConfig(rows=4, length_multiple=128, share_prefix=share, suffix_length_multiple=64)
        [micro] = make_minibatches(items, advantages, batching, 1, pixel_patches=patches or None, multimodal=multimodal)
        if share:
            assert all(mb.prefix is not None for mb in micro) and len(micro) == 2
        grads, metrics = learner.gradients(micro)
        logprobs = [np.asarray(learner.score(mb)) for mb in micro]
        results[share] = grads, metrics, logprobs, micro
    (g0, m0, lp0, mb0), (g1, m1, lp1, mb1) = results[False], results[True]
    assert m0["loss_denominator"] == m1["loss_denominator"]
    np.testing.assert_allclose(m0["loss"], m1["loss"], rtol=1e-5, atol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
        a, b, name = np.asarray(a), np.asarray(b), jax.tree_util.keystr(path)
        rtol = DECAY_RTOL if any(p in name for p in DECAY_PARAMETERS) else GRAD_RTOL
        assert np.abs(a - b).max() <= rtol * np.abs(a).max() + 1e-12, name
    # Row logprobs: each whole row's tail equals its shared row (which starts at the split).
    for whole, shared, batch_whole, batch_shared in zip(lp0, lp1, mb0, mb1):
        for r in range(int(np.asarray(batch_whole.item_valid).sum())):
            n_whole = int(np.asarray(batch_whole.segment_ids)[r].sum())
            n_shared = int(np.asarray(batch_shared.segment_ids)[r].sum())
            tail = whole[r, n_whole - n_shared + 1 : n_whole]
            np.testing.assert_allclose(shared[r, 1:n_shared], tail, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("cut", [1, 45])
def test_the_chunked_delta_rule_continues_exactly_from_a_carried_state(cut):
    """Cutting a sequence anywhere and carrying the state (what a shared prefix does) changes the
    chunked delta rule's outputs and per-token gradients by float rounding only, strong decays too."""
    from cua_jax.models.gated_deltanet import gated_delta_rule_chunked

    rng = np.random.default_rng(cut)
    t, h, d = 64, 2, 8
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    q, k = (
        unit(rng.normal(size=(1, t, h, d))).astype(np.float32),
        unit(rng.normal(size=(1, t, h, d))).astype(np.float32),
    )
    v = rng.normal(size=(1, t, h, d)).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.normal(size=(1, t, h))))).astype(np.float32)
    g = (-np.abs(rng.normal(size=(1, t, h))) * np.array([0.1, 20.0])).astype(np.float32)  # mild and strong decay
    w = jnp.asarray(rng.normal(size=(1, t, h, d)), jnp.float32)

    def whole(g):
        return gated_delta_rule_chunked(q, k, v, g, beta, None, 16)[0]

    def cut_at(g):
        first, state = gated_delta_rule_chunked(q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut], None, 16)
        rest, _ = gated_delta_rule_chunked(q[:, cut:], k[:, cut:], v[:, cut:], g[:, cut:], beta[:, cut:], state, 16)
        return jnp.concatenate([first, rest], axis=1)

    outputs = jax.jit(lambda g: (whole(g), cut_at(g)))(g)
    np.testing.assert_allclose(np.asarray(outputs[1]), np.asarray(outputs[0]), atol=2e-6)
    grads = jax.jit(lambda g: [jax.grad(lambda g: jnp.sum(f(g) * w))(g) for f in (whole, cut_at)])(g)  # noqa: B023 - traced within this iteration
    scale = np.abs(np.asarray(grads[0])).max()
    np.testing.assert_allclose(np.asarray(grads[1]), np.asarray(grads[0]), atol=5e-6 * max(1.0, scale))
