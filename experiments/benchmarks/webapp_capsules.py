"""Web application capsules over one shared server against an application process per environment
(Trac), side by side in one process on the same seeded state.

  capsules    `WebappRuntime`: one shared application server, a branch of the state per capsule
              generation (copy-on-write where the filesystem clones, else a full copy), a browser
              context per generation in one shared Chromium.
  processes   an application server (`app_server.py`) per environment on its own full copy of the
              state; reset and fork start a new process on a new copy. The browser side is the same
              as the capsules' (a context per environment in one shared Chromium), so the rows
              differ only in how the application's state and server are provided.
  containers  a `--network none` container of the trac image per environment (its seeded state in
              an image layer, its writes in the container's writable layer; --base must hold the
              same state, which the run checks by digest): create and reset run a new container
              (the old one `docker rm -f`ed), fork `docker commit`s the running container (its
              route frozen and drained) and runs the committed image. The browser side is the same
              again; it reaches each container's http.sock through a loopback TCP relay.

For each concurrency c (8 and 16 by default):

  create rdy  seconds from request to the new environment ready: its readiness probe (`GET
              /.well-known/ready` with the site's Host and the route header, which opens the
              environment and reads its database) answered 200; what a deployment's health check
              waits for, and the paper's create (preparation plus readiness checks). capsule =
              branch + publish + probe; process = copy + process started + publish + probe;
              container = `docker run` + server up + publish + probe. c at once; mean and p50.
              The capsules' shared server has served one page before (its one-time
              initialisation: Trac compiles its templates on the first render of the process); a
              process or container initialises with every environment, which is the cost capsules
              remove.
  create srv  the same until the start page is served over HTTP (urllib) too.
  create pg   the same with the browser page loaded (`WebappRuntime.create`). c at once.
  fork rdy    a fork of each ready environment, c at once, after a wiki page was written to each
              through its route: the parent's route frozen and drained, its state carried
              (capsule: a branch of its branch; process: a copy of its copy and a new process;
              container: `docker commit` and a container of the commit), the fork published and
              probed ready; the parent thawed. Every fork's database must hold its parent's page.
  reset       mean seconds per reset (with its first observation) inside the workload below.
  fork pg     a fork of each environment mid-episode (its comment typed, not submitted) with the
              fork's browser page loaded at the parent's URL (`WebappRuntime.fork`), c at once.
  env/s       episodes per second: c threads on the blocking API, --episodes each, every episode:
              reset onto a ticket's page, fill its comment, submit, done.
  MiB/env     PSS of every process serving the environments (application server(s), the browser
              and its children) with c environments live, divided by c.
  MiB/env st  storage each environment adds after the episodes: on a dedicated filesystem (the
              XFS image) the growth of its used blocks (statvfs) over the c environments, divided
              by c; elsewhere the allocated bytes of the environments' directories; containers:
              their writable layers (`docker inspect --size`'s SizeRw).
  (containers' MiB/env counts each container's processes with its shim.)

Copy-on-write ablation: the capsules run with branch_by="overlay" (an overlayfs mount per branch,
copy-up by clone), "reflink" (every file cloned) and "copy" (a full copy), on a loop-mounted XFS
image (reflink=1) created for the run when mkfs.xfs is there and mounting works; else the
capsules run on --workdir's filesystem by whatever it offers, and the rows it cannot run say why.
The first capsules row is the one the ratios compare. The filesystem of every row is printed.

Publication ablation (the paper's Fig. 4): --trials trials, each on a fresh branch A of the state
served under route R, while a writer thread keeps creating wiki pages through R (one row per
write). The operation publishes B, a branch of A (the capsule continued in a new generation):
  transaction  freeze R, drain R, branch A -> B, publish B under a new route R', unroute R; the
               writer retries a refused write and moves to R' once it is published.
  direct       branch A -> B while writes go on, then publish B on the live route R.
A trial is mixed when the writes R accepted are not all found alike in A and in B: a write the old
generation acknowledged after the branch was taken is missing from B, or a write sent on the old
route landed in B; a branch whose database cannot be read (torn while copied) counts as mixed.

Paths stay short: a control socket's path (the workdir's, plus about 30 characters) must fit
AF_UNIX's 107 bytes, so --workdir should be a short path (the default is the system's temp dir).

    python -m experiments.benchmarks.webapp_capsules --base DIR [--concurrency 8,16] [--episodes 2]
        [--trials 100] [--workdir DIR] [--json PATH] [--quick] [--systems capsules,processes,containers]
        [--container-image trac_bench]

Ratios are printed as `<metric> <baseline>/capsules (c=<c>): <x>x (paper: <y>x)`, each the
baseline's cost over the capsules' (throughput: capsules' over the baseline's), so above 1 means
the capsules win.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.client
import itertools
import json
import os
import pathlib
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.browser_baselines import UnixSocketRelay
from cua_jax.envs.capsules import CAPSULE_SITE_DOMAIN, SharedBrowserBackend, read_pss
from cua_jax.envs.capsules.backends import release_quietly
from cua_jax.envs.capsules.procfs import process_tree
from cua_jax.envs.webapp import judges
from cua_jax.envs.webapp.branches import (
    LAYERS_SUFFIX,
    allocated_bytes,
    branch,
    branch_method,
    detach_mounts,
    files_clone,
    overlay_mounts,
    own_bytes,
    remove_branch,
)
from cua_jax.envs.webapp.page import DEFAULT_VIEWPORT, WebappPage
from cua_jax.envs.webapp.runtime import DATABASE, WebappRuntime
from cua_jax.envs.webapp.server import AppServer
from cua_jax.envs.webapp.tasks import WebappTask, parse_task
from cua_jax.types import EpisodeStatus

SYSTEMS = ("capsules", "processes", "containers")
ROUTE_HEADER = "X-Cua-Route"
READY_PATH = "/.well-known/ready"  # app_server.py's readiness probe
COMMENT = "Reproduced on the benchmark build"
PAPER = {"create": "15.17", "fork": "17.84", "throughput": "6.20", "memory": "9.2", "storage": "504"}  # x, as printed
MAX_CONCURRENCY = 16
MAX_PROCESSES = 2 * MAX_CONCURRENCY  # never more application processes at once (c parents and their forks)
CALL_TIMEOUT_S = 1800.0


# ---- the task and its scripted episode ------------------------------------------------------


def first_ticket(base: pathlib.Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{base / DATABASE}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT min(id) FROM ticket").fetchone()
    if row[0] is None:
        raise SystemExit(f"{base} has no ticket: the benchmark's episodes comment on one")
    return int(row[0])


def comment_task(ticket: int) -> WebappTask:
    return parse_task(
        {
            "task_id": "benchmark-comment",
            "intent": f"Add the comment '{COMMENT}' to ticket #{ticket}.",
            "start_url": f"/ticket/{ticket}",
            "eval": {
                "eval_types": ["db_query"],
                "db_query": {
                    "sql": f"SELECT count(*) > 0 FROM ticket_change WHERE ticket = {ticket} AND field = 'comment' "
                    f"AND newvalue = '{COMMENT}'",
                    "expected": [[1]],
                },
            },
        },
        "<benchmark>",
    )


def comment_count(database: pathlib.Path, ticket: int) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        sql = "SELECT count(*) FROM ticket_change WHERE ticket = ? AND field = 'comment' AND newvalue = ?"
        return int(db.execute(sql, (ticket, COMMENT)).fetchone()[0])


def comment_field(obs) -> int:
    for e in obs.dom:
        if e.tag == "TEXTAREA" and e.id == "comment":
            return e.ref
    texts = " | ".join(e.text for e in obs.dom if e.text)[:300]
    raise RuntimeError(f"no comment field on {obs.url} ({obs.title!r}): {texts}")


def submit_button(obs) -> int:
    return next(e.ref for e in obs.dom if e.tag == "INPUT_submit" and e.value == "Submit changes")


def type_comment(system, env: str, obs):
    """The first half of an episode (what a fork carries over): the comment typed."""
    return system.step(env, A.FillElement(comment_field(obs), COMMENT))


def run_episode(system, env: str) -> float:
    """reset, fill the comment, submit, done; returns the reset's seconds."""
    started = time.perf_counter()
    obs = system.reset(env)
    seconds = time.perf_counter() - started
    obs = type_comment(system, env, obs)
    obs = system.step(env, A.ClickElement(submit_button(obs)))
    system.step(env, A.Done())
    return seconds


