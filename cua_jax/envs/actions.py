# Single job: the policy's action space (its types, text syntax, parser, renderer and coordinate map).
"""The action space the policy acts in, its text syntax, parser, renderer and coordinate map.

Actions (ScaleCUA App. A, plus ScienceBoard's done / answer / write_file and OSWorld's
DONE / FAIL / WAIT) are frozen dataclasses. The policy emits one action per turn as a
computer-use tool call in Qwen's format, a JSON object inside `<tool_call>` tags:

    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 312]}}
    </tool_call>

Free text (reasoning) may precede the call; exactly one call is allowed per turn; a
missing closing tag is tolerated (generation often stops on it). Arguments by action:

    left_click | right_click | middle_click | double_click | triple_click   coordinate [x, y]
    mouse_move                                                            coordinate [x, y]
    left_click_drag     coordinate [x, y] (drop point), start_coordinate [x, y] (optional:
                        the drag starts at the current pointer position when absent)
    left_mouse_down | left_mouse_up         coordinate [x, y] (optional: at the pointer)
    key                 keys ["ctrl", "s"]  (a combination pressed together; the string
                        "ctrl+s" is accepted as well)
    hold_key            keys [...], duration seconds (0 < d <= 10)
    type                text "..."
    scroll              direction "up"|"down"|"left"|"right", amount clicks (1..50),
                        coordinate [x, y] (optional: scroll where the pointer is)
    wait                time seconds (0 < t <= 60)
    screenshot | cursor_position                                           no arguments
    done                task finished (ScienceBoard `done`, OSWorld `DONE`)
    answer              text "..."      (submit a computed value)
    write_file          path "...", content "..."
    DONE | FAIL | WAIT  OSWorld's special actions (WAIT waits WAIT_SECONDS); Qwen's
                        `terminate` with status "success"/"failure" means DONE / FAIL.
    click_element       element N (an id the page lists: set-of-marks)
    fill_element        element N, text "..." (replaces the element's contents)

Element-reference actions name an element by the id its observation gives it (BrowserGym's
`bid`, WebArena's `[id]`, OSWorld's `som`); the environment resolves the id to a point where
a click reaches the element and acts there. An action space (`ACTION_SPACES`) says which
pointer actions a run allows: "coordinates" (grid points only), "elements" (element ids
only; keys, typing, scrolling in place and the terminal actions stay) or "both".
`parse_action(text, action_space)` turns an action outside the space into an InvalidAction.

Coordinates live on a relative GRID x GRID (1000 x 1000) grid, integers or numbers in
[0, GRID]; `grid_to_pixels` rescales them to any screen or page size (1280 x 800 for the
desktop, 160 x 210 for MiniWoB pages).

`parse_action` never raises: any malformed or out-of-range text becomes an
`InvalidAction` whose `message` is fed back to the agent. `render_action` is its inverse
on valid actions: parse_action(render_action(a)) == a.

This module is standard-library only: the in-environment server imports it inside the
desktop image.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Union

GRID = 1000
DEFAULT_SCREEN_SIZE = (1280, 800)
TOOL_NAME = "computer_use"
WAIT_SECONDS = 2.0  # how long OSWorld's WAIT pauses
MAX_WAIT_SECONDS = 60.0
MAX_HOLD_SECONDS = 10.0
MAX_SCROLL_AMOUNT = 50
MAX_TEXT_CHARS = 20_000
MAX_KEYS = 6

SCROLL_DIRECTIONS = ("up", "down", "left", "right")
ACTION_SPACES = ("coordinates", "elements", "both")
CLICK_KINDS = ("left_click", "right_click", "middle_click", "double_click", "triple_click")


# ------------------------------------------------------------------------------------
# Key names: one canonical lowercase spelling per key, with the aliases models write.
# ------------------------------------------------------------------------------------

MODIFIER_KEYS = ("ctrl", "alt", "shift", "super")
NAMED_KEYS = (
    "enter", "esc", "tab", "space", "backspace", "delete", "insert",
    "home", "end", "pageup", "pagedown", "up", "down", "left", "right",
    "capslock", "printscreen", "menu",
) + tuple(f"f{i}" for i in range(1, 13))
KEY_ALIASES = {
    "control": "ctrl", "ctl": "ctrl", "lctrl": "ctrl", "rctrl": "ctrl",
    "option": "alt", "lalt": "alt", "ralt": "alt",
    "lshift": "shift", "rshift": "shift",
    "cmd": "super", "command": "super", "win": "super", "windows": "super", "meta": "super",
    "return": "enter", "escape": "esc", "spacebar": "space", "del": "delete", "ins": "insert",
    "pgup": "pageup", "page_up": "pageup", "pgdn": "pagedown", "page_down": "pagedown",
    "arrowup": "up", "arrowdown": "down", "arrowleft": "left", "arrowright": "right",
    "back_space": "backspace", "caps_lock": "capslock", "print": "printscreen",
}
CANONICAL_KEYS = frozenset(MODIFIER_KEYS + NAMED_KEYS)


def canonical_key(name: str) -> str | None:
    """The canonical spelling of a key name, or None when it names no key.

    Single printable characters are keys of their own (letters are lower-cased, so
    "A" and "a" are the same key; use shift for capitals).
    """
    if len(name) == 1 and name.isprintable() and not name.isspace():
        return name.lower()
    lowered = name.strip().lower()
    lowered = KEY_ALIASES.get(lowered, lowered)
    return lowered if lowered in CANONICAL_KEYS else None


# ------------------------------------------------------------------------------------
# Actions
# ------------------------------------------------------------------------------------

Number = Union[int, float]


@dataclasses.dataclass(frozen=True)
class Click:
    """A click of `kind` (left/right/middle/double/triple) at grid point (x, y)."""

    kind: str
    x: Number
    y: Number


@dataclasses.dataclass(frozen=True)
class MouseMove:
    x: Number
    y: Number


@dataclasses.dataclass(frozen=True)
class LeftClickDrag:
    """Press the left button at the start (or the current pointer), release at (x, y)."""

    x: Number
    y: Number
    start_x: Number | None = None
    start_y: Number | None = None


@dataclasses.dataclass(frozen=True)
class LeftMouseDown:
    x: Number | None = None
    y: Number | None = None


@dataclasses.dataclass(frozen=True)
class LeftMouseUp:
    x: Number | None = None
    y: Number | None = None


@dataclasses.dataclass(frozen=True)
class Key:
    """Press `keys` together (a combination such as ctrl+s), then release them."""

    keys: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class HoldKey:
    keys: tuple[str, ...]
    duration: Number


@dataclasses.dataclass(frozen=True)
class Type:
    text: str


@dataclasses.dataclass(frozen=True)
class Scroll:
    direction: str
    amount: int
    x: Number | None = None
    y: Number | None = None


@dataclasses.dataclass(frozen=True)
class Wait:
    seconds: Number


@dataclasses.dataclass(frozen=True)
class Screenshot:
    pass


@dataclasses.dataclass(frozen=True)
class CursorPosition:
    pass


@dataclasses.dataclass(frozen=True)
class Done:
    """The agent declares the task finished (ScienceBoard done, OSWorld DONE)."""


@dataclasses.dataclass(frozen=True)
class Fail:
    """The agent declares the task infeasible (OSWorld FAIL)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str


@dataclasses.dataclass(frozen=True)
class WriteFile:
    path: str
    content: str


@dataclasses.dataclass(frozen=True)
class ClickElement:
    """A left click on the element the page numbers `element` (where a click reaches it)."""

    element: int


@dataclasses.dataclass(frozen=True)
class FillElement:
    """Replace the contents of the element numbered `element` with `text` (click it, select all, type)."""

    element: int
    text: str


Action = Union[
    Click, MouseMove, LeftClickDrag, LeftMouseDown, LeftMouseUp, Key, HoldKey, Type, Scroll,
    Wait, Screenshot, CursorPosition, Done, Fail, Answer, WriteFile, ClickElement, FillElement,
]
TERMINAL_ACTIONS = (Done, Fail, Answer)  # actions that end the episode
ELEMENT_ACTIONS = (ClickElement, FillElement)  # actions that name an element by its id


@dataclasses.dataclass(frozen=True)
class InvalidAction:
    """Text that is no valid action. `message` is shown to the agent as the step's feedback."""

    message: str
    text: str = ""


def is_terminal(action: Action | InvalidAction) -> bool:
    return isinstance(action, TERMINAL_ACTIONS)


def uses_coordinates(action: Action | InvalidAction) -> bool:
    """Whether the action places the pointer at a grid point."""
    if isinstance(action, (Click, MouseMove, LeftClickDrag)):
        return True
    return isinstance(action, (LeftMouseDown, LeftMouseUp, Scroll)) and action.x is not None


