"""The shared application server: one Trac process serving every capsule's private environment.

Run as a program by the application's own Python (it has Trac; it imports nothing of cua_jax):

    <app-python> cua_jax/envs/webapp/app_server.py --parent DIR --port P --control SOCKET [--http-unix PATH]

HTTP (127.0.0.1:P; P=0: a free port, which `ping` reports) serves Trac; with --http-unix, the same
application is served on a Unix socket too (in a `--network none` container, the only way in). Every request names
its route in the `X-Cua-Route` header, which the capsule's browser context sends with each
request (the page's own scripts cannot read or change it) and which the runtime draws at
random per capsule. The route table maps a route to
the capsule's site (the Host its page loads from) and its published branch: a Trac environment
directory under DIR. A request whose route is unknown, or whose Host is not its route's site,
is refused (403): a page cannot reach another capsule's branch by linking to its site. A request
on a frozen route is refused (503) and counts nothing; an admitted one counts as in flight until
its response has been sent. Trac's links are root-relative (SCRIPT_NAME is empty), so a page
never sees the branch's name.

`GET /.well-known/ready` on an admitted route is the readiness probe a deployment's health check
would use: 200 once the route's environment is open and its database answers (its schema
version read), 503 with the reason otherwise. It renders no page, so it measures the
environment being served, not a page of it.

Control (a Unix socket only the runtime's user can open): one JSON object per line in, one per
line out ({"ok": true, ...} or {"ok": false, "error": ...}). Admission and publication take one
lock, so a publish never lands between a request's admission and its branch lookup:

    {"op": "publish", "route": R, "site": S, "branch": B}   route R serves branch B now (thawed)
    {"op": "freeze", "route": R}                           new requests refused
    {"op": "thaw", "route": R}                             a failed transition: serve again
    {"op": "drain", "route": R, "timeout": T}              wait until nothing is in flight
    {"op": "unroute", "route": R}                          forget R (its capsule closed)
    {"op": "open", "branch": B}                            open B's environment ahead of use
    {"op": "retire", "branch": B}                          close B's environment (no route may serve it)
    {"op": "stats"}                                        routes, requests, open environments, pid
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import socketserver
import sys
import threading
import time

ROUTE_HEADER = "HTTP_X_CUA_ROUTE"
STATIC_PREFIX = "/chrome/common/"
READY_PATH = "/.well-known/ready"
# Connections waiting to be accepted: every capsule's page opens several at once, and a drain
# holds its control connection until its route is idle. socketserver's 5 would reset the rest.
LISTEN_BACKLOG = 256


class RouteTable:
    """Routes, their branches and in-flight counts, under one lock (see the module doc)."""

    def __init__(self, parent: str):
        self.parent = os.path.realpath(parent)
        self.lock = threading.Condition()
        self.routes: dict[str, dict] = {}  # route -> {"site", "branch", "frozen", "in_flight"}
        self.requests = 0
        self.refused = 0
        self.port = 0  # the HTTP port, once bound

    def admit(self, route: str, host: str) -> tuple[str | None, int, str]:
        """(branch path, 0, "") for an admitted request; (None, status, why) for a refused one."""
        with self.lock:
            entry = self.routes.get(route)
            if entry is None:
                self.refused += 1
                return None, 403, "no such route"
            if host.split(":", 1)[0].lower() != entry["site"]:
                self.refused += 1
                return None, 403, "this route serves another site"
            if entry["frozen"]:
                self.refused += 1
                return None, 503, "the capsule is frozen by a lifecycle operation; retry after it publishes"
            entry["in_flight"] += 1
            self.requests += 1
            return os.path.join(self.parent, entry["branch"]), 0, ""

    def leave(self, route: str) -> None:
        with self.lock:
            entry = self.routes.get(route)
            if entry is not None:
                entry["in_flight"] -= 1
                if entry["in_flight"] == 0:
                    self.lock.notify_all()

    def branch_path(self, branch: str) -> str:
        if not branch or "/" in branch or branch in (".", ".."):
            raise ValueError(f"not a branch name: {branch!r}")
        path = os.path.join(self.parent, branch)
        if not os.path.isdir(path):
            raise ValueError(f"no branch {branch!r} under {self.parent}")
        return path

    def control(self, request: dict) -> dict:
        op = request.get("op")
        if op == "publish":
            self.branch_path(request["branch"])
            with self.lock:
                entry = self.routes.setdefault(request["route"], {"in_flight": 0})
                previous = entry.get("branch")
                entry.update(site=str(request["site"]).lower(), branch=request["branch"], frozen=False)
            return {"previous": previous}
        if op in ("freeze", "thaw"):
            with self.lock:
                self._entry(request["route"])["frozen"] = op == "freeze"
            return {}
        if op == "drain":
            deadline = time.monotonic() + float(request.get("timeout", 30.0))
            with self.lock:
                entry = self._entry(request["route"])
                while entry["in_flight"] > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"{entry['in_flight']} request(s) still in flight")
                    self.lock.wait(left)
            return {}
        if op == "unroute":
            with self.lock:
                self.routes.pop(request["route"], None)
            return {}
        if op == "open":
            from trac.env import open_environment

            open_environment(self.branch_path(request["branch"]), use_cache=True)
            return {}
        if op == "retire":
            return {"closed": self._retire(request["branch"])}
        if op == "stats":
            from trac.env import env_cache

            with self.lock:
                return {
                    "pid": os.getpid(),
                    "routes": len(self.routes),
                    "in_flight": sum(e["in_flight"] for e in self.routes.values()),
                    "requests": self.requests,
                    "refused": self.refused,
                    "open_environments": len(env_cache),
                }
        if op == "ping":
            return {"pid": os.getpid(), "port": self.port}
        raise ValueError(f"unknown control op {op!r}")

    def _entry(self, route: str) -> dict:
        entry = self.routes.get(route)
        if entry is None:
            raise ValueError(f"no such route {route!r}")
        return entry

    def _retire(self, branch: str) -> bool:
        from trac.env import env_cache, env_cache_lock

        path = os.path.join(self.parent, branch)
        with self.lock:
            if any(e.get("branch") == branch for e in self.routes.values()):
                raise ValueError(f"branch {branch!r} is still published")
        with env_cache_lock:
            env = env_cache.pop(path, None)
        # Not env.shutdown(): Trac's connection pool is one per process, and a shutdown without a
        # thread closes every environment's connections, other capsules' in use among them. Only
        # the idle connections to this branch's database are closed (none is in use: drained).
        database = os.path.join(path, "db", "trac.db")
        _close_idle_connections(database)
        return env is not None


def _static_file(htdocs: str, path_info: str) -> str | None:
    """The file of Trac's own static assets (`/chrome/common/...`) a path names, if any."""
    if not path_info.startswith(STATIC_PREFIX):
        return None
    file = os.path.realpath(os.path.join(htdocs, path_info[len(STATIC_PREFIX) :]))
    return file if file.startswith(htdocs + os.sep) and os.path.isfile(file) else None


