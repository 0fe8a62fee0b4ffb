"""The Playwright driver of a web application's page (`WebappPage`): observing it with a general
marker of interactive elements, and acting on it with the action grammar.

MiniWoB's pages number their elements with MiniWoB's own `core.getDOMInfo`; an application's
pages have no such thing, so the marker here walks any document: every rendered element that
a person can act on (links, buttons, form fields, a `<select>`'s options, elements with a click
handler or an interactive ARIA role) or read (leaf elements with text) gets an id the first
time an observation sees it (`data-cua_ref`, kept while the element stays in the document, as
MiniWoB's refs are), and the observation lists them in document order as `DomElement`s with
viewport coordinates. Element ids are drawn on the screenshot as set-of-marks
(`miniwob.draw_marks`) when the action space acts on elements, and `click_element` /
`fill_element` act by id: a click on an `<option>` chooses it in its `<select>` (a native
list's popup is not part of the page a screenshot shows). Elements outside the viewport keep
their ids and are scrolled into view before they are acted on.
"""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import numpy as np
from PIL import Image

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import DomElement, InvalidElementError, dom_to_text, draw_marks
from cua_jax.envs.page_actions import PageActions

DEFAULT_VIEWPORT = (1024, 768)  # (width, height) of the page the agent sees
PAGE_TIMEOUT_MS = 30_000
# A link followed or a form submitted asks for its document within milliseconds of the click
# or key; an action that asked for none by then stays on its page.
NAVIGATION_GRACE_S = 0.15
NAVIGATING_ACTIONS = (A.Click, A.ClickElement, A.Key)
NAVIGATION_COMMIT_S = 10.0  # a navigation that never commits (a download, an aborted one) is waited for this long

# Ids for the marked elements, in document order, and their boxes. Text fragments are not
# listed apart: an element's text is its own text nodes', so a leaf cell or label carries it.
_MARK_JS = r"""() => {
  const INTERACTIVE = new Set(['A', 'BUTTON', 'INPUT', 'SELECT', 'OPTION', 'TEXTAREA', 'LABEL', 'SUMMARY']);
  const ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem', 'option', 'switch']);
  if (window.__cuaNextRef === undefined) window.__cuaNextRef = 1;
  const out = [];
  const visit = (el, parentRef, depth) => {
    const style = window.getComputedStyle(el);
    if (style.display === 'none') return;
    const tag = el.tagName;
    if (tag === 'SCRIPT' || tag === 'STYLE' || tag === 'NOSCRIPT' || tag === 'TEMPLATE') return;
    if (tag === 'INPUT' && el.type === 'hidden') return;
    let own = '';
    for (const node of el.childNodes) if (node.nodeType === 3) own += node.textContent;
    own = own.replace(/\s+/g, ' ').trim();
    const interactive = INTERACTIVE.has(tag) || ROLES.has(el.getAttribute('role'))
      || el.hasAttribute('onclick') || el.isContentEditable;
    const rect = el.getBoundingClientRect();
    const shown = style.visibility !== 'hidden' && rect.width > 0 && rect.height > 0;
    let ref = parentRef;
    if ((interactive || own) && (shown || tag === 'OPTION')) {
      if (el.dataset.cua_ref === undefined) el.dataset.cua_ref = String(window.__cuaNextRef++);
      ref = Number(el.dataset.cua_ref);
      let value = null;
      if (tag === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio')) value = el.checked;
      else if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT') value = el.value;
      else if (tag === 'OPTION') value = el.selected;
      let box = rect;
      if (tag === 'OPTION') box = el.parentElement.closest('select').getBoundingClientRect();
      out.push({ref: ref, parent: parentRef, depth: depth,
                tag: tag === 'INPUT' ? 'INPUT_' + (el.type || 'text') : tag,
                text: (tag === 'INPUT' ? (el.placeholder || '') : own).slice(0, 200),
                left: box.left, top: box.top, width: box.width, height: box.height,
                id: el.id || '', classes: typeof el.className === 'string' ? el.className : '',
                value: value, focused: document.activeElement === el});
    }
    for (const child of el.children) visit(child, ref, ref === parentRef ? depth : depth + 1);
  };
  if (document.body) visit(document.body, null, 0);
  return {title: document.title, elements: out};
}"""