def check_action_space(action_space: str) -> str:
    if action_space not in ACTION_SPACES:
        raise ValueError(f"unknown action space {action_space!r}; choose one of {', '.join(ACTION_SPACES)}")
    return action_space


def outside_action_space(action: Action | InvalidAction, action_space: str) -> str | None:
    """Why `action` is not allowed in `action_space` (None when it is)."""
    check_action_space(action_space)
    if action_space == "elements" and uses_coordinates(action):
        return (
            f"'{action_arguments(action)['action']}' at a grid point is not available: this run acts on "
            "elements by id (click_element, fill_element)"
        )
    if action_space == "coordinates" and isinstance(action, ELEMENT_ACTIONS):
        return (
            f"'{action_arguments(action)['action']}' is not available: this run acts at grid points "
            f"(coordinate [x, y] on the 0-{GRID} grid)"
        )
    return None


# ------------------------------------------------------------------------------------
# Coordinates
# ------------------------------------------------------------------------------------


def grid_to_pixels(x: Number, y: Number, width: int, height: int) -> tuple[int, int]:
    """Map a point on the GRID x GRID relative grid to integer pixels of a width x height screen.

    Grid value g maps to floor(g * size / GRID), clamped to the last pixel so that the
    grid's far edge (g == GRID) stays on screen. Inverse (up to rounding): pixels_to_grid.
    """
    px = min(width - 1, max(0, math.floor(x * width / GRID)))
    py = min(height - 1, max(0, math.floor(y * height / GRID)))
    return int(px), int(py)


def pixels_to_grid(px: Number, py: Number, width: int, height: int) -> tuple[int, int]:
    """Map screen pixels to the nearest point of the relative grid whose image contains it.

    The grid point returned maps back (grid_to_pixels) to the same pixel whenever the
    screen has at most GRID pixels along each axis.
    """
    gx = math.ceil(px * GRID / width)
    gy = math.ceil(py * GRID / height)
    return min(GRID, max(0, int(gx))), min(GRID, max(0, int(gy)))


# ------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------


def action_arguments(action: Action) -> dict[str, Any]:
    """The tool-call `arguments` object of an action (its canonical spelling)."""
    if isinstance(action, Click):
        return {"action": action.kind, "coordinate": [action.x, action.y]}
    if isinstance(action, MouseMove):
        return {"action": "mouse_move", "coordinate": [action.x, action.y]}
    if isinstance(action, LeftClickDrag):
        args: dict[str, Any] = {"action": "left_click_drag", "coordinate": [action.x, action.y]}
        if action.start_x is not None:
            args["start_coordinate"] = [action.start_x, action.start_y]
        return args
    if isinstance(action, (LeftMouseDown, LeftMouseUp)):
        name = "left_mouse_down" if isinstance(action, LeftMouseDown) else "left_mouse_up"
        args = {"action": name}
        if action.x is not None:
            args["coordinate"] = [action.x, action.y]
        return args
    if isinstance(action, Key):
        return {"action": "key", "keys": list(action.keys)}
    if isinstance(action, HoldKey):
        return {"action": "hold_key", "keys": list(action.keys), "duration": action.duration}
    if isinstance(action, Type):
        return {"action": "type", "text": action.text}
    if isinstance(action, Scroll):
        args = {"action": "scroll", "direction": action.direction, "amount": action.amount}
        if action.x is not None:
            args["coordinate"] = [action.x, action.y]
        return args
    if isinstance(action, Wait):
        return {"action": "wait", "time": action.seconds}
    if isinstance(action, Screenshot):
        return {"action": "screenshot"}
    if isinstance(action, CursorPosition):
        return {"action": "cursor_position"}
    if isinstance(action, Done):
        return {"action": "done"}
    if isinstance(action, Fail):
        return {"action": "FAIL"}
    if isinstance(action, Answer):
        return {"action": "answer", "text": action.text}
    if isinstance(action, WriteFile):
        return {"action": "write_file", "path": action.path, "content": action.content}
    if isinstance(action, ClickElement):
        return {"action": "click_element", "element": action.element}
    if isinstance(action, FillElement):
        return {"action": "fill_element", "element": action.element, "text": action.text}
    raise TypeError(f"not an action: {action!r}")