def _send_static(file: str, start_response):
    kind = mimetypes.guess_type(file)[0] or "application/octet-stream"
    with open(file, "rb") as data:
        body = data.read()
    headers = [("Content-Type", kind), ("Content-Length", str(len(body))), ("Cache-Control", "max-age=86400")]
    start_response("200 OK", headers)
    return [body]


def share_initialised_runtime() -> None:
    """What every environment of the process can share, loaded once rather than per environment
    (the shared, already-initialised runtime capsules are about):

    - installed plugins: Trac scans every installed plugin's entry points (pkg_resources) for
      each environment it opens, about 0.14 s of an environment's 0.15 s open, though they are
      imported once per process. After the first environment has loaded them, one with no
      plugins of its own (no files in its plugins folders, as every branch of the seeded state)
      loads nothing more; one with plugins of its own loads as Trac always does.
    - compiled templates: Trac's Chrome makes a Jinja2 environment per Trac environment, which
      compiles each template again on its first render (most of a branch's first page). One
      in-memory bytecode cache, keyed by Jinja2 on the template and its source's checksum,
      serves them all; the Jinja2 settings are Trac's own and the same for every environment.
    """
    import jinja2.bccache
    import trac.env
    import trac.loader
    import trac.web.chrome

    loaded = []

    def load_components(env, extra_path=None, *args, **kwargs):
        folders = [env.plugins_dir, *(extra_path or ())]
        own = any(os.path.isdir(folder) and os.listdir(folder) for folder in folders if folder)
        if loaded and not own:
            return
        trac.loader.load_components(env, extra_path, *args, **kwargs)
        loaded.append(env.path)

    trac.env.load_components = load_components

    class SharedBytecode(jinja2.bccache.BytecodeCache):
        def __init__(self):
            self.compiled: dict[str, bytes] = {}
            self.lock = threading.Lock()

        def load_bytecode(self, bucket):
            with self.lock:
                code = self.compiled.get(bucket.key)
            if code is not None:
                bucket.bytecode_from_string(code)

        def dump_bytecode(self, bucket):
            code = bucket.bytecode_to_string()
            with self.lock:
                self.compiled[bucket.key] = code

    shared = SharedBytecode()
    make_jinja2_environment = trac.web.chrome.jinja2env

    def jinja2env(**kwargs):
        kwargs.setdefault("bytecode_cache", shared)
        return make_jinja2_environment(**kwargs)

    trac.web.chrome.jinja2env = jinja2env


def _close_idle_connections(database: str) -> int:
    """Close the pooled, idle connections to `database` (Trac's process-wide pool); how many."""
    from trac.db.pool import _backend

    closed = 0
    with _backend._available:
        for index in reversed(range(len(_backend._pool_key))):
            if repr(database) in _backend._pool_key[index] or database in _backend._pool_key[index]:
                connection = _backend._pool.pop(index)
                _backend._pool_key.pop(index)
                _backend._pool_time.pop(index)
                connection.close()
                closed += 1
    return closed


