"""The loopback HTTP server that serves the MiniWoB++ task pages (`MiniWoBServer`)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading

from cua_jax.envs.miniwob.catalog import check_task, html_dir

# The server process: quiet, loopback only, and gone as soon as its parent is (stdin at EOF),
# however the parent ended.
_SERVER_SCRIPT = """
import functools, os, sys, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

ASSETS = sys.argv[2]

class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        # A task page opened on a capsule's own site takes its scripts from one shared host, so
        # a renderer that hosts many capsules compiles jQuery, d3 and core.js once, not per page.
        host = (self.headers.get("Host") or "").split(":")[0]
        if host.endswith(".test") and host != ASSETS and self.path.split("?")[0].endswith(".html"):
            try:
                with open(self.translate_path(self.path), "rb") as f:
                    body = f.read()
            except OSError:
                self.send_error(404)
                return
            shared = '<script src="http://%s:%d/' % (ASSETS, self.server.server_address[1])
            body = body.replace(b'<script src="../', shared.encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=sys.argv[1]))
httpd.daemon_threads = True
print("serving on port", httpd.server_address[1], flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
httpd.serve_forever()
"""


SHARED_ASSETS_HOST = "assets.test"  # where pages on capsule sites (*.test) load MiniWoB's scripts from


class MiniWoBServer:
    """Serves the package's html/ folder on 127.0.0.1 (an OS-chosen port).

    The server is a child process (the standard library's `http.server`), not a thread:
    page loads of many capsules would otherwise contend for the GIL with the event loop
    that drives Playwright. It exits when its parent does (its stdin reaches EOF).
    """

    def __init__(self, root: pathlib.Path | None = None, start_timeout_s: float = 30.0):
        self.root = root or html_dir()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SCRIPT, str(self.root), SHARED_ASSETS_HOST],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.PIPE,
            text=True,
        )
        self.port = self._read_port(start_timeout_s)

    def _read_port(self, timeout_s: float) -> int:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self._process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        match = re.search(r"port (\d+)", ready[0]) if ready else None
        if match is None:
            self.close()
            raise RuntimeError(f"the MiniWoB HTTP server did not start (said {ready[:1]!r})")
        return int(match.group(1))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def task_url(self, task: str, host: str = "127.0.0.1") -> str:
        """The task's page; `host` names the server by another name that resolves to it (a
        browser launched with a host-resolver rule gives each capsule a site of its own)."""
        return f"http://{host}:{self.port}/miniwob/{check_task(task)}.html"

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()  # the server exits on EOF
        if self._process.poll() is None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
