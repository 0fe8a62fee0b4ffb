"""A loopback TCP endpoint for one environment, so OSWorld's own client drives it unchanged.

OSWorld's `PythonController(vm_ip, server_port)` speaks plain HTTP to host:port and sends
no credentials. Our environments serve that protocol on a Unix socket (no token: only
processes that can open the socket's directory reach it) or on TCP, where a bearer token
is always required. A `LoopbackBridge` listens on 127.0.0.1 (an ephemeral port by
default) and forwards every connection, byte for byte, to the environment's Unix socket:

    bridge = LoopbackBridge(env.socket_path)          # or pool.osworld_endpoint(env)
    controller = PythonController(*bridge.address)    # desktop_env.controllers.python
    controller.get_screenshot()
    bridge.close()

Why a host-side bridge rather than a token-less TCP mode of the server itself:

  * Containers run with `--network none`: a TCP listener inside one is unreachable from
    the host, so a no-auth server mode would serve nobody outside the container unless
    the container got a network (losing the isolation) or a forwarder were added anyway.
  * The server keeps one rule: TCP always needs the bearer token (pools spanning
    machines); nothing can switch authentication off by a flag or a bind address.
  * The endpoint exists only when asked for, binds loopback only (other addresses are
    refused), and the pool closes it with its environment.
  * It forwards bytes and does not parse HTTP: every endpoint, keep-alive connections,
    large uploads and downloads pass through as they are.

The cost: a loopback port is reachable by every local process, not only by those that
may open the socket's directory. Use it on a host whose local users are trusted (a
training machine), and keep `EnvClient` on the Unix socket for the project's own calls.
"""

from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import threading

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_CONNECT_TIMEOUT = 10.0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackBridge:
    """Forwards TCP connections on a loopback address to a Unix socket, until closed.

    Args:
        socket_path: the environment server's Unix socket.
        host: a loopback address to listen on (127.0.0.1, ::1 or localhost).
        port: the port; 0 picks a free one (see `address`).
    """

    def __init__(self, socket_path: str, host: str = "127.0.0.1", port: int = 0):
        if not _is_loopback(host):
            raise ValueError(f"the bridge listens on loopback addresses only, not {host!r}")
        self.socket_path = socket_path
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._wake_read, self._wake_write = socket.socketpair()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"osworld-bridge-{self.address[1]}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"LoopbackBridge({self.address[0]}:{self.address[1]} -> {self.socket_path})"

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> LoopbackBridge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and cut every forwarded connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sockets = list(self._open)
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        for sock in sockets:  # wakes the pumps blocked in recv
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        for sock in (self._listener, self._wake_read, self._wake_write):
            sock.close()

    # ---- forwarding --------------------------------------------------------------------
    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(sockets)
            return True

    def _untrack(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._open.difference_update(sockets)
        for sock in sockets:
            sock.close()

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._closed:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_read:
                        return
                    try:
                        client, _ = self._listener.accept()
                    except OSError:
                        continue
                    threading.Thread(
                        target=self._serve, args=(client,), daemon=True, name=f"osworld-bridge-{self.address[1]}-conn"
                    ).start()

    def _serve(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if not self._track(client, upstream):
            client.close()
            upstream.close()
            return
        try:
            upstream.settimeout(_CONNECT_TIMEOUT)
            try:
                upstream.connect(self.socket_path)
            except OSError as error:  # the environment is down or restarting: as if refused
                log.debug("%r: cannot reach the environment: %s", self, error)
                return
            upstream.settimeout(None)
            to_server = threading.Thread(target=_pump, args=(client, upstream), daemon=True)
            to_server.start()
            _pump(upstream, client)
            to_server.join()
        finally:
            self._untrack(client, upstream)


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy until `source` ends, then end `target`'s sending side (half-close)."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass
