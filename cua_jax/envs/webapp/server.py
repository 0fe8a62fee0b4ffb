"""The framework's handle on the shared application server (`app_server.py`, a process of the
application's own Python): starting and restarting it, and its control channel."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import time
from typing import Any

from cua_jax.envs.faults import FaultError
from cua_jax.types import FaultKind

APP_SERVER = pathlib.Path(__file__).with_name("app_server.py")
PYTHON_VARIABLE = "CUA_JAX_WEBAPP_PYTHON"  # launch/setup.sh exports it: the application's virtualenv


class AppServerError(FaultError):
    """The application server is down, did not start, or refused a control request."""

    fault_kind = FaultKind.APP_SERVER_CRASHED


def app_python() -> str:
    """The Python that has the application (Trac) installed: launch/setup.sh builds its
    virtualenv from requirements-webapp.txt and exports its path."""
    python = os.environ.get(PYTHON_VARIABLE, "")
    if not python or not os.access(python, os.X_OK):
        raise AppServerError(
            f"${PYTHON_VARIABLE} names no Python ({python!r}): source launch/setup.sh, which builds the "
            "web application's virtualenv from requirements-webapp.txt"
        )
    return python


MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path, less its terminating NUL)


class AppServer:
    """One application server process over the branches under `parent`.

    start() launches it on a loopback port of its choosing and waits until its control socket answers;
    `port` is the HTTP port. `control(op, ...)` (a coroutine) and `control_blocking` send one
    control request (app_server.py lists them) and return its reply; a refused request raises
    AppServerError with the server's reason, a dead server AppServerError saying so.
    """

    def __init__(self, parent: str | os.PathLike, *, python: str | None = None, start_timeout_s: float = 60.0):
        self.parent = pathlib.Path(parent).resolve()
        self.parent.mkdir(parents=True, exist_ok=True)
        self.python = python or app_python()
        self.start_timeout_s = start_timeout_s
        self.control_path = str(self.parent / ".control.sock")
        if len(os.fsencode(self.control_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"the application server's control socket {self.control_path} would be "
                f"{len(os.fsencode(self.control_path))} bytes, over AF_UNIX's {MAX_SOCKET_PATH}: "
                "choose a shorter workdir"
            )
        self.log_path = self.parent / ".server.log"
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_status(self) -> str:
        """How the process ended, for a fault's reason ("running" while it runs)."""
        if self.process is None:
            return "not started"
        code = self.process.poll()
        if code is None:
            return "running"
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"

    def start(self) -> AppServer:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.python, str(APP_SERVER), "--parent", str(self.parent), "--port", "0"]
                + ["--control", self.control_path],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a signal to the framework's group does not reach it
            )
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if not self.alive():
                raise AppServerError(f"the application server {self.exit_status()} at start; see {self.log_path}")
            try:
                reply = self.control_blocking("ping")
                break
            except (OSError, AppServerError) as error:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AppServerError(
                        f"the application server did not answer in {self.start_timeout_s:.0f}s"
                    ) from error
                time.sleep(0.05)
        self.port = int(reply["port"])
        self.starts += 1
        return self

    def restart(self) -> AppServer:
        self.stop()
        return self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _check_reply(self, op: str, line: bytes) -> dict[str, Any]:
        if not line:
            raise AppServerError(f"the application server closed the control channel during {op!r}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise AppServerError(f"the application server refused {op!r}: {reply['error']}")
        return reply

    async def control(self, op: str, **arguments: Any) -> dict[str, Any]:
        if not self.alive():
            raise AppServerError(f"the application server is down ({self.exit_status()})")
        try:
            reader, writer = await asyncio.open_unix_connection(self.control_path)
        except OSError as error:
            raise AppServerError(f"the application server's control socket refused {op!r}: {error}") from error
        try:
            writer.write((json.dumps({"op": op, **arguments}) + "\n").encode())
            await writer.drain()
            return self._check_reply(op, await reader.readline())
        finally:
            writer.close()

    def control_blocking(self, op: str, **arguments: Any) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as channel:
            channel.connect(self.control_path)
            channel.sendall((json.dumps({"op": op, **arguments}) + "\n").encode())
            with channel.makefile("rb") as replies:
                return self._check_reply(op, replies.readline())
