"""The shared interaction probe (ScaleCUA §3.2): many agent workers, few environments.

Workers never hold a container handle: they open a `ProbeSession`, read screenshots and
accessibility text, dispatch actions and judge runs through it, and close it. Sessions
are granted in arrival order (FIFO): one dispatcher thread takes ready environments
from the pool and hands each to the longest-waiting worker, so no worker starves however
many share the pool. The dispatcher does O(1) work per hand-off, which is what lets
100+ workers share 100+ environments.

    probe = InteractionProbe(pool)
    with probe.session() as session:           # waits its turn
        session.setup(task)
        png, tree = session.observe()
        session.act(action_text)
        reward = session.judge(task)           # the judge runs inside the environment
    probe.close()
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import pathlib
import tempfile
import threading
import time
from collections.abc import Iterator

from cua_jax.envs import actions as A
from cua_jax.envs.client import StepResult
from cua_jax.envs.docker_pool import DockerEnvPool, PooledEnv, PoolError
from cua_jax.tasks import judges
from cua_jax.tasks.schema import Task


class ProbeError(RuntimeError):
    """No environment could be granted (the probe is closed, or the wait timed out)."""


@dataclasses.dataclass
class _Ticket:
    arrived: float
    granted: threading.Event = dataclasses.field(default_factory=threading.Event)
    env: PooledEnv | None = None
    error: str | None = None
    cancelled: bool = False


class ProbeSession:
    """A worker's turn on one environment: observe, act, set up and judge tasks."""

    def __init__(self, env: PooledEnv, cache_dir: pathlib.Path):
        self._env = env
        self.cache_dir = cache_dir
        self.name = env.name

    def observe(self) -> tuple[bytes, str]:
        """The screenshot (PNG bytes) and the accessibility text of the screen."""
        return self._env.client.screenshot(), self._env.client.accessibility_tree()

    def act(self, text: str) -> StepResult:
        """Parse a policy's action text and perform it; an invalid one comes back not ok."""
        action = A.parse_action(text)
        if isinstance(action, A.InvalidAction):
            return StepResult(False, None, {}, error=f"invalid action: {action.message}")
        if A.is_terminal(action):  # ends the attempt; nothing to perform in the environment
            return StepResult(True, action, {})
        return self._env.client.step(action, screenshot=False)

    def setup(self, task: Task, actions: list[str] = ()) -> None:
        """Run the task's setup steps, then replay `actions` (a trajectory prefix).
        Raises judges.SetupError naming the failing step."""
        judges.set_up_task(task, self._env.client, list(actions))

    def judge(self, task: Task) -> float:
        """The task's verdict on the current state; the Python judge runs inside the environment."""
        return judges.evaluate(task, self._env.client, self.cache_dir / task.id, judge=self._env.judge)

    def run_python(self, code: str, timeout: float = 30.0) -> dict:
        return self._env.client.run_python(code, timeout=timeout)


class InteractionProbe:
    """FIFO-fair access of many workers to a pool of environments.

    Args:
        pool: a started DockerEnvPool.
        reset: reset each environment when its session ends (fresh state for the next).
    """

    def __init__(self, pool: DockerEnvPool, reset: bool = True, cache_dir: str | None = None):
        self.pool, self.reset = pool, reset
        self.cache_dir = pathlib.Path(cache_dir or tempfile.mkdtemp(prefix="verigen-probe-"))
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Ticket] = collections.deque()
        self._closed = False
        self.waits: list[float] = []  # seconds each granted session waited, in grant order
        self.grants: list[float] = []  # arrival time of each granted session, in grant order
        self._dispatcher = threading.Thread(target=self._dispatch, daemon=True, name="verigen-probe-dispatch")
        self._dispatcher.start()

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                env = self.pool.acquire(timeout=5.0)
            except PoolError:
                continue  # none free yet (or the pool closed): look again
            with self._cond:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                if not self._waiting or self._closed:
                    self.pool.release(env, reset=False)
                    continue
                ticket = self._waiting.popleft()
                ticket.env = env
                self.grants.append(ticket.arrived)
                self.waits.append(time.monotonic() - ticket.arrived)
                ticket.granted.set()

    @contextlib.contextmanager
    def session(self, timeout: float | None = 900.0) -> Iterator[ProbeSession]:
        """Wait for this worker's turn, yield a session, give the environment back."""
        ticket = _Ticket(time.monotonic())
        with self._cond:
            if self._closed:
                raise ProbeError("the probe is closed")
            self._waiting.append(ticket)
            self._cond.notify_all()
        if not ticket.granted.wait(timeout):
            with self._cond:
                ticket.cancelled = True
                if ticket.env is None:
                    raise ProbeError(f"no environment was granted within {timeout}s")
        try:
            yield ProbeSession(ticket.env, self.cache_dir)
        finally:
            self.pool.release(ticket.env, reset=self.reset)

    def observe_fresh(self) -> str:
        """The accessibility text of a freshly reset environment's screen."""
        with self.session() as session:
            return session.observe()[1]

    def queue_length(self) -> int:
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._dispatcher.join(timeout=10.0)

    def __enter__(self) -> InteractionProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
