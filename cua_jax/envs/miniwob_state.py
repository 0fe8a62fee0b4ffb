# Single job: capturing and restoring a MiniWoB++ page's state (the recorder, capture and restore scripts).
"""Forking a MiniWoB++ page by capturing its state instead of replaying its actions.

A replay fork loads the task, begins the episode with the same seed and performs every
action of the parent again. Capture reads what those actions left behind instead, and
`restore_state` writes it onto a fresh page of the same task begun with the same seed.

Why this is exact when no task code ran since the episode began: MiniWoB builds each problem
from the seed alone (`Math.seedrandom`, then `genProblem`), so two pages begun with the same
seed hold the same DOM and the same closure state. What an agent's clicks, typing and
scrolling change without the task's own code running is the browser's default actions:
form state (value, checked, indeterminate, selected options, text selection in fields),
focus, the document's selection, scroll offsets, and the pointer's position (hover). Add
MiniWoB's element numbering (`data-wob_ref`, `core.nextRefCode`) and its click marks
(`data-tampered`, set by core's own body listener) and the episode globals, and the two pages
are the same page. The recorder (`install_state_recorder`) checks the premise per episode:
it sees every listener and inline handler of the task that runs, every timer callback,
pending timers and animations, and every DOM mutation other than numbering; any of these
makes `capture_state` answer with the reason instead of a state.

Where it is not exact, and so refused: a task handler ran (its closures may hold state the
DOM does not show: click-button-sequence's pressed buttons); a timer or animation runs on its
own clock (chase-circle, moving-items, jQuery UI slides); the DOM changed beyond form state
(contenteditable text, `<details open>`); the episode ended; a mouse button is held; a
scroll is still in progress; a field holds input its value does not show
(`validity.badInput`); a date or time field has the focus (the segment it edits is not a
property); the page navigated to a #fragment. Not restored, as no observation or reward
reads them: the click-trace canvas and the reward/countdown panel beside the 160 x 210 task
region, and the countdown's closure.
Wall-clock time is not page state here: the caller moves the fork's clock with
`MiniWoBPage.set_elapsed_ms`, as a replay fork does.

The pointer position is the last one a mouse event reported on the page (kept across
episodes); `restore_state` moves the fork's mouse there so hover styles match. A page whose
pointer never moved has none; a fork that has one then parks it outside the task region.
Chromium keeps a trace of a press the fork cannot replay without pressing: after a click in a
textarea, one pixel of its resize corner differs until the pointer moves (sign-agreement).
The fingerprint checks the DOM and form state, not pixels, so it does not see this.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from cua_jax.envs.miniwob import WINDOW_HEIGHT, WINDOW_WIDTH


class StateRestoreMismatch(RuntimeError):
    """A restored page does not match the captured state (another task or seed, or state the
    restore could not write); the message says what differs."""


@dataclasses.dataclass(frozen=True)
class FieldState:
    """One input, textarea or select, keyed by its element path from `document.body`
    (child-element indices, "2/0/1")."""

    path: str
    kind: str  # tag, and the type of an input: "INPUT_checkbox", "TEXTAREA", "SELECT"
    value: str | None  # None for selects (their options say it)
    checked: bool
    indeterminate: bool
    options_selected: tuple[bool, ...]  # a select's options, in order
    selection: tuple[int, int, str] | None  # selectionStart, selectionEnd, selectionDirection


@dataclasses.dataclass(frozen=True)
class PageState:
    """What a MiniWoB page's running episode holds beyond what its seed determines.

    Paths are child-element indices from `document.body` ("" is the body itself); node paths
    (the document's selection) count every child node. `fingerprint` is a SHA-256 of the page
    as `restore_state` verifies it: the body's DOM (bar the reward panel) with form state,
    focus, scroll, selection, numbering and the episode globals.
    """

    url_path: str
    fields: tuple[FieldState, ...]
    focus_path: str | None  # None: nothing but the body is focused
    focus_visible: bool
    document_selection: tuple[str, int, str, int] | None  # anchor path, offset, focus path, offset
    window_scroll: tuple[float, float]
    element_scroll: tuple[tuple[str, float, float], ...]  # (path, scrollLeft, scrollTop), nonzero only
    element_refs: tuple[tuple[str, int], ...]  # (path, data-wob_ref) of this episode's numbered elements
    next_ref: int  # core.nextRefCode
    tampered_paths: tuple[str, ...]  # elements core marked clicked in this episode
    pointer: tuple[float, float] | None
    done: bool
    env_reward: float
    raw_reward: float
    reason: str | None
    max_time_ms: float
    fingerprint: str


# The recorder, run before any of the page's own scripts. It wraps addEventListener (and
# jQuery's event.add, which registers one shared listener per element and type) to learn who
# registered each listener: code of the task page or common/ is the task's; MiniWoB's core/
# libraries (core.js, jQuery, jQuery UI, d3) on their own are not (jQuery UI's document
# mouseup, core's click tracer). Inline and property handlers (onclick=) are seen by a capture
# listener on window. Timers and animation frames are wrapped; MutationObserver sees the DOM.
# The record restarts when core.startEpisodeReal returns: what the seeded episode start itself
# does, a fresh page begun with the same seed does too.
_RECORDER_JS = (
    r"""
(() => {
  if (Object.prototype.hasOwnProperty.call(window, '__cuaStateRecorder')) return;
  const native = {
    add: EventTarget.prototype.addEventListener, remove: EventTarget.prototype.removeEventListener,
    setTimeout: window.setTimeout, setInterval: window.setInterval,
    clearTimeout: window.clearTimeout, clearInterval: window.clearInterval,
    requestAnimationFrame: window.requestAnimationFrame, cancelAnimationFrame: window.cancelAnimationFrame,
  };
  const R = {native: native, started: false, ran: [], mutations: [], pending: new Map(), pointer: null,
             buttons: 0, startHref: null, taskDepth: 0};
  Object.defineProperty(window, '__cuaStateRecorder', {value: R, enumerable: false});
  const IGNORED_ATTRIBUTES = ['data-wob_ref', 'data-wob_eps', 'data-tampered'];
  const CORE_PARTS = '#reward-display, #click-canvas, #sync-task-cover';

  const describe = (node) => {
    if (node === window) return 'window';
    if (node === document) return 'document';
    if (node && node.tagName) return node.tagName + (node.id ? '#' + node.id : '');
    return node && node.constructor ? node.constructor.name : String(node);
  };
  // Task code: not core.js registering for itself (its innermost frame), and either a frame
  // outside MiniWoB's core/ folder (the task page, common/) or a call made while task code runs.
  const taskOrigin = () => {
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 64;
    const stack = String(new Error().stack);
    Error.stackTraceLimit = limit;
    const urls = stack.match(/https?:\/\/[^\s)]+/g) || [];
    if (urls.length && /\/core\/core\.js:/.test(urls[0])) return false;
    return R.taskDepth > 0 || urls.some((url) => url.indexOf('/core/') < 0);
  };
  const note = (what) => { if (R.started && R.ran.length < 50) R.ran.push(what); };
  const runAs = (task, fn, self, args) => {
    if (task) R.taskDepth++;
    try { return fn.apply(self, args); } finally { if (task) R.taskDepth--; }
  };

  // jQuery: tag each handler with who added it; its shared listener is the task's when any
  // handler of the event's type is.
  const hookJQuery = (jq) => {
    if (!jq || !jq.event || typeof jq.event.add !== 'function' || jq.event.add.__cuaHooked) return;
    const add = jq.event.add;
    jq.event.add = function (elem, types, handler) {
      const fn = handler && handler.handler ? handler.handler : handler;
      if (typeof fn === 'function') {
        try { fn.__cuaTask = fn.__cuaTask === true || taskOrigin(); } catch (e) {}
      }
      return add.apply(this, arguments);
    };
    jq.event.add.__cuaHooked = true;
  };
  const jQueryHandlersAreTask = (target, listener, type) => {
    const jq = window.jQuery;
    if (!jq || typeof jq._data !== 'function') return false;
    let data;
    try { data = jq._data(target); } catch (e) { return false; }
    if (!data || data.handle !== listener) return false;
    return ((data.events || {})[type] || []).some((h) => !h.handler || h.handler.__cuaTask !== false);
  };
  let jQueryValue;
  Object.defineProperty(window, 'jQuery', {configurable: true, enumerable: true,
    get() { return jQueryValue; }, set(value) { jQueryValue = value; hookJQuery(value); }});

  // Listeners.
  const wrappers = new WeakMap();  // listener -> Map(type|capture -> wrapper)
  const keyOf = (type, options) =>
    type + '|' + (typeof options === 'boolean' ? options : !!(options && options.capture));
  EventTarget.prototype.addEventListener = function (type, listener, options) {
    if (!listener || (typeof listener !== 'function' && typeof listener !== 'object')) {
      return native.add.call(this, type, listener, options);
    }
    let byKey = wrappers.get(listener);
    if (!byKey) { byKey = new Map(); wrappers.set(listener, byKey); }
    const key = keyOf(type, options);
    let wrapper = byKey.get(key);
    if (!wrapper) {
      wrapper = function (event) {
        const task = wrapper.task || jQueryHandlersAreTask(this, listener, event.type);
        if (task) note(event.type + ' listener on ' + describe(this));
        const fn = typeof listener === 'function' ? listener : listener.handleEvent;
        return runAs(task, fn, typeof listener === 'function' ? this : listener, arguments);
      };
      wrapper.task = false;
      byKey.set(key, wrapper);
    }
    wrapper.task = wrapper.task || taskOrigin();
    return native.add.call(this, type, wrapper, options);
  };
  EventTarget.prototype.removeEventListener = function (type, listener, options) {
    const byKey = listener && wrappers.get(listener);
    const wrapper = byKey && byKey.get(keyOf(type, options));
    return native.remove.call(this, type, wrapper || listener, options);
  };

  // Inline and property handlers (onclick=..., el.onclick = fn) on the event's path.
  const inlineTypes = new Set();
  for (const proto of [HTMLElement.prototype, Document.prototype, Window.prototype]) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name.startsWith('on')) inlineTypes.add(name.slice(2));
    }
  }
  const inlineCheck = (event) => {
    if (!R.started) return;
    for (const node of event.composedPath()) {
      const handler = node['on' + event.type];
      if (typeof handler === 'function' && !(window.core && node === window.core.cover_div)) {
        note('on' + event.type + ' handler on ' + describe(node));
        return;
      }
    }
  };
  for (const type of inlineTypes) native.add.call(window, type, inlineCheck, true);

  // The pointer, kept across episodes: the mouse stays where it was.
  const pointerSeen = (event) => { R.pointer = [event.clientX, event.clientY]; R.buttons = event.buttons; };
  for (const type of ['mousemove', 'mousedown', 'mouseup', 'click', 'dblclick', 'contextmenu', 'wheel']) {
    native.add.call(window, type, pointerSeen, true);
  }

  // Scrolls in progress (a wheel scrolls smoothly, over several frames), until their scrollend.
  R.scrolling = new Set();
  native.add.call(window, 'scroll', (event) => R.scrolling.add(event.target), true);
  native.add.call(window, 'scrollend', (event) => R.scrolling.delete(event.target), true);

  // Timers and animation frames. Core's episode timer and countdown are recognised by their
  // ids (core.EP_TIMER, core.CD_TIMER) when asked.
  const isCoreTimer = (key) => !!window.core && (key === 'T' + window.core.EP_TIMER"""
    r""" || key === 'T' + window.core.CD_TIMER);
  const wrapTimer = (kind, prefix, repeats, schedule, args) => {
    const fn = args[0];
    const task = taskOrigin();
    const entry = {kind: kind, key: null};
    if (typeof fn === 'function') {
      args[0] = function () {
        if (!repeats) R.pending.delete(entry.key);
        if (!isCoreTimer(entry.key)) note(kind + ' callback');
        return runAs(task, fn, this, arguments);
      };
    }
    const id = schedule.apply(window, args);
    entry.key = prefix + id;
    R.pending.set(entry.key, entry);
    return id;
  };
  window.setTimeout = function () {
    return wrapTimer('setTimeout', 'T', false, native.setTimeout, Array.from(arguments));
  };
  window.setInterval = function () {
    return wrapTimer('setInterval', 'T', true, native.setInterval, Array.from(arguments));
  };
  window.requestAnimationFrame = function () {
    return wrapTimer('requestAnimationFrame', 'A', false, native.requestAnimationFrame, Array.from(arguments));
  };
  window.clearTimeout = function (id) { R.pending.delete('T' + id); return native.clearTimeout.call(window, id); };
  window.clearInterval = function (id) { R.pending.delete('T' + id); return native.clearInterval.call(window, id); };
  window.cancelAnimationFrame = function (id) {
    R.pending.delete('A' + id);
    return native.cancelAnimationFrame.call(window, id);
  };
  R.pendingTimers = () => Array.from(R.pending.entries()).filter(([key]) => !isCoreTimer(key)).map(([, e]) => e.kind);

  // DOM mutations beyond MiniWoB's numbering and its own panels.
  const interesting = (record) => {
    if (record.type === 'attributes' && IGNORED_ATTRIBUTES.indexOf(record.attributeName) >= 0) return false;
    if (record.type === 'attributes' && record.attributeName === 'style'
        && R.styleWithoutCaret(record.oldValue) === R.styleWithoutCaret(record.target.getAttribute('style')))"""
    r""" return false;
    const element = record.target.nodeType === 1 ? record.target : record.target.parentElement;
    return !(element && element.closest && element.closest(CORE_PARTS));
  };
  const keep = (record) => {
    if (R.started && interesting(record) && R.mutations.length < 50) {
      R.mutations.push(record.type + (record.attributeName ? ' ' + record.attributeName : '')"""
    r""" + ' on ' + describe(record.target));
    }
  };
  const observer = new MutationObserver((records) => records.forEach(keep));
  // Playwright's screenshots hide the caret through inline styles of fields, then undo it, and
  // the undo rewrites the attribute in the browser's serialisation ("width:40px;" becomes
  // "width: 40px;"): styles are compared as parsed declarations without the caret colour.
  const styleParser = document.createElement('div');
  R.styleWithoutCaret = (style) => {
    styleParser.setAttribute('style', style || '');
    styleParser.style.removeProperty('caret-color');
    return styleParser.style.cssText;
  };
  observer.observe(document, {subtree: true, childList: true, attributes: true, attributeOldValue: true,
                              characterData: true});
  R.flushMutations = () => observer.takeRecords().forEach(keep);

  // The episode start: core.startEpisodeReal, hooked as core.js defines it.
  const episodeStarted = () => {
    observer.takeRecords();
    R.started = true; R.ran = []; R.mutations = []; R.startHref = location.href;
  };
  const hookCore = (core) => {
    if (!core || typeof core !== 'object') return;
    let start;
    Object.defineProperty(core, 'startEpisodeReal', {configurable: true, enumerable: true,
      get() { return start; },
      set(fn) {
        start = typeof fn !== 'function' ? fn : function () {
          try { return fn.apply(this, arguments); } finally { episodeStarted(); }
        };
      }});
  };
  let coreValue;
  Object.defineProperty(window, 'core', {configurable: true, enumerable: true,
    get() { return coreValue; }, set(value) { coreValue = value; hookCore(value); }});
})();
"""
)

# Paths, the fingerprint's serialisation, and the text-field test, shared by capture and restore.
_HELPERS_JS = (
    r"""
  const body = document.body;
  const episodeMark = 'e' + WOB_EPISODE_ID;
  const elementPath = (el) => {
    const parts = [];
    for (let node = el; node && node !== body; node = node.parentElement) {
      if (!node.parentElement) return null;
      parts.push(Array.prototype.indexOf.call(node.parentElement.children, node));
    }
    return parts.reverse().join('/');
  };
  const atPath = (path) => {
    let node = body;
    for (const part of path === '' ? [] : path.split('/')) {
      node = node && node.children[+part];
    }
    return node || null;
  };
  const nodePath = (node) => {
    const parts = [];
    for (; node && node !== body; node = node.parentNode) {
      if (!node.parentNode) return null;
      parts.push(Array.prototype.indexOf.call(node.parentNode.childNodes, node));
    }
    return node === body ? parts.reverse().join('/') : null;
  };
  const atNodePath = (path) => {
    let node = body;
    for (const part of path === '' ? [] : path.split('/')) node = node && node.childNodes[+part];
    return node || null;
  };
  const hasSelection = (el) => {
    try { return el.selectionStart !== null && el.selectionStart !== undefined; } catch (e) { return false; }
  };
  const isTextControl = (el) => (el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement)"""
    r""" && hasSelection(el);
  const fingerprintText = () => {
    const active = document.activeElement;
    const out = [];
    const walk = (node) => {
      if (node.nodeType === 3) { out.push(JSON.stringify(node.data)); return; }
      if (node.nodeType !== 1 || node.id === 'reward-display') return;
      const attributes = Array.from(node.attributes).filter((a) => {
        if (a.name === 'data-wob_ref') return node.dataset.wob_eps === episodeMark;
        if (a.name === 'data-wob_eps' || a.name === 'data-tampered') return a.value === episodeMark;
        return a.name !== 'style' || R.styleWithoutCaret(a.value) !== '';
      }).map((a) => {
        const shown = a.name === 'data-wob_eps' || a.name === 'data-tampered' ? 'current'
          : a.name === 'style' ? R.styleWithoutCaret(a.value) : a.value;
        return a.name + '=' + JSON.stringify(shown);
      }).sort();
      const props = [];
      if (node instanceof HTMLInputElement || node instanceof HTMLTextAreaElement) {
        props.push('value=' + JSON.stringify(node.value));
        if (node instanceof HTMLInputElement)"""
    r""" props.push('checked=' + node.checked, 'indeterminate=' + node.indeterminate);
        if (hasSelection(node))"""
    r""" props.push('selection=' + [node.selectionStart, node.selectionEnd, node.selectionDirection]);
      }
      if (node instanceof HTMLOptionElement) props.push('selected=' + node.selected);
      if (node.scrollLeft || node.scrollTop) props.push('scroll=' + node.scrollLeft + ',' + node.scrollTop);
      if (node === active) props.push('focused', 'focus-visible=' + node.matches(':focus-visible'));
      out.push('<' + node.tagName + ' ' + attributes.join(' ') + ' | ' + props.join(' ') + '>');
      node.childNodes.forEach(walk);
      out.push('</' + node.tagName + '>');
    };
    walk(body);
    const selection = window.getSelection();
    const selected = selection && selection.rangeCount > 0
      ? [nodePath(selection.anchorNode), selection.anchorOffset, nodePath(selection.focusNode), selection.focusOffset]
      : null;
    out.push(JSON.stringify({
      path: location.pathname + location.search + location.hash, scroll: [window.scrollX, window.scrollY],
      selection: selected, nextRef: core.nextRefCode, done: WOB_DONE_GLOBAL, env: WOB_REWARD_GLOBAL,
      raw: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON),
      maxTime: core.EPISODE_MAX_TIME,
    }));
    return out.join('\n');
  };
