"""A pool of desktop environment containers, driven through the docker Python SDK.

Each environment is one container of the desktop image, run with no network
(`--network none`), CPU / memory / pid caps, and a host directory bind-mounted at
/run/cua where its server creates its Unix socket. Containers carry the labels
`cua-jax.pool=<pool id>` so that `close()` removes exactly what this pool started.

    pool = DockerEnvPool(PoolConfig(image=image_tag("desktop"), size=4))
    with pool:                       # starts the containers and waits for readiness
        env = pool.acquire()         # a ready, healthy environment (PooledEnv)
        env.client.step(action)      # EnvClient: OSWorld endpoints + our actions
        fault = pool.diagnose(env)   # None, or why the environment broke (faults.Fault)
        host, port = pool.osworld_endpoint(env)  # for OSWorld's PythonController, unchanged
        pool.release(env)            # reset (recreate or restart) in the background

The pool is safe to use from many threads at once; `acquire_async` / `release_async`
serve asyncio code. A released environment is reset before anyone gets it again; an
unhealthy one is replaced by a fresh container.

`osworld_endpoint(env)` opens, on request, a loopback TCP endpoint that forwards to the
environment's Unix socket without a token (cua_jax.envs.osworld_bridge says why), so an
OSWorld agent's `PythonController(host, port)` drives it as it is. The endpoint closes
with its environment (a recreate, a replacement, or `close()`); a restart keeps it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import queue
import shutil
import socket
import tempfile
import threading
import time
import uuid
from typing import Literal

import docker
import docker.errors

from cua_jax.envs.client import EnvClient
from cua_jax.envs.container_judge import ContainerJudge, judge_volume
from cua_jax.envs.faults import Fault, FaultKind, container_fault
from cua_jax.envs.osworld_bridge import LoopbackBridge

log = logging.getLogger(__name__)

LABEL_POOL = "cua-jax.pool"
LABEL_ROLE = "cua-jax.role"
LABEL_OWNER = "cua-jax.owner"  # "<host>:<pid>:<start time>" of the process whose pool started it
SOCKET_NAME = "env.sock"
EXIT_GRACE_S = 3.0  # how long a container whose server stopped answering may take to exit
CONTAINER_SOCKET_DIR = "/run/cua"


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks after boot, /proc/<pid>/stat field 22), or
    None when there is no such process."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_owner() -> str:
    """This process as a container's owner: host, pid and start time (a reused pid differs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_is_gone(owner: str) -> bool:
    """Whether the owner label `owner` names a process of this host that no longer runs (an
    owner of another host, or an unreadable label, is never gone: its containers stay)."""
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not started:
        return False
    return _start_time(int(pid)) != started


class PoolError(RuntimeError):
    """The pool could not provide an environment (start failed, none free in time, closed)."""


@dataclasses.dataclass
class PoolConfig:
    """How the pool runs its containers.

    image: the exact image tag (cua_jax.envs.images.image_tag("desktop")).
    size: number of environments kept alive.
    cpus / memory / pids_limit: per-container caps (memory without swap).
    screen: the virtual screen, WIDTHxHEIGHT.
    reset_mode: "recreate" (a new container: clean files and processes) or "restart"
        (restart the same container: processes reset, files written by the last episode
        remain in its layer; faster).
    ready_timeout: seconds a new container has to answer its health probe.
    call_timeout: the default timeout of every environment call.
    docker_timeout: the timeout of every Docker API call.
    health_interval: seconds between health checks of idle environments (None or 0: only
        on acquire).
    health_timeout: seconds a health probe may take before the server counts as hung.
    socket_root: host directory holding the per-container socket directories (a fresh
        temporary directory when None).
    """

    image: str
    size: int = 4
    cpus: float = 1.0
    memory: str = "1g"
    pids_limit: int = 1024
    screen: str = "1280x800"
    reset_mode: Literal["recreate", "restart"] = "recreate"
    ready_timeout: float = 240.0
    call_timeout: float = 30.0
    docker_timeout: float = 60.0
    health_interval: float | None = 10.0
    health_timeout: float = 10.0
    socket_root: str | None = None

    def __post_init__(self):
        for name in ("size", "cpus", "pids_limit", "ready_timeout", "call_timeout", "docker_timeout", "health_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.health_interval is not None and self.health_interval < 0:
            raise ValueError(f"health_interval must be >= 0 (0 or None: on acquire only), got {self.health_interval}")
        if self.reset_mode not in ("recreate", "restart"):
            raise ValueError(f"reset_mode {self.reset_mode!r} is not one of ('recreate', 'restart')")


@dataclasses.dataclass
class PooledEnv:
    """One environment of the pool: its container and the client of its server."""

    slot: int
    name: str
    container_id: str
    socket_dir: str
    client: EnvClient
    started_at: float
    # Judge code runs here, by docker exec from the host, not through the server (container_judge).
    judge: ContainerJudge

    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, SOCKET_NAME)


