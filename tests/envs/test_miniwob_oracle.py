"""The oracle's pure parts: where its clicks land, and how it reads a DOM (no browser)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import TASK_HEIGHT, TASK_WIDTH, DomElement, MiniWoBObservation, dom_to_text
from cua_jax.envs.miniwob_oracle import OracleError, click_element, oracle_action


def _element(ref, tag, left, top, width, height, parent=None, depth=0, **kw):
    return DomElement(ref, parent, depth, tag, kw.pop("text", ""), left, top, width, height, **kw)


def _obs(task, utterance, dom):
    return MiniWoBObservation(task, utterance, np.zeros((TASK_HEIGHT, TASK_WIDTH, 3), np.uint8), tuple(dom))


@settings(max_examples=300, deadline=None)
@given(
    left=st.floats(-50, TASK_WIDTH - 1), top=st.floats(-50, TASK_HEIGHT - 1),
    width=st.floats(1, 200), height=st.floats(1, 200),
)
def test_clicks_land_inside_the_visible_part_of_the_element(left, top, width, height):
    element = _element(1, "BUTTON", left, top, width, height)
    visible_right, visible_bottom = min(TASK_WIDTH, left + width), min(TASK_HEIGHT, top + height)
    if visible_right - max(0, left) < 1 or visible_bottom - max(0, top) < 1:
        return  # less than a pixel on screen
    click = click_element(element, TASK_WIDTH, TASK_HEIGHT)
    px, py = A.grid_to_pixels(click.x, click.y, TASK_WIDTH, TASK_HEIGHT)
    assert max(0, left) - 1 <= px <= visible_right and max(0, top) - 1 <= py <= visible_bottom
    assert A.parse_action(A.render_action(click)) == click


def test_element_outside_the_task_region_is_an_oracle_error():
    with pytest.raises(OracleError, match="outside"):
        click_element(_element(1, "BUTTON", 300, 20, 30, 20), TASK_WIDTH, TASK_HEIGHT)


def test_checkbox_oracle_toggles_mismatches_then_submits():
    dom = [
        _element(1, "LABEL", 2, 59, 47, 11),
        _element(2, "INPUT_checkbox", 6, 55, 20, 13, parent=1, value=False),
        _element(-1, "t", 29, 59, 20, 11, parent=1, text="USa"),
        _element(3, "LABEL", 2, 78, 62, 11),
        _element(4, "INPUT_checkbox", 6, 74, 20, 13, parent=3, value=True),
        _element(-2, "t", 29, 78, 35, 11, parent=3, text="DKkQH"),
        _element(5, "BUTTON", 2, 101, 101, 31, text="Submit", id="subbtn"),
    ]
    first = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(first.x, first.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(55, 68)  # USa's box
    dom[1] = dataclasses.replace(dom[1], value=True)
    second = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(second.x, second.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(74, 87)  # untick DKkQH
    dom[4] = dataclasses.replace(dom[4], value=False)
    third = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(third.x, third.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(101, 132)  # Submit
    assert "INPUT_checkbox#" not in dom_to_text(tuple(dom)) and "[5] BUTTON#subbtn 'Submit'" in dom_to_text(tuple(dom))


def test_enter_text_oracle_focuses_types_and_submits():
    field = _element(1, "INPUT_text", 5, 56, 128, 21, id="tt", value="")
    submit = _element(2, "BUTTON", 5, 87, 101, 31, text="Submit", id="subbtn")
    utterance = 'Enter "Jerald" into the text field and press Submit.'
    assert isinstance(oracle_action(_obs("enter-text", utterance, [field, submit])), A.Click)
    focused = dataclasses.replace(field, focused=True)
    assert oracle_action(_obs("enter-text", utterance, [focused, submit])) == A.Type("Jerald")
    wrong = dataclasses.replace(focused, value="Jer4")
    assert oracle_action(_obs("enter-text", utterance, [wrong, submit])) == A.Key(("backspace",))
    done = dataclasses.replace(focused, value="Jerald")
    click = oracle_action(_obs("enter-text", utterance, [done, submit]))
    assert A.grid_to_pixels(click.x, click.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(87, 118)


def test_missing_target_names_what_was_looked_for():
    with pytest.raises(OracleError, match="button 'ok'"):
        oracle_action(_obs("click-button", 'Click on the "ok" button.', [_element(1, "BUTTON", 2, 52, 33, 21, text="no")]))