def serve_first_page(port: int, site: str, token: str, path: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": site, ROUTE_HEADER: token})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{path} on {site} answered {response.status}")


@dataclasses.dataclass
class Served:
    """An environment served over HTTP without a browser page (the create rdy and fork rdy rows)."""

    server: AppServer
    port: int
    site: str
    token: str
    state: str  # what a fork copies: the capsule's branch name, the process's copy, the container
    database: pathlib.Path
    remove: Callable[[], None]

    @classmethod
    def publish(cls, server: AppServer, port: int, branch_name: str, name: str, state: str, database, remove):
        """Branch `branch_name` of `server` published under a new route for site `<name>.test`,
        probed ready."""
        token, site = secrets.token_urlsafe(18), f"{name}.{CAPSULE_SITE_DOMAIN}"
        server.control_blocking("publish", route=token, site=site, branch=branch_name)
        served = cls(server, port, site, token, state, database, lambda: remove(token))
        serve_first_page(port, site, token, READY_PATH)
        return served


@contextlib.contextmanager
def held(served: Served):
    """The route frozen and drained while a fork reads its state; thawed after."""
    served.server.control_blocking("freeze", route=served.token)
    try:
        served.server.control_blocking("drain", route=served.token, timeout=60)
        yield
    finally:
        served.server.control_blocking("thaw", route=served.token)


# ---- the two systems, behind one blocking API -----------------------------------------------


class Capsules:
    """`WebappRuntime` with the benchmark's blocking calls (observations from steps)."""

    def __init__(self, base: pathlib.Path, workdir: pathlib.Path, task: WebappTask, branch_by: str):
        self.task = task
        self.runtime = WebappRuntime(
            base, workdir, branch_by=branch_by, action_space="both", call_timeout_s=CALL_TIMEOUT_S
        )
        self.storage_dir = self.runtime.branches_dir
        self._served = itertools.count(1)
        # The shared runtime is initialised once, as CUA-Sandbox's is before capsules are made: its
        # first page compiles Trac's templates, which every later branch's pages reuse.
        first = self.serve_new()
        serve_first_page(first.port, first.site, first.token, task.start_url)
        first.remove()

    def _serve(self, source: pathlib.Path) -> Served:
        """A branch of `source` published on the shared server and probed ready."""
        rt = self.runtime
        name = f"served-{next(self._served)}"
        branch(source, rt.branches_dir / name, rt.branch_by)

        def remove(token: str) -> None:
            rt.server.control_blocking("unroute", route=token)
            rt.server.control_blocking("retire", branch=name)
            remove_branch(rt.branches_dir / name)

        return Served.publish(rt.server, rt.server.port, name, name, name, rt.branches_dir / name / DATABASE, remove)

    def serve_new(self) -> Served:
        return self._serve(self.runtime.base)

    def fork_served(self, parent: Served) -> Served:
        with held(parent):
            return self._serve(self.runtime.branches_dir / parent.state)

    def create(self) -> str:
        return self.runtime.create(self.task)

    def reset(self, env: str):
        return self.runtime.reset(env)

    def step(self, env: str, action):
        result = self.runtime.step(env, action)
        if result.status == EpisodeStatus.QUARANTINED:
            raise RuntimeError(f"{env}: {result.status} ({result.reason or result.quarantine_reason})")
        if result.invalid_action:
            raise RuntimeError(f"{env}: invalid action {action}: {result.invalid_action}")
        return result.observation

    def fork(self, env: str) -> str:
        return self.runtime.fork(env)

    def close(self, env: str) -> None:
        self.runtime.close(env)

    def database(self, env: str) -> pathlib.Path:
        return self.runtime.database(env)

    def pids(self) -> list[int]:
        return self.runtime.pids()

    def shutdown(self) -> None:
        self.runtime.shutdown()


