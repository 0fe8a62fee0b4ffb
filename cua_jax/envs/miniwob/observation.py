"""What an agent sees of a MiniWoB++ page: the DOM model (`DomElement`), the observation and
episode state, and the DOM's text form (`dom_to_text`, read back by `dom_from_text`)."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Any

import numpy as np

from cua_jax.envs import actions as A

TASK_WIDTH, TASK_HEIGHT = 160, 210  # the task region MiniWoB observes (miniwob.constants)


@dataclasses.dataclass(frozen=True)
class DomElement:
    """One visible element of the task page (MiniWoB's DOM info, flattened in document order).

    `ref` numbers the elements of one observation in document order (negative for text
    fragments, tag "t"), as MiniWoB's `core.getDOMInfo` does;
    left/top/width/height are page pixels; `value` is an input's value (bool for
    checkboxes and radios); `tag` carries the input type ("INPUT_text", "INPUT_checkbox").
    """

    ref: int
    parent: int | None
    depth: int
    tag: str
    text: str
    left: float
    top: float
    width: float
    height: float
    id: str = ""
    classes: str = ""
    value: Any = None
    focused: bool = False

    @property
    def center(self) -> tuple[float, float]:
        return self.left + self.width / 2, self.top + self.height / 2


@dataclasses.dataclass(frozen=True)
class MiniWoBObservation:
    """What an agent sees of a MiniWoB page.

    screenshot: uint8 [TASK_HEIGHT, TASK_WIDTH, 3] = [210, 160, 3], the task region.
    dom: the visible elements; dom_text: the same as indented text (None unless asked for).
    """

    task: str
    utterance: str
    screenshot: np.ndarray
    dom: tuple[DomElement, ...]
    dom_text: str | None = None

    @property
    def screen_size(self) -> tuple[int, int]:
        """(width, height) of the screenshot: the size the 1000-grid maps onto."""
        return int(self.screenshot.shape[1]), int(self.screenshot.shape[0])

    def same_as(self, other: MiniWoBObservation) -> bool:
        """Equal task, utterance, DOM and pixels."""
        return (
            self.task == other.task
            and self.utterance == other.utterance
            and self.dom == other.dom
            and np.array_equal(self.screenshot, other.screenshot)
        )


@dataclasses.dataclass(frozen=True)
class EpisodeState:
    """MiniWoB's episode globals: done, rewards (raw: the task's; env: scaled by time left)."""

    done: bool
    raw_reward: float
    env_reward: float
    reason: str | None

    @property
    def success(self) -> bool:
        """MiniWoB's success criterion: the episode ended with a positive raw reward."""
        return self.done and self.raw_reward > 0


def click_point(element: DomElement, width: int = TASK_WIDTH, height: int = TASK_HEIGHT) -> tuple[int, int] | None:
    """The action-grid point (`actions.GRID` per axis) at the centre of the part of `element`
    inside the width x height task region, or None when no part of it is inside."""
    left, top = max(0.0, element.left), max(0.0, element.top)
    right, bottom = min(float(width), element.left + element.width), min(float(height), element.top + element.height)
    if right <= left or bottom <= top:
        return None
    return A.pixels_to_grid(int((left + right) / 2), int((top + bottom) / 2), width, height)


def dom_line(e: DomElement, geometry: bool = True) -> str:
    """One element's line of `dom_to_text`, without its indentation."""
    name = e.tag + (f"#{e.id}" if e.id else "") + "".join(f".{c}" for c in e.classes.split())
    parts = [name]
    if e.text:
        parts.append(repr(e.text))
    if e.value is not None and e.value != "":
        parts.append(f"value={e.value!r}")
    if e.focused:
        parts.append("focused")
    if not geometry:
        return " ".join(parts + [f"[{e.ref}]"])
    box = [f"{value:.0f}" for value in (e.left, e.top, e.width, e.height)]
    parts.append(f"@{box[0]},{box[1]} {box[2]}x{box[3]}")
    # The point of the box as printed, so a reader of the text (the demonstrator) clicks it.
    left, top, width, height = (float(value) for value in box)
    point = click_point(dataclasses.replace(e, left=left, top=top, width=width, height=height))
    if point is not None:
        parts.append(f"click=[{point[0]}, {point[1]}]")
    return " ".join([f"[{e.ref}]"] + parts)


