"""The action grammar: round trips, the coordinate map, and a parser that never raises."""

import json
import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.envs import actions as A

grid = st.integers(0, A.GRID) | st.floats(0, A.GRID, allow_nan=False)
key_names = st.sampled_from(sorted(A.CANONICAL_KEYS) + list("abcxyz019;,./"))
text = st.text(min_size=1, max_size=40)

valid_actions = st.one_of(
    st.builds(A.Click, st.sampled_from(A.CLICK_KINDS), grid, grid),
    st.builds(A.MouseMove, grid, grid),
    st.builds(A.LeftClickDrag, grid, grid),
    st.builds(A.LeftClickDrag, grid, grid, grid, grid),
    st.builds(A.LeftMouseDown),
    st.builds(A.LeftMouseDown, grid, grid),
    st.builds(A.LeftMouseUp),
    st.builds(A.LeftMouseUp, grid, grid),
    st.builds(A.Key, st.lists(key_names, min_size=1, max_size=A.MAX_KEYS).map(tuple)),
    st.builds(A.HoldKey, st.lists(key_names, min_size=1, max_size=3).map(tuple), st.floats(0.01, A.MAX_HOLD_SECONDS)),
    st.builds(A.Type, text),
    st.builds(A.Scroll, st.sampled_from(A.SCROLL_DIRECTIONS), st.integers(1, A.MAX_SCROLL_AMOUNT)),
    st.builds(A.Scroll, st.sampled_from(A.SCROLL_DIRECTIONS), st.integers(1, 50), grid, grid),
    st.builds(A.Wait, st.floats(0.01, A.MAX_WAIT_SECONDS)),
    st.just(A.Screenshot()),
    st.just(A.CursorPosition()),
    st.just(A.Done()),
    st.just(A.Fail()),
    st.builds(A.Answer, st.text(max_size=40)),
    st.builds(A.WriteFile, text, st.text(max_size=80)),
    st.builds(A.ClickElement, st.integers(1, 10_000)),
    st.builds(A.FillElement, st.integers(1, 10_000), st.text(max_size=40)),
)


@settings(max_examples=300, deadline=None)
@given(valid_actions)
def test_parse_inverts_render(action):
    rendered = A.render_action(action)
    assert A.parse_action(rendered) == action
    # Reasoning before the call and a missing closing tag are both tolerated.
    truncated = "I will act now.\n" + rendered.removesuffix("</tool_call>")
    assert A.parse_action(truncated) == action


def call(**arguments):
    return "<tool_call>" + json.dumps({"name": "computer_use", "arguments": arguments}) + "</tool_call>"


@pytest.mark.parametrize(
    "text, expected",
    [
        (call(action="key", keys="ctrl+S"), A.Key(("ctrl", "s"))),
        (call(action="key", keys=["Control", "Return"]), A.Key(("ctrl", "enter"))),
        (call(action="key", keys="+"), A.Key(("+",))),
        (call(action="DONE"), A.Done()),
        (call(action="done"), A.Done()),
        (call(action="FAIL"), A.Fail()),
        (call(action="WAIT"), A.Wait(A.WAIT_SECONDS)),
        (call(action="terminate", status="success"), A.Done()),
        (call(action="terminate", status="failure"), A.Fail()),
        (call(action="scroll", direction="up"), A.Scroll("up", 3)),
        (call(action="left_click_drag", coordinate=[10, 20]), A.LeftClickDrag(10, 20)),
    ],
)
def test_accepted_spellings(text, expected):
    assert A.parse_action(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("just words", "no action found"),
        (call(action="left_click", coordinate=[1001, 3]), "outside the 0-1000 grid"),
        (call(action="left_click", coordinate=[-1, 3]), "outside the 0-1000 grid"),
        (call(action="left_click"), "needs 'coordinate'"),
        (call(action="left_click", coordinate=[1, "2"]), "two numbers"),
        (call(action="fly"), "unknown action 'fly'"),
        (call(action="key", keys=["ctrl", "hyper"]), "unknown key 'hyper'"),
        (call(action="scroll", direction="sideways", amount=2), "'direction'"),
        (call(action="scroll", direction="up", amount=0), "'amount'"),
        (call(action="wait", time=3600), "'time'"),
        (call(action="type", text=""), "must not be empty"),
        (call(action="terminate", status="maybe"), "'terminate'"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "browser", "arguments": {}}</tool_call>', "unknown tool 'browser'"),
        (call(action="done") + call(action="done"), "exactly one action"),
        ("<tool_call>" + "[" * 100_000, "not valid JSON"),
    ],
)
def test_invalid_actions_explain_themselves(text, fragment):
    result = A.parse_action(text)
    assert isinstance(result, A.InvalidAction)
    assert fragment in result.message


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        pos = rng.randrange(len(chars) + 1)
        if op < 0.4 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif op < 0.8:
            chars.insert(pos, rng.choice(string.printable + '{}[]":,<>/\u00e9\u4e2d\x00'))
        else:
            chars[pos:pos] = rng.choice(['"action"', "null", "1e999", "-0", "[]", "{}", "true", "</tool_call>"])
    return "".join(chars)