def render_action(action: Action) -> str:
    """The text the policy emits for `action`: a `<tool_call>` block holding one JSON call."""
    call = {"name": TOOL_NAME, "arguments": action_arguments(action)}
    return "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"


# ------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------


class _Malformed(Exception):
    """Raised inside the parser only; turned into an InvalidAction before returning."""


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_ACTION_NAMES = (
    CLICK_KINDS
    + ("mouse_move", "left_click_drag", "left_mouse_down", "left_mouse_up", "key", "hold_key",
       "type", "scroll", "wait", "screenshot", "cursor_position", "done", "answer",
       "write_file", "click_element", "fill_element", "DONE", "FAIL", "WAIT", "terminate")
)
ELEMENT_ACTION_NAMES = ("click_element", "fill_element")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _coordinate(args: dict[str, Any], field: str, required: bool) -> tuple[Number, Number] | None:
    value = args.get(field)
    if value is None:
        if required:
            raise _Malformed(f"'{args['action']}' needs '{field}': [x, y] on the 0-{GRID} grid")
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_number, value))):
        raise _Malformed(f"'{field}' must be two numbers [x, y], got {_short(value)}")
    x, y = value
    if not (0 <= x <= GRID and 0 <= y <= GRID):
        raise _Malformed(f"'{field}' {[x, y]} is outside the 0-{GRID} grid")
    return x, y


def _number(args: dict[str, Any], field: str, low: float, high: float, default=None) -> Number:
    value = args.get(field, default)
    if value is None:
        raise _Malformed(f"'{args['action']}' needs '{field}' (a number in ({low}, {high}])")
    if not _is_number(value) or not (low < value <= high):
        raise _Malformed(f"'{field}' must be a number in ({low}, {high}], got {_short(value)}")
    return value


def _element(args: dict[str, Any]) -> int:
    value = args.get("element")
    if value is None:
        raise _Malformed(f"'{args['action']}' needs 'element': the id of an element the page lists")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Malformed(f"'element' must be a positive integer id, got {_short(value)}")
    return value


def _string(args: dict[str, Any], field: str, allow_empty: bool = False) -> str:
    value = args.get(field)
    if not isinstance(value, str):
        raise _Malformed(f"'{args['action']}' needs '{field}' as a string, got {_short(value)}")
    if not value and not allow_empty:
        raise _Malformed(f"'{field}' must not be empty")
    if len(value) > MAX_TEXT_CHARS:
        raise _Malformed(f"'{field}' is longer than {MAX_TEXT_CHARS} characters")
    return value


