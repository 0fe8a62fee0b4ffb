"""Segmenters: every response trained exactly once, with the engine's own ids and logprobs."""

import dataclasses
import inspect

import hypothesis.strategies as st
import numpy as np
import pytest
from episode_strategies import episodes
from hypothesis import given, settings

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import (
    SEGMENTER_OPTIONS,
    SEGMENTERS,
    CompactContext,
    SlidingWindow,
    StepWise,
    WholeTrajectory,
    make_segmenter,
)
from cua_jax.context.tokenizer import load_processor, save_tokenizer_and_processor, special_token_ids
from tests.support.items import assert_items_equal


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of ones in a 0/1 mask."""
    padded = np.concatenate([[0], mask, [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def check_items(episode, items, renderer):
    """The properties every segmenter must have; returns {turn: (item index, response start)}."""
    specials = special_token_ids(renderer.tokenizer)
    trained = sorted(t for item in items for t in item.step_indices)
    assert trained == list(range(episode.num_turns)), "each turn's response is trained in exactly one item"
    where = {}
    for n, item in enumerate(items):
        assert (item.episode_id, item.group_id) == (episode.episode_id, episode.group_id)
        assert (
            item.ids.dtype == np.int32
            and item.loss_mask.dtype == np.int32
            and item.rollout_logprobs.dtype == np.float32
        )
        assert item.ids.shape == item.loss_mask.shape == item.rollout_logprobs.shape
        assert set(np.unique(item.loss_mask)) <= {0, 1}
        assert np.all(item.rollout_logprobs[item.loss_mask == 0] == 0)
        runs = _runs(item.loss_mask)
        assert len(runs) == len(item.step_indices) and list(item.step_indices) == sorted(item.step_indices)
        for (start, end), t in zip(runs, item.step_indices):
            turn = episode.turns[t]
            np.testing.assert_array_equal(item.ids[start:end], turn.response_ids)  # exactly as sampled
            np.testing.assert_array_equal(item.rollout_logprobs[start:end], turn.response_logprobs)
            where[t] = (n, start)
        pads = item.ids == specials["<|image_pad|>"]
        assert sum(span.end - span.start for span in item.images) == int(pads.sum())
        for span in item.images:
            assert np.all(pads[span.start : span.end])
            assert (
                item.ids[span.start - 1] == specials["<|vision_start|>"]
                and item.ids[span.end] == specials["<|vision_end|>"]
            )
            height, width = episode.turns[span.turn].images[span.index].shape[:2]
            assert span.grid_thw == renderer.grid_thw(height, width)
            assert span.end - span.start == np.prod(span.grid_thw) // renderer.merge_size**2
        assert [(s.turn, s.index) for s in item.images] == sorted((s.turn, s.index) for s in item.images)
    return where


def check_live_rollout_matches_replay(segmenter, episode, items):
    """Driving the context turn by turn (as the rollout does) gives the same items, and each
    response in its item follows exactly the prompt the engine was given."""
    context = segmenter.start(episode.episode_id, episode.group_id, episode.system_prompt, episode.instruction)
    prompts = []
    for t, turn in enumerate(episode.turns):
        context.observe(t, turn.observation_text, turn.images)
        prompts.append(context.prompt())
        context.respond(t, turn.response_ids, turn.response_logprobs)
    assert_items_equal(context.finish(), items)
    return prompts


PLACEHOLDER = "[Screenshot of step {step} removed; action: {action}]"


def segmenter_strategy(renderer):
    return st.one_of(
        st.builds(
            lambda k, d, p: SlidingWindow(renderer, k, d, p),
            st.integers(0, 4),
            st.integers(1, 4),
            st.sampled_from(["", PLACEHOLDER]),
        ),
        st.just(WholeTrajectory(renderer)),
        st.builds(
            lambda k, p: StepWise(renderer, k, p), st.none() | st.integers(0, 3), st.sampled_from(["", PLACEHOLDER])
        ),
        st.builds(lambda w: CompactContext(renderer, w), st.integers(0, 3)),
    )


@pytest.fixture(scope="module")
def vocab(renderer):
    num_bpe = min(special_token_ids(renderer.tokenizer).values())
    return num_bpe, renderer.end_of_turn_id


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_segmenter_trains_each_response_once_with_the_engines_tokens(renderer, vocab, data):
    episode = data.draw(episodes(*vocab))
    segmenter = data.draw(segmenter_strategy(renderer))
    items = segmenter.segment(episode)
    where = check_items(episode, items, renderer)
    prompts = check_live_rollout_matches_replay(segmenter, episode, items)
    for t, prompt in enumerate(prompts):
        n, start = where[t]
        assert start == len(prompt.ids)
        np.testing.assert_array_equal(items[n].ids[:start], prompt.ids)
        assert list(prompt.images) == [s for s in items[n].images if s.end <= start]
    if isinstance(segmenter, SlidingWindow):
        assert all(len(item.images) <= segmenter.options.keep + segmenter.options.min_removal for item in items)
    if isinstance(segmenter, WholeTrajectory):
        assert len(items) == 1
    if isinstance(segmenter, (StepWise, CompactContext)):
        assert [item.step_indices for item in items] == [(t,) for t in range(episode.num_turns)]


def _one_image_episode(renderer, num_turns, seed=0):
    from cua_jax.types import Episode, Turn

    rng = np.random.default_rng(seed)
    turns = []
    for t in range(num_turns):
        ids = np.asarray(
            renderer.tokenizer(f"<tool_call>click {t}</tool_call>")["input_ids"] + [renderer.end_of_turn_id], np.int32
        )
        turns.append(
            Turn(f"page {t}", [np.zeros((210, 160, 3), np.uint8)], ids, -rng.random(len(ids)).astype(np.float32))
        )
    return Episode("e", "task", 0, "Click submit.", turns, system_prompt="You operate a computer.")


def test_sliding_window_follows_algorithm_2(renderer):
    """K = Delta = 2 over 9 one-screenshot turns: the 5th screenshot triggers pruning, the stream
    is saved, the oldest 2 go and K + 1 = 3 remain; earlier responses reappear as loss-0 context."""
    episode = _one_image_episode(renderer, 9)
    items = SlidingWindow(renderer, keep=2, min_removal=2).segment(episode)
    assert [item.step_indices for item in items] == [(0, 1, 2, 3), (4, 5), (6, 7), (8,)]
    assert [[s.turn for s in item.images] for item in items] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8]]
    check_items(episode, items, renderer)
    # The second item re-tokenizes turns 0-3 (their responses as mask-0 context, screenshots 0-1 dropped).
    second = renderer.tokenizer.decode(items[1].ids[items[1].loss_mask == 0].tolist())
    assert "click 0" in second and "page 0" in second and "click 4" not in second


def test_a_dropped_screenshot_leaves_its_placeholder_text(renderer):
    """ScaleCUA Fig. 4: with placeholder_text, each screenshot the window drops is replaced by a
    short text naming its step and the action taken there; without it the screenshot just goes."""
    episode = _one_image_episode(renderer, 5)
    items = SlidingWindow(renderer, keep=1, min_removal=1, placeholder_text=PLACEHOLDER).segment(episode)
    plain = SlidingWindow(renderer, keep=1, min_removal=1).segment(episode)
    assert [item.step_indices for item in items] == [item.step_indices for item in plain]
    assert [[s.turn for s in item.images] for item in items] == [[s.turn for s in item.images] for item in plain]
    check_items(episode, items, renderer)
    second = renderer.tokenizer.decode(items[1].ids.tolist())
    assert "[Screenshot of step 1 removed; action: <tool_call>click 0</tool_call>]" in second
    assert "step 2 removed" not in second and "removed" not in renderer.tokenizer.decode(plain[1].ids.tolist())
    assert len(items[1].ids) > len(plain[1].ids)
    step_items = StepWise(renderer, keep_images=1, placeholder_text="(step {step} screenshot)").segment(episode)
    assert "(step 1 screenshot)" in renderer.tokenizer.decode(step_items[2].ids.tolist())
    with pytest.raises(ValueError, match="may name only"):
        SlidingWindow(renderer, keep=1, placeholder_text="{title}")


def test_compact_context_collapses_old_turns_into_an_action_history(renderer):
    episode = _one_image_episode(renderer, 6)
    items = CompactContext(renderer, window=2).segment(episode)
    last = renderer.tokenizer.decode(items[5].ids.tolist())
    assert (
        "Previous actions:\nStep 1: <tool_call>click 0</tool_call>\n"
        "Step 2: <tool_call>click 1</tool_call>\nStep 3: <tool_call>click 2</tool_call>\n" in last
    )
    assert "page 2" not in last and "page 3" in last
    assert [s.turn for s in items[5].images] == [3, 4, 5]


def test_step_wise_keeps_the_last_screenshots(renderer):
    episode = _one_image_episode(renderer, 6)
    items = StepWise(renderer, keep_images=2).segment(episode)
    assert [[s.turn for s in item.images] for item in items] == [[0], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]
    full = StepWise(renderer).segment(episode)
    assert [len(item.images) for item in full] == [1, 2, 3, 4, 5, 6]


def test_make_segmenter_by_name(renderer):
    assert set(SEGMENTERS) == {"sliding_window", "whole_trajectory", "step_wise", "compact_context"}
    segmenter = make_segmenter("sliding_window", renderer, keep=3, min_removal=2)
    assert (segmenter.options.keep, segmenter.options.min_removal) == (3, 2)
    with pytest.raises(ValueError, match="unknown segmenter 'window'"):
        make_segmenter("window", renderer)
    with pytest.raises(ValueError, match="min_removal >= 1"):
        SlidingWindow(renderer, keep=3, min_removal=0)


def test_same_items_from_a_tokenizer_and_processor_loaded_from_a_model_directory(renderer, tmp_path):
    save_tokenizer_and_processor(tmp_path)
    loaded = ChatRenderer(*load_processor(tmp_path))
    episode = _one_image_episode(renderer, 7, seed=3)
    for name, options in [
        ("sliding_window", {"keep": 2}),
        ("whole_trajectory", {}),
        ("step_wise", {}),
        ("compact_context", {"window": 2}),
    ]:
        ours, theirs = (
            make_segmenter(name, renderer, **options).segment(episode),
            make_segmenter(name, loaded, **options).segment(episode),
        )
        check_items(episode, theirs, loaded)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
            assert a.images == b.images


def test_bad_screenshot_is_named(renderer):
    episode = _one_image_episode(renderer, 2)
    episode.turns[1].images = [np.zeros((210, 160), np.uint8)]
    with pytest.raises(ValueError, match=r"turn 1 image 0: expected a \[H, W, C\] array"):
        StepWise(renderer).segment(episode)


@pytest.mark.parametrize("name", sorted(SEGMENTERS))
def test_contexts_reject_turns_out_of_order(renderer, name):
    context = make_segmenter(name, renderer).start("e", 0, "", "Do it.")
    with pytest.raises(ValueError, match="observation for turn 1 out of order"):
        context.observe(1, "page", [])
    context.observe(0, "page", [(210, 160)])
    with pytest.raises(ValueError, match="turn 0 has an observation but no response yet"):
        context.observe(1, "page", [])


def test_segmenter_options_are_the_constructors_keywords():
    fields = {name: tuple(field.name for field in dataclasses.fields(cls)) for name, cls in SEGMENTER_OPTIONS.items()}
    assert fields == {
        "sliding_window": ("keep", "min_removal", "placeholder_text"),
        "step_wise": ("keep_images", "placeholder_text"),
        "compact_context": ("window",),
        "whole_trajectory": (),
    }
    for name, options in fields.items():
        parameters = inspect.signature(SEGMENTERS[name]).parameters
        assert all(parameters[option].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for option in options), name