# Where to act on element `ref`, or why it cannot be: scrolled into view first, then the centre
# of its visible part when a click there reaches it, else the nearest point that does.
_RESOLVE_JS = r"""([ref, width, height]) => {
  const el = document.querySelector('[data-cua_ref="' + ref + '"]');
  if (el === null) return {status: ref < (window.__cuaNextRef || 1) ? 'gone' : 'unknown'};
  const tag = el.tagName;
  const editable = tag === 'TEXTAREA' || el.isContentEditable || (tag === 'INPUT'
    && ['text', 'password', 'email', 'search', 'tel', 'url', 'number', ''].indexOf(el.type) >= 0);
  if (tag === 'OPTION') {
    const select = el.closest('select');
    if (select === null || select.disabled || el.disabled) return {status: 'hidden', tag: tag};
    return {status: 'option', tag: tag};
  }
  el.scrollIntoView({block: 'nearest', inline: 'nearest'});
  const rect = el.getBoundingClientRect(), style = window.getComputedStyle(el);
  const found = {status: 'hidden', tag: tag, editable: editable};
  if (style.visibility === 'hidden' || rect.width <= 0 || rect.height <= 0) return found;
  const left = Math.max(0, rect.left), top = Math.max(0, rect.top);
  const right = Math.min(width, rect.right), bottom = Math.min(height, rect.bottom);
  if (right - left < 1 || bottom - top < 1) return found;
  const cx = Math.floor((left + right) / 2), cy = Math.floor((top + bottom) / 2);
  const hits = (x, y) => { const at = document.elementFromPoint(x + 0.5, y + 0.5);
                           return at !== null && el.contains(at); };
  if (hits(cx, cy)) { found.x = cx; found.y = cy; }
  let nearest = Infinity;
  for (let y = Math.ceil(top); found.x === undefined && y < bottom; y += 2) {
    for (let x = Math.ceil(left); x < right; x += 2) {
      const d = (x - cx) * (x - cx) + (y - cy) * (y - cy);
      if (d < nearest && hits(x, y)) { nearest = d; found.px = x; found.py = y; }
    }
  }
  if (found.x === undefined && found.px !== undefined) { found.x = found.px; found.y = found.py; }
  found.status = found.x === undefined ? 'covered' : 'ok';
  return found;
}"""

# Choose an option as a person choosing it from the list would: selected, and the select's
# input and change events fired.
_CHOOSE_OPTION_JS = r"""(ref) => {
  const option = document.querySelector('[data-cua_ref="' + ref + '"]');
  const select = option.closest('select');
  select.focus();
  option.selected = true;
  select.dispatchEvent(new Event('input', {bubbles: true}));
  select.dispatchEvent(new Event('change', {bubbles: true}));
}"""

# Carets and animations stilled, so that two screenshots of one state are equal.
_STILL_JS = """() => {
  if (document.getElementById('cua-still')) return true;
  const root = document.head || document.documentElement;
  if (root === null) return false;  // a document not parsed yet (a navigation is committing)
  const style = document.createElement('style');
  style.id = 'cua-still';
  style.textContent = '*, *::before, *::after { caret-color: transparent !important; ' +
    'animation-duration: 0s !important; animation-delay: 0s !important; transition: none !important; }';
  root.appendChild(style);
  return true;
}"""


def _element(raw: dict[str, Any]) -> DomElement:
    return DomElement(
        ref=int(raw["ref"]),
        parent=None if raw["parent"] is None else int(raw["parent"]),
        depth=int(raw["depth"]),
        tag=str(raw["tag"]),
        text=str(raw["text"]),
        left=float(raw["left"]),
        top=float(raw["top"]),
        width=float(raw["width"]),
        height=float(raw["height"]),
        id=str(raw["id"]),
        classes=str(raw["classes"]),
        value=raw["value"],
        focused=bool(raw["focused"]),
    )


def _point(found: dict[str, Any], ref: int, fill: bool) -> tuple[int, int]:
    """The pixel `_RESOLVE_JS` found for element `ref`, or InvalidElementError saying why there is none."""
    status = found["status"]
    if status == "unknown":
        raise InvalidElementError(f"element {ref} does not exist: use an id the page lists")
    if status == "gone":
        raise InvalidElementError(f"element {ref} is no longer on the page: use an id from the current page")
    name = f"element {ref} ({found['tag']})"
    if status == "option":
        raise InvalidElementError(f"{name} is an option of a list: click it to choose it")
    if status == "hidden":
        raise InvalidElementError(f"{name} is hidden: it cannot be acted on until it is shown")
    if status == "covered":
        raise InvalidElementError(f"{name} is covered by other elements: no click would reach it")
    if fill and not found["editable"]:
        raise InvalidElementError(f"{name} cannot be filled: fill_element takes a text field or text area")
    return int(found["x"]), int(found["y"])


