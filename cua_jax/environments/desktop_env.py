"""Desktop tasks (OSWorld's format) on pooled Docker environments: `DesktopEpisode` (one
blocking episode: setup, steps, verdict, status) and `DesktopEnvironment`, its adapter to the
environment contract (`cua_jax.envs.contract`).

    episode = DesktopEpisode(pool, task, max_turns=15, cache_dir=...)
    observation = episode.start()             # acquires an environment, runs the setup
    while not episode.done:
        observation = episode.step(policy_text(observation))   # text the policy emitted
    outcome = episode.finish()                # judge, attribute, release: faults.Outcome

Nothing here raises because of the environment or the agent: infrastructure faults end
the episode as QUARANTINED with their reason (cua_jax.envs.faults), invalid action text
becomes feedback on the next observation, and a spent turn budget ends it NO_VERDICT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pathlib
import tempfile
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvError, EnvServerError, decode_png
from cua_jax.envs.container_judge import JudgeTamperedError
from cua_jax.envs.contract import (
    AgentEnvironment,
    EnvironmentFault,
    EnvObservation,
    EnvReset,
    EnvTransition,
    TaskIsGroupStart,
)
from cua_jax.envs.docker_pool import DockerEnvPool, PooledEnv, PoolError
from cua_jax.envs.faults import Attribution, Fault, FaultKind, Outcome, episode_outcome
from cua_jax.envs.prompts import observation_text
from cua_jax.tasks import judges
from cua_jax.tasks.schema import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Observation:
    """What the agent sees after a step: the screen, and feedback text (errors, results)."""

    screenshot_png: bytes | None
    feedback: str = ""


@dataclasses.dataclass
class StepRecord:
    text: str
    action: A.Action | A.InvalidAction
    feedback: str


class DesktopEpisode:
    def __init__(
        self,
        pool: DockerEnvPool,
        task: Task,
        max_turns: int = 15,
        cache_dir: str | pathlib.Path | None = None,
        acquire_timeout: float | None = 600.0,
        attribution: Attribution = Attribution(),
    ):
        self.pool, self.task, self.max_turns = pool, task, max_turns
        self.cache_dir = pathlib.Path(cache_dir or tempfile.mkdtemp(prefix=f"cua-judge-{task.id}-"))
        self.acquire_timeout = acquire_timeout
        self.attribution = attribution
        self.env: PooledEnv | None = None
        self.history: list[StepRecord] = []
        self.fault: Fault | None = None
        self.done = False
        self.outcome: Outcome | None = None
        self.malformed_results: tuple[str, ...] = ()  # the judge's notes of the agent's malformed files

    # ---- faults ---------------------------------------------------------------------
    def _fault_from(self, error: Exception, kind_if_alive: FaultKind) -> Fault:
        """The infrastructure fault behind an error: the container's own state when it
        shows one (exited, OOM-killed), else `kind_if_alive` with the error text."""
        if self.env is not None:
            diagnosed = self.pool.diagnose(self.env)
            if diagnosed is not None:
                return diagnosed
        if isinstance(error, EnvServerError) and kind_if_alive is FaultKind.SERVER_UNRESPONSIVE:
            kind_if_alive = FaultKind.SERVER_ERROR
        return Fault(kind_if_alive, str(error))

    def _quarantine(self, fault: Fault) -> None:
        self.fault = fault
        self.done = True
        log.warning("episode of %s quarantined: %s", self.task.id, fault.reason)

    # ---- the episode ----------------------------------------------------------------
    def start(self) -> Observation:
        """Acquire an environment and prepare the task; the first observation."""
        try:
            self.env = self.pool.acquire(timeout=self.acquire_timeout)
        except PoolError as error:
            self._quarantine(Fault(FaultKind.SETUP_FAILED, f"no environment: {error}"))
            return Observation(None, "")
        try:
            judges.set_up_task(self.task, self.env.client)
            return Observation(self.env.client.screenshot())
        except judges.SetupError as error:
            self._quarantine(self._fault_from(error, FaultKind.SETUP_FAILED))
        except EnvError as error:
            self._quarantine(self._fault_from(error, FaultKind.SERVER_UNRESPONSIVE))
        return Observation(None, "")

    def step(self, text: str) -> Observation:
        """Parse the policy's text, perform the action, return the next observation."""
        return self.perform(text, A.parse_action(text, "coordinates"))  # a desktop lists no element ids

    def perform(self, text: str, action: A.Action | A.InvalidAction) -> Observation:
        """Perform `action` (parsed from the policy's `text`); the next observation. An
        InvalidAction is not performed: its message is the next observation's feedback."""
        if self.done:
            raise RuntimeError("the episode is over")
        if isinstance(action, A.InvalidAction):
            return self._record(text, action, f"Invalid action: {action.message}", None)
        try:
            result = self.env.client.step(action, screenshot=not A.is_terminal(action))
        except EnvError as error:
            self._quarantine(self._fault_from(error, FaultKind.SERVER_UNRESPONSIVE))
            self.history.append(StepRecord(text, action, ""))
            return Observation(None, "")
        if not result.ok:
            return self._record(text, action, f"Action failed: {result.error}", None)
        if A.is_terminal(action):
            self.history.append(StepRecord(text, action, ""))
            self.done = True
            return Observation(None, "")
        feedback = f"Result: {result.result}" if result.result else ""
        return self._record(text, action, feedback, result.screenshot_png)

    def _record(self, text, action, feedback: str, png: bytes | None) -> Observation:
        self.history.append(StepRecord(text, action, feedback))
        if len(self.history) >= self.max_turns:
            self.done = True
        if png is None and not self.done:
            try:
                png = self.env.client.screenshot()
            except EnvError as error:
                self._quarantine(self._fault_from(error, FaultKind.SERVER_UNRESPONSIVE))
        return Observation(png, feedback)

    def finish(self, judge_unfinished: bool = False) -> Outcome:
        """Judge the episode (unless a fault ended it), decide its status, release the env.
        An episode the agent did not end is judged only with `judge_unfinished` (on the state
        it reached, as OSWorld judges at its step limit); else it ends NO_VERDICT."""
        if self.outcome is not None:
            return self.outcome
        verdict = None
        last = self.history[-1].action if self.history else None
        finished = last is not None and A.is_terminal(last)
        if self.fault is None and (finished or judge_unfinished):
            try:
                judged = judges.verdict(
                    self.task, self.env.client, self.cache_dir, last_action=last, judge=self.env.judge
                )
                verdict, self.malformed_results = judged.reward, judged.malformed_results
            except judges.SetupError as error:
                self.fault = self._fault_from(error, FaultKind.SETUP_FAILED)
            except JudgeTamperedError as error:
                self.fault = self._fault_from(error, FaultKind.JUDGE_TAMPERED)
            except judges.JudgeError as error:
                log.error("judging an episode of %s failed", self.task.id, exc_info=True)
                self.fault = self._fault_from(error, FaultKind.JUDGE_FAILED)
            except EnvError as error:
                self.fault = self._fault_from(error, FaultKind.SERVER_UNRESPONSIVE)
        self.outcome = episode_outcome(
            fault=self.fault,
            verdict=verdict,
            budget_exhausted=self.fault is None and verdict is None and not finished,
            rule=self.attribution,
        )
        if self.env is not None:
            self.pool.release(self.env)
            self.env = None
        judges.clear_cache(self.cache_dir)
        return self.outcome


