"""The token-ID stream (ScaleCUA Alg. 2): diff appends that reproduce the template, engine tokens kept."""

import hypothesis.strategies as st
import numpy as np
import pytest
from episode_strategies import observation_texts
from hypothesis import given, settings

from cua_jax.context.render import ChatRenderer, ImageRef
from cua_jax.context.segment import WholeTrajectory
from cua_jax.context.token_stream import PrefixMismatchError, TokenStreamBuilder
from cua_jax.context.tokenizer import QWEN_VL_CHAT_TEMPLATE
from cua_jax.types import Episode, Turn


def _conversation(texts, responses, shapes):
    messages = [{"role": "system", "content": "You operate a computer."}]
    for t, (text, response) in enumerate(zip(texts, responses)):
        content = [{"type": "image", "ref": ImageRef(t, i, h, w)} for i, (h, w) in enumerate(shapes[t])]
        messages.append({"role": "user", "content": content + [{"type": "text", "text": text}]})
        messages.append({"role": "assistant", "content": response})
    return messages


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(observation_texts, min_size=1, max_size=5),
    data=st.data(),
)
def test_diff_grown_stream_equals_the_templates_rendering_for_canonical_responses(renderer, texts, data):
    """With responses tokenized as the template would, the stream is exactly Tokenize(whole conversation):
    every diff, the generation prompts and the closing tokens line up, whether or not the engine
    emitted the end-of-turn token."""
    # A leading newline would merge with the prompt's "assistant\n" in a whole-conversation rendering
    # (the stream keeps the engine's tokens there instead); that case has its own test below.
    responses = [data.draw(observation_texts.filter(lambda s: s and not s[0].isspace())) for _ in texts]
    shapes = [data.draw(st.lists(st.tuples(st.integers(16, 90), st.integers(16, 90)), max_size=2)) for _ in texts]
    emits_end = [data.draw(st.booleans()) for _ in texts]
    messages = _conversation(texts, responses, shapes)
    builder = TokenStreamBuilder(renderer, messages[:2], turn=0)
    for t, response in enumerate(responses):
        ids = (
            renderer.tokenizer(response, add_special_tokens=False)["input_ids"]
            + [renderer.end_of_turn_id] * emits_end[t]
        )
        builder.add_response(t, np.asarray(ids, np.int32), np.full(len(ids), -0.5, np.float32), response)
        if t + 1 < len(texts):
            builder.add_observation(t + 1, messages[2 * t + 3])
    whole = renderer.render(messages, add_generation_prompt=False)
    item = builder.stream.to_item("e", 0)
    np.testing.assert_array_equal(item.ids, whole.ids)
    assert [(s.start, s.end, s.turn, s.index, s.grid_thw) for s in item.images] == [
        (p.start, p.end, p.ref.turn, p.ref.index, p.grid_thw) for p in whole.images
    ]
    # Trained: the response tokens and the end-of-turn token where the engine emitted it; nothing else.
    assert int(item.loss_mask.sum()) == sum(
        len(renderer.tokenizer(r, add_special_tokens=False)["input_ids"]) + e for r, e in zip(responses, emits_end)
    )


def test_non_canonical_engine_tokens_are_kept_not_re_tokenized(renderer):
    """An engine may sample "click" as single characters; the stream keeps those ids and their
    logprobs, and only the text of the history uses the canonical tokenization."""
    tokenizer = renderer.tokenizer
    pieces = [tokenizer.convert_tokens_to_ids(c) for c in "click"] + [renderer.end_of_turn_id]
    assert tokenizer("click", add_special_tokens=False)["input_ids"] != pieces[:-1]  # BPE merges it
    logprobs = np.linspace(-3, -0.1, len(pieces)).astype(np.float32)
    turns = [
        Turn("first", [np.zeros((40, 60, 3), np.uint8)], np.asarray(pieces, np.int32), logprobs),
        Turn("second", [], np.asarray(pieces, np.int32), logprobs),
    ]
    (item,) = WholeTrajectory(renderer).segment(Episode("e", "t", 1, "Do it.", turns))
    np.testing.assert_array_equal(item.ids[item.loss_mask == 1], pieces * 2)
    np.testing.assert_array_equal(item.rollout_logprobs[item.loss_mask == 1], np.concatenate([logprobs, logprobs]))
    text = tokenizer.decode(item.ids.tolist())
    assert text.endswith("<|im_start|>user\nsecond<|im_end|>\n<|im_start|>assistant\nclick<|im_end|>\n")


def test_a_response_starting_with_newlines_keeps_the_engines_tokens_at_the_prompt_boundary(renderer):
    """BPE merges "assistant\n" + "\n\nclick" differently when the whole conversation is rendered;
    that is not a template moving earlier tokens: the stream keeps the prompt the engine saw and
    the engine's tokens, and the text is the template's."""
    tokenizer = renderer.tokenizer
    turns = []
    for t, text in enumerate(["\n\nclick", "\n", "plain"]):
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"] + [renderer.end_of_turn_id], np.int32)
        turns.append(Turn(f"page {t}", [], ids, np.full(len(ids), -1.0, np.float32)))
    context = WholeTrajectory(renderer).start("e", 0, "", "Do it.")
    for t, turn in enumerate(turns):
        context.observe(t, turn.observation_text, [])
        prompt = context.prompt()
        assert tokenizer.decode(prompt.ids.tolist()).endswith("<|im_end|>\n<|im_start|>assistant\n")
        context.respond(t, turn.response_ids, turn.response_logprobs)
    (item,) = context.finish()
    np.testing.assert_array_equal(item.ids[item.loss_mask == 1], np.concatenate([t.response_ids for t in turns]))
    whole = renderer.render(context.history.messages(), add_generation_prompt=False)
    assert tokenizer.decode(item.ids.tolist()) == tokenizer.decode(whole.ids.tolist())
    assert not np.array_equal(item.ids, whole.ids)  # the boundary tokens differ, as they should