class WebappPage(PageActions):
    """One capsule's page of a web application (a Playwright async `page`), `viewport` pixels.
    Not safe for concurrent use. `answer` holds the text of the agent's terminal action once it
    has ended the episode (None before); `ended_by` names that action."""

    def __init__(self, page: Any, viewport: tuple[int, int] = DEFAULT_VIEWPORT):
        self.page = page
        self.region = (int(viewport[0]), int(viewport[1]))
        self.answer: str | None = None
        self.ended_by: str | None = None
        self._cdp: Any = None
        self._navigations_requested = 0  # document requests of the main frame
        self._navigations_committed = 0
        page.on("request", self._on_request)
        page.on("framenavigated", self._on_frame_navigated)

    def _on_request(self, request: Any) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self._navigations_requested += 1

    def _on_frame_navigated(self, frame: Any) -> None:
        if frame == self.page.main_frame:
            self._navigations_committed += 1

    async def perform(self, action: A.Action) -> None:
        """`PageActions.perform`, then, for a click or a key (a link followed, a form submitted),
        the navigation it started, loaded: the observation that follows shows the page the action
        led to, never the one it left."""
        requested, committed = self._navigations_requested, self._navigations_committed
        await super().perform(action)
        if not isinstance(action, NAVIGATING_ACTIONS):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NAVIGATION_GRACE_S
        while self._navigations_requested == requested and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self._navigations_requested == requested:
            return  # the action stayed on the page
        # A redirect (Trac answers a form with 303) asks for more documents than it commits:
        # wait for the first commit since the action, then for its load.
        deadline = loop.time() + NAVIGATION_COMMIT_S
        while self._navigations_committed == committed and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await self.page.wait_for_load_state("load")

    async def load(self, url: str) -> None:
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        width, height = self.region
        if self.page.viewport_size != {"width": width, "height": height}:
            await self.page.set_viewport_size({"width": width, "height": height})
        await self.page.goto(url, wait_until="load")

    async def settle(self) -> None:
        """Wait for a navigation an action started to finish loading, then still the page."""
        from playwright.async_api import Error as PlaywrightError

        for attempt in range(10):
            await self.page.wait_for_load_state("load")
            try:
                if await self.page.evaluate(_STILL_JS):
                    return
            except PlaywrightError as error:  # a navigation began after the load: wait for it
                if "context was destroyed" not in str(error):
                    raise
            await asyncio.sleep(0.05 * (attempt + 1))
        raise TimeoutError(f"the page at {self.page.url} did not settle into a document")

    async def elements(self) -> tuple[str, tuple[DomElement, ...]]:
        marked = await self.page.evaluate(_MARK_JS)
        return str(marked["title"]), tuple(_element(e) for e in marked["elements"])

    async def screenshot(self) -> np.ndarray:
        """The viewport (uint8 [height, width, 3]), by one DevTools call."""
        if self._cdp is None:
            self._cdp = await self.page.context.new_cdp_session(self.page)
        width, height = self.region
        shot = await self._cdp.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "optimizeForSpeed": True,
                "captureBeyondViewport": False,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        png = base64.b64decode(shot["data"])
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)

    async def observe(
        self, include_dom_text: bool = False, action_space: str = "coordinates"
    ) -> tuple[str, tuple[DomElement, ...], np.ndarray, str | None]:
        """(page title, elements, screenshot, DOM text or None). With an action space that acts
        on elements the screenshot shows their ids."""
        from playwright.async_api import Error as PlaywrightError

        for attempt in range(5):
            await self.settle()
            try:
                title, dom = await self.elements()
                break
            except PlaywrightError as error:  # an action's navigation replaced the document meanwhile
                if attempt == 4 or "context was destroyed" not in str(error):
                    raise
        image = await self.screenshot()
        if A.check_action_space(action_space) != "coordinates":
            image = draw_marks(image, dom)
        text = dom_to_text(dom, geometry=action_space != "elements") if include_dom_text else None
        return title, dom, image, text

    def path(self) -> str:
        """The page's URL relative to its site: path, query and fragment."""
        url = self.page.url
        scheme_end = url.find("://")
        slash = url.find("/", scheme_end + 3) if scheme_end >= 0 else -1
        return url[slash:] if slash >= 0 else "/"

    async def element_point(self, ref: int, fill: bool = False) -> tuple[int, int]:
        return _point(await self.page.evaluate(_RESOLVE_JS, [ref, *self.region]), ref, fill)

    async def click_element(self, ref: int) -> None:
        found = await self.page.evaluate(_RESOLVE_JS, [ref, *self.region])
        if found["status"] == "option":
            await self.page.evaluate(_CHOOSE_OPTION_JS, ref)
            return
        await self.page.mouse.click(*_point(found, ref, fill=False))

    async def end_by_agent(self, action: A.Action) -> None:
        """The agent ended the episode: `answer` is its text (an answer), "N/A" for a declared
        failure (WebArena's answer for a task that cannot be done), "" for done."""
        self.ended_by = A.action_arguments(action)["action"]
        if isinstance(action, A.Answer):
            self.answer = action.text
        else:
            self.answer = "N/A" if isinstance(action, A.Fail) else ""
