"""Element-reference actions (set-of-marks) on real MiniWoB pages: ids in the DOM text and on
the screenshot, clicks and fills by id, and the refusals (unknown, gone, hidden) that leave
the page untouched."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob import (
    MARK_COLOR,
    TASK_HEIGHT,
    TASK_WIDTH,
    DomElement,
    dom_from_text,
    dom_to_text,
    draw_marks,
    marked_elements,
)

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def runtime():
    rt = CapsuleRuntime(include_dom_text=True, action_space="both", call_timeout_s=600, time_limit_s=600)
    yield rt
    rt.shutdown()


def _element(ref, tag, left, top, width, height, parent=None, depth=0, **kw):
    return DomElement(ref, parent, depth, tag, kw.pop("text", ""), left, top, width, height, **kw)


def _target_button(obs):
    target = re.search(r'"(.*)"', obs.utterance).group(1)
    return next(e for e in obs.dom if e.tag == "BUTTON" and e.text == target)


# ---- pure parts ---------------------------------------------------------------------------


def test_marks_are_drawn_at_each_marked_element_and_nowhere_else():
    white = np.full((TASK_HEIGHT, TASK_WIDTH, 3), 255, np.uint8)
    dom = (
        _element(1, "DIV", 0, 0, 160, 210),
        _element(2, "BUTTON", 20, 40, 60, 20, parent=1, depth=1, text="ok"),
        _element(3, "INPUT_text", 20, 100, 100, 20, parent=1, depth=1),
    )
    marked = draw_marks(white, dom)
    assert [e.ref for e in marked_elements(dom)] == [2, 3]  # the container is not marked
    assert np.array_equal(white, np.full_like(white, 255)), "draw_marks must not change its input"
    magenta = np.all(marked == MARK_COLOR, axis=-1)
    for e in dom[1:]:
        assert magenta[int(e.top), int(e.left)], f"no mark at element {e.ref}'s corner"
        assert magenta[int(e.top + e.height - 1), int(e.left + e.width // 2)], f"no outline under element {e.ref}"
    # The label holds the id in white on the magenta box.
    label = marked[40:50, 20:30]
    assert np.any(np.all(label == (255, 255, 255), axis=-1)) and np.any(np.all(label == MARK_COLOR, axis=-1))
    assert not magenta[5:35, :].any() and not magenta[130:, :].any()


def test_dom_text_without_geometry_lists_ids_and_reads_back():
    dom = (
        _element(1, "DIV", 0, 0, 160, 210, id="area"),
        _element(2, "BUTTON", 20, 40, 60, 20, parent=1, depth=1, text="ok 'go'"),
        _element(3, "INPUT_text", 20, 100, 100, 20, parent=1, depth=1, value="abc", focused=True),
    )
    text = dom_to_text(dom, geometry=False)
    assert text.splitlines() == ["DIV#area [1]", "  BUTTON \"ok 'go'\" [2]", "  INPUT_text value='abc' focused [3]"]
    back = dom_from_text(text)
    assert [(e.ref, e.parent, e.tag, e.text, e.value, e.focused) for e in back] == [
        (e.ref, e.parent, e.tag, e.text, e.value, e.focused) for e in dom
    ]
    assert all(np.isnan(e.left) for e in back)
    assert dom_from_text(dom_to_text(dom)) == dom  # with geometry: exact (whole pixels)


# ---- on real pages ------------------------------------------------------------------------


def test_observation_lists_ids_and_marks_them_on_the_screenshot(runtime):
    env = runtime.create("click-button", seed=3)
    obs = runtime.observe(env)
    listed = {int(ref) for ref in re.findall(r"^\s*\[(\d+)\]", obs.dom_text, flags=re.M)}  # "both": id first
    assert listed == {e.ref for e in obs.dom if e.tag != "t"}
    magenta = np.all(obs.screenshot == MARK_COLOR, axis=-1)
    for e in marked_elements(obs.dom):
        assert magenta[int(max(0, e.top)), int(max(0, e.left))], f"element {e.ref} is not marked"
    with CapsuleRuntime(include_dom_text=True) as plain:  # the coordinates space draws no marks
        assert not np.all(plain.observe(plain.create("click-button", seed=3)).screenshot == MARK_COLOR, axis=-1).any()
    runtime.close(env)


def test_click_by_element_id_solves_the_task(runtime):
    env = runtime.create("click-button", seed=5)
    result = runtime.step(env, A.ClickElement(_target_button(runtime.observe(env)).ref))
    assert result.done and result.success and result.invalid_action is None
    runtime.close(env)


def test_fill_by_element_id_replaces_the_contents(runtime):
    env = runtime.create("enter-text", seed=2)
    obs = runtime.observe(env)
    target = re.search(r'"(.*)"', obs.utterance).group(1)
    field = next(e for e in obs.dom if e.tag == "INPUT_text")
    submit = next(e for e in obs.dom if e.id == "subbtn")
    obs = runtime.step(env, A.FillElement(field.ref, "wrong text")).observation
    obs = runtime.step(env, A.FillElement(field.ref, target)).observation
    assert next(e for e in obs.dom if e.ref == field.ref).value == target
    refused = runtime.step(env, A.FillElement(submit.ref, "x"))
    assert "cannot be filled" in refused.invalid_action and not refused.done
    result = runtime.step(env, A.ClickElement(submit.ref))
    assert result.done and result.success
    runtime.close(env)


def _unchanged_after(runtime, env, action, message):
    before = runtime.observe(env)
    result = runtime.step(env, action)
    assert result.invalid_action is not None and message in result.invalid_action, result.invalid_action
    assert not result.done and result.observation.same_as(before)


def test_unknown_gone_and_hidden_ids_are_refused_and_change_nothing(runtime):
    env = runtime.create("click-button", seed=3)  # four buttons
    obs = runtime.observe(env)
    _unchanged_after(runtime, env, A.ClickElement(500), "element 500 does not exist")
    button = _target_button(obs)
    others = [e for e in obs.dom if e.tag == "BUTTON" and e.ref != button.ref]
    # An element that left the page: its id is not handed to another element.
    runtime.evaluate(env, "(ref) => document.querySelector('[data-wob_ref=\"' + ref + '\"]').remove()", others[0].ref)
    _unchanged_after(runtime, env, A.ClickElement(others[0].ref), f"element {others[0].ref} is no longer on the page")
    # Hidden by style, and moved outside the task region.
    runtime.evaluate(
        env,
        "(ref) => { document.querySelector('[data-wob_ref=\"' + ref + '\"]').style.visibility = 'hidden'; }",
        others[1].ref,
    )
    _unchanged_after(runtime, env, A.ClickElement(others[1].ref), "is hidden")
    runtime.evaluate(
        env,
        "(ref) => { var e = document.querySelector('[data-wob_ref=\"' + ref + '\"]');"
        " e.style.position = 'fixed'; e.style.left = '300px'; }",
        button.ref,
    )
    _unchanged_after(runtime, env, A.ClickElement(button.ref), "is hidden")
    runtime.close(env)


_COVER_JS = """([ref, fraction]) => {
  var r = document.querySelector('[data-wob_ref="' + ref + '"]').getBoundingClientRect();
  var cover = document.createElement('div');
  cover.style.cssText = 'position:fixed;background:#888;z-index:99;left:' + r.left + 'px;top:' + r.top
    + 'px;width:' + r.width + 'px;height:' + (r.height * fraction) + 'px';
  document.body.appendChild(cover);
}"""


def test_a_partly_covered_element_is_clicked_where_it_shows_and_a_covered_one_is_refused(runtime):
    env = runtime.create("click-button", seed=5)
    target = _target_button(runtime.observe(env))
    runtime.evaluate(env, _COVER_JS, [target.ref, 0.7])  # hides the centre, leaves the bottom
    result = runtime.step(env, A.ClickElement(target.ref))
    assert result.done and result.success, result.invalid_action
    runtime.close(env)
    env = runtime.create("click-button", seed=5)
    assert _target_button(runtime.observe(env)).ref == target.ref  # ids are handed out by observing
    runtime.evaluate(env, _COVER_JS, [target.ref, 1.0])
    _unchanged_after(runtime, env, A.ClickElement(target.ref), "is covered")
    runtime.close(env)


def _inactive_tab(obs):
    return next(
        e
        for e in obs.dom
        if e.tag == "A"
        and "ui-tabs-anchor" in e.classes
        and not any(p.ref == e.parent and "ui-tabs-active" in p.classes for p in obs.dom)
    )


def test_ids_of_a_tab_that_was_switched_away_are_hidden_and_new_content_gets_new_ids(runtime):
    env = runtime.create("click-tab-2", seed=1)  # switching tabs does not end its episodes
    obs = runtime.observe(env)
    panel_text = next(e for e in obs.dom if e.tag == "P")
    result = runtime.step(env, A.ClickElement(_inactive_tab(obs).ref))
    assert not result.done and result.invalid_action is None
    shown = next(e for e in result.observation.dom if e.tag == "P")
    assert shown.ref > max(e.ref for e in obs.dom), "newly shown content gets fresh ids"
    assert all(e.ref != panel_text.ref for e in result.observation.dom)
    _unchanged_after(runtime, env, A.ClickElement(panel_text.ref), "is hidden")
    runtime.close(env)


def test_a_fork_after_element_actions_hands_out_the_same_ids(runtime):
    env = runtime.create("click-tab-2", seed=4)
    obs = runtime.step(env, A.ClickElement(_inactive_tab(runtime.observe(env)).ref)).observation
    child = runtime.fork(env)
    assert runtime.observe(child).same_as(obs)
    tab = _inactive_tab(obs)
    p, c = runtime.step(env, A.ClickElement(tab.ref)), runtime.step(child, A.ClickElement(tab.ref))
    assert p.invalid_action is None and c.invalid_action is None
    assert c.observation.same_as(p.observation)
    runtime.close(env)
    runtime.close(child)


@pytest.mark.parametrize(
    "space, action, message",
    [
        ("coordinates", A.ClickElement(3), "acts at grid points"),
        ("elements", A.Click("left_click", 500, 500), "acts on elements by id"),
    ],
)
def test_an_action_outside_the_runtime_space_is_an_invalid_step(space, action, message):
    with CapsuleRuntime(include_dom_text=True, action_space=space) as rt:
        env = rt.create("click-button", seed=1)
        result = rt.step(env, action)
        assert message in result.invalid_action and not result.done