def _keys(args: dict[str, Any]) -> tuple[str, ...]:
    value = args.get("keys", args.get("key", args.get("text")))
    if isinstance(value, str):
        # "ctrl+s"; a lone "+" is the plus key itself.
        value = [value] if value == "+" else [part for part in value.split("+")]
    if not (isinstance(value, list) and value and all(isinstance(k, str) for k in value)):
        raise _Malformed(f"'{args['action']}' needs 'keys': a list of key names such as [\"ctrl\", \"s\"]")
    if len(value) > MAX_KEYS:
        raise _Malformed(f"at most {MAX_KEYS} keys may be pressed together, got {len(value)}")
    keys = []
    for name in value:
        key = canonical_key(name)
        if key is None:
            raise _Malformed(
                f"unknown key {_short(name)}; use a single character or one of "
                + ", ".join(sorted(CANONICAL_KEYS))
            )
        keys.append(key)
    return tuple(keys)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _build(args: dict[str, Any]) -> Action:
    name = args.get("action")
    if not isinstance(name, str) or name not in _ACTION_NAMES:
        raise _Malformed(
            f"unknown action {_short(name)}; the actions are " + ", ".join(_ACTION_NAMES)
        )
    if name in CLICK_KINDS:
        return Click(name, *_coordinate(args, "coordinate", required=True))
    if name == "mouse_move":
        return MouseMove(*_coordinate(args, "coordinate", required=True))
    if name == "left_click_drag":
        end = _coordinate(args, "coordinate", required=True)
        start = _coordinate(args, "start_coordinate", required=False) or (None, None)
        return LeftClickDrag(end[0], end[1], start[0], start[1])
    if name in ("left_mouse_down", "left_mouse_up"):
        point = _coordinate(args, "coordinate", required=False) or (None, None)
        return (LeftMouseDown if name == "left_mouse_down" else LeftMouseUp)(*point)
    if name == "key":
        return Key(_keys(args))
    if name == "hold_key":
        return HoldKey(_keys(args), _number(args, "duration", 0.0, MAX_HOLD_SECONDS))
    if name == "type":
        return Type(_string(args, "text"))
    if name == "scroll":
        direction = args.get("direction")
        if direction not in SCROLL_DIRECTIONS:
            raise _Malformed(f"'direction' must be one of {', '.join(SCROLL_DIRECTIONS)}, got {_short(direction)}")
        amount = args.get("amount", 3)
        if not (isinstance(amount, int) and not isinstance(amount, bool) and 1 <= amount <= MAX_SCROLL_AMOUNT):
            raise _Malformed(f"'amount' must be an integer in [1, {MAX_SCROLL_AMOUNT}], got {_short(amount)}")
        point = _coordinate(args, "coordinate", required=False) or (None, None)
        return Scroll(direction, amount, *point)
    if name == "wait":
        return Wait(_number(args, "time", 0.0, MAX_WAIT_SECONDS, default=args.get("seconds")))
    if name == "WAIT":
        return Wait(WAIT_SECONDS)
    if name == "screenshot":
        return Screenshot()
    if name == "cursor_position":
        return CursorPosition()
    if name in ("done", "DONE"):
        return Done()
    if name == "FAIL":
        return Fail()
    if name == "terminate":
        status = args.get("status")
        if status not in ("success", "failure"):
            raise _Malformed(f"'terminate' needs 'status' \"success\" or \"failure\", got {_short(status)}")
        return Done() if status == "success" else Fail()
    if name == "answer":
        return Answer(_string(args, "text", allow_empty=True))
    if name == "write_file":
        return WriteFile(_string(args, "path"), _string(args, "content", allow_empty=True))
    if name == "click_element":
        return ClickElement(_element(args))
    if name == "fill_element":
        return FillElement(_element(args), _string(args, "text", allow_empty=True))
    raise AssertionError(name)  # every name in _ACTION_NAMES is handled above


def _call_json(text: str) -> str:
    starts = [m.start() for m in re.finditer(re.escape(_OPEN), text)]
    if not starts:
        raise _Malformed(
            "no action found: end your reply with one "
            '<tool_call>{"name": "computer_use", "arguments": {"action": ...}}</tool_call>'
        )
    if len(starts) > 1:
        raise _Malformed(f"found {len(starts)} <tool_call> blocks; emit exactly one action per turn")
    body = text[starts[0] + len(_OPEN):]
    end = body.find(_CLOSE)
    return body if end < 0 else body[:end]


def _build_in(args: dict[str, Any], action_space: str) -> Action:
    action = _build(args)
    problem = outside_action_space(action, action_space)
    if problem is not None:
        raise _Malformed(problem)
    return action


