"""MiniWoB++ tasks in capsules of a shared browser (`cua_jax.envs.capsules.CapsuleRuntime`),
behind the environment contract (`cua_jax.envs.contract`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import RuntimeShutDownError
from cua_jax.envs.contract import AgentEnvironment, EnvObservation, EnvReset, EnvTransition
from cua_jax.envs.faults import Fault, FaultKind, classify_environment_error, episode_outcome
from cua_jax.envs.miniwob import check_task
from cua_jax.envs.prompts import INVALID_ACTION_PREFIX, observation_text
from cua_jax.types import EpisodeStatus

# Re-arms MiniWoB's episode timer with a new limit, counting the time already spent.
_SET_TIME_LIMIT_JS = """(limit) => {
  core.EPISODE_MAX_TIME = limit;
  if (WOB_DONE_GLOBAL || core.EP_TIMER === null) return;
  clearTimeout(core.EP_TIMER);
  var elapsed = new Date().getTime() - core.ept0;
  core.EP_TIMER = setTimeout(function () { core.endEpisode(-1, false, 'timed out'); },
                             Math.max(0, limit - elapsed));
}"""


class CapsuleEnvironment(AgentEnvironment):
    """What an environment over a capsule runtime (one that owns its event loop:
    `capsules.loop.LoopOwner`) shares: `runtime`, `screenshots`, the capsule it holds (`env_id`),
    awaiting the runtime's coroutines on its loop (`_call`), the observation the agent sees, and
    closing the capsule."""

    def __init__(self, runtime: Any, *, screenshots: bool = True):
        self.runtime = runtime
        self.screenshots = screenshots
        self.env_id: str | None = None

    async def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await a coroutine of the runtime on the runtime's own event loop (Playwright lives there)."""
        runtime_loop = self.runtime.loop
        if not runtime_loop.is_running():  # shut down: nothing would ever run the coroutine
            coro.close()
            raise RuntimeShutDownError(self.runtime.shut_down_message)
        if asyncio.get_running_loop() is runtime_loop:
            return await asyncio.wait_for(coro, self.runtime.call_timeout_s)
        future = asyncio.run_coroutine_threadsafe(coro, runtime_loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.runtime.call_timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _observation(self, observation: Any, feedback: str = "") -> EnvObservation:
        images = (observation.screenshot,) if self.screenshots else ()
        return EnvObservation(images, observation_text(feedback=feedback, dom_text=observation.dom_text))

    async def close(self) -> None:
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            try:
                await self._call(self.runtime.aclose(env_id))
            except Exception as error:
                if classify_environment_error(error) is None:
                    raise  # a bug in this library
                # the runtime may be gone already (shut down, crashed): nothing left to close


class MiniWoBEnvironment(CapsuleEnvironment):
    """A MiniWoB++ task in one capsule of a `CapsuleRuntime` (cua_jax.envs.capsules).

    task: a MiniWoB task name; seed: MiniWoB's problem seed (None: the runtime draws one).
    The instruction is MiniWoB's utterance; each observation is the 160 x 210 task region
    and, when the runtime was made with include_dom_text=True, the DOM as text.
    time_limit_s replaces MiniWoB's per-task time limit (10 s by default), which a policy
    sampled on a small CPU cannot meet; the time-scaled reward follows the new limit.
    A quarantined capsule (browser crash, page failure) ends the episode QUARANTINED with
    the runtime's fault; the next reset builds a fresh capsule generation. Exceptions from the
    runtime go through the contract's fault rule: infrastructure faults quarantine (a reset
    raises EnvironmentFault, a step ends QUARANTINED), anything else is a bug and raises.
    screenshots=False: text-only observations (the DOM text, for a text-only policy); the
    reset still reports the task region's size, which coordinates refer to.
    """

    def __init__(self, runtime: Any, *, time_limit_s: float | None = None, screenshots: bool = True):
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
        if not screenshots and not getattr(runtime, "include_dom_text", True):
            raise ValueError("text-only MiniWoB observations need a runtime made with include_dom_text=True")
        super().__init__(runtime, screenshots=screenshots)
        self.time_limit_s = time_limit_s

    async def _start(self, task: str, build, rebuild) -> EnvReset:
        """Publishes a capsule of `task` (`build()`: a new one, when this environment has none;
        `rebuild(env_id)`: a new generation of its own), arms the time limit, and observes."""
        check_task(task)  # an unknown task is the caller's error, not an infrastructure fault
        observation = None
        if self.env_id is None:
            self.env_id = await self._call(build())
        else:
            observation = await self._call(rebuild(self.env_id))
        if self.time_limit_s is not None:
            await self._call(self.runtime.aevaluate(self.env_id, _SET_TIME_LIMIT_JS, self.time_limit_s * 1000))
        if observation is None:
            observation = await self._call(self.runtime.aobserve(self.env_id))
        height, width = observation.screenshot.shape[:2]
        return EnvReset(observation.utterance, self._observation(observation), screen_size=(width, height))

    def _fault_place(self, task: Any) -> str:
        return f"MiniWoB {task}" if task is not None else f"capsule {self.env_id}"

    async def _reset(self, task: str, seed: int | None) -> EnvReset:
        return await self._start(
            task, lambda: self.runtime.acreate(task, seed), lambda env_id: self.runtime.areset(env_id, seed, task)
        )

    async def _shared_state(self) -> Any:
        """The capsule's snapshot (task, seed, no actions yet, its clock): what a fork rebuilds."""
        if self.env_id is None:
            raise RuntimeError("shared_state() before reset()")
        return await self._call(self.runtime.asnapshot(self.env_id))

    async def _reset_to(self, task: str, seed: int | None, state: Any) -> EnvReset:
        """A fork of another capsule's snapshot `state` (a new capsule, or a restore of this one)."""
        if state.task != task:
            raise ValueError(f"the shared state is a {state.task!r} capsule, not {task!r}")
        return await self._start(
            task, lambda: self.runtime.afork(state), lambda env_id: self.runtime.arestore(env_id, state)
        )

    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        if self.env_id is None:
            raise RuntimeError("step() before reset()")
        result = await self._call(self.runtime.astep(self.env_id, action))
        if result.status is EpisodeStatus.QUARANTINED:
            fault = result.fault or Fault(
                FaultKind.SERVER_ERROR, result.quarantine_reason or f"capsule {self.env_id} quarantined"
            )
            return EnvTransition(None, 0.0, episode_outcome(fault=fault), fault=fault)
        info = {"raw_reward": result.reward, "env_reward": result.env_reward}
        if result.reason is not None:
            info["miniwob_reason"] = result.reason
        if result.done:
            # MiniWoB's raw reward is in [-1, 1]; success is raw > 0 (its own criterion).
            verdict = min(1.0, max(0.0, float(result.reward)))
            return EnvTransition(None, verdict, episode_outcome(verdict=verdict), info)
        feedback = INVALID_ACTION_PREFIX + result.invalid_action if result.invalid_action else ""
        return EnvTransition(self._observation(result.observation, feedback), 0.0, None, info)