def _reasoning_dropping_template():
    """A template that, like Qwen3's thinking templates, strips the reasoning of earlier assistant turns."""
    old = "{{- '<|im_start|>assistant\\n' + render_content(message.content, false) -}}"
    new = (
        "{%- set body = render_content(message.content, false) -%}"
        "{%- if not loop.last -%}{%- set body = body.split('</think>')[-1] -%}{%- endif -%}"
        "{{- '<|im_start|>assistant\\n' + body -}}"
    )
    assert old in QWEN_VL_CHAT_TEMPLATE
    return QWEN_VL_CHAT_TEMPLATE.replace(old, new)


def test_a_template_that_moves_earlier_tokens_raises_naming_the_turn(tokenizer_and_processor, renderer):
    moving = ChatRenderer(*tokenizer_and_processor, chat_template=_reasoning_dropping_template())
    tokenizer = renderer.tokenizer
    ids = np.asarray(
        tokenizer("<think>look</think>click", add_special_tokens=False)["input_ids"] + [renderer.end_of_turn_id],
        np.int32,
    )
    turns = [Turn(f"page {t}", [], ids, np.zeros(len(ids), np.float32)) for t in range(3)]
    episode = Episode("e", "t", 0, "Do it.", turns)
    with pytest.raises(
        PrefixMismatchError, match=r"turn 1: adding its observation changed the chat template's earlier tokens"
    ):
        WholeTrajectory(moving).segment(episode)
    # Without reasoning nothing moves, and the same template streams fine.
    plain = np.asarray(tokenizer("click", add_special_tokens=False)["input_ids"] + [renderer.end_of_turn_id], np.int32)
    for turn in turns:
        turn.response_ids, turn.response_logprobs = plain, np.zeros(len(plain), np.float32)
    (item,) = WholeTrajectory(moving).segment(episode)
    assert item.step_indices == (0, 1, 2)


def test_builder_rejects_out_of_order_turns(renderer):
    messages = [{"role": "user", "content": "hi"}]
    builder = TokenStreamBuilder(renderer, messages, turn=0)
    with pytest.raises(ValueError, match="observation for turn 1 out of order"):
        builder.add_observation(1, {"role": "user", "content": "again"})
    ids = np.asarray([5, renderer.end_of_turn_id], np.int32)
    builder.add_response(0, ids, np.zeros(2, np.float32), "x")
    with pytest.raises(ValueError, match="response for turn 0 out of order"):
        builder.add_response(0, ids, np.zeros(2, np.float32), "x")
    with pytest.raises(ValueError, match="turn 0 already has its response"):
        builder.prompt()


def test_mismatched_logprobs_and_literal_image_pads_are_named(renderer):
    builder = TokenStreamBuilder(renderer, [{"role": "user", "content": "hi"}], turn=0)
    with pytest.raises(ValueError, match=r"turn 0: response ids \(3,\) and logprobs \(2,\)"):
        builder.add_response(0, np.asarray([1, 2, 3]), np.zeros(2), "x")
    with pytest.raises(ValueError, match="1 image pads but 0 images"):
        renderer.render([{"role": "user", "content": "look <|image_pad|>"}], add_generation_prompt=True)


def test_tool_schemas_render_in_the_system_turn_and_the_stream_still_lines_up(tokenizer_and_processor):
    tools = [{"type": "function", "function": {"name": "computer_use", "parameters": {"type": "object"}}}]
    with_tools = ChatRenderer(*tokenizer_and_processor, tools=tools)
    tokenizer = with_tools.tokenizer
    ids = np.asarray(
        tokenizer("<tool_call>\n{}\n</tool_call>", add_special_tokens=False)["input_ids"] + [with_tools.end_of_turn_id],
        np.int32,
    )
    turns = [
        Turn(f"page {t}", [np.zeros((64, 64, 3), np.uint8)], ids, np.zeros(len(ids), np.float32)) for t in range(2)
    ]
    (item,) = WholeTrajectory(with_tools).segment(Episode("e", "t", 0, "Do it.", turns, system_prompt="Act."))
    text = tokenizer.decode(item.ids.tolist())
    assert text.startswith("<|im_start|>system\nAct.\n\n# Tools\n") and '"name": "computer_use"' in text
    np.testing.assert_array_equal(item.ids[item.loss_mask == 1], np.concatenate([ids, ids]))


def test_an_image_item_without_a_reference_is_named(renderer):
    with pytest.raises(ValueError, match="needs .*ImageRef"):
        renderer.render([{"role": "user", "content": [{"type": "image"}]}], add_generation_prompt=True)