class DockerEnvPool:
    def __init__(self, config: PoolConfig):
        self.config = config
        self.pool_id = uuid.uuid4().hex[:10]
        self._own_socket_root = config.socket_root is None
        self.socket_root = config.socket_root or tempfile.mkdtemp(prefix=f"cua-jax-pool-{self.pool_id}-")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._idle: queue.Queue[PooledEnv] = queue.Queue()
        self._envs: dict[int, PooledEnv] = {}  # slot -> its current environment
        self._background = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(2, config.size), thread_name_prefix=f"cua-pool-{self.pool_id}"
        )
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None
        self._bridges: dict[str, LoopbackBridge] = {}  # container id -> its OSWorld endpoint
        self.counters = {"started": 0, "replaced": 0, "resets": 0, "failed_starts": 0}

    # ---- Docker plumbing ------------------------------------------------------------
    @property
    def docker(self) -> docker.DockerClient:
        """A Docker client per thread (the SDK's HTTP session is not meant to be shared)."""
        client = getattr(self._local, "docker", None)
        if client is None:
            client = docker.from_env(timeout=int(self.config.docker_timeout))
            self._local.docker = client
        return client

    def _labels(self, slot: int) -> dict[str, str]:
        return {LABEL_POOL: self.pool_id, LABEL_ROLE: "env", "cua-jax.slot": str(slot), LABEL_OWNER: process_owner()}

    def remove_orphans(self) -> int:
        """Remove the environment containers on this host whose owning process is gone (a
        killed run's pool never closed): the count removed. Runs when a pool starts."""
        try:
            containers = self.docker.api.containers(all=True, filters={"label": f"{LABEL_ROLE}=env"})
        except docker.errors.DockerException as error:
            log.warning("cannot list environment containers: %s", error)
            return 0
        removed = 0
        for container in containers:
            if not owner_is_gone((container.get("Labels") or {}).get(LABEL_OWNER, "")):
                continue
            try:
                self.docker.api.remove_container(container["Id"], force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
        if removed:
            log.warning("removed %d environment containers a killed process left behind", removed)
        return removed

    def _start_container(self, slot: int) -> PooledEnv:
        """Start a container for `slot` and wait until its server is ready."""
        name = f"cua-jax-{self.pool_id}-{slot}-{uuid.uuid4().hex[:6]}"
        socket_dir = os.path.join(self.socket_root, name)
        os.makedirs(socket_dir)
        cfg = self.config
        try:
            container = self.docker.containers.run(
                cfg.image,
                command=["--screen", cfg.screen],
                name=name,
                detach=True,
                labels=self._labels(slot),
                network_mode="none",
                init=True,
                nano_cpus=int(cfg.cpus * 1e9),
                mem_limit=cfg.memory,
                memswap_limit=cfg.memory,
                pids_limit=cfg.pids_limit,
                shm_size="256m",
                volumes={socket_dir: {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"}, **judge_volume()},
            )
        except docker.errors.DockerException as error:
            shutil.rmtree(socket_dir, ignore_errors=True)
            with self._lock:
                self.counters["failed_starts"] += 1
            raise PoolError(f"cannot start a container of {cfg.image}: {error}") from None
        env = PooledEnv(
            slot,
            name,
            container.id,
            socket_dir,
            EnvClient(os.path.join(socket_dir, SOCKET_NAME), timeout=cfg.call_timeout),
            time.monotonic(),
            ContainerJudge(lambda: self.docker, container.id),
        )
        try:
            self._wait_ready(env)
        except PoolError:
            self._remove(env)
            with self._lock:
                self.counters["failed_starts"] += 1
            raise
        with self._lock:
            self.counters["started"] += 1
        return env

    def _wait_ready(self, env: PooledEnv) -> None:
        """The readiness probe: the server answers /health, or the container's fault is raised."""
        deadline = time.monotonic() + self.config.ready_timeout
        delay = 0.05
        while True:
            if os.path.exists(env.socket_path) and env.client.health(timeout=self.config.health_timeout):
                return
            if self._closed.is_set():
                raise PoolError(f"{env.name}: the pool closed while it started")
            fault = container_fault(self._state(env))
            if fault is not None:
                raise PoolError(f"{env.name} did not start: {fault.reason}; logs: {self._logs(env)}")
            if time.monotonic() > deadline:
                raise PoolError(
                    f"{env.name} was not ready within {self.config.ready_timeout}s; logs: {self._logs(env)}"
                )
            time.sleep(delay)
            delay = min(0.5, delay * 1.5)

    def _state(self, env: PooledEnv) -> dict | None:
        try:
            return self.docker.api.inspect_container(env.container_id)["State"]
        except docker.errors.NotFound:
            return None

    def _logs(self, env: PooledEnv, tail: int = 20) -> str:
        try:
            return self.docker.api.logs(env.container_id, tail=tail).decode(errors="replace").strip()
        except docker.errors.DockerException:
            return "(no logs)"

    def _remove(self, env: PooledEnv) -> None:
        self._close_bridge(env.container_id)
        try:
            self.docker.api.remove_container(env.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as error:
            log.warning("cannot remove %s: %s", env.name, error)
        shutil.rmtree(env.socket_dir, ignore_errors=True)

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> DockerEnvPool:
        """Start `size` containers in parallel and wait for all to be ready (first removing
        the containers of pools whose process is gone: `remove_orphans`)."""
        self.remove_orphans()
        futures = {self._background.submit(self._start_container, slot): slot for slot in range(self.config.size)}
        errors = []
        for future in concurrent.futures.as_completed(futures):
            try:
                env = future.result()
            except PoolError as error:
                errors.append(str(error))
                continue
            with self._lock:
                self._envs[env.slot] = env
            self._idle.put(env)
        if errors:
            self.close()
            raise PoolError(f"{len(errors)} of {self.config.size} environments failed to start: {errors[0]}")
        if self.config.health_interval:
            self._monitor = threading.Thread(
                target=self._monitor_idle, daemon=True, name=f"cua-pool-{self.pool_id}-health"
            )
            self._monitor.start()
        return self

    def __enter__(self) -> DockerEnvPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove every container this pool started (found by its label), and its sockets."""
        self._closed.set()
        self._background.shutdown(wait=True, cancel_futures=True)
        try:
            containers = self.docker.api.containers(all=True, filters={"label": f"{LABEL_POOL}={self.pool_id}"})
        except docker.errors.DockerException as error:
            log.warning("cannot list the pool's containers: %s", error)
            containers = []
        for container in containers:
            try:
                self.docker.api.remove_container(container["Id"], force=True)
            except docker.errors.NotFound:
                pass
        with self._lock:
            self._envs.clear()
            bridges = list(self._bridges)
        for container_id in bridges:
            self._close_bridge(container_id)
        if self._own_socket_root:
            shutil.rmtree(self.socket_root, ignore_errors=True)

    # ---- acquire / release ------------------------------------------------------------
    def acquire(self, timeout: float | None = None) -> PooledEnv:
        """A ready, healthy environment; blocks until one is free (PoolError after `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed.is_set():
                raise PoolError("the pool is closed")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                env = self._idle.get(timeout=remaining)
            except queue.Empty:
                raise PoolError(f"no environment became free within {timeout}s") from None
            if env.client.health(timeout=self.config.health_timeout):
                return env
            fault = self.diagnose(env)
            self._submit(self._replace_slot, env, fault.reason if fault else "unhealthy")

    def _submit(self, fn, *args) -> None:
        """Run `fn` in the background unless the pool is closing (then the work is moot)."""
        try:
            self._background.submit(fn, *args)
        except RuntimeError:  # shut down between the check and the submit
            if not self._closed.is_set():
                raise

    def release(self, env: PooledEnv, reset: bool = True) -> None:
        """Give an environment back. It is reset (or replaced, when broken) in the background
        and becomes available again once ready."""
        if self._closed.is_set():
            return
        if reset:
            self._submit(self._reset_slot, env)
        else:
            self._idle.put(env)

    async def acquire_async(self, timeout: float | None = None) -> PooledEnv:
        return await asyncio.to_thread(self.acquire, timeout)

    async def release_async(self, env: PooledEnv, reset: bool = True) -> None:
        await asyncio.to_thread(self.release, env, reset)

    def reset(self, env: PooledEnv) -> PooledEnv:
        """Reset an acquired environment now and return it (a new handle when recreated)."""
        if self.config.reset_mode == "restart" and self.diagnose(env) is None:
            try:
                try:  # the restarted server binds a new socket; never probe the old one
                    os.unlink(env.socket_path)
                except FileNotFoundError:
                    pass
                self.docker.api.restart(env.container_id, timeout=2)
                self._wait_ready(env)
                with self._lock:
                    self.counters["resets"] += 1
                return env
            except (PoolError, docker.errors.DockerException) as error:
                log.warning("restarting %s failed (%s); recreating it", env.name, error)
        fresh = self._recreate(env)
        with self._lock:
            self.counters["resets"] += 1
        return fresh

    def _recreate(self, env: PooledEnv) -> PooledEnv:
        self._remove(env)
        fresh = self._start_container(env.slot)
        with self._lock:
            self._envs[env.slot] = fresh
        return fresh

    def _reset_slot(self, env: PooledEnv) -> None:
        fault = self.diagnose(env)
        if fault is not None:
            self._replace_slot(env, fault.reason)
            return
        try:
            self._idle.put(self.reset(env))
        except PoolError as error:
            if self._closed.is_set():  # the pool closed under the reset: nothing to retry
                return
            log.error("slot %d could not be reset: %s; retrying", env.slot, error)
            self._retry_slot(env.slot)

    def _replace_slot(self, env: PooledEnv, reason: str) -> None:
        log.warning("replacing %s: %s", env.name, reason)
        with self._lock:
            self.counters["replaced"] += 1
        try:
            self._idle.put(self._recreate(env))
        except PoolError as error:
            if self._closed.is_set():
                return
            log.error("slot %d could not be replaced: %s; retrying", env.slot, error)
            self._retry_slot(env.slot)

    def _retry_slot(self, slot: int, attempts: int = 3) -> None:
        for attempt in range(attempts):
            if self._closed.is_set():
                return
            try:
                env = self._start_container(slot)
            except PoolError as error:
                log.error("slot %d start attempt %d failed: %s", slot, attempt + 1, error)
                time.sleep(1.0 + attempt)
                continue
            with self._lock:
                self._envs[slot] = env
            self._idle.put(env)
            return
        log.error("slot %d is lost after %d attempts; the pool runs one short", slot, attempts)

    # ---- OSWorld's client -------------------------------------------------------------
    def osworld_endpoint(self, env: PooledEnv) -> tuple[str, int]:
        """(host, port) of a loopback TCP endpoint (127.0.0.1) forwarding to `env`'s server
        without a token, for OSWorld's `PythonController(host, port)`. Opened on the first
        call (the same endpoint afterwards); closed when the environment is recreated,
        replaced or the pool closes."""
        with self._lock:
            if self._closed.is_set():
                raise PoolError("the pool is closed")
            bridge = self._bridges.get(env.container_id)
            if bridge is None:
                if self._envs.get(env.slot) is not env:
                    raise PoolError(f"{env.name} is no longer one of this pool's environments")
                bridge = self._bridges[env.container_id] = LoopbackBridge(env.socket_path)
            return bridge.address

    def _close_bridge(self, container_id: str) -> None:
        with self._lock:
            bridge = self._bridges.pop(container_id, None)
        if bridge is not None:
            bridge.close()

    # ---- health -------------------------------------------------------------------------
    def diagnose(self, env: PooledEnv) -> Fault | None:
        """Why an environment is broken (container exited / OOM-killed / server
        unresponsive), or None when its container runs and its server answers."""
        try:
            fault = container_fault(self._state(env))
        except docker.errors.DockerException as error:
            return Fault(FaultKind.SERVER_UNRESPONSIVE, f"docker cannot inspect {env.name}: {error}")
        if fault is not None:
            return fault
        if not env.client.health(timeout=self.config.health_timeout):
            # A server that just exited leaves a container that is still stopping: its exit
            # status says who stopped it (container_fault), so it is read once the container is down.
            deadline = time.monotonic() + EXIT_GRACE_S
            while time.monotonic() < deadline:
                try:
                    fault = container_fault(self._state(env))
                except docker.errors.DockerException:
                    break
                if fault is not None:
                    return fault
                time.sleep(0.1)
            return Fault(FaultKind.SERVER_UNRESPONSIVE, f"{env.name} does not answer its health probe")
        return None

    def _monitor_idle(self) -> None:
        """Replace idle environments that went bad while nobody held them."""
        while not self._closed.wait(self.config.health_interval):
            checked = []
            while True:
                try:
                    checked.append(self._idle.get_nowait())
                except queue.Empty:
                    break
            for env in checked:
                fault = None if self._closed.is_set() else self.diagnose(env)
                if fault is None:
                    self._idle.put(env)
                elif not self._closed.is_set():
                    self._submit(self._replace_slot, env, fault.reason)

    # ---- introspection --------------------------------------------------------------
    def environments(self) -> list[PooledEnv]:
        with self._lock:
            return list(self._envs.values())

    def idle_count(self) -> int:
        return self._idle.qsize()
