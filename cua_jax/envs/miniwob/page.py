"""The Playwright driver of one MiniWoB++ task page (`MiniWoBPage`): loading, episodes,
observing and acting."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob.catalog import check_task
from cua_jax.envs.miniwob.marks import draw_marks
from cua_jax.envs.miniwob.observation import (
    TASK_HEIGHT,
    TASK_WIDTH,
    EpisodeState,
    MiniWoBObservation,
    dom_to_text,
    flatten_dom,
)
from cua_jax.envs.page_actions import PageActions

WINDOW_WIDTH, WINDOW_HEIGHT = 500, 320  # MiniWoB's browser window (miniwob.constants)
VIEWPORT = {"width": WINDOW_WIDTH, "height": WINDOW_HEIGHT}
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


class EpisodeEndedError(RuntimeError):
    """An action sent to an episode that has already ended; reset it first."""


class InvalidElementError(ValueError):
    """An element action whose id names no visible element of the page; the message says why."""


# ------------------------------------------------------------------------------------
# Driving a page
# ------------------------------------------------------------------------------------

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


def _episode_state(s: dict[str, Any]) -> EpisodeState:
    return EpisodeState(bool(s["done"]), float(s["raw"]), float(s["env"]), s["reason"])


def unsupported_reason(action: A.Action, action_space: str = "both") -> str | None:
    """Why `action` cannot act on a MiniWoB page in `action_space` (None when it can)."""
    if isinstance(action, A.WriteFile):
        return "write_file is not available in a web page; MiniWoB tasks are solved in the page itself"
    return A.outside_action_space(action, action_space)


# Screenshots must not depend on when they are taken: a blinking caret and running CSS
# animations or transitions would make two captures of one state differ. Stilled once per page
# (a style element in <head>, outside the task region and its DOM), not around every capture.
# The caret also stops blinking (caret-animation: manual): with the frame-rate limit off
# (CHROMIUM_ARGS), a blinking caret in a focused field of a page that shares the browser kept
# the compositor drawing frames without pause, 0.3-0.9 of a core while every page sat idle.
_STILL_PAGE_JS = """() => {
  const style = document.createElement('style');
  style.id = 'cua-still';
  style.textContent = '*, *::before, *::after { caret-color: transparent !important; ' +
    'caret-animation: manual !important; ' +
    'animation-duration: 0s !important; animation-delay: 0s !important; ' +
    'animation-iteration-count: 1 !important; transition: none !important; }';
  document.head.appendChild(style);
}"""
# The task is loaded: MiniWoB's core is up and shows its start cover.
_CORE_LOADED = "typeof core !== 'undefined' && core.cover_div !== null"
_LOADED_JS = "() => " + _CORE_LOADED
# Still the document `load` opened: a reload or another document would lack the still style.
_TASK_DOCUMENT_JS = "() => " + _CORE_LOADED + " && document.getElementById('cua-still') !== null"

# Between two episodes in one page (`MiniWoBPage.prepare_next_episode`, `repaint`).
# Focus back to the body (some tasks keep their fields across episodes) and the site's storage emptied.
_CLEAR_PAGE_STATE_JS = """async () => {
  if (document.activeElement) document.activeElement.blur();
  localStorage.clear();
  sessionStorage.clear();
  for (const cookie of document.cookie.split(';')) {
    const name = cookie.split('=')[0].trim();
    if (name) document.cookie = name + '=; expires=Thu, 01 Jan 1970 00:00:00 GMT; path=/';
  }
  for (const db of await indexedDB.databases()) {
    await new Promise((done, failed) => {
      const request = indexedDB.deleteDatabase(db.name);
      request.onsuccess = done;
      request.onerror = () => failed(request.error);
      request.onblocked = done;
    });
  }
}"""
# Takes the body out of the layout and back, then waits two frames: the next paint is of the whole page.
_REPAINT_JS = """async () => {
  const body = document.body;
  body.style.display = 'none';
  void body.offsetHeight;
  body.style.display = '';
  void body.offsetHeight;
  await new Promise((painted) => requestAnimationFrame(() => requestAnimationFrame(painted)));
}"""


class MiniWoBPage(PageActions):
    """One MiniWoB task page of a Playwright (async) `page`. Not safe for concurrent use.
    Actions act on the task region (`region`: TASK_WIDTH x TASK_HEIGHT); `perform` is `PageActions`'s."""

    region = (TASK_WIDTH, TASK_HEIGHT)

    def __init__(self, page: Any, task: str):
        self.page = page
        self.task = check_task(task)
        self.max_time_ms: float | None = None
        self.url: str | None = None  # the task's document, once loaded
        self._cdp: Any = None  # the page's DevTools session, for screenshots
        self._mouse_down = False  # a LeftMouseDown not yet followed by its LeftMouseUp
        self._navigating = False  # the page asked to leave the task document after its load

    async def load(self, url: str) -> None:
        """Open the task and wait until MiniWoB shows its start cover (the task is loaded)."""
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        if self.page.viewport_size != VIEWPORT:
            await self.page.set_viewport_size(VIEWPORT)
        await self.page.goto(url, wait_until="load")
        self.url = self.page.url
        self.page.on("request", self._on_request)
        if not await self.page.evaluate(_LOADED_JS):
            await self.page.wait_for_function(_LOADED_JS)
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

    def _on_request(self, request: Any) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self._navigating = True

    async def holds_task_document(self) -> bool:
        """Whether the page still shows the task document `load` opened, and will: no
        navigation of its own was requested since (an action may navigate the page away or
        reload it, a moment after the action), the same URL, MiniWoB's core loaded, and the
        still style `load` added, which a new document would not have."""
        if self._navigating or self.page.is_closed() or self.page.url != self.url:
            return False
        from playwright.async_api import Error as PlaywrightError

        try:
            return bool(await self.page.evaluate(_TASK_DOCUMENT_JS))
        except PlaywrightError:  # e.g. a navigation under way destroyed the evaluation's context
            return False

    async def prepare_next_episode(self) -> None:
        """Before the page's next episode: release a button the last one left pressed, put the
        pointer and focus back where a new page has them (nothing hovered, dragged or focused),
        and empty the site's storage (local and session storage, cookies, IndexedDB), which a
        new page on a new site starts without."""
        if self._mouse_down:
            await self.page.mouse.up()
            self._mouse_down = False
        await self.page.mouse.move(0, 0)
        await self.page.evaluate(_CLEAR_PAGE_STATE_JS)

    async def repaint(self) -> None:
        """Paint the whole page anew. An episode begun in a used page is painted over the last
        one's tiles, and rounded edges can come out a shade apart from a new page's paint."""
        await self.page.evaluate(_REPAINT_JS)

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
        dom = flatten_dom(page_info["dom"])
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
