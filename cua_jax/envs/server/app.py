# Single job: the environment server's HTTP endpoints (OSWorld's protocol plus /action).
"""The HTTP endpoints (OSWorld's protocol plus /action), served on a Unix socket or TCP.

Endpoints (JSON bodies unless noted; errors are JSON {"status": "error", "message", "error"}):
    GET  /screenshot                        PNG of the screen
    POST /execute, /setup/execute           {command: str|list, shell?, timeout?} -> {status, output, error, returncode}
                                            (status "success" once the command ran, whatever its exit status)
    POST /run_python                        {code, timeout?} -> {status, output, error, returncode, return_code,
                                             message: output and error together, need_more: false}
    POST /run_bash_script                   {script, timeout?, working_dir?} -> {status, output: stdout and
                                             stderr merged, error: "", returncode}
    POST /file                              form or JSON {file_path} -> the file's bytes (404 when missing)
    POST /setup/upload                      multipart (file_path, file_data) or JSON {file_path, content_b64}
    POST /setup/launch                      {command: str|list, shell?} -> {status, pid}
    POST /setup/open_file                   {path, timeout?}: opens it in its application, waits for the window
    GET  /cursor_position                   [x, y] in pixels
    POST /screen_size                       {width, height}
    GET  /platform                          "Linux"
    POST /list_directory                    {path, depth?} -> {directory_tree: {name, type, children}}
                                            (every level unless depth is given)
    POST /desktop_path                      {desktop_path} (404 when ~/Desktop does not exist)
    POST /window_size                       form {app_class_name} -> {width, height} (404: no such window)
    POST /wallpaper                         the wallpaper image (404 when none is set)
    GET  /terminal                          {output: text of the focused terminal or null, status}
    POST /start_recording, /end_recording   screen recording with ffmpeg; end returns the MP4
                                            (501 where the environment has no ffmpeg)
    GET  /accessibility                     {AT: XML of the accessibility tree: AT-SPI's in OSWorld's form
                                             where the image has it, else the X window tree}
    POST /action                            {action: arguments object | text: tool-call text,
                                             screenshot?: bool} -> {status, result, screenshot_b64?}
    GET  /health                            {status, display}: 200 while Xvfb and the window manager live

A request that is the agent's fault (a malformed action) gets 400; a failure of the
environment itself gets 500. On TCP every request needs `Authorization: Bearer <token>`
(OSWorld's own client reaches a container through cua_jax.envs.osworld_bridge instead).

The replies have the shapes of OSWorld's server (desktop_env/server/main.py), so its
`PythonController` reads them as it is. Where that server answers 500 for what is not
the environment's failure (a command that timed out or does not exist), this one answers
200 with status "error": OSWorld's client re-sends any non-200 request three times (so a
timed-out script would run three more times), and our fault attribution counts 5xx as the
infrastructure's fault.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hmac
import http.server
import json
import mimetypes
import os
import pathlib
import shlex
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable
from xml.etree import ElementTree

from Xlib import X, display as xdisplay, error as xerror

from cua_jax.envs.server import accessibility
from cua_jax.envs import actions as A
from cua_jax.envs.server.display import Display
from cua_jax.envs.server.executor import Executor

# OSWorld's server's defaults, for requests that name no timeout (its client names none).
EXECUTE_TIMEOUT, RUN_PYTHON_TIMEOUT, RUN_BASH_TIMEOUT = 120.0, 30.0, 100.0
MAX_COMMAND_TIMEOUT = 600.0
RECORDING_PATH = "/tmp/recording.mp4"
EDITOR_SUFFIXES = {".txt", ".md", ".py", ".json", ".cfg", ".ini", ".log", ".sh", ".yaml", ".yml"}
SPREADSHEET_SUFFIXES = {".csv", ".xlsx", ".xls", ".ods", ".gnumeric", ".tsv"}


class BadRequest(Exception):
    """The request is malformed (HTTP 400)."""


class NotAvailable(Exception):
    """This environment lacks what the request needs (HTTP 501)."""


def run_process(
    command: str | list[str], shell: bool, timeout: float, cwd: str | None = None, merge_stderr: bool = False
) -> dict[str, Any]:
    """Run a command to completion in its own session; kill the whole group on timeout.
    With `merge_stderr`, stderr goes into "output" in order and "error" is empty."""
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    timeout = min(float(timeout), MAX_COMMAND_TIMEOUT)
    process = subprocess.Popen(
        command,
        shell=shell,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        message = f"timed out after {timeout}s"
        return {
            "status": "error",
            "output": out.decode(errors="replace"),
            "error": message,
            "message": message,
            "returncode": -1,
        }
    return {
        "status": "success" if process.returncode == 0 else "error",
        "output": out.decode(errors="replace"),
        "error": (err or b"").decode(errors="replace"),
        "returncode": process.returncode,
    }


def expand_home(command: str | list[str], shell: bool) -> str | list[str]:
    """Arguments starting with ~/ name the home directory, as OSWorld's server expands them."""
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(arg) if isinstance(arg, str) and arg.startswith("~/") else arg for arg in command]
    return command


