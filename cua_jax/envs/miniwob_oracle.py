"""A scripted MiniWoB++ policy: reads the observation's DOM, emits one action of our grammar.

`oracle_action(observation)` is stateless: it looks at the current utterance and DOM
(checkbox states, focus, input values) and returns the next action that brings the page
closer to the goal, so it can be called once per turn, from any state, by tests and by
the trainer (demonstrations: `render_action(oracle_action(obs))` is the target text).
Clicks aim at the centre of the target element's visible part, converted to the
1000-grid of the 160 x 210 task region.

Tasks: click-button, click-link, click-checkboxes, click-option, enter-text, focus-text,
click-tab, click-dialog (ORACLE_TASKS). Others raise OracleUnsupportedError; a page the
oracle cannot read (no matching element) raises OracleError naming what it looked for.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import DomElement, MiniWoBObservation, click_point


class OracleError(RuntimeError):
    """The page does not contain what the task's utterance refers to."""


class OracleUnsupportedError(OracleError):
    """The oracle has no script for this task."""


def click_element(element: DomElement, width: int, height: int) -> A.Click:
    """A left click at the centre of the part of `element` inside the width x height region
    (`miniwob.click_point`: the point the DOM text shows as click=[x, y])."""
    point = click_point(element, width, height)
    if point is None:
        raise OracleError(f"element {element.tag} {element.text!r} lies outside the {width}x{height} task region")
    return A.Click("left_click", *point)


def _quoted(utterance: str) -> str:
    match = re.search(r'"([^"]*)"', utterance)
    if not match:
        raise OracleError(f"no quoted target in the utterance {utterance!r}")
    return match.group(1)


def _find(obs: MiniWoBObservation, what: str, predicate: Callable[[DomElement], bool]) -> DomElement:
    for element in obs.dom:
        if predicate(element):
            return element
    raise OracleError(f"{obs.task}: no {what} on the page (utterance {obs.utterance!r})")


def _click(obs: MiniWoBObservation, what: str, predicate: Callable[[DomElement], bool]) -> A.Click:
    return click_element(_find(obs, what, predicate), *obs.screen_size)


def _label_text(obs: MiniWoBObservation, label: DomElement) -> str:
    """A label's text: its own, or that of its text-fragment children."""
    return label.text or " ".join(e.text for e in obs.dom if e.parent == label.ref and e.tag == "t")


def _inputs_by_label(obs: MiniWoBObservation, input_tag: str) -> list[tuple[str, DomElement]]:
    out = []
    for label in obs.dom:
        if label.tag != "LABEL":
            continue
        box = next((e for e in obs.dom if e.parent == label.ref and e.tag == input_tag), None)
        if box is not None:
            out.append((_label_text(obs, label), box))
    return out


def _submit(obs: MiniWoBObservation) -> A.Click:
    return _click(obs, "Submit button", lambda e: e.tag == "BUTTON" and e.id == "subbtn")


def _click_button(obs: MiniWoBObservation) -> A.Action:
    target = _quoted(obs.utterance)
    return _click(obs, f"button {target!r}", lambda e: e.tag == "BUTTON" and e.text == target)


def _click_link(obs: MiniWoBObservation) -> A.Action:
    target = _quoted(obs.utterance)
    return _click(obs, f"link {target!r}", lambda e: "alink" in e.classes.split() and e.text == target)


def _click_checkboxes(obs: MiniWoBObservation) -> A.Action:
    match = re.fullmatch(r"Select (.*) and click Submit\.", obs.utterance)
    if not match:
        raise OracleError(f"click-checkboxes: unexpected utterance {obs.utterance!r}")
    wanted = set() if match.group(1) == "nothing" else set(match.group(1).split(", "))
    for name, box in _inputs_by_label(obs, "INPUT_checkbox"):
        if bool(box.value) != (name in wanted):
            return click_element(box, *obs.screen_size)
    return _submit(obs)


def _click_option(obs: MiniWoBObservation) -> A.Action:
    match = re.fullmatch(r"Select (.*) and click Submit\.", obs.utterance)
    if not match:
        raise OracleError(f"click-option: unexpected utterance {obs.utterance!r}")
    for name, radio in _inputs_by_label(obs, "INPUT_radio"):
        if name == match.group(1):
            return _submit(obs) if radio.value else click_element(radio, *obs.screen_size)
    raise OracleError(f"click-option: no option {match.group(1)!r}")


def _enter_text(obs: MiniWoBObservation) -> A.Action:
    target = _quoted(obs.utterance)
    field = _find(obs, "text field", lambda e: e.tag == "INPUT_text")
    value = field.value or ""
    if value == target:
        return _submit(obs)
    if not field.focused:
        return click_element(field, *obs.screen_size)
    if value:  # a wrong value: delete it one character at a time (the caret is at its end)
        return A.Key(("backspace",))
    return A.Type(target)


def _focus_text(obs: MiniWoBObservation) -> A.Action:
    return _click(obs, "text field", lambda e: e.tag == "INPUT_text")


def _click_tab(obs: MiniWoBObservation) -> A.Action:
    match = re.search(r"Tab #(\d+)", obs.utterance)
    if not match:
        raise OracleError(f"click-tab: unexpected utterance {obs.utterance!r}")
    target = f"Tab #{match.group(1)}"
    return _click(obs, f"tab {target!r}", lambda e: e.tag == "A" and e.text == target)


def _click_dialog(obs: MiniWoBObservation) -> A.Action:
    return _click(obs, "dialog close button", lambda e: "ui-dialog-titlebar-close" in e.classes.split())


ORACLES: dict[str, Callable[[MiniWoBObservation], A.Action]] = {
    "click-button": _click_button,
    "click-link": _click_link,
    "click-checkboxes": _click_checkboxes,
    "click-option": _click_option,
    "enter-text": _enter_text,
    "focus-text": _focus_text,
    "click-tab": _click_tab,
    "click-dialog": _click_dialog,
}
ORACLE_TASKS = tuple(ORACLES)


def _by_element(action: A.Action, observation: MiniWoBObservation) -> A.Action:
    """The same action by element id: a click becomes a click on the element it lands on."""
    if not isinstance(action, A.Click):
        return action
    width, height = observation.screen_size
    point = A.grid_to_pixels(action.x, action.y, width, height)
    for element in observation.dom:
        if element.tag != "t" and click_point(element, width, height) == (action.x, action.y):
            return A.ClickElement(element.ref)
    raise OracleError(f"{observation.task}: no element has its click point at {point}")


def oracle_action(observation: MiniWoBObservation, action_space: str = "coordinates") -> A.Action:
    """The scripted next action for `observation` (its task must be one of ORACLE_TASKS) in
    `action_space` (`actions.ACTION_SPACES`; "both" acts by element id)."""
    script = ORACLES.get(observation.task)
    if script is None:
        raise OracleUnsupportedError(
            f"no oracle for MiniWoB task {observation.task!r}; scripted tasks: {', '.join(ORACLE_TASKS)}"
        )
    action = script(observation)
    return action if A.check_action_space(action_space) == "coordinates" else _by_element(action, observation)
