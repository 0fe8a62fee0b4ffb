"""The conventional deployments that capsules are measured against, behind the same interface.

Both are `RuntimeBackend`s for `CapsuleRuntime`, so create / reset / step / snapshot /
fork / close, the transactions and the MiniWoB driver are literally the same code; only
the isolation unit differs. In a conventional deployment the initialised runtime *is* the
unit of isolation, so every generation (create, reset, fork) gets a runtime of its own:

* `BrowserPerEnvironmentBackend`: a fresh Chromium process per generation.
* `ContainerPerEnvironmentBackend`: a fresh Docker container per generation, running the
  `chromium` image (launch/images/chromium) with `--network none`. Chromium's DevTools
  endpoint is bridged by socat to a Unix socket in a bind-mounted host folder; a
  loopback-only TCP relay on the host lets Playwright `connect_over_cdp` through it.
  MiniWoB's HTML is bind-mounted read-only and opened by file:// URL.

A runtime that dies quarantines only its own environment (its runtime id is unique).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from typing import Any

from cua_jax.envs.capsules import (
    CapsuleError,
    CrashCallback,
    RuntimeBackend,
    RuntimeStartError,
    Slot,
    find_browser_pid,
    launch_browser,
    launch_marker,
)
from cua_jax.envs.images import image_tag
from cua_jax.envs.miniwob import VIEWPORT, MiniWoBServer, check_task, html_dir

CONTAINER_IMAGE_NAME = "chromium"  # launch/images/chromium
CONTAINER_HTML_DIR = "/miniwob"
CONTAINER_SOCKET_DIR = "/run/cua"
CONTAINER_READY_TIMEOUT_S = 60.0
CONTAINER_RUNTIME_PREFIX = "container-"  # of every container runtime id


class BrowserPerEnvironmentBackend(RuntimeBackend):
    """One Chromium process per capsule generation."""

    name = "browser-per-env"

    def __init__(self) -> None:
        self._playwright: Any = None
        self._on_crash: CrashCallback | None = None
        self._browsers: dict[str, tuple[Any, str]] = {}  # runtime id -> (browser, marker)
        self._ids = itertools.count(1)
        self._closing = False

    async def start(self, playwright: Any, on_crash: CrashCallback) -> None:
        self._playwright, self._on_crash = playwright, on_crash

    async def open_slot(self) -> Slot:
        marker = launch_marker()
        runtime_id = f"browser-{next(self._ids)}"
        browser = await launch_browser(self._playwright, marker)
        self._browsers[runtime_id] = (browser, marker)
        browser.on("disconnected", lambda _: self._disconnected(runtime_id))
        try:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
        except BaseException:
            await self._release(runtime_id)
            raise
        return Slot(runtime_id, context, page, lambda: self._release(runtime_id))

    def _disconnected(self, runtime_id: str) -> None:
        entry = self._browsers.pop(runtime_id, None)
        if entry is not None and not self._closing and self._on_crash is not None:
            self._on_crash(runtime_id, f"browser runtime {runtime_id} crashed (browser disconnected)")

    async def _release(self, runtime_id: str) -> None:
        entry = self._browsers.pop(runtime_id, None)
        if entry is not None:
            await entry[0].close()

    def browser_pid(self, runtime_id: str) -> int | None:
        """The browser process of runtime `runtime_id` (None once it is gone)."""
        entry = self._browsers.get(runtime_id)
        return find_browser_pid(entry[1]) if entry else None

    def pids(self) -> list[int]:
        return [pid for runtime_id in list(self._browsers) if (pid := self.browser_pid(runtime_id))]

    async def close(self) -> None:
        self._closing = True
        for runtime_id in list(self._browsers):
            await self._release(runtime_id)


# ------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------


class UnixSocketRelay:
    """Accepts TCP connections on 127.0.0.1 (an OS-chosen port) and pipes each to a Unix socket."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        tasks = [asyncio.ensure_future(pipe(reader, up_writer)), asyncio.ensure_future(pipe(up_reader, writer))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks)
        finally:
            self._tasks.difference_update(tasks)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._server = None


def _http_get_unix(socket_path: str, path: str, timeout: float = 5.0) -> bytes:
    """GET `path` from an HTTP server listening on a Unix socket (for readiness probes)."""
    import http.client
    import socket

    class _Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(socket_path)

    connection = _Connection("127.0.0.1", timeout=timeout)
    try:
        connection.request("GET", path, headers={"Host": "127.0.0.1"})
        response = connection.getresponse()
        if response.status != 200:
            raise OSError(f"{path} answered HTTP {response.status}")
        return response.read()
    finally:
        connection.close()


def container_image_tag() -> str:
    """The tag the current sources of launch/images/chromium build to."""

    return image_tag(CONTAINER_IMAGE_NAME)


