"""The X display: starting Xvfb and the window manager, screenshots, pointer, window tree."""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
import zlib
from xml.sax.saxutils import quoteattr

from Xlib import X, display as xdisplay, error as xerror


class Display:
    """One X display, reached through python-xlib (reads) and xdotool (input)."""

    def __init__(self, name: str):
        self.name = name
        self.processes: list[subprocess.Popen] = []
        self._lock = threading.Lock()  # python-xlib connections are not thread-safe
        self._x: xdisplay.Display | None = None

    # ---- lifecycle ------------------------------------------------------------------
    def start(self, width: int, height: int, window_manager: list[str], timeout: float = 30.0) -> None:
        """Start Xvfb at width x height x 24 and the window manager; wait for both."""
        number = self.name.lstrip(":").split(".")[0]
        socket_path = f"/tmp/.X11-unix/X{number}"
        # The server starts with its container, so any lock or socket of this display is stale:
        # left in the files of a committed or restarted container. Xvfb refuses a lock whose
        # pid is alive, and the new container may well reuse that pid.
        for stale in (f"/tmp/.X{number}-lock", socket_path):
            if os.path.lexists(stale):
                os.remove(stale)
        xvfb = subprocess.Popen(
            ["Xvfb", self.name, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp",
             "-ac", "-noreset"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.processes.append(xvfb)
        deadline = time.monotonic() + timeout
        while not os.path.exists(socket_path):
            if xvfb.poll() is not None:
                raise RuntimeError(f"Xvfb exited with status {xvfb.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Xvfb did not create {socket_path} within {timeout}s")
            time.sleep(0.05)
        self.connect(timeout=deadline - time.monotonic())
        env = {**os.environ, "DISPLAY": self.name}
        self.processes.append(
            subprocess.Popen(window_manager, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        while self.window_manager_name() is None:
            if self.processes[-1].poll() is not None:
                raise RuntimeError(f"window manager {window_manager[0]} exited")
            if time.monotonic() > deadline:
                raise RuntimeError(f"window manager {window_manager[0]} did not start within {timeout}s")
            time.sleep(0.05)

    def connect(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._x = xdisplay.Display(self.name)
                return
            except (xerror.DisplayError, OSError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def alive(self) -> bool:
        """False when a process this display started has exited."""
        return all(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()

    # ---- reads -----------------------------------------------------------------------
    def _root(self):
        if self._x is None:
            self.connect()
        return self._x.screen().root

    def size(self) -> tuple[int, int]:
        """(width, height) in pixels; known from the connection setup, no round trip."""
        with self._lock:
            if self._x is None:
                self.connect()
            screen = self._x.screen()
            return int(screen.width_in_pixels), int(screen.height_in_pixels)

    def cursor_position(self) -> tuple[int, int]:
        with self._lock:
            pointer = self._root().query_pointer()
            return int(pointer.root_x), int(pointer.root_y)

    def screenshot_png(self) -> bytes:
        """The whole screen as an RGB PNG."""
        width, height = self.size()
        with self._lock:
            image = self._root().get_image(0, 0, width, height, X.ZPixmap, 0xFFFFFFFF)
        return encode_png_bgrx(image.data, width, height)

    def window_manager_name(self) -> str | None:
        with self._lock:
            root = self._root()
            atom = self._x.intern_atom("_NET_SUPPORTING_WM_CHECK")
            prop = root.get_full_property(atom, X.AnyPropertyType)
            return None if prop is None or not prop.value else str(prop.value[0])

    def accessibility_tree(self) -> str:
        """The X window tree as XML: the part of an accessibility tree the X server knows."""
        with self._lock:
            root = self._root()
            lines = ['<desktop-frame name="root">']
            self._describe(root, 1, lines)
            lines.append("</desktop-frame>")
            return "\n".join(lines)

    def _describe(self, window, depth: int, lines: list[str]) -> None:
        try:
            children = window.query_tree().children
        except xerror.XError:
            return
        for child in children:
            try:
                attrs = child.get_attributes()
                geometry = child.get_geometry()
                name = child.get_wm_name() or ""
                wm_class = child.get_wm_class() or ("", "")
            except xerror.XError:
                continue  # a window closed while we walked the tree
            if attrs.map_state != X.IsViewable:
                continue
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            indent = "  " * depth
            lines.append(
                f"{indent}<window id=\"{child.id:#x}\" name={quoteattr(str(name))} "
                f"class={quoteattr(str(wm_class[-1] if wm_class else ''))} x=\"{geometry.x}\" "
                f"y=\"{geometry.y}\" width=\"{geometry.width}\" height=\"{geometry.height}\">"
            )
            self._describe(child, depth + 1, lines)
            lines.append(f"{indent}</window>")


def encode_png_bgrx(data: bytes, width: int, height: int, level: int = 1) -> bytes:
    """PNG (8-bit RGB) of a 32-bit BGRX pixel buffer, as the X server returns for depth 24."""
    rgb = bytearray(width * height * 3)
    rgb[0::3] = data[2::4]
    rgb[1::3] = data[1::4]
    rgb[2::3] = data[0::4]
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[row * stride:(row + 1) * stride] for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, level)) + chunk(b"IEND", b"")
