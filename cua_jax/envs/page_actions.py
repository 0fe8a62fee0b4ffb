"""The action grammar carried out on a Playwright page: what every browser page driver
(a MiniWoB task page, a web application's page) shares."""

from __future__ import annotations

import asyncio
from typing import Any

from cua_jax.envs import actions as A

SCROLL_PIXELS_PER_CLICK = 50  # miniwob.constants.DEFAULT_SCROLL_AMOUNT

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


def playwright_key(key: str) -> str:
    """Playwright's name for a canonical key of the action grammar."""
    return _PLAYWRIGHT_KEYS.get(key, key)


class PageActions:
    """`perform` for a page driver. The driver sets `page` (a Playwright page) and `region`
    ((width, height): the pixels the 1000-grid maps onto), and implements `element_point`
    (where a click reaches element `ref`; InvalidElementError when none does) and
    `end_by_agent` (a terminal action). `click_element` may be overridden (a `<select>`'s
    options are chosen, not clicked)."""

    page: Any
    region: tuple[int, int]
    _mouse_down = False  # a LeftMouseDown not yet followed by its LeftMouseUp

    async def element_point(self, ref: int, fill: bool = False) -> tuple[int, int]:
        raise NotImplementedError

    async def end_by_agent(self, action: A.Action) -> None:
        raise NotImplementedError

    async def click_element(self, ref: int) -> None:
        await self.page.mouse.click(*await self.element_point(ref))

    async def perform(self, action: A.Action) -> None:
        """Carry out one action of the grammar on the page (coordinates: 1000-grid -> `region`;
        element ids: `click_element` and `element_point`, whose InvalidElementError leaves the
        page untouched)."""
        page, mouse = self.page, self.page.mouse

        def px(x: float, y: float) -> tuple[int, int]:
            return A.grid_to_pixels(x, y, *self.region)

        if isinstance(action, A.Click):
            button, count = _CLICKS[action.kind]
            await mouse.click(*px(action.x, action.y), button=button, click_count=count)
        elif isinstance(action, A.ClickElement):
            await self.click_element(action.element)
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
            self._mouse_down = isinstance(action, A.LeftMouseDown)
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
            raise TypeError(f"not an action a page can perform: {action!r}")
