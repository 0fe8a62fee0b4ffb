"""The system prompt's action space in both styles, and the agent loop's choice of style."""

from __future__ import annotations

import pytest

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import SlidingWindow
from cua_jax.context.tokenizer import load_processor
from cua_jax.envs import actions as A
from cua_jax.envs.prompts import PROMPT_STYLES, system_prompt
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop

# Every action the parser accepts except Qwen's `terminate`, which it reads as DONE / FAIL
# and the tool schema does not list either.
LISTED_ACTIONS = [name for name in A._ACTION_NAMES if name != "terminate"]
ELEMENT_ONLY = set(A.ELEMENT_ACTION_NAMES)


@pytest.fixture(scope="module")
def processor():
    return load_processor()


@pytest.mark.parametrize("style", PROMPT_STYLES)
def test_system_prompt_lists_every_action_and_a_parsable_example(style):
    prompt = system_prompt(160, 210, style)
    assert "160x210" in prompt and f"{A.GRID}x{A.GRID}" in prompt
    for name in LISTED_ACTIONS:
        if name in ELEMENT_ONLY:
            assert name not in prompt, f"{style} coordinates prompt lists the element action {name!r}"
        else:
            assert name in prompt, f"{style} prompt does not list {name!r}"
    for argument in (
        "coordinate",
        "start_coordinate",
        "keys",
        "duration",
        "text",
        "direction",
        "amount",
        "time",
        "path",
        "content",
        *A.SCROLL_DIRECTIONS,
    ):
        assert argument in prompt, f"{style} prompt does not name the argument {argument!r}"
    example = prompt.split("Example reply:\n", 1)[1]
    assert A.parse_action(example) == A.Click("left_click", A.GRID // 2, A.GRID // 2)


@pytest.mark.parametrize("style", PROMPT_STYLES)
@pytest.mark.parametrize("action_space", A.ACTION_SPACES)
def test_prompt_lists_exactly_the_action_space_and_its_example_parses_in_it(style, action_space):
    prompt = system_prompt(160, 210, style, action_space)
    listed = set(A.action_names(action_space))
    for name in LISTED_ACTIONS:
        if name in listed:
            assert name in prompt, f"{style}/{action_space} prompt does not list {name!r}"
        elif name not in ("left_click",):  # 'left_click' is a substring of nothing else listed
            assert f"{name} " not in prompt and f"{name}|" not in prompt and f'"{name}"' not in prompt, name
    if action_space == "elements":
        assert "left_click" not in prompt.split("Example reply:")[0]
        assert "element" in prompt
    example = prompt.split("Example reply:\n", 1)[1]
    assert not isinstance(A.parse_action(example, action_space), A.InvalidAction)


def test_agent_loop_prompts_and_parses_in_its_action_space(processor):
    tokenizer, image_processor = processor
    segmenter = SlidingWindow(ChatRenderer(tokenizer, image_processor), keep=2, min_removal=1)
    loop = AgentLoop(
        engine=None, segmenter=segmenter, config=AgentConfig(prompt_style="compact", action_space="elements")
    )
    assert loop.system_prompt_for(160, 210) == system_prompt(160, 210, "compact", "elements")
    with pytest.raises(ValueError, match="action_space 'pixels'"):
        AgentConfig(action_space="pixels")


def test_compact_prompt_is_under_half_the_schema_in_tokens(processor):
    tokenizer = processor[0]
    lengths = {style: len(tokenizer(system_prompt(160, 210, style))["input_ids"]) for style in PROMPT_STYLES}
    assert lengths["compact"] < lengths["tool_schema"] / 2, lengths


def test_unknown_style_and_screen_size_are_named():
    with pytest.raises(ValueError, match="style 'json'"):
        system_prompt(160, 210, "json")
    with pytest.raises(ValueError, match="screen size"):
        system_prompt(0, 210)
    with pytest.raises(ValueError, match="prompt_style 'json'"):
        AgentConfig(prompt_style="json")


@pytest.mark.parametrize("style", PROMPT_STYLES)
def test_agent_loop_prompts_in_its_configured_style(style, processor):
    tokenizer, image_processor = processor
    segmenter = SlidingWindow(ChatRenderer(tokenizer, image_processor), keep=2, min_removal=1)
    loop = AgentLoop(engine=None, segmenter=segmenter, config=AgentConfig(prompt_style=style))
    assert loop.system_prompt_for(160, 210) == system_prompt(160, 210, style)