def run_scripted(pool: DockerEnvPool, task: Task, texts: list[str], max_turns: int = 30) -> DesktopEpisode:
    """Play a fixed list of policy replies as one episode (used for solutions and tests)."""
    episode = DesktopEpisode(pool, task, max_turns=max_turns)
    episode.start()
    for text in texts:
        if episode.done:
            break
        episode.step(text)
    episode.finish()
    return episode


class DesktopEnvironment(TaskIsGroupStart, AgentEnvironment):
    """A desktop task (`cua_jax.tasks.schema.Task`) on a pooled container (`DesktopEpisode`).

    DesktopEpisode is blocking; its calls run in worker threads. The turn budget belongs to
    the agent loop, so the episode's own is set out of reach. Its outcome (judge verdict,
    quarantine with the container's fault) becomes the transition's outcome.

    A group's shared start is the task: each container runs its setup again. The alternative,
    a `docker commit` of the prepared container and containers started from it (whose launch
    steps must run again, since a commit keeps files but no running programs), measured slower
    (experiments/benchmarks/group_fork.py; its row in docs/benchmarks.md).
    """

    def __init__(self, pool: Any, *, cache_dir: str | None = None, attribution: Attribution = Attribution()):
        self.pool = pool
        self.cache_dir = cache_dir
        self.attribution = attribution
        self.episode: Any = None

    @staticmethod
    def _observation(observation: Any) -> EnvObservation:
        images = () if observation.screenshot_png is None else (decode_png(observation.screenshot_png),)
        return EnvObservation(images, observation_text(feedback=observation.feedback))

    async def _finish(self) -> EnvTransition:
        outcome = await asyncio.to_thread(self.episode.finish)
        # The last turn's info names the agent's malformed files (each scored 0); the batch's
        # metrics count such episodes as agent_fault/malformed_result.
        info = {"malformed_results": list(self.episode.malformed_results)} if self.episode.malformed_results else {}
        return EnvTransition(None, outcome.reward, outcome, info, fault=self.episode.fault)

    async def _reset(self, task: Any, seed: int | None) -> EnvReset:
        if self.episode is not None and self.episode.outcome is None:
            await asyncio.to_thread(self.episode.finish)  # release the previous episode's container
        self.episode = DesktopEpisode(
            self.pool, task, max_turns=2**31, cache_dir=self.cache_dir, attribution=self.attribution
        )
        observation = await asyncio.to_thread(self.episode.start)
        if self.episode.fault is not None:
            fault = self.episode.fault
            await asyncio.to_thread(self.episode.finish)
            raise EnvironmentFault(fault)
        return EnvReset(task.instruction, self._observation(observation))

    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        if self.episode is None:
            raise RuntimeError("step() before reset()")
        text = action.text if isinstance(action, A.InvalidAction) else A.render_action(action)
        observation = await asyncio.to_thread(self.episode.perform, text, action)
        if self.episode.done:
            return await self._finish()
        return EnvTransition(self._observation(observation))

    async def judge_current(self) -> Outcome | None:
        """Judges the running episode on the state it reached (the loop's turn budget ran
        out) and releases its container."""
        if self.episode is None or self.episode.outcome is not None:
            return None
        return await asyncio.to_thread(self.episode.finish, True)

    async def end_episode(self) -> None:
        """Releases the container of an episode the agent loop ended on its own (a budget, the
        policy's failure): its outcome is the loop's, the judge does not run."""
        if self.episode is not None and self.episode.outcome is None:
            await asyncio.to_thread(self.episode.finish)

    async def close(self) -> None:
        await self.end_episode()