def parse_arguments(args: Any, action_space: str = "both") -> Action | InvalidAction:
    """Validate a tool-call `arguments` object (already decoded JSON) into an action of `action_space`."""
    check_action_space(action_space)
    try:
        if not isinstance(args, dict):
            raise _Malformed(f"'arguments' must be a JSON object, got {_short(args)}")
        return _build_in(args, action_space)
    except _Malformed as error:
        return InvalidAction(str(error), json.dumps(args, default=repr)[:2000] if isinstance(args, dict) else "")


def parse_action(text: Any, action_space: str = "both") -> Action | InvalidAction:
    """Parse the policy's reply into one action of `action_space`, or an InvalidAction
    explaining what is wrong (an action outside the space included).

    Never raises, whatever `text` holds (an unknown `action_space` is the caller's error).
    """
    check_action_space(action_space)
    if not isinstance(text, str):
        return InvalidAction(f"expected text, got {type(text).__name__}")
    try:
        body = _call_json(text).strip()
        try:
            call = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise _Malformed(f"the tool call is not valid JSON ({error})".replace("\n", " ")) from None
        if not isinstance(call, dict):
            raise _Malformed("the tool call must be a JSON object with 'name' and 'arguments'")
        if call.get("name") != TOOL_NAME:
            raise _Malformed(f"unknown tool {_short(call.get('name'))}; the tool is '{TOOL_NAME}'")
        if not isinstance(call.get("arguments"), dict):
            raise _Malformed("the tool call needs 'arguments': a JSON object with an 'action'")
        return _build_in(call["arguments"], action_space)
    except _Malformed as error:
        return InvalidAction(str(error), text[-2000:])


# ------------------------------------------------------------------------------------
# The tool description placed in the system prompt.
# ------------------------------------------------------------------------------------


COORDINATE_ACTION_NAMES = CLICK_KINDS + ("mouse_move", "left_click_drag")  # need a grid point


def action_names(action_space: str = "coordinates") -> tuple[str, ...]:
    """The action names a prompt lists for `action_space` (Qwen's `terminate` is accepted, not listed)."""
    check_action_space(action_space)
    names = tuple(name for name in _ACTION_NAMES if name != "terminate")
    if action_space == "coordinates":
        return tuple(name for name in names if name not in ELEMENT_ACTION_NAMES)
    if action_space == "elements":
        return tuple(name for name in names if name not in COORDINATE_ACTION_NAMES)
    return names


def tool_description(
    width: int = DEFAULT_SCREEN_SIZE[0], height: int = DEFAULT_SCREEN_SIZE[1], action_space: str = "coordinates"
) -> dict[str, Any]:
    """The function schema of the computer-use tool (Qwen `tools=[...]` format) for `action_space`."""
    coordinate = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
    properties: dict[str, Any] = {"action": {"type": "string", "enum": list(action_names(action_space))}}
    properties["coordinate"] = coordinate  # in "elements" too: scroll and mouse down / up take an optional point
    if action_space != "elements":
        properties["start_coordinate"] = coordinate
    if action_space != "coordinates":
        properties["element"] = {"type": "integer"}
    properties |= {
        "keys": {"type": "array", "items": {"type": "string"}},
        "duration": {"type": "number"},
        "text": {"type": "string"},
        "direction": {"type": "string", "enum": list(SCROLL_DIRECTIONS)},
        "amount": {"type": "integer"},
        "time": {"type": "number"},
        "path": {"type": "string"},
        "content": {"type": "string"},
    }
    grid = (
        f"Coordinates are on a relative {GRID}x{GRID} grid: [0, 0] is the top-left corner, "
        f"[{GRID}, {GRID}] the bottom-right. "
    )
    ids = "Elements are named by the ids the page lists and marks. "
    where = {"coordinates": grid, "elements": ids, "both": grid + ids}[action_space]
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                f"Use a mouse and keyboard to interact with a {width}x{height} screen, seen through "
                f"screenshots. {where}Emit exactly one call per turn. "
                "Call `done` when the task is complete, `FAIL` when it cannot be done, and `answer` to "
                "submit a value."
            ),
            "parameters": {"type": "object", "properties": properties, "required": ["action"]},
        },
    }