@dataclasses.dataclass
class _ProcessEnv:
    parent: pathlib.Path  # the process's directory: its copy of the state is parent / "env"
    server: AppServer
    page: WebappPage
    slot: Any
    token: str
    site: str


class Processes:
    """An application server per environment on its own full copy of the state (the baseline).

    The same `app_server.py`, route header and browser arrangement as the capsules' runtime; what
    differs is the unit: create, reset and fork each copy the state and start a process on it."""

    def __init__(self, base: pathlib.Path, workdir: pathlib.Path, task: WebappTask):
        self.base, self.task = base, task
        self.storage_dir = self.root = workdir / "processes"
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self._names = itertools.count(1)
        self._envs: dict[str, _ProcessEnv] = {}
        self._lock = threading.Lock()
        self.backend = SharedBrowserBackend(
            renderers=None, extra_args=(f"--host-resolver-rules=MAP *.{CAPSULE_SITE_DOMAIN} 127.0.0.1",)
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="process-baseline", daemon=True)
        self._thread.start()
        self._playwright_cm: Any = None
        self._call(self._start())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        self._playwright_cm = async_playwright()
        playwright = await self._playwright_cm.__aenter__()
        await self.backend.start(playwright, lambda runtime_id, reason: None)

    def _start_server(self, source: pathlib.Path) -> tuple[pathlib.Path, AppServer]:
        with self._lock:
            if sum(e.server.alive() for e in self._envs.values()) >= MAX_PROCESSES:
                raise RuntimeError(f"more than {MAX_PROCESSES} application processes")
        parent = self.root / f"p{next(self._names)}"
        parent.mkdir()
        branch(source, parent / "env", "copy")
        return parent, AppServer(parent).start()

    def _serve(self, source: pathlib.Path) -> Served:
        """A process on a copy of `source`, its route published and probed ready."""
        parent, server = self._start_server(source)

        def remove(token: str) -> None:
            server.stop()
            remove_branch(parent)

        env = parent / "env"
        return Served.publish(server, server.port, "env", parent.name, str(env), env / DATABASE, remove)

    def serve_new(self) -> Served:
        return self._serve(self.base)

    def fork_served(self, parent: Served) -> Served:
        with held(parent):
            return self._serve(pathlib.Path(parent.state))

    async def _new_env(self, source: pathlib.Path, url: str) -> _ProcessEnv:
        started = asyncio.ensure_future(asyncio.to_thread(self._start_server, source))
        try:
            slot = await self.backend.open_slot()
        finally:
            parent, server = await started
        token, site = secrets.token_urlsafe(18), f"{parent.name}.{CAPSULE_SITE_DOMAIN}"
        await server.control("publish", route=token, site=site, branch="env")
        await server.control("open", branch="env")
        await slot.context.set_extra_http_headers({ROUTE_HEADER: token})
        page = WebappPage(slot.page, DEFAULT_VIEWPORT)
        await page.load(f"http://{site}:{server.port}{url}")
        return _ProcessEnv(parent, server, page, slot, token, site)

    async def _retire(self, env: _ProcessEnv) -> None:
        await release_quietly(env.slot)
        await asyncio.to_thread(env.server.stop)
        await asyncio.to_thread(remove_branch, env.parent)

    async def _observe(self, env: _ProcessEnv):
        from cua_jax.envs.webapp.runtime import WebappObservation

        title, dom, image, text = await env.page.observe(False, "both")
        return WebappObservation(self.task.task_id, self.task.intent, image, dom, env.page.path(), title, text)

    async def _acreate(self, source: pathlib.Path, url: str) -> str:
        env = await self._new_env(source, url)
        env_id = env.parent.name
        self._envs[env_id] = env
        return env_id

    def create(self) -> str:
        return self._call(self._acreate(self.base, self.task.start_url))

    async def _areset(self, env_id: str):
        old = self._envs[env_id]
        await self._retire(old)  # the process and its copy go, as a container would be replaced
        env = self._envs[env_id] = await self._new_env(self.base, self.task.start_url)
        return await self._observe(env)

    def reset(self, env_id: str):
        return self._call(self._areset(env_id))

    async def _astep(self, env_id: str, action):
        env = self._envs[env_id]
        await env.page.perform(action)
        if A.is_terminal(action):
            # As the runtime judges: the page settled, its requests drained, the evaluators run.
            await env.page.settle()
            await env.server.control("drain", route=env.token, timeout=60)
            await asyncio.to_thread(
                judges.judge,
                {"task_id": self.task.task_id, "eval": dict(self.task.eval)},
                env.page.answer,
                env.page.path(),
                str(self.database(env_id)),
                str(self.base / DATABASE),
            )
            return None
        return await self._observe(env)

    def step(self, env_id: str, action):
        return self._call(self._astep(env_id, action))

    async def _afork(self, env_id: str) -> str:
        env = self._envs[env_id]
        await env.server.control("freeze", route=env.token)
        try:
            await env.server.control("drain", route=env.token, timeout=60)
            return await self._acreate(env.parent / "env", env.page.path())
        finally:
            await env.server.control("thaw", route=env.token)

    def fork(self, env_id: str) -> str:
        return self._call(self._afork(env_id))

    def close(self, env_id: str) -> None:
        self._call(self._retire(self._envs.pop(env_id)))

    def database(self, env_id: str) -> pathlib.Path:
        return self._envs[env_id].parent / "env" / DATABASE

    def pids(self) -> list[int]:
        roots = self.backend.pids() + [e.server.pid for e in self._envs.values() if e.server.alive()]
        return process_tree(roots)

    def shutdown(self) -> None:
        async def stop() -> None:
            for env in list(self._envs.values()):
                await self._retire(env)
            self._envs.clear()
            try:
                await self.backend.close()
            finally:
                if self._playwright_cm is not None:
                    await self._playwright_cm.__aexit__(None, None, None)

        try:
            self._call(stop())
        finally:
            for env in self._envs.values():
                env.server.stop()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            shutil.rmtree(self.root, ignore_errors=True)