def dom_to_text(dom: tuple[DomElement, ...], geometry: bool = True) -> str:
    """One line per element, indented by depth:
    `[ref] TAG#id.classes "text" value=.. focused @x,y wxh click=[gx, gy]`, or without
    geometry `TAG#id.classes "text" value=.. focused [ref]`.

    [ref] is the element's id for element actions. @x,y wxh is the box in page pixels;
    click=[gx, gy] (elements with a visible part only) is its visible centre on the action
    grid, in the same form as a tool call's "coordinate", so a policy can ground an action by
    reading it off the page rather than by arithmetic. geometry=False leaves both out (a policy
    that acts by element id needs neither, and the prompt is shorter) and puts the id last,
    after what identifies the element: a reply that names its target as the page does
    (`oracle_engine.reasoning_line`) then reaches the id by continuing a copied span, the lookup
    small transformers learn first (an induction head), instead of looking back from the text
    to the start of its line.
    """
    return "\n".join("  " * e.depth + dom_line(e, geometry) for e in dom)


_DOM_LINE = re.compile(
    r"^(?P<indent> *)\[(?P<ref>-?\d+)\] (?P<name>\S+)(?P<rest>.*?)"
    r"(?: @(?P<left>-?[\d.]+),(?P<top>-?[\d.]+) (?P<width>[\d.]+)x(?P<height>[\d.]+)(?: click=\[\d+, \d+\])?)?$"
)
# A line written without geometry: the id last.
_DOM_LINE_ID_LAST = re.compile(r"^(?P<indent> *)(?P<name>[^\s\[]\S*)(?P<rest>.*?) \[(?P<ref>-?\d+)\]$")


def _leading_literal(text: str) -> tuple[Any, str]:
    """The Python literal (a repr) at the start of `text`, and what follows it."""
    for end in range(1, len(text) + 1):
        if end == len(text) or text[end] == " ":
            try:
                return ast.literal_eval(text[:end]), text[end:].strip()
            except (ValueError, SyntaxError):
                continue
    raise ValueError(f"no literal at the start of {text!r}")


def _position(printed: str | None) -> float:
    return math.nan if printed is None else float(printed)


def dom_from_text(text: str) -> tuple[DomElement, ...]:
    """The inverse of `cua_jax.envs.miniwob.dom_to_text` (positions as printed: whole pixels;
    NaN when the text was written without geometry)."""
    elements: list[DomElement] = []
    parents: list[int] = []
    for line in text.splitlines():
        match = _DOM_LINE.match(line) or _DOM_LINE_ID_LAST.match(line)
        if match is None:
            raise ValueError(f"not a DOM text line: {line!r}")
        match = {"left": None, "top": None, "width": None, "height": None, **match.groupdict()}
        depth = len(match["indent"]) // 2
        head, *classes = match["name"].split(".")
        tag, _, element_id = head.partition("#")
        rest, label, value, focused = match["rest"].strip(), "", None, False
        if rest.endswith("focused"):
            rest, focused = rest[: -len("focused")].strip(), True
        if rest[:1] in ("'", '"'):
            label, rest = _leading_literal(rest)
        if rest.startswith("value="):
            value, rest = _leading_literal(rest[len("value=") :])
        if rest:
            raise ValueError(f"unexpected {rest!r} in the DOM text line {line!r}")
        del parents[depth:]
        ref = int(match["ref"])
        elements.append(
            DomElement(
                ref=ref,
                parent=parents[-1] if parents else None,
                depth=depth,
                tag=tag,
                text=label,
                left=_position(match["left"]),
                top=_position(match["top"]),
                width=_position(match["width"]),
                height=_position(match["height"]),
                id=element_id,
                classes=" ".join(classes),
                value=value,
                focused=focused,
            )
        )
        parents.append(ref)
    return tuple(elements)


def flatten_dom(info: dict[str, Any] | None) -> tuple[DomElement, ...]:
    """MiniWoB's `core.getDOMInfo` tree as `DomElement`s in document order (empty for None)."""
    out: list[DomElement] = []

    def visit(node: dict[str, Any], parent: int | None, depth: int) -> None:
        classes = node.get("classes") or ""
        out.append(
            DomElement(
                ref=int(node["ref"]),
                parent=parent,
                depth=depth,
                tag=str(node["tag"]),
                text=str(node.get("text") or ""),
                left=float(node["left"]),
                top=float(node["top"]),
                width=float(node["width"]),
                height=float(node["height"]),
                id=str(node.get("id") or ""),
                classes=classes if isinstance(classes, str) else "",  # SVG className is an object
                value=node.get("value"),
                focused=bool(node.get("focused", False)),
            )
        )
        for child in node.get("children", ()):
            visit(child, int(node["ref"]), depth + 1)

    if info:
        visit(info, None, 0)
    return tuple(out)
