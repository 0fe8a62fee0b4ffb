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

Modules, one job each (their public names are re-exported here):
    catalog       the tasks the package ships (`task_names`, `check_task`, `html_dir`)
    server        the loopback HTTP server (`MiniWoBServer`)
    observation   the DOM model, observation and episode state, the DOM's text form
    marks         set-of-marks drawing (`draw_marks`)
    page          the Playwright driver (`MiniWoBPage`), browser settings
"""

from cua_jax.envs.miniwob.catalog import UnknownTaskError, check_task, html_dir, task_names
from cua_jax.envs.miniwob.marks import MARK_COLOR, MARK_TEXT_COLOR, draw_marks, marked_elements
from cua_jax.envs.miniwob.observation import (
    TASK_HEIGHT,
    TASK_WIDTH,
    DomElement,
    EpisodeState,
    MiniWoBObservation,
    click_point,
    dom_from_text,
    dom_line,
    dom_to_text,
    flatten_dom,
)
from cua_jax.envs.miniwob.page import (
    CHROMIUM_ARGS,
    CHROMIUM_EXECUTABLE,
    PAGE_TIMEOUT_MS,
    VIEWPORT,
    WINDOW_HEIGHT,
    WINDOW_WIDTH,
    EpisodeEndedError,
    InvalidElementError,
    MiniWoBPage,
    unsupported_reason,
)
from cua_jax.envs.miniwob.server import SHARED_ASSETS_HOST, MiniWoBServer
from cua_jax.envs.page_actions import SCROLL_PIXELS_PER_CLICK, playwright_key

__all__ = [
    "CHROMIUM_ARGS",
    "CHROMIUM_EXECUTABLE",
    "MARK_COLOR",
    "MARK_TEXT_COLOR",
    "PAGE_TIMEOUT_MS",
    "SCROLL_PIXELS_PER_CLICK",
    "SHARED_ASSETS_HOST",
    "TASK_HEIGHT",
    "TASK_WIDTH",
    "VIEWPORT",
    "WINDOW_HEIGHT",
    "WINDOW_WIDTH",
    "DomElement",
    "EpisodeEndedError",
    "EpisodeState",
    "InvalidElementError",
    "MiniWoBObservation",
    "MiniWoBPage",
    "MiniWoBServer",
    "UnknownTaskError",
    "check_task",
    "click_point",
    "dom_from_text",
    "dom_line",
    "dom_to_text",
    "flatten_dom",
    "draw_marks",
    "html_dir",
    "marked_elements",
    "playwright_key",
    "task_names",
    "unsupported_reason",
]