BENCHMARK_LABEL = "cua-jax.webapp-benchmark=1"  # every container and committed image of a run
FORK_REPOSITORY = "cua-jax-benchmark/trac-fork"  # the images `docker commit` makes for forks
CONTAINER_STATE = "/srv/trac/base"  # the image's seeded state, the container's one environment


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def remove_labelled() -> None:
    """Remove every container and committed image a run of this benchmark made."""
    containers = docker("ps", "-aq", "--filter", f"label={BENCHMARK_LABEL}").split()
    if containers:
        docker("rm", "-f", *containers)
    images = docker("images", "-q", "--filter", f"label={BENCHMARK_LABEL}", FORK_REPOSITORY).split()
    if images:
        docker("rmi", "-f", *sorted(set(images)))


def image_state_digest(image: str) -> str:
    return docker("run", "--rm", "--network", "none", image, "cat", "/opt/cua/state.digest")


class ContainerServer(AppServer):
    """`app_server.py` in a `--network none` container of the trac image, serving the image's
    state: the control channel is <hostdir>/control.sock and HTTP <hostdir>/http.sock (the
    folder is bind-mounted at /run/cua). Writes land in the container's writable layer."""

    def __init__(self, hostdir: pathlib.Path, image: str, start_timeout_s: float = 60.0):
        self.hostdir, self.image, self.start_timeout_s = hostdir, image, start_timeout_s
        self.control_path, self.http_path = str(hostdir / "control.sock"), str(hostdir / "http.sock")
        self.container = ""
        self.init_pid = 0
        self.root: pathlib.Path | None = None  # the container's root filesystem, once started

    @property
    def pid(self) -> int | None:
        return self.init_pid or None

    def alive(self) -> bool:
        return self.init_pid > 0 and os.path.exists(f"/proc/{self.init_pid}")

    def exit_status(self) -> str:
        if not self.container:
            return "not started"
        return docker("inspect", "-f", "{{.State.Status}} (exit code {{.State.ExitCode}})", self.container)

    def start(self) -> ContainerServer:
        self.hostdir.mkdir(parents=True)
        self.container = docker(
            "run", "-d", "--network", "none", "--label", BENCHMARK_LABEL, "-v", f"{self.hostdir}:/run/cua", self.image
        )
        pid, merged = docker("inspect", "-f", "{{.State.Pid}} {{.GraphDriver.Data.MergedDir}}", self.container).split()
        self.init_pid, self.root = int(pid), pathlib.Path(merged)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                self.control_blocking("ping")  # answered once both sockets are bound
                return self
            except OSError as error:
                if not self.alive() or time.monotonic() > deadline:
                    logs = subprocess.run(["docker", "logs", "--tail", "20", self.container], capture_output=True)
                    self.stop()
                    raise RuntimeError(f"the container did not serve: {logs.stderr.decode()[-500:]}") from error
                time.sleep(0.05)

    def stop(self) -> None:
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True)
            self.init_pid = 0
        shutil.rmtree(self.hostdir, ignore_errors=True)

    def shim_pid(self) -> int | None:
        """The container's shim (its processes' parent, one per container)."""
        try:
            with open(f"/proc/{self.init_pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return None

    def database(self) -> pathlib.Path:
        """The container's database in its root filesystem as the host mounts it (overlay2's merged
        folder; SQLite resolves /proc/<pid>/root, a link, to the host's own root)."""
        return self.root / CONTAINER_STATE.lstrip("/") / DATABASE


@dataclasses.dataclass
class _ContainerEnv:
    name: str
    server: ContainerServer
    relay: UnixSocketRelay
    port: int
    page: WebappPage
    slot: Any
    token: str
    site: str
    committed: str = ""  # the image this environment's container runs, when made by a fork


class Containers(Processes):
    """A container of the trac image per environment (the container deployment's baseline).

    The same `app_server.py`, route header and browser arrangement as the processes' baseline
    (the browser reaches each container through a loopback TCP relay to its http.sock); create
    and reset run a new container of the image, fork `docker commit`s the running container (its
    route frozen and drained) and runs the committed image."""

    def __init__(self, base: pathlib.Path, workdir: pathlib.Path, task: WebappTask, image: str):
        self.image = image
        self.hostdirs = workdir / "containers"
        super().__init__(base, workdir, task)
        self.storage_dir = self.hostdirs

    async def _start_container(self, image: str) -> tuple[str, ContainerServer, UnixSocketRelay, int]:
        name = f"c{next(self._names)}"
        server = await asyncio.to_thread(ContainerServer(self.hostdirs / name, image).start)
        relay = UnixSocketRelay(server.http_path)
        return name, server, relay, await relay.start()

    def _serve(self, image: str, committed: str = "") -> Served:
        """A container of `image`, its route published and probed ready."""
        name, server, relay, port = self._call(self._start_container(image))

        def remove(token: str) -> None:
            self._call(relay.close())
            server.stop()
            if committed:
                subprocess.run(["docker", "rmi", "-f", committed], capture_output=True)

        return Served.publish(server, port, "base", name, server.container, server.database(), remove)

    def serve_new(self) -> Served:
        return self._serve(self.image)

    def fork_served(self, parent: Served) -> Served:
        with held(parent):
            committed = f"{FORK_REPOSITORY}:{secrets.token_hex(8)}"
            docker("commit", parent.state, committed)
            try:
                return self._serve(committed, committed)
            except BaseException:
                subprocess.run(["docker", "rmi", "-f", committed], capture_output=True)
                raise

    async def _new_container_env(self, image: str, url: str) -> _ContainerEnv:
        started = asyncio.ensure_future(self._start_container(image))
        try:
            slot = await self.backend.open_slot()
        finally:
            name, server, relay, port = await started
        token, site = secrets.token_urlsafe(18), f"{name}.{CAPSULE_SITE_DOMAIN}"
        await server.control("publish", route=token, site=site, branch="base")
        await server.control("open", branch="base")
        await slot.context.set_extra_http_headers({ROUTE_HEADER: token})
        page = WebappPage(slot.page, DEFAULT_VIEWPORT)
        await page.load(f"http://{site}:{port}{url}")
        return _ContainerEnv(name, server, relay, port, page, slot, token, site)

    async def _retire(self, env: _ContainerEnv) -> None:
        await release_quietly(env.slot)
        await env.relay.close()
        await asyncio.to_thread(env.server.stop)
        if env.committed:
            await asyncio.to_thread(subprocess.run, ["docker", "rmi", "-f", env.committed], capture_output=True)

    async def _acreate(self, source, url: str) -> str:
        env = await self._new_container_env(source, url)
        self._envs[env.name] = env
        return env.name

    def create(self) -> str:
        return self._call(self._acreate(self.image, self.task.start_url))

    async def _areset(self, env_id: str):
        old = self._envs[env_id]
        await self._retire(old)  # the container goes (docker rm -f); a new one of the image serves
        env = self._envs[env_id] = await self._new_container_env(self.image, self.task.start_url)
        return await self._observe(env)

    async def _afork(self, env_id: str) -> str:
        env = self._envs[env_id]
        await env.server.control("freeze", route=env.token)
        try:
            await env.server.control("drain", route=env.token, timeout=60)
            committed = f"{FORK_REPOSITORY}:{secrets.token_hex(8)}"
            await asyncio.to_thread(docker, "commit", env.server.container, committed)
            try:
                fork = await self._new_container_env(committed, env.page.path())
            except BaseException:
                await asyncio.to_thread(subprocess.run, ["docker", "rmi", "-f", committed], capture_output=True)
                raise
            fork.committed = committed
            self._envs[fork.name] = fork
            return fork.name
        finally:
            await env.server.control("thaw", route=env.token)

    def database(self, env_id: str) -> pathlib.Path:
        return self._envs[env_id].server.database()

    def pids(self) -> list[int]:
        shims = [e.server.shim_pid() for e in self._envs.values()]
        return process_tree(self.backend.pids() + [pid for pid in shims if pid is not None])

    def storage_bytes(self) -> int:
        """The containers' writable layers (what each adds over the image)."""
        ids = [e.server.container for e in self._envs.values()]
        return sum(int(size) for size in docker("inspect", "--size", "-f", "{{.SizeRw}}", *ids).split())

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            remove_labelled()
            shutil.rmtree(self.hostdirs, ignore_errors=True)


# ---- measurement --------------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    system: str
    filesystem: str
    branch_by: str
    create_ready: list[float]
    create_served: list[float]
    create_page: list[float]
    fork_ready: list[float]
    reset: list[float]
    fork: list[float]
    throughput: float
    memory_mib: float
    unread: int
    storage_mib: float
    storage_by: str
    episodes: int


def filesystem_type(path: pathlib.Path) -> str:
    done = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def timed_concurrently(count: int, call: Callable[[], Any]) -> tuple[list[float], list[Any]]:
    def one(_):
        started = time.perf_counter()
        result = call()
        return time.perf_counter() - started, result

    with ThreadPoolExecutor(count) as pool:
        done = list(pool.map(one, range(count)))
    return [s for s, _ in done], [r for _, r in done]


def served_and_forked(system, c: int) -> tuple[list[float], list[float], list[float]]:
    """The create rdy, create srv and fork rdy rows' seconds (see the module doc)."""

    def create() -> tuple[float, Served]:
        started = time.perf_counter()
        served = system.serve_new()
        ready = time.perf_counter() - started
        serve_first_page(served.port, served.site, served.token, system.task.start_url)
        return ready, served

    served_s, created = timed_concurrently(c, create)
    parents = [served for _, served in created]
    try:
        form_token = secrets.token_hex(12)
        for n, parent in enumerate(parents):  # state the forks must carry
            status = write_wiki_page(parent.port, parent.site, parent.token, f"Parent{n}", form_token)
            if status not in (200, 303):
                raise RuntimeError(f"writing a wiki page to {parent.site} answered {status}")
        forking = iter(enumerate(parents))

        def fork() -> tuple[int, Served]:
            n, parent = next(forking)
            return n, system.fork_served(parent)

        forked_s, forks = timed_concurrently(c, fork)
        try:
            for n, child in forks:
                if wiki_pages(child.database, f"Parent{n}") != {f"Parent{n}"}:
                    raise RuntimeError(f"the fork of {parents[n].site} lacks the page its parent held")
        finally:
            for _, child in forks:
                child.remove()
    finally:
        for parent in parents:
            parent.remove()
    return [ready for ready, _ in created], served_s, forked_s


def measure(system, name: str, branch_by: str, workdir: pathlib.Path, c: int, episodes: int):
    ticket = int(system.task.start_url.rsplit("/", 1)[1])
    ready, served, forked_ready = served_and_forked(system, c)
    created, envs = timed_concurrently(c, system.create)
    memory = read_pss(system.pids())

    resets: list[float] = []
    started = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        for seconds in pool.map(lambda env: [run_episode(system, env) for _ in range(episodes)], envs):
            resets.extend(seconds)
    throughput = c * episodes / (time.perf_counter() - started)
    missing = [env for env in envs if comment_count(system.database(env), ticket) != 1]
    if missing:
        raise RuntimeError(f"{name}: the last episode's comment is not in the state of {missing}")
    if isinstance(system, Containers):  # its environments' state is in Docker's storage, not workdir
        storage, storage_by = system.storage_bytes(), "SizeRw"
    else:  # the environments' own extents: a clone's writes, a copy's every block (FIEMAP)
        # The branches (an overlay's layers count with it), not the server's log.
        folders = [f for f in system.storage_dir.iterdir() if f.is_dir() and not f.name.endswith(LAYERS_SUFFIX)]
        storage, storage_by = sum(own_bytes(folder) for folder in folders), "own extents"

    def mid_episode(env: str) -> None:
        type_comment(system, env, system.reset(env))

    with ThreadPoolExecutor(c) as pool:
        list(pool.map(mid_episode, envs))
    forked_at = iter(envs)
    forked, forks = timed_concurrently(c, lambda: system.fork(next(forked_at)))
    for env in forks + envs:
        system.close(env)
    # The containers' state is in Docker's storage (its driver's name), the others' in workdir.
    filesystem = docker("info", "-f", "{{.Driver}}") if isinstance(system, Containers) else filesystem_type(workdir)
    return Measurement(
        name, filesystem, branch_by, ready, served, created, forked_ready, resets, forked, throughput,
        memory.pss_bytes / c / 2**20, len(memory.unreadable), storage / c / 2**20, storage_by, c * episodes,
    )  # fmt: skip


# ---- the publication ablation -----------------------------------------------------------


def write_wiki_page(port: int, site: str, route: str, page: str, form_token: str) -> int:
    """Create wiki page `page` (its text its name) through `route`; the HTTP status."""
    body = urllib.parse.urlencode(
        {"__FORM_TOKEN": form_token, "action": "edit", "version": "0", "text": page, "save": "Submit changes"}
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST", f"/wiki/{page}", body,
            {"Host": site, ROUTE_HEADER: route, "Cookie": f"trac_form_token={form_token}",
             "Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


class WikiWriter(threading.Thread):
    """Creates wiki pages W<trial>x<n> through the route `self.route[0]` (read at each send)
    until stopped; records each write's route and HTTP status."""

    def __init__(self, port: int, site: str, route: list[str], trial: int):
        super().__init__(daemon=True)
        self.port, self.site, self.route, self.trial = port, site, route, trial
        self.stop = threading.Event()
        self.writes: list[tuple[str, str, int]] = []  # (page, route, status)
        self.token = secrets.token_hex(12)

    def run(self) -> None:
        for n in itertools.count():
            if self.stop.is_set():
                return
            page = f"W{self.trial}x{n}"
            while not self.stop.is_set():
                route = self.route[0]
                status = write_wiki_page(self.port, self.site, route, page, self.token)
                self.writes.append((page, route, status))
                if status in (303, 200):
                    break
                time.sleep(0.005)  # refused while frozen or re-routed: send it again on the current route


def wiki_pages(database: pathlib.Path, prefix: str) -> set[str] | None:
    """The names of the wiki pages starting with `prefix`; None when the database is torn."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT name FROM wiki WHERE name LIKE ?", (f"{prefix}%",)).fetchall()
    except sqlite3.DatabaseError:
        return None  # torn while it was copied
    return {name for (name,) in rows}


def publication_trials(base: pathlib.Path, workdir: pathlib.Path, trials: int, method: str) -> dict[str, int]:
    parent = workdir / "publication"
    remove_branch(parent)
    server = AppServer(parent).start()
    mixed = {"transaction": 0, "direct": 0}
    try:
        trial_ids = itertools.count()
        for mode in mixed:
            for _ in range(trials):
                trial = next(trial_ids)
                old, new = f"a{trial}", f"b{trial}"
                branch(base, parent / old, method)
                site, token = f"t{trial}.{CAPSULE_SITE_DOMAIN}", secrets.token_urlsafe(18)
                server.control_blocking("publish", route=token, site=site, branch=old)
                server.control_blocking("open", branch=old)
                route = [token]
                writer = WikiWriter(server.port, site, route, trial)
                writer.start()
                while len(writer.writes) < 2:
                    time.sleep(0.002)
                if mode == "transaction":
                    server.control_blocking("freeze", route=token)
                    server.control_blocking("drain", route=token, timeout=60)
                    branch(parent / old, parent / new, method)
                    successor = secrets.token_urlsafe(18)
                    server.control_blocking("publish", route=successor, site=site, branch=new)
                    route[0] = successor
                    server.control_blocking("unroute", route=token)
                else:
                    try:
                        branch(parent / old, parent / new, method)
                    except OSError:  # copied while written: a file SQLite removed meanwhile (torn)
                        writer.stop.set()
                        writer.join()
                        mixed[mode] += 1
                        server.control_blocking("unroute", route=token)
                        server.control_blocking("retire", branch=old)
                        remove_branch(parent / old)
                        continue
                    server.control_blocking("publish", route=token, site=site, branch=new)
                settle_at = len(writer.writes) + 2
                while len(writer.writes) < settle_at:
                    time.sleep(0.002)
                writer.stop.set()
                writer.join()
                server.control_blocking("drain", route=route[0], timeout=60)
                # Writes the old route accepted (a refused one was sent again, on the route then current).
                accepted_on_old = {page for page, r, status in writer.writes if r == token and status in (200, 303)}
                in_old, in_new = (wiki_pages(parent / b / DATABASE, f"W{trial}x") for b in (old, new))
                if in_old is None or in_new is None or (in_old & accepted_on_old) != (in_new & accepted_on_old):
                    mixed[mode] += 1
                server.control_blocking("unroute", route=route[0])
                for name in (old, new):
                    server.control_blocking("retire", branch=name)
                    remove_branch(parent / name)
    finally:
        server.stop()
        remove_branch(parent)
    return mixed


# ---- the XFS image ------------------------------------------------------------------------


@contextlib.contextmanager
def xfs_workdir(parent: pathlib.Path, size_bytes: int):
    """A loop-mounted XFS filesystem with reflinks under `parent`; yields (its path, None) or
    (None, why it could not be made). Unmounted and removed on exit."""
    if shutil.which("mkfs.xfs") is None:
        yield None, "skipped: mkfs.xfs not found"
        return
    image, mount = parent / "xfs.img", parent / "xfs"
    mount.mkdir(parents=True, exist_ok=True)
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        made = subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], capture_output=True, text=True)
        if made.returncode != 0:
            yield None, f"skipped: mkfs.xfs failed: {made.stderr.strip()}"
            return
        done = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
        if done.returncode != 0:
            yield None, f"skipped: mounting the XFS image failed: {done.stderr.strip()}"
            return
        mounted = True
        yield mount, None
    finally:
        if mounted:  # the branches' overlays a failed run left mounted in it go too
            detach_mounts(mount)
        image.unlink(missing_ok=True)
        shutil.rmtree(mount, ignore_errors=True)


# ---- reporting ----------------------------------------------------------------------------


def cpu_model() -> str:
    done = subprocess.run(["lscpu"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


HEADER = (
    f"{'c':>3} {'system':<20} {'fs':<8} {'create rdy mean/p50 s':>22} {'create srv s':>12} {'create pg s':>11} "
    f"{'fork rdy s':>10} {'fork pg s':>9} {'reset s':>8} {'env/s':>6} {'MiB/env':>8} {'MiB/env st':>11}"
)


def print_row(c: int, r: Measurement) -> None:
    def pair(values: list[float]) -> str:
        return f"{statistics.mean(values):.3f}/{statistics.median(values):.3f}"

    print(
        f"{c:>3} {r.system:<20} {r.filesystem:<8} {pair(r.create_ready):>22} {statistics.mean(r.create_served):>12.3f} "
        f"{statistics.mean(r.create_page):>11.3f} {statistics.mean(r.fork_ready):>10.3f} "
        f"{statistics.mean(r.fork):>9.3f} {statistics.mean(r.reset):>8.3f} {r.throughput:>6.2f} "
        f"{r.memory_mib:>8.1f} {r.storage_mib:>11.2f}" + (f"  ({r.unread} unread)" if r.unread else ""),
        flush=True,
    )


def ratios(baseline: Measurement, capsules: Measurement) -> dict[str, float]:
    def ratio(field: str) -> float:
        return statistics.mean(getattr(baseline, field)) / statistics.mean(getattr(capsules, field))

    return {
        "create": ratio("create_ready"),
        "fork": ratio("fork_ready"),
        "create_served": ratio("create_served"),
        "create_page": ratio("create_page"),
        "fork_page": ratio("fork"),
        "reset": ratio("reset"),
        "throughput": capsules.throughput / baseline.throughput,
        "memory": baseline.memory_mib / capsules.memory_mib,
        "storage": baseline.storage_mib / max(capsules.storage_mib, 1 / 2**20),
    }


def capsules_system(base: pathlib.Path, workdir: pathlib.Path, task: WebappTask, branch_by: str):
    return f"capsules ({branch_by})", branch_by, lambda: Capsules(base, workdir, task, branch_by)


def container_image(name: str, base: pathlib.Path) -> str:
    """The tag of image `name` (built if missing), once its seeded state is the one at `base`:
    the containers serve the image's state, the other rows `base`."""
    from cua_jax.envs.images import ensure_image
    from cua_jax.envs.webapp.server import app_python
    from cua_jax.envs.webapp.state import BUILDER

    image = ensure_image(name)
    digest = subprocess.run(
        [app_python(), str(BUILDER), "digest", str(base)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if image_state_digest(image) != digest:
        raise SystemExit(
            f"{image} holds another seeded state than {base}: build --base with `trac_state.py build --scale` "
            "at the image's scale, or leave the containers out (--systems capsules,processes)"
        )
    return image


def print_ratios(c: int, short: str, values: dict[str, float]) -> None:
    for metric in ("create", "fork", "reset", "throughput", "memory", "storage"):
        paper = f" (paper: {PAPER[metric]}x)" if metric in PAPER else ""
        print(f"{metric} {short}/capsules (c={c}): {values[metric]:.2f}x{paper}")
    print(f"create, start page served {short}/capsules (c={c}): {values['create_served']:.2f}x")
    print(f"create, browser page loaded {short}/capsules (c={c}): {values['create_page']:.2f}x")
    print(f"fork, browser page loaded {short}/capsules (c={c}): {values['fork_page']:.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base",
        type=pathlib.Path,
        default=None,
        help="the seeded state (a Trac environment; default: the bench scale's, the test scale's with --quick)",
    )
    parser.add_argument("--concurrency", default="8,16", help="comma-separated concurrencies")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per environment")
    parser.add_argument("--trials", type=int, default=100, help="trials per mode of the publication ablation")
    parser.add_argument("--workdir", type=pathlib.Path, default=None, help="where branches go (default: a temp dir)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write every measurement here")
    parser.add_argument("--quick", action="store_true", help="c=2, one episode, 5 trials: a check that it runs")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument(
        "--container-image",
        default=None,
        help="the image of the containers row (default: trac_bench; trac with --quick); it holds the seeded "
        "state, which must be the one --base names (trac_state.py build --scale bench, or test)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.episodes, args.trials = "2", 1, 5
    chosen = [name for name in args.systems.split(",") if name]
    if not chosen or set(chosen) - set(SYSTEMS):
        raise SystemExit(f"--systems names {args.systems!r}; the systems are {', '.join(SYSTEMS)}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if max(concurrencies) > MAX_CONCURRENCY:
        raise SystemExit(f"concurrency above {MAX_CONCURRENCY}: the load must stay bounded")
    if args.base is None:
        from cua_jax.envs.webapp.state import ensure_base_state

        args.base = ensure_base_state("test" if args.quick else "bench")
    base = args.base.resolve()
    ticket = first_ticket(base)
    task = comment_task(ticket)
    if "containers" in chosen:
        image = container_image(args.container_image or ("trac" if args.quick else "trac_bench"), base)

    print(f"CPU: {cpu_model()}; {os.cpu_count()} CPUs", flush=True)
    print(
        f"Trac state {base} ({allocated_bytes(base) / 2**20:.1f} MiB); episodes: reset onto /ticket/{ticket}, "
        f"fill the comment, submit, done; {args.episodes} per environment",
        flush=True,
    )
    report: dict[str, Any] = {"cpu": cpu_model(), "base": str(base), "episodes": args.episodes, "rows": []}
    with contextlib.ExitStack() as stack:
        scratch = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.workdir, prefix="webapp-")))
        state_bytes = allocated_bytes(base)
        image_bytes = state_bytes * (3 * max(concurrencies) + 4) + 2**31
        xfs, why_not = stack.enter_context(xfs_workdir(scratch, image_bytes))
        workdir = xfs if xfs is not None else scratch / "work"
        workdir.mkdir(exist_ok=True)
        local_base = workdir / "base"  # the state on the same filesystem as its branches (clones need it)
        branch(base, local_base, "copy")
        fs = filesystem_type(workdir)
        print(f"workdir {workdir}: {fs}; branches by {branch_method(workdir)}", flush=True)
        report["workdir_filesystem"] = fs
        if why_not:
            print(f"capsules (overlay, reflink): {why_not}", flush=True)
        systems: list[tuple[str, str, Callable[[], Any]]] = []
        if "capsules" in chosen:
            why_no_overlay = overlay_mounts(workdir)
            if why_no_overlay is None and files_clone(workdir):
                systems.append(capsules_system(local_base, workdir, task, "overlay"))
            elif why_no_overlay is not None:
                print(f"capsules (overlay): skipped: {why_no_overlay}", flush=True)
            if files_clone(workdir) and (not args.quick or not systems):
                systems.append(capsules_system(local_base, workdir, task, "reflink"))
            if not args.quick or not systems:  # the copy-on-write ablation's other half
                systems.append(capsules_system(local_base, workdir, task, "copy"))
        if "processes" in chosen:
            systems.append(("processes", "copy", lambda: Processes(local_base, workdir, task)))
        if "containers" in chosen:
            stack.callback(remove_labelled)  # whatever a failed run left behind
            systems.append(("containers", "docker commit", lambda: Containers(local_base, workdir, task, image)))

        for c in concurrencies:
            print(f"\n{HEADER}", flush=True)
            rows: dict[str, Measurement] = {}
            for name, branch_by, make in systems:
                system = make()
                try:
                    rows[name] = measure(system, name, branch_by, workdir, c, args.episodes)
                finally:
                    system.shutdown()
                    if xfs is not None:  # give the image's freed blocks back to the disk it lives on
                        subprocess.run(["fstrim", str(xfs)], capture_output=True)
                print_row(c, rows[name])
                report["rows"].append({"concurrency": c, **dataclasses.asdict(rows[name])})
            if "capsules" in chosen:
                capsules = rows[systems[0][0]]
                for baseline in ("processes", "containers"):
                    if baseline in rows:
                        values = ratios(rows[baseline], capsules)
                        print_ratios(c, baseline, values)
                        report.setdefault("ratios", {})[f"{baseline}/capsules c={c}"] = values
            for cow_by in ("overlay", "reflink"):
                if f"capsules ({cow_by})" in rows and "capsules (copy)" in rows:
                    cow = ratios(rows["capsules (copy)"], rows[f"capsules ({cow_by})"])
                    print(
                        f"copy-on-write off/on ({cow_by}, c={c}): create {cow['create']:.2f}x, fork "
                        f"{cow['fork']:.2f}x, reset {cow['reset']:.2f}x, storage {cow['storage']:.1f}x"
                    )

        if "capsules" in chosen:  # the publication ablation is the capsules'
            mixed = publication_trials(local_base, workdir, args.trials, branch_method(workdir))
            print(
                f"\npublication during writes, {args.trials} trials each ({fs}): mixed-generation trials "
                f"with the transaction {mixed['transaction']}, with direct publication {mixed['direct']}",
                flush=True,
            )
            report["publication"] = {"trials": args.trials, **mixed}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