class ContainerPerEnvironmentBackend(RuntimeBackend):
    """One `--network none` Docker container running Chromium per capsule generation."""

    name = "container-per-env"

    def __init__(self, image: str | None = None, memory_limit: str = "1g"):
        self.image = image or container_image_tag()
        self.memory_limit = memory_limit
        self._playwright: Any = None
        self._on_crash: CrashCallback | None = None
        self._containers: dict[str, dict[str, Any]] = {}  # runtime id -> resources
        self._closing = False
        self._workdir = tempfile.mkdtemp(prefix="cua-jax-chromium-")
        self._html = str(html_dir())

    async def start(self, playwright: Any, on_crash: CrashCallback) -> None:
        self._playwright, self._on_crash = playwright, on_crash
        probe = await asyncio.to_thread(
            subprocess.run, ["docker", "image", "inspect", self.image], capture_output=True, text=True
        )
        if probe.returncode != 0:
            raise CapsuleError(
                f"docker image {self.image} is missing (or dockerd is down: {probe.stderr.strip()[:200]}); "
                "build it with `bash launch/images/build.sh chromium`"
            )

    serves_over_http = False  # the HTML is bind-mounted into the container

    def task_url(self, server: MiniWoBServer, task: str, site: str | None = None) -> str:
        return f"file://{CONTAINER_HTML_DIR}/miniwob/{check_task(task)}.html"

    async def open_slot(self) -> Slot:
        runtime_id = f"{CONTAINER_RUNTIME_PREFIX}{uuid.uuid4().hex[:12]}"
        socket_dir = pathlib.Path(self._workdir) / runtime_id
        socket_dir.mkdir(mode=0o755)
        socket_path = str(socket_dir / "cdp.sock")
        entry: dict[str, Any] = {"name": self.container_name(runtime_id), "dir": socket_dir}
        self._containers[runtime_id] = entry
        try:
            run = await asyncio.to_thread(
                subprocess.run,
                [
                    "docker",
                    "run",
                    "-d",
                    "--rm",
                    "--network",
                    "none",
                    "--name",
                    entry["name"],
                    "--memory",
                    self.memory_limit,
                    "--shm-size",
                    "256m",
                    "-v",
                    f"{socket_dir}:{CONTAINER_SOCKET_DIR}",
                    "-v",
                    f"{self._html}:{CONTAINER_HTML_DIR}:ro",
                    self.image,
                ],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                raise RuntimeStartError(f"docker run {self.image} failed: {run.stderr.strip()[:500]}")
            entry["id"] = run.stdout.strip()
            version = await asyncio.to_thread(self._wait_ready, entry, socket_path)
            relay = UnixSocketRelay(socket_path)
            entry["relay"] = relay
            port = await relay.start()
            # DevTools names its own address (127.0.0.1:9222 inside the container): aim at the relay.
            ws = urllib.parse.urlsplit(json.loads(version)["webSocketDebuggerUrl"])
            endpoint = urllib.parse.urlunsplit(ws._replace(netloc=f"127.0.0.1:{port}"))
            browser = await self._playwright.chromium.connect_over_cdp(endpoint)
            entry["browser"] = browser
            browser.on("disconnected", lambda _: self._disconnected(runtime_id))
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
        except BaseException:
            await self._release(runtime_id)
            raise
        return Slot(runtime_id, context, page, lambda: self._release(runtime_id))

    @staticmethod
    def container_name(runtime_id: str) -> str:
        """The Docker name of the container behind runtime `runtime_id`."""
        return f"cua-jax-{runtime_id}"

    @staticmethod
    def _wait_ready(entry: dict[str, Any], socket_path: str) -> bytes:
        deadline = time.monotonic() + CONTAINER_READY_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if os.path.exists(socket_path):
                try:
                    return _http_get_unix(socket_path, "/json/version")
                except OSError as error:
                    last_error = error
            state = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Running}}", entry["id"]], capture_output=True, text=True
            )
            if state.stdout.strip() != "true":
                logs = subprocess.run(["docker", "logs", "--tail", "20", entry["id"]], capture_output=True, text=True)
                raise RuntimeStartError(
                    f"container {entry['name']} exited while starting: {(logs.stdout + logs.stderr)[-500:]}"
                )
            time.sleep(0.1)
        raise RuntimeStartError(f"container {entry['name']}: Chromium's DevTools socket not ready ({last_error})")

    def _disconnected(self, runtime_id: str) -> None:
        entry = self._containers.get(runtime_id)
        if entry is None or entry.get("released") or self._closing or self._on_crash is None:
            return
        self._on_crash(runtime_id, f"container runtime {entry['name']} crashed (browser disconnected)")

    async def _release(self, runtime_id: str) -> None:
        entry = self._containers.pop(runtime_id, None)
        if entry is None:
            return
        entry["released"] = True
        if "browser" in entry:
            try:
                await entry["browser"].close()
            except Exception:  # noqa: BLE001 - the container may already be gone
                pass
        if "relay" in entry:
            await entry["relay"].close()
        await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", entry["name"]], capture_output=True)
        shutil.rmtree(entry["dir"], ignore_errors=True)

    def pids(self) -> list[int]:
        """Each container's shim (its parent): the container's processes descend from it."""
        out = []
        for entry in list(self._containers.values()):
            if "id" not in entry:
                continue
            state = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", entry["id"]], capture_output=True, text=True
            )
            pid = state.stdout.strip()
            if pid.isdigit() and pid != "0":
                with open(f"/proc/{pid}/stat") as f:
                    out.append(int(f.read().rsplit(")", 1)[1].split()[1]))  # the shim
        return out

    async def close(self) -> None:
        self._closing = True
        for runtime_id in list(self._containers):
            await self._release(runtime_id)
        shutil.rmtree(self._workdir, ignore_errors=True)


# The name every container of ContainerPerEnvironmentBackend starts with (to find them with `docker ps`).
CONTAINER_NAME_PREFIX = ContainerPerEnvironmentBackend.container_name(CONTAINER_RUNTIME_PREFIX)
