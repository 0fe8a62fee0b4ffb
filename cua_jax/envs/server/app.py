"""The HTTP endpoints (OSWorld's protocol plus /action), served on a Unix socket or TCP.

Endpoints (JSON bodies unless noted; errors are JSON {"status": "error", "message"}):
    GET  /screenshot                        PNG of the screen
    POST /execute, /setup/execute           {command: str|list, shell?, timeout?} -> {status, output, error, returncode}
    POST /run_python                        {code, timeout?} -> {status, output, error, returncode}
    POST /run_bash_script                   {script, timeout?, working_dir?} -> {status, output, error, returncode}
    POST /file                              form or JSON {file_path} -> the file's bytes
    POST /setup/upload                      multipart (file_path, file_data) or JSON {file_path, content_b64}
    POST /setup/launch                      {command: str|list, shell?} -> {status, pid}
    POST /setup/open_file                   {path, timeout?}: opens it in its application, waits for the window
    GET  /cursor_position                   [x, y] in pixels
    POST /screen_size                       {width, height}
    GET  /platform                          "Linux"
    POST /list_directory                    {path} -> {name, type, children}
    GET  /accessibility                     {AT: XML of the X window tree}
    POST /action                            {action: arguments object | text: tool-call text,
                                             screenshot?: bool} -> {status, result, screenshot_b64?}
    GET  /health                            {status, display}: 200 while Xvfb and the window manager live

A request that is the agent's fault (a malformed action) gets 400; a failure of the
environment itself gets 500. On TCP every request needs `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hmac
import http.server
import json
import os
import pathlib
import shlex
import signal
import socketserver
import subprocess
import sys
import time
import urllib.parse
from typing import Any, Callable

from cua_jax.envs import actions as A
from cua_jax.envs.server.display import Display
from cua_jax.envs.server.executor import Executor

DEFAULT_COMMAND_TIMEOUT = 60.0
MAX_COMMAND_TIMEOUT = 600.0
EDITOR_SUFFIXES = {".txt", ".md", ".py", ".json", ".cfg", ".ini", ".log", ".sh", ".yaml", ".yml"}
SPREADSHEET_SUFFIXES = {".csv", ".xlsx", ".xls", ".ods", ".gnumeric", ".tsv"}


class BadRequest(Exception):
    """The request is malformed (HTTP 400)."""


def run_process(command: str | list[str], shell: bool, timeout: float, cwd: str | None = None) -> dict[str, Any]:
    """Run a command to completion in its own session; kill the whole group on timeout."""
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    timeout = min(float(timeout), MAX_COMMAND_TIMEOUT)
    process = subprocess.Popen(
        command, shell=shell, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return {"status": "error", "output": out.decode(errors="replace"),
                "error": f"timed out after {timeout}s", "returncode": -1}
    return {"status": "success" if process.returncode == 0 else "error",
            "output": out.decode(errors="replace"), "error": err.decode(errors="replace"),
            "returncode": process.returncode}


class Environment:
    """What the endpoints act on: the display, the action executor and the file system."""

    def __init__(self, display: Display, home: str = "/root"):
        self.display = display
        self.executor = Executor(display, home)
        self.home = home

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
        if isinstance(command, str) and not shell:
            command = shlex.split(command)
        env = {**os.environ, "DISPLAY": self.display.name}
        process = subprocess.Popen(command, shell=shell, env=env, cwd=self.home, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return process.pid

    def wait_for_window(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        env = {**os.environ, "DISPLAY": self.display.name}
        while True:
            found = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", name],
                                   env=env, capture_output=True)
            if found.returncode == 0 and found.stdout.strip():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no window named like '{name}' appeared within {timeout}s")
            time.sleep(0.2)


def _list_directory(path: pathlib.Path, depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"name": path.name or str(path), "type": "directory" if path.is_dir() else "file"}
    if path.is_dir() and depth > 0:
        node["children"] = [_list_directory(child, depth - 1) for child in sorted(path.iterdir())]
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
                f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
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
            self._json(400, {"status": "error", "message": str(error)})
        except Exception as error:  # the environment itself failed: report, keep serving
            self._json(500, {"status": "error", "message": f"{type(error).__name__}: {error}"})

    def do_GET(self) -> None:
        self._dispatch({
            "/screenshot": self.screenshot, "/cursor_position": self.cursor_position,
            "/platform": self.platform, "/accessibility": self.accessibility, "/health": self.health,
            "/screen_size": self.screen_size,
        })

    def do_POST(self) -> None:
        self._dispatch({
            "/execute": self.execute, "/setup/execute": self.execute, "/run_python": self.run_python,
            "/run_bash_script": self.run_bash_script, "/file": self.file, "/setup/upload": self.upload,
            "/setup/launch": self.launch, "/setup/open_file": self.open_file,
            "/screen_size": self.screen_size, "/list_directory": self.list_directory,
            "/action": self.action, "/cursor_position": self.cursor_position,
        })

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
        self._json(200, {"AT": self.environment.display.accessibility_tree()})

    def execute(self) -> None:
        body = self._body()
        command = body.get("command")
        if not isinstance(command, (str, list)) or not command:
            raise BadRequest("'command' must be a string or a list of strings")
        timeout = _number_field(body, "timeout", DEFAULT_COMMAND_TIMEOUT)
        try:
            self._json(200, run_process(command, bool(body.get("shell", False)), timeout, self.environment.home))
        except (FileNotFoundError, PermissionError) as error:
            self._json(200, {"status": "error", "output": "", "error": str(error), "returncode": 127})

    def run_python(self) -> None:
        body = self._body()
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("'code' must be a string")
        timeout = _number_field(body, "timeout", DEFAULT_COMMAND_TIMEOUT)
        self._json(200, run_process([sys.executable, "-c", code], False, timeout, self.environment.home))

    def run_bash_script(self) -> None:
        body = self._body()
        script = body.get("script")
        if not isinstance(script, str):
            raise BadRequest("'script' must be a string")
        timeout = _number_field(body, "timeout", DEFAULT_COMMAND_TIMEOUT)
        cwd = body.get("working_dir") or self.environment.home
        self._json(200, run_process(["bash", "-c", script], False, timeout, cwd))

    def file(self) -> None:
        path = self._body().get("file_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("'file_path' is required")
        file = pathlib.Path(path).expanduser()
        if not file.is_file():
            self._json(404, {"status": "error", "message": f"no such file: {path}"})
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
        file = pathlib.Path(path).expanduser()
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
        depth = body.get("depth", 3)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= 20:
            raise BadRequest(f"'depth' must be an integer in [0, 20], got {depth!r}")
        self._json(200, _list_directory(path, depth))

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


def make_server(environment: Environment, socket_path: str | None = None,
                host: str = "127.0.0.1", port: int = 0, token: str | None = None):
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
