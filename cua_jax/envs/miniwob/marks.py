"""Set-of-marks: the ids of a page's interactive elements drawn on its screenshot."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from cua_jax.envs.miniwob.observation import DomElement

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