"""
)

_CAPTURE_JS = (
    "() => {\n  const R = window.__cuaStateRecorder;\n"
    "  if (!R) return {refused: 'the page has no state recorder: "
    "call install_state_recorder before loading the task'};\n"
    "  if (typeof core === 'undefined' || !R.started) return {refused: 'no episode has started on this page'};\n"
    + _HELPERS_JS
    + r"""
  const reasons = [];
  if (WOB_DONE_GLOBAL || core.EP_TIMER === null) reasons.push('the episode has ended');
  const unique = (items) => Array.from(new Set(items));
  if (R.ran.length) reasons.push('task code ran: ' + unique(R.ran).join(', '));
  const pending = R.pendingTimers();
  if (pending.length) reasons.push('timers are pending: ' + unique(pending).join(', '));
  const animations = document.getAnimations().filter((a) => a.playState === 'running' || a.pending);
  if (animations.length) reasons.push(animations.length + ' animation(s) running');
  R.flushMutations();
  if (R.mutations.length)"""
    r""" reasons.push('the DOM changed beyond form state: ' + unique(R.mutations).slice(0, 5).join(', '));
  if (R.buttons) reasons.push('a mouse button is held down');
  if (R.scrolling.size) reasons.push('a scroll is in progress');
  if (location.href !== R.startHref) reasons.push('the page navigated to ' + location.hash);
  const controls = Array.from(body.querySelectorAll('input, textarea, select'));
  for (const el of controls) {
    if (el.validity && el.validity.badInput)"""
    r""" reasons.push('a field (' + el.tagName + ') holds input its value does not show');
    if (el.type === 'file' && el.files && el.files.length) reasons.push('a file input holds files');
  }
  const active = document.activeElement;
  // A focused date or time field edits one segment (month, hour), which no property shows.
  if (active instanceof HTMLInputElement"""
    r""" && ['date', 'datetime-local', 'month', 'week', 'time'].indexOf(active.type) >= 0) {
    reasons.push('the focus is in a ' + active.type + ' field, whose segment being edited the page cannot read');
  }
  if (active && active !== body && elementPath(active) === null) reasons.push('the focus is outside the page body');
  if (active && (active.tagName === 'IFRAME' || active.shadowRoot))"""
    r""" reasons.push('the focus is inside a frame or shadow root');
  if (reasons.length) return {refused: reasons.join('; ')};

  const fields = controls.map((el) => ({
    path: elementPath(el),
    kind: el.tagName + (el instanceof HTMLInputElement ? '_' + el.type : ''),
    value: el instanceof HTMLSelectElement ? null : el.value,
    checked: !!el.checked,
    indeterminate: !!el.indeterminate,
    options: el instanceof HTMLSelectElement ? Array.from(el.options).map((o) => o.selected) : [],
    selection: hasSelection(el) ? [el.selectionStart, el.selectionEnd, el.selectionDirection] : null,
  }));
  const scrolled = Array.from(body.querySelectorAll('*')).filter((el) => el.scrollLeft || el.scrollTop)
    .map((el) => [elementPath(el), el.scrollLeft, el.scrollTop]);
  if (body.scrollLeft || body.scrollTop) scrolled.unshift(['', body.scrollLeft, body.scrollTop]);
  const refs = Array.from(body.querySelectorAll('[data-wob_ref]')).filter((el) => el.dataset.wob_eps === episodeMark)
    .map((el) => [elementPath(el), +el.dataset.wob_ref]);
  if (body.dataset.wob_ref !== undefined && body.dataset.wob_eps === episodeMark)"""
    r""" refs.unshift(['', +body.dataset.wob_ref]);
  const tampered = Array.from(body.querySelectorAll('[data-tampered]'))"""
    r""".filter((el) => el.dataset.tampered === episodeMark)
    .map(elementPath);
  if (body.dataset.tampered === episodeMark) tampered.unshift('');
  const selection = window.getSelection();
  const documentSelection = !isTextControl(active) && selection && selection.rangeCount > 0
    ? [nodePath(selection.anchorNode), selection.anchorOffset, nodePath(selection.focusNode), selection.focusOffset]
    : null;
  return {
    urlPath: location.pathname, fields: fields,
    focusPath: active && active !== body ? elementPath(active) : null,
    focusVisible: !!(active && active !== body && active.matches(':focus-visible')),
    documentSelection: documentSelection && documentSelection.indexOf(null) < 0 ? documentSelection : null,
    windowScroll: [window.scrollX, window.scrollY], elementScroll: scrolled, refs: refs, nextRef: core.nextRefCode,
    tampered: tampered, pointer: R.pointer, done: WOB_DONE_GLOBAL, env: WOB_REWARD_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL,
    reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON), maxTime: core.EPISODE_MAX_TIME,
    fingerprint: fingerprintText(),
  };
}"""
)

# Writes properties, never dispatches input/change events: no task handler sees the restore.
# Focus does fire focus events, as it did on the parent, whose handlers did not run there.
_RESTORE_JS = (
    "(s) => {\n  const R = window.__cuaStateRecorder;\n"
    "  if (!R) return {error: 'the page has no state recorder: call install_state_recorder before loading the task'};\n"
    "  if (typeof core === 'undefined' || !R.started) {\n"
    "    return {error: 'no episode has begun on this page: call begin_episode first'};\n  }\n" + _HELPERS_JS + r"""
  if (location.pathname !== s.urlPath) return {error: 'another task: ' + location.pathname + ', captured ' + s.urlPath};
  if (core.EPISODE_MAX_TIME !== s.maxTime) {
    return {error: 'the episode time limit is ' + core.EPISODE_MAX_TIME + ' ms, captured ' + s.maxTime
                   + ' ms: begin the episode with the same limit'};
  }
  if (R.ran.length) return {error: 'task code already ran on this page: ' + R.ran.join(', ')};
  WOB_DONE_GLOBAL = s.done; WOB_REWARD_GLOBAL = s.env; WOB_RAW_REWARD_GLOBAL = s.raw; WOB_REWARD_REASON = s.reason;
  const controls = Array.from(body.querySelectorAll('input, textarea, select'));
  if (controls.length !== s.fields.length) {
    return {error: 'the page has ' + controls.length + ' form fields, captured ' + s.fields.length};
  }
  for (let i = 0; i < controls.length; i++) {
    const el = controls[i], f = s.fields[i];
    const kind = el.tagName + (el instanceof HTMLInputElement ? '_' + el.type : '');
    if (elementPath(el) !== f.path || kind !== f.kind) {
      return {error: 'form field ' + i + ' is ' + kind + ' at ' + elementPath(el)"""
    r""" + ', captured ' + f.kind + ' at ' + f.path};
    }
    if (f.value !== null && el.value !== f.value) el.value = f.value;
    if (el instanceof HTMLInputElement) {
      if (el.checked !== f.checked) el.checked = f.checked;
      if (el.indeterminate !== f.indeterminate) el.indeterminate = f.indeterminate;
    }
    if (el instanceof HTMLSelectElement) {
      if (el.options.length !== f.options.length) return {error: 'select at ' + f.path + ' has other options'};
      f.options.forEach((selected, j) => {"""
    r""" if (el.options[j].selected !== selected) el.options[j].selected = selected; });
    }
  }
  const applySelection = (el, f) => {
    if (f.selection === null || !hasSelection(el)) return;
    const [start, end, direction] = f.selection;
    if (el.selectionStart !== start || el.selectionEnd !== end || el.selectionDirection !== direction) {
      el.setSelectionRange(start, end, direction);
    }
  };
  controls.forEach((el, i) => applySelection(el, s.fields[i]));

  // Numbering: this episode's ids where the parent gave them, none elsewhere.
  const wanted = new Map(s.refs.map(([path, ref]) => [path, ref]));
  for (const el of [body, ...body.querySelectorAll('[data-wob_ref]')]) {
    if (el.dataset.wob_ref !== undefined && el.dataset.wob_eps === episodeMark && !wanted.has(elementPath(el))) {
      delete el.dataset.wob_ref; delete el.dataset.wob_eps;
    }
  }
  for (const [path, ref] of wanted) {
    const el = atPath(path);
    if (el === null) return {error: 'no element at ' + path + ' for id ' + ref};
    el.dataset.wob_ref = ref; el.dataset.wob_eps = episodeMark;
  }
  core.nextRefCode = s.nextRef;
  for (const path of s.tampered) {
    const el = atPath(path);
    if (el === null) return {error: 'no element at ' + path + ' marked clicked'};
    el.dataset.tampered = episodeMark;
  }

  for (const [path, left, top] of s.elementScroll) {
    const el = atPath(path);
    if (el === null) return {error: 'no scrolled element at ' + path};
    el.scrollLeft = left; el.scrollTop = top;
  }
  window.scrollTo(s.windowScroll[0], s.windowScroll[1]);

  if (s.documentSelection !== null) {
    const anchor = atNodePath(s.documentSelection[0]), focus = atNodePath(s.documentSelection[2]);
    if (anchor === null || focus === null) return {error: 'the selected nodes are missing'};
    window.getSelection().setBaseAndExtent(anchor, s.documentSelection[1], focus, s.documentSelection[3]);
  }
  if (s.focusPath !== null) {
    const el = atPath(s.focusPath);
    if (el === null) return {error: 'no element at ' + s.focusPath + ' to focus'};
    el.focus({preventScroll: true, focusVisible: s.focusVisible});
    const i = controls.indexOf(el);
    if (i >= 0) applySelection(el, s.fields[i]);
  } else if (document.activeElement && document.activeElement !== body) {
    document.activeElement.blur();
  }
  return {};
}"""
)
# After the pointer has moved too: nothing of the task ran, and the page's fingerprint.
_VERIFY_JS = (
    "() => {\n  const R = window.__cuaStateRecorder;\n"
    + _HELPERS_JS
    + r"""
  R.flushMutations();
  if (R.ran.length) return {error: 'task code ran while restoring: ' + R.ran.join(', ')};
  if (R.mutations.length) return {error: 'the DOM changed while restoring: ' + R.mutations.join(', ')};
  return {fingerprint: fingerprintText()};
}"""
)

_POINTER_JS = "() => window.__cuaStateRecorder ? window.__cuaStateRecorder.pointer : null"
# Where a pointer that must leave the task region rests: the window's empty bottom-right corner.
_PARKED_POINTER = (WINDOW_WIDTH - 1, WINDOW_HEIGHT - 1)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _page_state(raw: dict[str, Any]) -> PageState:
    fields = tuple(
        FieldState(
            path=str(f["path"]),
            kind=str(f["kind"]),
            value=None if f["value"] is None else str(f["value"]),
            checked=bool(f["checked"]),
            indeterminate=bool(f["indeterminate"]),
            options_selected=tuple(bool(o) for o in f["options"]),
            selection=None
            if f["selection"] is None
            else (int(f["selection"][0]), int(f["selection"][1]), str(f["selection"][2])),
        )
        for f in raw["fields"]
    )
    selection = raw["documentSelection"]
    return PageState(
        url_path=str(raw["urlPath"]),
        fields=fields,
        focus_path=raw["focusPath"],
        focus_visible=bool(raw["focusVisible"]),
        document_selection=None
        if selection is None
        else (str(selection[0]), int(selection[1]), str(selection[2]), int(selection[3])),
        window_scroll=(float(raw["windowScroll"][0]), float(raw["windowScroll"][1])),
        element_scroll=tuple((str(p), float(x), float(y)) for p, x, y in raw["elementScroll"]),
        element_refs=tuple((str(p), int(r)) for p, r in raw["refs"]),
        next_ref=int(raw["nextRef"]),
        tampered_paths=tuple(str(p) for p in raw["tampered"]),
        pointer=None if raw["pointer"] is None else (float(raw["pointer"][0]), float(raw["pointer"][1])),
        done=bool(raw["done"]),
        env_reward=float(raw["env"]),
        raw_reward=float(raw["raw"]),
        reason=raw["reason"],
        max_time_ms=float(raw["maxTime"]),
        fingerprint=_digest(raw["fingerprint"]),
    )


def _state_for_page(state: PageState) -> dict[str, Any]:
    """The state as `_RESTORE_JS` reads it."""
    return {
        "urlPath": state.url_path,
        "fields": [
            {
                "path": f.path,
                "kind": f.kind,
                "value": f.value,
                "checked": f.checked,
                "indeterminate": f.indeterminate,
                "options": list(f.options_selected),
                "selection": None if f.selection is None else list(f.selection),
            }
            for f in state.fields
        ],
        "focusPath": state.focus_path,
        "focusVisible": state.focus_visible,
        "documentSelection": None if state.document_selection is None else list(state.document_selection),
        "windowScroll": list(state.window_scroll),
        "elementScroll": [list(s) for s in state.element_scroll],
        "refs": [list(r) for r in state.element_refs],
        "nextRef": state.next_ref,
        "tampered": list(state.tampered_paths),
        "done": state.done,
        "env": state.env_reward,
        "raw": state.raw_reward,
        "reason": state.reason,
        "maxTime": state.max_time_ms,
    }


async def install_state_recorder(page: Any) -> None:
    """Make every later load of `page` (a Playwright page) record whether the task's own code
    runs during an episode; call it before `MiniWoBPage.load`."""
    await page.add_init_script(script=_RECORDER_JS)


async def capture_state(page: Any) -> PageState | str:
    """The running episode's state, or the reason a state would not rebuild it exactly
    (e.g. "task code ran: click listener on BUTTON#subbtn")."""
    raw = await page.evaluate(_CAPTURE_JS)
    if "refused" in raw:
        return str(raw["refused"])
    return _page_state(raw)


async def restore_state(page: Any, state: PageState) -> None:
    """Write `state` onto `page`: the same task, loaded with the recorder installed and its
    episode begun with the captured episode's seed (and time limit). Raises
    StateRestoreMismatch when the page then differs from the captured one."""
    result = await page.evaluate(_RESTORE_JS, _state_for_page(state))
    if "error" in result:
        raise StateRestoreMismatch(str(result["error"]))
    # The pointer last: hover follows the page under it as the source's did.
    pointer = state.pointer
    if pointer is None and await page.evaluate(_POINTER_JS) is not None:
        pointer = _PARKED_POINTER
    if pointer is not None:
        await page.mouse.move(pointer[0], pointer[1])
    result = await page.evaluate(_VERIFY_JS)
    if "error" in result:
        raise StateRestoreMismatch(str(result["error"]))
    fingerprint = _digest(result["fingerprint"])
    if fingerprint != state.fingerprint:
        raise StateRestoreMismatch(
            f"the restored page's fingerprint {fingerprint[:12]} differs from the captured {state.fingerprint[:12]}:"
            " another seed, or state the restore does not write"
        )