def _send_readiness(env_path: str, start_response):
    """The readiness probe's answer (see the module doc)."""
    from trac.env import open_environment

    try:
        env = open_environment(env_path, use_cache=True)
        version = env.db_query("SELECT value FROM system WHERE name='database_version'")[0][0]
        status, body = "200 OK", f"ready: database version {version}"
    except Exception as error:  # noqa: BLE001 - not ready, and why
        status, body = "503 Service Unavailable", f"not ready: {type(error).__name__}: {error}"
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]


def make_app(table: RouteTable):
    import trac
    from trac.web.main import dispatch_request

    htdocs = os.path.realpath(os.path.join(os.path.dirname(trac.__file__), "htdocs"))

    def app(environ, start_response):
        route = environ.get(ROUTE_HEADER, "")
        path, status, why = table.admit(route, environ.get("HTTP_HOST", ""))
        if path is None:
            reason = {403: "Forbidden", 503: "Service Unavailable"}[status]
            start_response(f"{status} {reason}", [("Content-Type", "text/plain; charset=utf-8")])
            return [why.encode()]
        environ["trac.env_path"] = path
        environ["SCRIPT_NAME"] = ""
        try:
            if environ.get("PATH_INFO") == READY_PATH:
                return _Counted(_send_readiness(path, start_response), lambda: table.leave(route))
            static = _static_file(htdocs, environ.get("PATH_INFO", ""))
            if static is not None:
                # Trac's shipped stylesheets, scripts and icons: the same for every branch, served
                # as a deployment's front server serves them (`trac-admin deploy`), not by Trac.
                return _Counted(_send_static(static, start_response), lambda: table.leave(route))
            body = dispatch_request(environ, start_response)
        except BaseException:
            table.leave(route)
            raise
        return _Counted(body, lambda: table.leave(route))

    return app


class _Counted:
    """A response body that calls `done` once the server has sent (or dropped) it."""

    def __init__(self, body, done):
        self.body, self.done, self.closed = body, done, False

    def __iter__(self):
        return iter(self.body)

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                if hasattr(self.body, "close"):
                    self.body.close()
            finally:
                self.done()


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            try:
                reply = {"ok": True, **self.server.table.control(json.loads(line))}
            except Exception as error:  # noqa: BLE001 - every failure goes back to the caller
                reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            self.wfile.write((json.dumps(reply) + "\n").encode())
            self.wfile.flush()


class _ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Trac's HTTP/1.1 request handler and WSGI gateway (as TracHTTPServer uses them) on a Unix
    stream socket."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, path: str, application):
        from trac.web.standalone import TracHTTP11RequestHandler
        from trac.web.wsgi import WSGIServerGateway

        super().__init__(path, TracHTTP11RequestHandler)
        self.application, self.gateway = application, WSGIServerGateway
        self.environ = {"SERVER_NAME": "localhost", "SERVER_PORT": "80", "SCRIPT_NAME": ""}

    def get_request(self):
        # A Unix socket's peer has no address, and Trac's handler reads client_address[0]; the
        # connections come from the host's loopback relay.
        connection, _ = super().get_request()
        return connection, ("127.0.0.1", 0)


def _log_server_errors_only() -> None:
    """Trac's request handler logs every request; the server's log keeps the server's errors
    (status 500 and above) alone, or it would grow by a line a request."""
    from trac.web.standalone import TracHTTPRequestHandler

    def log_request(handler, code="-", size="-"):
        if str(code).isdigit() and int(code) >= 500:
            handler.log_message('"%s" %s %s', handler.requestline, str(code), str(size))

    TracHTTPRequestHandler.log_request = log_request


def _exit_with_parent(parent: int) -> None:
    """The server is its runtime's: when the process that started it is gone (killed, crashed),
    it ends too rather than serve on with nobody to stop it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--http-unix", default=None, help="also serve HTTP on this Unix socket")
    args = parser.parse_args(argv)
    table = RouteTable(args.parent)
    share_initialised_runtime()
    _log_server_errors_only()
    if os.path.exists(args.control):
        os.unlink(args.control)
    old_umask = os.umask(0o077)  # the control socket is the runtime's alone
    control = _ControlServer(args.control, _ControlHandler)
    os.umask(old_umask)
    control.table = table
    from trac.web.standalone import TracHTTPServer

    class Server(TracHTTPServer):
        request_queue_size = LISTEN_BACKLOG

    # Trac's own threaded server (tracd's), keeping connections alive (HTTP/1.1).
    http = Server(("127.0.0.1", args.port), make_app(table), None, [], use_http_11=True)
    table.port = http.server_port
    if args.http_unix:
        if os.path.exists(args.http_unix):
            os.unlink(args.http_unix)
        http_unix = _UnixHTTPServer(args.http_unix, make_app(table))
        threading.Thread(target=http_unix.serve_forever, name="http-unix", daemon=True).start()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    threading.Thread(target=control.serve_forever, name="control", daemon=True).start()
    print(f"serving {table.parent} on 127.0.0.1:{http.server_port}", file=sys.stderr, flush=True)
    http.serve_forever()


if __name__ == "__main__":
    main()