def _expand_path(path: str) -> pathlib.Path:
    return pathlib.Path(os.path.expandvars(os.path.expanduser(path)))


class Environment:
    """What the endpoints act on: the display, the action executor and the file system."""

    def __init__(self, display: Display, home: str = "/root"):
        self.display = display
        self.executor = Executor(display, home)
        self.home = home
        self._recording: tuple[subprocess.Popen, Any] | None = None  # ffmpeg and its log file
        self._recording_lock = threading.Lock()

    def open_file(self, path: str, timeout: float) -> dict[str, Any]:
        file = pathlib.Path(path).expanduser()
        if not file.exists():
            raise BadRequest(f"no such file: {path}")
        suffix = file.suffix.lower()
        if suffix in SPREADSHEET_SUFFIXES:
            command = ["gnumeric", "--no-splash", str(file)]
        elif suffix in EDITOR_SUFFIXES or not suffix:
            command = ["mousepad", str(file)]
        else:
            raise BadRequest(f"no application opens '{suffix}' files")
        self.launch(command, shell=False)
        self.wait_for_window(file.name, timeout)
        return {"status": "success", "path": str(file)}

    def launch(self, command: str | list[str], shell: bool) -> int:
        command = expand_home(command, shell)
        env = {**os.environ, "DISPLAY": self.display.name}
        process = subprocess.Popen(
            command,
            shell=shell,
            env=env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return process.pid

    def wait_for_window(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        env = {**os.environ, "DISPLAY": self.display.name}
        while True:
            found = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", name], env=env, capture_output=True)
            if found.returncode == 0 and found.stdout.strip():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no window named like '{name}' appeared within {timeout}s")
            time.sleep(0.2)

    # ---- OSWorld's getters ------------------------------------------------------------
    def desktop_path(self) -> str | None:
        path = os.path.join(self.home, "Desktop")
        return path if os.path.isdir(path) else None

    def window_size(self, app_class_name: str) -> tuple[int, int] | None:
        """(width, height) of the first window whose WM_CLASS names `app_class_name`
        (either part, any case): the managed windows first, then the whole window tree."""
        wanted = app_class_name.lower()
        connection = xdisplay.Display(self.display.name)  # its own: requests run in threads
        try:
            root = connection.screen().root
            managed = root.get_full_property(connection.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
            windows = (
                [connection.create_resource_object("window", wid) for wid in managed.value]
                if managed is not None and len(managed.value)
                else []
            )
            for window in windows + _window_tree(root):
                try:
                    wm_class = window.get_wm_class()
                    if not wm_class or wanted not in (name.lower() for name in wm_class):
                        continue
                    geometry = window.get_geometry()
                    return int(geometry.width), int(geometry.height)
                except xerror.XError:  # closed while we looked
                    continue
            return None
        finally:
            connection.close()

    def wallpaper_path(self) -> str | None:
        """The desktop background picture where the desktop names one (GNOME's setting)."""
        if shutil.which("gsettings") is None:
            return None
        found = subprocess.run(
            ["gsettings", "get", "org.gnome.desktop.background", "picture-uri"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        path = found.stdout.strip().strip("'").replace("file://", "")
        return path if found.returncode == 0 and path and os.path.isfile(path) else None

    def terminal_output(self) -> str | None:
        """The text of the focused terminal of the active GNOME Terminal window, read from the
        accessibility tree as OSWorld's server reads it; None where there is no such terminal
        or no accessibility bus (the plain desktop image), as OSWorld's server answers."""
        if not accessibility.atspi_available():
            return None
        try:
            tree = ElementTree.fromstring(accessibility.atspi_tree())
        except accessibility.AtspiUnavailable:
            return None
        state = "{%s}" % accessibility.NAMESPACES["st"]
        terminals = [
            terminal
            for application in tree.iter("application")
            if application.get("name") == "gnome-terminal-server"
            for frame in application.findall("frame")
            if frame.get(state + "active") == "true"
            for terminal in frame.iter("terminal")
            if terminal.get(state + "focused") == "true"
        ]
        return (terminals[0].text or "").rstrip() if len(terminals) == 1 else None

    def start_recording(self) -> None:
        """Record the screen with ffmpeg into RECORDING_PATH (OSWorld's x11grab command)."""
        if shutil.which("ffmpeg") is None:
            raise NotAvailable("screen recording needs ffmpeg, which this environment lacks")
        with self._recording_lock:
            if self._recording is not None and self._recording[0].poll() is None:
                raise BadRequest("a recording is already in progress")
            if os.path.exists(RECORDING_PATH):
                os.remove(RECORDING_PATH)
            width, height = self.display.size()
            log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would stall ffmpeg
            process = subprocess.Popen(
                [
                    "ffmpeg",
                    "-nostdin",
                    "-nostats",
                    "-loglevel",
                    "error",
                    "-y",
                    "-f",
                    "x11grab",
                    "-draw_mouse",
                    "1",
                    "-s",
                    f"{width}x{height}",
                    "-i",
                    self.display.name,
                    "-c:v",
                    "libx264",
                    "-pix_fmt",
                    "yuv420p",
                    "-r",
                    "30",
                    RECORDING_PATH,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
            try:
                process.wait(timeout=2)  # it should still run by now
            except subprocess.TimeoutExpired:
                self._recording = (process, log)
                return
            log.seek(0)
            message = log.read().decode(errors="replace")[-500:]
            log.close()
            raise RuntimeError(f"ffmpeg stopped at once: {message}")

    def end_recording(self) -> bytes:
        """Stop the recording and return the MP4."""
        with self._recording_lock:
            recording, self._recording = self._recording, None
            if recording is None:
                raise BadRequest("no recording is in progress")
            process, log = recording
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # ffmpeg finishes the file on SIGINT
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.seek(0)
            errors = log.read().decode(errors="replace")[-500:]
            log.close()
            if not os.path.isfile(RECORDING_PATH) or os.path.getsize(RECORDING_PATH) == 0:
                raise RuntimeError(f"the recording is missing or empty; ffmpeg said: {errors}")
            return pathlib.Path(RECORDING_PATH).read_bytes()


def _window_tree(window) -> list:
    """Every window below `window`, depth first."""
    found = []
    try:
        children = window.query_tree().children
    except xerror.XError:
        return found
    for child in children:
        found.append(child)
        found.extend(_window_tree(child))
    return found


def _directory_tree(path: pathlib.Path, depth: int | None, ancestors: frozenset = frozenset()) -> dict[str, Any]:
    """OSWorld's tree: {type: "directory", name, children: [...]}, files as {type: "file", name}.
    Symbolic links are followed, but never back into a directory being listed. A directory
    at the depth limit has no "children"; one that cannot be read has an "error"."""
    node: dict[str, Any] = {"type": "directory", "name": path.name or str(path)}
    if depth is not None and depth <= 0:
        return node
    node["children"] = []
    try:
        status = path.stat()
        key = (status.st_dev, status.st_ino)
        if key in ancestors:
            return node
        entries = sorted(path.iterdir())
    except OSError as error:
        node["error"] = str(error)
        return node
    below = None if depth is None else depth - 1
    for child in entries:
        if child.is_dir():
            node["children"].append(_directory_tree(child, below, ancestors | {key}))
        else:
            node["children"].append({"type": "file", "name": child.name})
    return node


def _number_field(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise BadRequest(f"'{name}' must be a positive number, got {value!r}")
    return float(value)


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "cua-jax-env/1"
    protocol_version = "HTTP/1.1"
    environment: Environment  # set on the subclass made by make_server
    token: str | None = None

    # ---- plumbing ---------------------------------------------------------------------
    def address_string(self) -> str:
        return "unix" if not isinstance(self.client_address, tuple) else self.client_address[0]

    def log_message(self, format: str, *args) -> None:
        sys.stderr.write(f"[env-server] {self.command} {self.path} {format % args}\n")

    def log_request(self, code="-", size="-") -> None:
        if isinstance(code, int) and code >= 400:
            super().log_request(code, size)

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, value: Any) -> None:
        self._send(code, json.dumps(value).encode(), "application/json")

    def _raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _body(self) -> dict[str, Any]:
        raw = self._raw_body()
        content_type = self.headers.get("Content-Type", "")
        if content_type.startswith("multipart/form-data"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                f"Content-Type: {content_type}\r\n\r\n".encode() + raw
            )
            fields: dict[str, Any] = {}
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True) or b""
                fields[name] = payload if part.get_filename() else payload.decode(errors="replace")
            return fields
        if content_type.startswith("application/x-www-form-urlencoded"):
            return {k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode()).items()}
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise BadRequest(f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def _authorised(self) -> bool:
        if self.token is None:
            return True
        header = self.headers.get("Authorization", "")
        return hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        if not self._authorised():
            self._json(401, {"status": "error", "message": "missing or wrong bearer token"})
            return
        route = routes.get(urllib.parse.urlsplit(self.path).path.rstrip("/") or "/")
        if route is None:
            self._json(404, {"status": "error", "message": f"no endpoint {self.command} {self.path}"})
            return
        try:
            route()
        except BadRequest as error:
            self._error(400, str(error))
        except NotAvailable as error:
            self._error(501, str(error))
        except Exception as error:  # the environment itself failed: report, keep serving
            self._error(500, f"{type(error).__name__}: {error}")

    def _error(self, code: int, message: str) -> None:
        # "message" for our client, "error" for OSWorld's (run_python_script reads it)
        self._json(code, {"status": "error", "message": message, "error": message})

    def do_GET(self) -> None:
        self._dispatch(
            {
                "/screenshot": self.screenshot,
                "/cursor_position": self.cursor_position,
                "/platform": self.platform,
                "/accessibility": self.accessibility,
                "/health": self.health,
                "/screen_size": self.screen_size,
                "/terminal": self.terminal,
            }
        )

    def do_POST(self) -> None:
        self._dispatch(
            {
                "/execute": self.execute,
                "/setup/execute": self.execute,
                "/run_python": self.run_python,
                "/run_bash_script": self.run_bash_script,
                "/file": self.file,
                "/setup/upload": self.upload,
                "/setup/launch": self.launch,
                "/setup/open_file": self.open_file,
                "/screen_size": self.screen_size,
                "/list_directory": self.list_directory,
                "/action": self.action,
                "/cursor_position": self.cursor_position,
                "/desktop_path": self.desktop_path,
                "/window_size": self.window_size,
                "/wallpaper": self.wallpaper,
                "/start_recording": self.start_recording,
                "/end_recording": self.end_recording,
            }
        )

    # ---- endpoints --------------------------------------------------------------------
    def screenshot(self) -> None:
        self._send(200, self.environment.display.screenshot_png(), "image/png")

    def cursor_position(self) -> None:
        self._json(200, list(self.environment.display.cursor_position()))

    def platform(self) -> None:
        self._send(200, b"Linux", "text/plain")

    def screen_size(self) -> None:
        width, height = self.environment.display.size()
        self._json(200, {"width": width, "height": height})

    def health(self) -> None:
        alive = self.environment.display.alive()
        self._json(200 if alive else 500, {"status": "ok" if alive else "error", "display": alive})

    def accessibility(self) -> None:
        self._json(200, {"AT": accessibility.accessibility_tree(self.environment.display)})

    def execute(self) -> None:
        body = self._body()
        command = body.get("command")
        if not isinstance(command, (str, list)) or not command:
            raise BadRequest("'command' must be a string or a list of strings")
        timeout = _number_field(body, "timeout", EXECUTE_TIMEOUT)
        shell = bool(body.get("shell", False))
        try:
            reply = run_process(expand_home(command, shell), shell, timeout, self.environment.home)
        except (FileNotFoundError, PermissionError) as error:
            reply = {"status": "error", "output": "", "error": str(error), "message": str(error), "returncode": 127}
        if "message" not in reply:  # neither timed out nor failed to start
            reply["status"] = "success"  # it ran; the exit status says how it went (as OSWorld)
        self._json(200, reply)

    def run_python(self) -> None:
        body = self._body()
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("'code' must be a string")
        timeout = _number_field(body, "timeout", RUN_PYTHON_TIMEOUT)
        reply = run_process([sys.executable, "-c", code], False, timeout, self.environment.home)
        # OSWorld's fields besides ours: stdout and stderr together, its name of the exit status
        joined = "\n".join(part for part in (reply["output"], reply["error"]) if part)
        reply.setdefault("message", joined)
        reply.update(need_more=False, return_code=reply["returncode"])
        self._json(200, reply)

    def run_bash_script(self) -> None:
        body = self._body()
        script = body.get("script")
        if not isinstance(script, str):
            raise BadRequest("'script' must be a string")
        timeout = _number_field(body, "timeout", RUN_BASH_TIMEOUT)
        cwd = os.path.expanduser(body.get("working_dir") or self.environment.home)
        if not os.path.isdir(cwd):
            self._json(
                400,
                {
                    "status": "error",
                    "output": f"Working directory does not exist: {cwd}",
                    "error": "",
                    "message": f"no such working directory: {cwd}",
                    "returncode": -1,
                },
            )
            return
        reply = run_process(["bash", "-c", script], False, timeout, cwd, merge_stderr=True)
        if "message" in reply:  # timed out: OSWorld says so in "output"
            reply["output"] += f"Script execution timed out after {timeout:g} seconds"
        reply["error"] = ""
        self._json(200, reply)

    def file(self) -> None:
        path = self._body().get("file_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("'file_path' is required")
        file = _expand_path(path)
        if not file.is_file():
            self._error(404, f"no such file: {path}")
            return
        self._send(200, file.read_bytes(), "application/octet-stream")

    def upload(self) -> None:
        body = self._body()
        path = body.get("file_path")
        data = body.get("file_data")
        if data is None and isinstance(body.get("content_b64"), str):
            try:
                data = base64.b64decode(body["content_b64"], validate=True)
            except ValueError as error:
                raise BadRequest(f"'content_b64' is not base64: {error}") from None
        if not isinstance(path, str) or not path or not isinstance(data, (bytes, str)):
            raise BadRequest("'file_path' and 'file_data' (or 'content_b64') are required")
        file = _expand_path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data if isinstance(data, bytes) else data.encode())
        self._json(200, {"status": "success", "path": str(file)})

    def launch(self) -> None:
        body = self._body()
        command = body.get("command")
        if not isinstance(command, (str, list)) or not command:
            raise BadRequest("'command' must be a string or a list of strings")
        try:
            pid = self.environment.launch(command, bool(body.get("shell", False)))
        except FileNotFoundError as error:
            raise BadRequest(f"cannot launch: {error}") from None
        self._json(200, {"status": "success", "pid": pid})

    def open_file(self) -> None:
        body = self._body()
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise BadRequest("'path' is required")
        self._json(200, self.environment.open_file(path, _number_field(body, "timeout", 60.0)))

    def list_directory(self) -> None:
        body = self._body()
        path = pathlib.Path(str(body.get("path", self.environment.home))).expanduser()
        if not path.is_dir():
            raise BadRequest(f"not a directory: {path}")
        depth = body.get("depth")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= 20):
            raise BadRequest(f"'depth' must be an integer in [0, 20], got {depth!r}")
        self._json(200, {"directory_tree": _directory_tree(path, depth)})

    def desktop_path(self) -> None:
        path = self.environment.desktop_path()
        if path is None:
            self._error(404, f"no desktop directory under {self.environment.home}")
            return
        self._json(200, {"desktop_path": path})

    def window_size(self) -> None:
        name = self._body().get("app_class_name")
        if not isinstance(name, str) or not name:
            raise BadRequest("'app_class_name' is required")
        size = self.environment.window_size(name)
        if size is None:
            self._error(404, f"no window of class '{name}'")
            return
        self._json(200, {"width": size[0], "height": size[1]})

    def wallpaper(self) -> None:
        path = self.environment.wallpaper_path()
        if path is None:
            self._error(404, "no wallpaper is set")
            return
        content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        self._send(200, pathlib.Path(path).read_bytes(), content_type)

    def terminal(self) -> None:
        self._json(200, {"output": self.environment.terminal_output(), "status": "success"})

    def start_recording(self) -> None:
        self.environment.start_recording()
        self._json(200, {"status": "success", "message": "Started recording successfully."})

    def end_recording(self) -> None:
        self._send(200, self.environment.end_recording(), "video/mp4")

    def action(self) -> None:
        body = self._body()
        # A desktop has no element ids: it acts at grid points only.
        if "text" in body:
            action = A.parse_action(body["text"], "coordinates")
        else:
            action = A.parse_arguments(body.get("action"), "coordinates")
        if isinstance(action, A.InvalidAction):
            raise BadRequest(action.message)
        try:
            result = self.environment.executor.perform(action)
        except (OSError, UnicodeError) as error:
            if isinstance(action, A.WriteFile):  # a path the agent chose badly
                raise BadRequest(f"write_file failed: {error}") from None
            raise
        reply: dict[str, Any] = {"status": "success", "action": A.action_arguments(action), "result": result}
        if body.get("screenshot"):
            reply["screenshot_b64"] = base64.b64encode(self.environment.display.screenshot_png()).decode()
        self._json(200, reply)


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class TCPHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True


def make_server(
    environment: Environment,
    socket_path: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
):
    """A threading HTTP server on `socket_path` (Unix) or host:port (TCP, token required)."""
    handler = type("BoundHandler", (Handler,), {"environment": environment, "token": token})
    if socket_path is not None:
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        server = UnixHTTPServer(socket_path, handler)
        os.chmod(socket_path, 0o666)
        return server
    if not token:
        raise ValueError("a TCP server needs a bearer token")
    return TCPHTTPServer((host, port), handler)