def test_thousand_fuzzed_strings_raise_nothing():
    rng = random.Random(0)
    seeds = [
        A.render_action(a)
        for a in (
            A.Click("left_click", 1, 2),
            A.Key(("ctrl", "s")),
            A.Scroll("down", 2, 5, 5),
            A.WriteFile("/tmp/a", "b"),
            A.LeftClickDrag(1, 2, 3, 4),
            A.HoldKey(("shift",), 1.0),
        )
    ]
    outcomes = {"valid": 0, "invalid": 0}
    for i in range(1000):
        if i % 5 == 0:
            text = "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 200)))
        else:
            text = _mutate(rng, rng.choice(seeds))
        result = A.parse_action(text)
        assert isinstance(result, (A.InvalidAction,) + A.Action.__args__)
        outcomes["invalid" if isinstance(result, A.InvalidAction) else "valid"] += 1
        if isinstance(result, A.InvalidAction):
            assert result.message
    assert outcomes["invalid"] > 0 and outcomes["valid"] > 0
    assert isinstance(A.parse_action(None), A.InvalidAction)
    assert isinstance(A.parse_arguments([1]), A.InvalidAction)


def grid_to_pixels_reference(x, y, width, height):
    import math

    return (min(width - 1, math.floor(x * width / 1000)), min(height - 1, math.floor(y * height / 1000)))


@given(grid, grid, st.integers(1, 4000), st.integers(1, 4000))
def test_grid_to_pixels_stays_on_screen(x, y, width, height):
    px, py = A.grid_to_pixels(x, y, width, height)
    assert (px, py) == grid_to_pixels_reference(x, y, width, height)
    assert 0 <= px < width and 0 <= py < height


def test_grid_corners_map_to_screen_corners():
    assert A.grid_to_pixels(0, 0, 1280, 800) == (0, 0)
    assert A.grid_to_pixels(1000, 1000, 1280, 800) == (1279, 799)
    assert A.grid_to_pixels(500, 500, 1280, 800) == (640, 400)
    assert A.grid_to_pixels(500, 500, 160, 210) == (80, 105)


@settings(deadline=None)  # a loaded machine can pause any example past the default 200 ms
@given(st.integers(1, 1000), st.integers(1, 1000), st.data())
def test_pixels_to_grid_inverts_on_small_screens(width, height, data):
    px = data.draw(st.integers(0, width - 1))
    py = data.draw(st.integers(0, height - 1))
    assert A.grid_to_pixels(*A.pixels_to_grid(px, py, width, height), width, height) == (px, py)


def test_tool_description_lists_every_action():
    names = A.tool_description()["function"]["parameters"]["properties"]["action"]["enum"]
    for a in (A.Click("triple_click", 0, 0), A.HoldKey(("a",), 1), A.WriteFile("p", "")):
        assert A.action_arguments(a)["action"] in names


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"action": "click_element"}, "needs 'element'"),
        ({"action": "click_element", "element": 0}, "positive integer"),
        ({"action": "click_element", "element": -3}, "positive integer"),
        ({"action": "click_element", "element": "4"}, "positive integer"),
        ({"action": "click_element", "element": True}, "positive integer"),
        ({"action": "click_element", "element": 2.5}, "positive integer"),
        ({"action": "fill_element", "element": 4}, "needs 'text'"),
    ],
)
def test_malformed_element_actions_are_invalid_with_a_message(arguments, message):
    parsed = A.parse_action(call(**arguments))
    assert isinstance(parsed, A.InvalidAction) and message in parsed.message


@settings(deadline=None)
@given(valid_actions, st.sampled_from(A.ACTION_SPACES))
def test_action_spaces_admit_exactly_their_pointer_actions(action, action_space):
    parsed = A.parse_action(A.render_action(action), action_space)
    refused = (action_space == "coordinates" and isinstance(action, A.ELEMENT_ACTIONS)) or (
        action_space == "elements" and A.uses_coordinates(action)
    )
    if refused:
        assert isinstance(parsed, A.InvalidAction) and "not available" in parsed.message
        assert isinstance(A.parse_arguments(A.action_arguments(action), action_space), A.InvalidAction)
    else:
        assert parsed == action
        assert A.parse_arguments(A.action_arguments(action), action_space) == action


def test_unknown_action_space_is_the_callers_error():
    with pytest.raises(ValueError, match="action space 'pixels'"):
        A.parse_action("", "pixels")
