"""The host-side client of the in-environment server (cua_jax.envs.server), OSWorld protocol.

One `EnvClient` talks to one environment over its Unix socket (or TCP with a bearer
token). Every call has a timeout. Errors are sorted by who caused them, which is what
fault attribution (cua_jax.envs.faults) needs:

    EnvUnreachable   no connection, connection dropped, or no answer in time: the
                     environment is down or hung (infrastructure).
    EnvServerError   the server answered 5xx: it could not do a well-formed request
                     (infrastructure).
    EnvRequestError  the server answered 4xx: the request was malformed (the caller's or
                     the agent's fault; for actions the message goes back to the agent).
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import io
import json
import socket
from typing import Any

import numpy as np

from cua_jax.envs import actions as A

DEFAULT_TIMEOUT = 30.0


class EnvError(Exception):
    """Base of the errors an environment call raises."""


class EnvUnreachable(EnvError):
    """The environment did not answer (refused, reset, closed, or timed out)."""


class EnvServerError(EnvError):
    """The environment answered that it failed (HTTP 5xx)."""


class EnvRequestError(EnvError):
    """The environment rejected the request as malformed (HTTP 4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclasses.dataclass
class StepResult:
    """What performing one action returned.

    `error` is set (and `ok` False) when the environment rejected the action as invalid;
    the message is meant for the agent. `screenshot_png` is the screen after the action
    when one was asked for.
    """

    ok: bool
    action: A.Action | None
    result: dict[str, Any]
    error: str | None = None
    screenshot_png: bytes | None = None


def decode_png(png: bytes) -> np.ndarray:
    """uint8 [H, W, 3] RGB pixels of a PNG."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"))


class EnvClient:
    """A client of one environment server.

    Args:
        socket_path: the server's Unix socket (the default transport), or
        host/port/token: its TCP address and bearer token, for pools spanning machines.
        timeout: seconds any single call may take unless the call says otherwise.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        if (socket_path is None) == (host is None):
            raise ValueError("give either socket_path or host/port")
        if host is not None and (port is None or not token):
            raise ValueError("a TCP environment needs a port and a bearer token")
        self.socket_path, self.host, self.port, self.token = socket_path, host, port, token
        self.timeout = timeout

    def __repr__(self) -> str:
        where = self.socket_path or f"{self.host}:{self.port}"
        return f"EnvClient({where})"

    # ---- transport --------------------------------------------------------------------
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        """One HTTP exchange; returns (status, body) for 2xx, raises EnvError otherwise."""
        timeout = self.timeout if timeout is None else timeout
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        headers = {"Content-Type": content_type} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        connection = self._connection(timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:  # timeouts are OSErrors too
            raise EnvUnreachable(f"{method} {path} on {self}: {type(error).__name__}: {error}") from None
        finally:
            connection.close()
        if response.status >= 500:
            raise EnvServerError(f"{method} {path} on {self}: {response.status} {_message(data)}")
        if response.status >= 400:
            raise EnvRequestError(response.status, _message(data))
        return response.status, data

    def _json(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        _, data = self.request(method, path, body, timeout)
        try:
            return json.loads(data)
        except ValueError:
            raise EnvServerError(f"{method} {path} on {self}: the reply is not JSON: {data[:200]!r}") from None

    # ---- OSWorld endpoints ------------------------------------------------------------
    def health(self, timeout: float = 5.0) -> bool:
        """True when the server answers and its display processes live."""
        try:
            return self._json("GET", "/health", timeout=timeout).get("display") is True
        except EnvError:
            return False

    def platform(self) -> str:
        return self.request("GET", "/platform")[1].decode()

    def screenshot(self, timeout: float | None = None) -> bytes:
        return self.request("GET", "/screenshot", timeout=timeout)[1]

    def screen_size(self) -> tuple[int, int]:
        size = self._json("POST", "/screen_size")
        return int(size["width"]), int(size["height"])

    def cursor_position(self) -> tuple[int, int]:
        x, y = self._json("GET", "/cursor_position")
        return int(x), int(y)

    def accessibility_tree(self) -> str:
        return self._json("GET", "/accessibility")["AT"]

    def execute(self, command: str | list[str], shell: bool = False, timeout: float = 60.0) -> dict[str, Any]:
        """Run a command to completion: {status, output, error, returncode}; status is
        "success" once it ran, whatever its exit status (OSWorld's meaning)."""
        return self._json(
            "POST", "/execute", {"command": command, "shell": shell, "timeout": timeout}, timeout=timeout + 10
        )

    def run_python(self, code: str, timeout: float = 60.0) -> dict[str, Any]:
        """Run Python code inside the environment: {status, output, error, returncode}."""
        return self._json("POST", "/run_python", {"code": code, "timeout": timeout}, timeout=timeout + 10)

    def run_bash_script(self, script: str, timeout: float = 60.0, working_dir: str | None = None) -> dict[str, Any]:
        """Run a bash script: {status, output (stdout and stderr merged), error: "", returncode}."""
        body = {"script": script, "timeout": timeout, "working_dir": working_dir}
        return self._json("POST", "/run_bash_script", body, timeout=timeout + 10)

    def get_file(self, path: str) -> bytes | None:
        """The bytes of a file in the environment, or None when it does not exist."""
        try:
            return self.request("POST", "/file", {"file_path": path})[1]
        except EnvRequestError as error:
            if error.status == 404:
                return None
            raise

    def upload(self, path: str, data: bytes) -> None:
        self._json("POST", "/setup/upload", {"file_path": path, "content_b64": base64.b64encode(data).decode()})

    def launch(self, command: str | list[str], shell: bool = False) -> int:
        return int(self._json("POST", "/setup/launch", {"command": command, "shell": shell})["pid"])

    def open_file(self, path: str, timeout: float = 60.0) -> None:
        self._json("POST", "/setup/open_file", {"path": path, "timeout": timeout}, timeout=timeout + 10)

    def list_directory(self, path: str, depth: int | None = 3) -> dict[str, Any]:
        """The tree under `path`, `depth` levels deep (None: every level), in OSWorld's shape:
        {type: "directory", name, children: [...]}, files as {type: "file", name}; a directory
        at the depth limit has no "children"."""
        body: dict[str, Any] = {"path": path} if depth is None else {"path": path, "depth": depth}
        return self._json("POST", "/list_directory", body)["directory_tree"]

    # ---- actions of the grammar -----------------------------------------------------
    def step(self, action: A.Action, screenshot: bool = True, timeout: float | None = None) -> StepResult:
        """Perform one action; an action the server rejects comes back with `error` set."""
        if timeout is None:
            timeout = self.timeout + action_duration(action)
        body = {"action": A.action_arguments(action), "screenshot": screenshot}
        try:
            reply = self._json("POST", "/action", body, timeout=timeout)
        except EnvRequestError as error:
            return StepResult(False, action, {}, error=error.message)
        png = base64.b64decode(reply["screenshot_b64"]) if "screenshot_b64" in reply else None
        return StepResult(True, action, reply.get("result", {}), screenshot_png=png)


def action_duration(action: A.Action) -> float:
    """Seconds an action legitimately takes beyond a plain call (waits, holds, long typing)."""
    if isinstance(action, A.Wait):
        return float(action.seconds)
    if isinstance(action, A.HoldKey):
        return float(action.duration)
    if isinstance(action, A.Type):
        return 0.05 * len(action.text)
    return 0.0


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", data[:300]))
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")
