"""MiniWoB++ tasks on a Playwright page: loading, observing, acting, rewards.

The task HTML comes from the installed `miniwob` package and is served by a loopback HTTP
server (`MiniWoBServer`, 127.0.0.1 only, in a child process). A `MiniWoBPage` drives one task page through
Playwright's async API; it knows nothing about who owns the browser, so the capsule
runtime (`cua_jax.envs.capsules`) and the baselines beside it reuse it unchanged.

Episodes follow MiniWoB's own protocol (as its Selenium driver does): load the task page,
`Math.seedrandom(seed)`, `core.startEpisodeReal()`; the task's JavaScript decides the
reward (`WOB_RAW_REWARD_GLOBAL`, raw; `WOB_REWARD_GLOBAL`, scaled by the time left) and
ends the episode itself, including on MiniWoB's time limit (`core.EPISODE_MAX_TIME`, 10 s
by default, per task), which ends with raw reward -1 and reason "timed out".

Observation: the 160 x 210 task region as MiniWoB crops it (uint8 [210, 160, 3]), the
utterance, the visible DOM as flat `DomElement`s (MiniWoB's `core.getDOMInfo`) and,
optionally, that DOM as text. Actions are `cua_jax.envs.actions`; their 1000-grid
coordinates map onto the 160 x 210 region, which is the page's top-left corner.

Element ids (set-of-marks): every visible element keeps the ref MiniWoB gives it the first
time it is observed in an episode (`[ref]` in the DOM text), so an id stays valid while its
element is on the page. With an action space other than "coordinates" the screenshot shows
the ids of interactive elements (`draw_marks`), and `click_element` / `fill_element` act where
a click reaches the element (`MiniWoBPage.element_point`). An id never given out, an id whose
element has left the page, and an element that is hidden, outside the task region or wholly
covered are refused with a message (`InvalidElementError`), never acted on.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import dataclasses
import difflib
import functools
import io
import math
import pathlib
import re
import subprocess
import sys
import threading
from typing import Any

import numpy as np
from PIL import Image

from cua_jax.envs import actions as A

TASK_WIDTH, TASK_HEIGHT = 160, 210  # the task region MiniWoB observes (miniwob.constants)
WINDOW_WIDTH, WINDOW_HEIGHT = 500, 320  # MiniWoB's browser window (miniwob.constants)
VIEWPORT = {"width": WINDOW_WIDTH, "height": WINDOW_HEIGHT}
SCROLL_PIXELS_PER_CLICK = 50  # miniwob.constants.DEFAULT_SCROLL_AMOUNT
PAGE_TIMEOUT_MS = 30_000  # bound on Playwright waits (loads): generous, as machines can be oversubscribed

CHROMIUM_EXECUTABLE = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # MiniWoB's clock and handlers are timers: pages of many capsules must not be throttled.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    # A screenshot waits for the next frame; without a vsync-paced frame rate that wait is
    # shorter (measured by experiments/benchmarks/capsules.py's observation lever).
    "--disable-gpu-vsync",
    "--disable-frame-rate-limit",
)


class UnknownTaskError(ValueError):
    """A task name that the installed MiniWoB++ package does not ship."""


class EpisodeEndedError(RuntimeError):
    """An action sent to an episode that has already ended; reset it first."""


class InvalidElementError(ValueError):
    """An element action whose id names no visible element of the page; the message says why."""


def html_dir() -> pathlib.Path:
    """The `html/` folder of the installed `miniwob` package (holds miniwob/, core/, common/)."""
    import miniwob

    path = pathlib.Path(miniwob.__file__).parent / "html"
    if not (path / "miniwob").is_dir() or not (path / "core" / "core.js").is_file():
        raise FileNotFoundError(f"the installed miniwob package has no task HTML under {path}")
    return path


@functools.lru_cache(maxsize=1)
def task_names() -> tuple[str, ...]:
    """Every MiniWoB++ task the installed package ships (the file stems of html/miniwob/*.html)."""
    return tuple(sorted(p.stem for p in (html_dir() / "miniwob").glob("*.html")))


def check_task(task: str) -> str:
    """Return `task` if the package ships it, else raise UnknownTaskError naming close matches."""
    if not isinstance(task, str) or task not in task_names():
        close = difflib.get_close_matches(str(task), task_names(), n=3)
        hint = (
            f"; did you mean {', '.join(close)}?" if close else f"; {len(task_names())} tasks exist, e.g. click-button"
        )
        raise UnknownTaskError(f"unknown MiniWoB task {task!r}{hint}")
    return task


# The server process: quiet, loopback only, and gone as soon as its parent is (stdin at EOF),
# however the parent ended.
_SERVER_SCRIPT = """
import functools, os, sys, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

ASSETS = sys.argv[2]

class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        # A task page opened on a capsule's own site takes its scripts from one shared host, so
        # a renderer that hosts many capsules compiles jQuery, d3 and core.js once, not per page.
        host = (self.headers.get("Host") or "").split(":")[0]
        if host.endswith(".test") and host != ASSETS and self.path.split("?")[0].endswith(".html"):
            try:
                with open(self.translate_path(self.path), "rb") as f:
                    body = f.read()
            except OSError:
                self.send_error(404)
                return
            shared = '<script src="http://%s:%d/' % (ASSETS, self.server.server_address[1])
            body = body.replace(b'<script src="../', shared.encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=sys.argv[1]))
httpd.daemon_threads = True
print("serving on port", httpd.server_address[1], flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
httpd.serve_forever()
"""


SHARED_ASSETS_HOST = "assets.test"  # where pages on capsule sites (*.test) load MiniWoB's scripts from


class MiniWoBServer:
    """Serves the package's html/ folder on 127.0.0.1 (an OS-chosen port).

    The server is a child process (the standard library's `http.server`), not a thread:
    page loads of many capsules would otherwise contend for the GIL with the event loop
    that drives Playwright. It exits when its parent does (its stdin reaches EOF).
    """

    def __init__(self, root: pathlib.Path | None = None, start_timeout_s: float = 30.0):
        self.root = root or html_dir()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SCRIPT, str(self.root), SHARED_ASSETS_HOST],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.PIPE,
            text=True,
        )
        self.port = self._read_port(start_timeout_s)

    def _read_port(self, timeout_s: float) -> int:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self._process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        match = re.search(r"port (\d+)", ready[0]) if ready else None
        if match is None:
            self.close()
            raise RuntimeError(f"the MiniWoB HTTP server did not start (said {ready[:1]!r})")
        return int(match.group(1))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def task_url(self, task: str, host: str = "127.0.0.1") -> str:
        """The task's page; `host` names the server by another name that resolves to it (a
        browser launched with a host-resolver rule gives each capsule a site of its own)."""
        return f"http://{host}:{self.port}/miniwob/{check_task(task)}.html"

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()  # the server exits on EOF
        if self._process.poll() is None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


# ------------------------------------------------------------------------------------
# Observations and rewards
# ------------------------------------------------------------------------------------


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


def _flatten_dom(info: dict[str, Any] | None) -> tuple[DomElement, ...]:
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


# ------------------------------------------------------------------------------------
# Driving a page
# ------------------------------------------------------------------------------------

_PLAYWRIGHT_KEYS = {
    "ctrl": "Control",
    "alt": "Alt",
    "shift": "Shift",
    "super": "Meta",
    "enter": "Enter",
    "esc": "Escape",
    "tab": "Tab",
    "space": "Space",
    "backspace": "Backspace",
    "delete": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "pagedown": "PageDown",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "capslock": "CapsLock",
    "printscreen": "PrintScreen",
    "menu": "ContextMenu",
    **{f"f{i}": f"F{i}" for i in range(1, 13)},
}
_CLICKS = {  # kind -> (button, click count)
    "left_click": ("left", 1),
    "right_click": ("right", 1),
    "middle_click": ("middle", 1),
    "double_click": ("left", 2),
    "triple_click": ("left", 3),
}
_STATE_JS = (
    "() => ({done: WOB_DONE_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL, env: WOB_REWARD_GLOBAL,"
    " reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON)})"
)


# MiniWoB gives an element its ref the first time it observes it in an episode (the element's
# id for element actions, stable while it stays on the page) and renumbers text fragments on
# every call. Text refs restart at -1 on each observation so that they are a function of the
# page alone. A replay (fork, restore) numbers the page where the original episode observed
# it, before each action, so that it hands out the same element ids.
_NUMBER_JS = "core.nextTextRefCode = -1; var dom = core.getDOMInfo();"
_OBSERVE_JS = (
    "() => { " + _NUMBER_JS + " var state = (" + _STATE_JS + ")();"
    " return {utterance: core.getUtterance(), dom: dom, state: state}; }"
)
_NUMBER_ONLY_JS = "() => { " + _NUMBER_JS + " return null; }"
# A fresh episode numbers its elements from 1.
_RESET_NUMBERING_JS = """
  document.querySelectorAll('[data-wob_ref]').forEach(function (e) { delete e.dataset.wob_ref; });
  core.nextRefCode = 1;
  core.nextTextRefCode = -1;
"""
# Where to act on the element with id `ref`, or why it cannot be acted on. The point is the
# centre of the element's part inside the task region (width x height) when the element (or
# one of its descendants) is what a click there hits, else the hit point nearest that centre
# on a 2-pixel lattice: an element partly covered by another is clicked where it shows.
_RESOLVE_ELEMENT_JS = (
    """([ref, width, height]) => {
  var element = document.querySelector('[data-wob_ref="' + ref + '"]');
  if (element === null || element.dataset.wob_eps !== 'e' + WOB_EPISODE_ID) {
    return {status: ref < core.nextRefCode ? 'gone' : 'unknown'};
  }
  var rect = element.getBoundingClientRect(), style = window.getComputedStyle(element);
  var editable = element instanceof HTMLTextAreaElement || element.isContentEditable
    || (element instanceof HTMLInputElement
        && ['text', 'password', 'email', 'search', 'tel', 'url', 'number', ''].indexOf(element.type) >= 0);
  var found = {status: 'hidden', tag: element.tagName, editable: editable};
  var visible = rect.width > 0 && rect.height > 0 && style.visibility !== 'hidden'
    && (typeof element.checkVisibility !== 'function' || element.checkVisibility());
  var left = Math.max(0, rect.left), top = Math.max(0, rect.top);
  var right = Math.min(width, rect.right), bottom = Math.min(height, rect.bottom);
  if (!visible || right - left < 1 || bottom - top < 1) return found;
  var cx = Math.floor((left + right) / 2), cy = Math.floor((top + bottom) / 2);
  var hits = function (x, y) { var at = document.elementFromPoint(x + 0.5, y + 0.5);"""
    """ return at !== null && element.contains(at); };
  var point = hits(cx, cy) ? [cx, cy] : null, nearest = Infinity;
  for (var y = Math.ceil(top); point === null && y < bottom; y += 2) {
    for (var x = Math.ceil(left); x < right; x += 2) {
      var d = (x - cx) * (x - cx) + (y - cy) * (y - cy);
      if (d < nearest && hits(x, y)) { nearest = d; found.x = x; found.y = y; }
    }
  }
  if (point !== null) { found.x = point[0]; found.y = point[1]; }
  found.status = found.x === undefined ? 'covered' : 'ok';
  return found;
}"""
)

# Set-of-marks: which elements get their id drawn on the screenshot (every element keeps its
# id in the DOM text). Interactive tags, and leaves with text or a value (MiniWoB's widgets
# are often bare spans and divs with click handlers).
_MARKED_TAGS = frozenset({"BUTTON", "A", "SELECT", "TEXTAREA", "LABEL", "OPTION", "LI", "SPAN", "TD", "H3"})
MARK_COLOR = (255, 0, 255)  # magenta boxes: rare in MiniWoB pages, visible on white and grey
MARK_TEXT_COLOR = (255, 255, 255)


def marked_elements(dom: tuple[DomElement, ...]) -> list[DomElement]:
    """The elements whose ids `draw_marks` draws: inputs, interactive tags, and leaf elements with text."""
    parents = {e.parent for e in dom if e.tag != "t"}
    marked = []
    for e in dom:
        if e.tag == "t" or e.width <= 0 or e.height <= 0:
            continue
        leaf = e.ref not in parents
        if (
            e.tag.startswith("INPUT")
            or (e.tag in _MARKED_TAGS and (leaf or e.tag in ("BUTTON", "A", "SELECT")))
            or (leaf and e.text)
        ):
            marked.append(e)
    return marked


@functools.lru_cache(maxsize=1)
def _mark_font():
    from PIL import ImageFont

    return ImageFont.load_default(size=8)


def draw_marks(screenshot: np.ndarray, dom: tuple[DomElement, ...]) -> np.ndarray:
    """The screenshot (uint8 [H, W, 3]) with each marked element's id in a filled box at its
    top-left corner and its outline drawn, as set-of-marks prompting shows them. Pure: returns a new array."""
    from PIL import ImageDraw

    image = Image.fromarray(screenshot)
    draw = ImageDraw.Draw(image)
    font = _mark_font()
    height, width = screenshot.shape[:2]
    for e in marked_elements(dom):
        left, top = max(0.0, e.left), max(0.0, e.top)
        right, bottom = min(float(width), e.left + e.width) - 1, min(float(height), e.top + e.height) - 1
        if right <= left or bottom <= top:
            continue
        draw.rectangle((left, top, right, bottom), outline=MARK_COLOR)
        label = str(e.ref)
        box = draw.textbbox((0, 0), label, font=font)
        label_width, label_height = box[2] - box[0] + 2, box[3] - box[1] + 2
        x0, y0 = min(left, width - label_width), min(top, height - label_height)
        draw.rectangle((x0, y0, x0 + label_width - 1, y0 + label_height - 1), fill=MARK_COLOR)
        draw.text((x0 + 1 - box[0], y0 + 1 - box[1]), label, fill=MARK_TEXT_COLOR, font=font)
    return np.asarray(image, dtype=np.uint8)


def _episode_state(s: dict[str, Any]) -> EpisodeState:
    return EpisodeState(bool(s["done"]), float(s["raw"]), float(s["env"]), s["reason"])


def playwright_key(key: str) -> str:
    """Playwright's name for a canonical key of the action grammar."""
    return _PLAYWRIGHT_KEYS.get(key, key)


def unsupported_reason(action: A.Action, action_space: str = "both") -> str | None:
    """Why `action` cannot act on a MiniWoB page in `action_space` (None when it can)."""
    if isinstance(action, A.WriteFile):
        return "write_file is not available in a web page; MiniWoB tasks are solved in the page itself"
    return A.outside_action_space(action, action_space)


# Screenshots must not depend on when they are taken: a blinking caret and running CSS
# animations or transitions would make two captures of one state differ. Stilled once per page
# (a style element in <head>, outside the task region and its DOM), not around every capture.
_STILL_PAGE_JS = """() => {
  const style = document.createElement('style');
  style.id = 'cua-still';
  style.textContent = '*, *::before, *::after { caret-color: transparent !important; ' +
    'animation-duration: 0s !important; animation-delay: 0s !important; ' +
    'animation-iteration-count: 1 !important; transition: none !important; }';
  document.head.appendChild(style);
}"""


class MiniWoBPage:
    """One MiniWoB task page of a Playwright (async) `page`. Not safe for concurrent use."""

    def __init__(self, page: Any, task: str):
        self.page = page
        self.task = check_task(task)
        self.max_time_ms: float | None = None
        self.url: str | None = None  # the task's document, once loaded
        self._cdp: Any = None  # the page's DevTools session, for screenshots

    async def load(self, url: str) -> None:
        """Open the task and wait until MiniWoB shows its start cover (the task is loaded)."""
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        if self.page.viewport_size != VIEWPORT:
            await self.page.set_viewport_size(VIEWPORT)
        await self.page.goto(url, wait_until="load")
        self.url = self.page.url
        loaded = "() => typeof core !== 'undefined' && core.cover_div !== null"
        if not await self.page.evaluate(loaded):
            await self.page.wait_for_function(loaded)
        await self.page.evaluate(_STILL_PAGE_JS)

    async def begin_episode(self, seed: int, time_limit_ms: float | None = None) -> None:
        """Seed MiniWoB's RNG and start an episode, as MiniWoB's own driver does.

        time_limit_ms replaces the task's own limit (core.EPISODE_MAX_TIME) when given; the
        time-scaled reward then follows it. The start cover's click handler is removed: only
        the driver starts episodes, so a click that lands after a time limit ended the
        episode cannot start an unseeded one.
        """
        ready = await self.page.evaluate(
            """([seed, limit]) => {
              core.cover_div.onclick = null;
              if (limit !== null) core.EPISODE_MAX_TIME = limit;
              Math.seedrandom(seed);
              core.setDataMode('train');
              core.startEpisodeReal();"""
            + _RESET_NUMBERING_JS
            + """
              return [WOB_TASK_READY === true, core.EPISODE_MAX_TIME];
            }""",
            [seed, time_limit_ms],
        )
        self.max_time_ms = float(ready[1])
        if not ready[0]:
            await self.page.wait_for_function("() => WOB_TASK_READY === true")

    async def elapsed_ms(self) -> float:
        """Milliseconds since the running episode began (MiniWoB's own clock)."""
        return float(await self.page.evaluate("() => new Date().getTime() - core.ept0"))

    async def set_elapsed_ms(self, elapsed_ms: float) -> None:
        """Move the running episode's clock so that `elapsed_ms` have passed, and re-arm its limit.

        A fork replays its parent's actions in less time than they took; this gives the fork
        the parent's remaining time, so time limits and time-scaled rewards carry over.
        """
        await self.page.evaluate(
            """(elapsed) => {
              if (WOB_DONE_GLOBAL || core.EP_TIMER === null) return;
              core.ept0 = new Date().getTime() - elapsed;
              clearTimeout(core.EP_TIMER);
              core.EP_TIMER = setTimeout(function () { core.endEpisode(-1, false, 'timed out'); },
                                         Math.max(0, core.EPISODE_MAX_TIME - elapsed));
            }""",
            elapsed_ms,
        )

    async def state(self) -> EpisodeState:
        return _episode_state(await self.page.evaluate(_STATE_JS))

    async def observe(self, include_dom_text: bool = False, action_space: str = "coordinates") -> MiniWoBObservation:
        return (await self.observe_with_state(include_dom_text, action_space))[0]

    async def number_elements(self) -> None:
        """Give ids to the elements now on the page, as an observation would (for replays)."""
        await self.page.evaluate(_NUMBER_ONLY_JS)

    async def observe_with_state(
        self, include_dom_text: bool = False, action_space: str = "coordinates"
    ) -> tuple[MiniWoBObservation, EpisodeState]:
        """The observation and the episode state, read in one round trip plus the screenshot.

        With an action space that acts on elements the screenshot shows the element ids
        (`draw_marks`); the DOM text leaves out geometry when only element actions are allowed.
        """
        page_info = await self.page.evaluate(_OBSERVE_JS)
        image = await self.screenshot()
        dom = _flatten_dom(page_info["dom"])
        if A.check_action_space(action_space) != "coordinates":
            image = draw_marks(image, dom)
        observation = MiniWoBObservation(
            task=self.task,
            utterance=str(page_info["utterance"]),
            screenshot=image,
            dom=dom,
            dom_text=dom_to_text(dom, geometry=action_space != "elements") if include_dom_text else None,
        )
        return observation, _episode_state(page_info["state"])

    async def screenshot(self) -> np.ndarray:
        """The task region (uint8 [TASK_HEIGHT, TASK_WIDTH, 3]), captured by one DevTools call:
        the page's caret and animations were stilled once at load (`_STILL_PAGE_JS`), so no
        per-shot restyling is needed; PNG at the encoder's fast setting, decoded once."""
        if self._cdp is None:
            self._cdp = await self.page.context.new_cdp_session(self.page)
        shot = await self._cdp.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "optimizeForSpeed": True,
                "captureBeyondViewport": False,
                "clip": {"x": 0, "y": 0, "width": TASK_WIDTH, "height": TASK_HEIGHT, "scale": 1},
            },
        )
        png = base64.b64decode(shot["data"])
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)

    async def end_by_agent(self, action: A.Action) -> None:
        """The agent ended the episode (done / FAIL / answer): a failure unless the task already paid."""
        name = A.action_arguments(action)["action"]
        await self.page.evaluate(
            "(reason) => core.endEpisode(-1.0, false, reason)", f"agent ended the episode with {name}"
        )

    async def element_point(self, ref: int, fill: bool = False) -> tuple[int, int]:
        """The page pixel where a click reaches element `ref`: the centre of its part inside the
        task region, or the nearest point to it not covered by other elements. Raises
        InvalidElementError when the id names no element the agent can act on."""
        found = await self.page.evaluate(_RESOLVE_ELEMENT_JS, [ref, TASK_WIDTH, TASK_HEIGHT])
        if found["status"] == "unknown":
            raise InvalidElementError(f"element {ref} does not exist: use an id the page lists")
        if found["status"] == "gone":
            raise InvalidElementError(f"element {ref} is no longer on the page: use an id from the current page")
        name = f"element {ref} ({found['tag']})"
        if found["status"] == "hidden":
            raise InvalidElementError(f"{name} is hidden: it cannot be acted on until it is shown")
        if found["status"] == "covered":
            raise InvalidElementError(f"{name} is covered by other elements: no click would reach it")
        if fill and not found["editable"]:
            raise InvalidElementError(f"{name} cannot be filled: fill_element takes a text field or text area")
        return int(found["x"]), int(found["y"])

    async def perform(self, action: A.Action) -> None:
        """Carry out one action of the grammar on the page (coordinates: 1000-grid -> 160 x 210;
        element ids: `element_point`, whose InvalidElementError leaves the page untouched)."""
        page, mouse = self.page, self.page.mouse

        def px(x: float, y: float) -> tuple[int, int]:
            return A.grid_to_pixels(x, y, TASK_WIDTH, TASK_HEIGHT)

        if isinstance(action, A.Click):
            button, count = _CLICKS[action.kind]
            await mouse.click(*px(action.x, action.y), button=button, click_count=count)
        elif isinstance(action, A.ClickElement):
            await mouse.click(*await self.element_point(action.element))
        elif isinstance(action, A.FillElement):
            await mouse.click(*await self.element_point(action.element, fill=True))
            await page.keyboard.press("Control+A")
            if action.text:
                await page.keyboard.type(action.text)
            else:
                await page.keyboard.press("Backspace")
        elif isinstance(action, A.MouseMove):
            await mouse.move(*px(action.x, action.y))
        elif isinstance(action, A.LeftClickDrag):
            if action.start_x is not None:
                await mouse.move(*px(action.start_x, action.start_y))
            await mouse.down()
            await mouse.move(*px(action.x, action.y), steps=5)
            await mouse.up()
        elif isinstance(action, (A.LeftMouseDown, A.LeftMouseUp)):
            if action.x is not None:
                await mouse.move(*px(action.x, action.y))
            await (mouse.down() if isinstance(action, A.LeftMouseDown) else mouse.up())
        elif isinstance(action, A.Key):
            await page.keyboard.press("+".join(playwright_key(k) for k in action.keys))
        elif isinstance(action, A.HoldKey):
            for k in action.keys:
                await page.keyboard.down(playwright_key(k))
            await asyncio.sleep(float(action.duration))
            for k in reversed(action.keys):
                await page.keyboard.up(playwright_key(k))
        elif isinstance(action, A.Type):
            await page.keyboard.type(action.text)
        elif isinstance(action, A.Scroll):
            if action.x is not None:
                await mouse.move(*px(action.x, action.y))
            step = SCROLL_PIXELS_PER_CLICK * action.amount
            dx, dy = {"up": (0, -step), "down": (0, step), "left": (-step, 0), "right": (step, 0)}[action.direction]
            await mouse.wheel(dx, dy)
        elif isinstance(action, A.Wait):
            await asyncio.sleep(float(action.seconds))
        elif isinstance(action, (A.Screenshot, A.CursorPosition)):
            pass  # every step returns a fresh observation anyway
        elif A.is_terminal(action):
            await self.end_by_agent(action)
        else:
            raise TypeError(f"not an action MiniWoB can perform: {action!r}")
