"""Performing actions of the grammar (cua_jax.envs.actions) on an X display with xdotool."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import time
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.server.display import Display

# xdotool takes X keysym names; single characters pass through as themselves.
XDOTOOL_KEYS = {
    "ctrl": "ctrl", "alt": "alt", "shift": "shift", "super": "super",
    "enter": "Return", "esc": "Escape", "tab": "Tab", "space": "space",
    "backspace": "BackSpace", "delete": "Delete", "insert": "Insert", "home": "Home",
    "end": "End", "pageup": "Prior", "pagedown": "Next", "up": "Up", "down": "Down",
    "left": "Left", "right": "Right", "capslock": "Caps_Lock", "printscreen": "Print",
    "menu": "Menu", **{f"f{i}": f"F{i}" for i in range(1, 13)},
}
BUTTONS = {"left_click": ("1", 1), "right_click": ("3", 1), "middle_click": ("2", 1),
           "double_click": ("1", 2), "triple_click": ("1", 3)}
SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}
TYPE_DELAY_MS = "8"


class ActionFailed(RuntimeError):
    """xdotool could not perform a well-formed action: the display is at fault."""


def xdotool_key(key: str) -> str:
    return XDOTOOL_KEYS.get(key, key)


class Executor:
    def __init__(self, display: Display, home: str = "/root"):
        self.display = display
        self.home = home

    def _xdotool(self, *args: str, timeout: float = 30.0) -> None:
        env = {**os.environ, "DISPLAY": self.display.name}
        result = subprocess.run(["xdotool", *args], env=env, capture_output=True, timeout=timeout)
        if result.returncode != 0:
            raise ActionFailed(f"xdotool {' '.join(args[:3])}... failed: {result.stderr.decode(errors='replace')[:300]}")

    def _pixels(self, x, y) -> list[str]:
        width, height = self.display.size()
        px, py = A.grid_to_pixels(x, y, width, height)
        return [str(px), str(py)]

    def perform(self, action: A.Action) -> dict[str, Any]:
        """Perform one action; returns what it reports (cursor position, written path...)."""
        if isinstance(action, A.Click):
            button, repeat = BUTTONS[action.kind]
            self._xdotool("mousemove", *self._pixels(action.x, action.y),
                          "click", "--repeat", str(repeat), "--delay", "60", button)
        elif isinstance(action, A.MouseMove):
            self._xdotool("mousemove", *self._pixels(action.x, action.y))
        elif isinstance(action, A.LeftClickDrag):
            start = [] if action.start_x is None else ["mousemove", *self._pixels(action.start_x, action.start_y), "sleep", "0.05"]
            self._xdotool(*start, "mousedown", "1", "sleep", "0.05",
                          "mousemove", *self._pixels(action.x, action.y), "sleep", "0.05", "mouseup", "1")
        elif isinstance(action, (A.LeftMouseDown, A.LeftMouseUp)):
            move = [] if action.x is None else ["mousemove", *self._pixels(action.x, action.y)]
            self._xdotool(*move, "mousedown" if isinstance(action, A.LeftMouseDown) else "mouseup", "1")
        elif isinstance(action, A.Key):
            self._xdotool("key", "--clearmodifiers", "+".join(xdotool_key(k) for k in action.keys))
        elif isinstance(action, A.HoldKey):
            keys = [xdotool_key(k) for k in action.keys]
            self._xdotool("keydown", *keys, "sleep", str(action.duration), "keyup", *reversed(keys))
        elif isinstance(action, A.Type):
            # xdotool types "\n" as a linefeed keysym that applications ignore; press the
            # keys a person would (Return, Tab) between the plain runs of text.
            for part in re.split(r"([\n\t])", action.text):
                if part in ("\n", "\t"):
                    self._xdotool("key", "--clearmodifiers", "Return" if part == "\n" else "Tab")
                elif part:
                    self._xdotool("type", "--delay", TYPE_DELAY_MS, "--", part,
                                  timeout=30.0 + len(part) * 0.05)
        elif isinstance(action, A.Scroll):
            move = [] if action.x is None else ["mousemove", *self._pixels(action.x, action.y)]
            self._xdotool(*move, "click", "--repeat", str(action.amount), "--delay", "30",
                          SCROLL_BUTTONS[action.direction])
        elif isinstance(action, A.Wait):
            time.sleep(float(action.seconds))
        elif isinstance(action, A.CursorPosition):
            width, height = self.display.size()
            px, py = self.display.cursor_position()
            return {"coordinate": list(A.pixels_to_grid(px, py, width, height)), "pixels": [px, py]}
        elif isinstance(action, A.WriteFile):
            path = pathlib.Path(action.path).expanduser()
            if not path.is_absolute():
                path = pathlib.Path(self.home) / path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(action.content, encoding="utf-8")
            return {"path": str(path)}
        # Screenshot, Done, Fail, Answer change nothing on the screen.
        return {}
