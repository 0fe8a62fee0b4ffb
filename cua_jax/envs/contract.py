"""The environment contract: what the agent loop drives, whatever the environment is.

    start = await env.reset(task, seed)           -> EnvReset: instruction, first observation
    step  = await env.step(action)                -> EnvTransition: next observation, reward,
                                                     and once it ended the Outcome (verdict,
                                                     declared end, or a quarantining Fault)
    await env.end_episode()                       the loop is done with it, however it ended
    await env.close()

A group that starts from one state (`AgentConfig.group_start = "shared"`): one environment
resets, `shared_state()` captures where it stands before any action, and the group's other
environments `reset_to(task, seed, state)` from it.

Faults are attributed where they happen: a reset that the infrastructure failed raises
`EnvironmentFault` (its `Fault` names the kind: browser crashed, container exited, setup
failed, ...); a step never raises for the infrastructure, it returns a transition whose
outcome is QUARANTINED and whose `fault` says why. Anything else an adapter raises is a bug
in this library and propagates (`faults.classify_environment_error` draws that line).

That rule is applied once, here: `reset`, `reset_to`, `shared_state` and `step` are final
methods around the adapter's `_reset`, `_reset_to`, `_shared_state` and `_step`, which raise
what they meet and leave the classification to the contract.

`EnvironmentWrapper` passes the contract through to a wrapped environment (fault injection,
added latency override what they change). Adapters:
`cua_jax.environments.capsule_env.MiniWoBEnvironment` (MiniWoB++ in a capsule of a shared
browser), `cua_jax.environments.desktop_env.DesktopEnvironment` (a task of OSWorld's format on a
pooled Docker desktop) and `cua_jax.environments.code_env.CodeEnvironment` (a Python repository in a
container, acted on with its own shell and editor tools: `system_prompt`, `parse_action`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable
from typing import Any, final

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.envs.faults import Fault, Outcome, classify_environment_error, episode_outcome


@dataclasses.dataclass(frozen=True)
class EnvObservation:
    """What the agent sees at a turn: screenshots (uint8 [H, W, 3]) and the text beside them."""

    images: tuple[np.ndarray, ...]
    text: str = ""


@dataclasses.dataclass(frozen=True)
class EnvReset:
    """The start of an episode: the task's instruction and the first observation.

    screen_size: (width, height) of the screen the coordinates refer to; None: the first
    screenshot's. A text-only observation (no screenshot) must give it.
    """

    instruction: str
    observation: EnvObservation
    screen_size: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class EnvTransition:
    """One environment step.

    observation: the next observation (None once the episode ended).
    reward: the step's reward (0 until the end for sparse-reward tasks).
    outcome: set when the episode ended (verdict, declared end, or a quarantining fault).
    fault: the infrastructure fault that quarantined the episode (its kind and detail).
    info: environment-specific details (MiniWoB's raw / time-scaled reward and reason).
    """

    observation: EnvObservation | None
    reward: float = 0.0
    outcome: Outcome | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    fault: Fault | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None


class EnvironmentFault(Exception):
    """An infrastructure fault outside a step (setup, reset): the episode is quarantined."""

    def __init__(self, fault: Fault):
        super().__init__(fault.reason)
        self.fault = fault


# The contract's methods that apply the fault rule; an adapter implements them with a leading "_".
_FINAL_METHODS = ("reset", "reset_to", "shared_state", "step")


class AgentEnvironment(abc.ABC):
    """One environment the agent loop drives, one episode at a time (see the module doc).

    An adapter implements `_reset` and `_step` (and `_shared_state` / `_reset_to` when a group
    can start from one state); `reset`, `reset_to`, `shared_state` and `step` are final: they
    apply `classify_environment_error` around those. `_fault_place` names where a fault
    happened in its detail (a capsule, a task).

    The tools the policy acts with are the computer-use tool by default: the agent loop
    renders its system prompt (`prompts.system_prompt`) and reads replies with
    `actions.parse_action`. An environment with tools of its own (a shell and an editor) sets
    `system_prompt` to the prompt describing them and overrides `parse_action`.
    """

    system_prompt: str | None = None  # None: the computer-use tool's prompt, from the agent loop

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        overridden = [name for name in _FINAL_METHODS if name in vars(cls)]
        if overridden:
            raise TypeError(
                f"{cls.__name__} overrides {overridden}, which apply the fault rule: implement "
                f"{['_' + name for name in overridden]} instead"
            )

    def parse_action(self, text: str, action_space: str) -> Any:
        """The action the policy's reply `text` names, or an InvalidAction saying why there is
        none (never raises): the computer-use tool's call, pointers as `action_space` allows."""
        return A.parse_action(text, action_space)

    @final
    async def reset(self, task: Any, seed: int | None = None) -> EnvReset:
        """Start an episode of `task` (its type is the environment's: a MiniWoB task name, a
        desktop `Task`). Raises EnvironmentFault when the infrastructure fails to set it up,
        ValueError for a task the environment does not know."""
        return await self._set_up(self._reset(task, seed), task)

    @final
    async def step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        """Perform `action`; an InvalidAction is not performed, its message is the feedback.
        An infrastructure error ends the episode QUARANTINED with its fault (never raises)."""
        try:
            return await self._step(action)
        except Exception as error:
            fault = classify_environment_error(error)
            if fault is None:
                raise  # a bug in this library (stepping an ended episode too), not the environment's fault
            fault = self._placed(fault, None)
            return EnvTransition(None, 0.0, episode_outcome(fault=fault), fault=fault)

    @final
    async def shared_state(self) -> Any:
        """A handle on the state the last reset reached, before any step, from which
        `reset_to` starts other environments of the same kind. Raises EnvironmentFault when
        the infrastructure fails to capture it."""
        return await self._set_up(self._shared_state(), None)

    @final
    async def reset_to(self, task: Any, seed: int | None, state: Any) -> EnvReset:
        """Start an episode of `task` from `state` (another environment's `shared_state()`);
        the first observation equals that environment's. Raises as `reset` does."""
        return await self._set_up(self._reset_to(task, seed, state), task)

    async def _set_up(self, work: Awaitable[Any], task: Any) -> Any:
        """Awaits `work` (a reset's or a shared state's) and raises the EnvironmentFault of an
        infrastructure error it meets (`_setup_fault`); anything else propagates as it is."""
        try:
            return await work
        except Exception as error:
            fault = self._setup_fault(error, task)
            if fault is None:
                raise
            raise fault from error

    def _placed(self, fault: Fault, task: Any) -> Fault:
        place = self._fault_place(task)
        return Fault(fault.kind, f"{place}: {fault.detail}") if place else fault

    def _setup_fault(self, error: Exception, task: Any) -> EnvironmentFault | None:
        """The EnvironmentFault a failed reset raises for `error` (the infrastructure fault
        behind it), or None when `error` itself propagates: an EnvironmentFault already, a bug,
        or the caller's bad task."""
        if isinstance(error, EnvironmentFault):
            return None
        fault = classify_environment_error(error, setup=True)
        return None if fault is None else EnvironmentFault(self._placed(fault, task))

    def _fault_place(self, task: Any) -> str:
        """Where a fault this environment meets happened, for its detail ("" : nothing to add);
        `task` is the task being reset, None for a step or a shared state."""
        return ""

    @abc.abstractmethod
    async def _reset(self, task: Any, seed: int | None) -> EnvReset:
        """`reset`'s work; raises what it meets (the contract classifies it)."""

    @abc.abstractmethod
    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        """`step`'s work; raises what it meets (the contract classifies it)."""

    async def _shared_state(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot share its start state")

    async def _reset_to(self, task: Any, seed: int | None, state: Any) -> EnvReset:
        raise NotImplementedError(f"{type(self).__name__} cannot start from a shared state")

    async def judge_current(self) -> Outcome | None:
        """The outcome of judging the current, unfinished episode on the state it reached (the
        agent loop asks when its turn budget runs out and AgentConfig.judge_at_budget is set),
        or None where this environment cannot judge an unfinished episode (the default: the
        episode then ends NO_VERDICT). Ends the episode."""
        return None

    async def end_episode(self) -> None:
        """The agent loop is done with the current episode, however it ended (a verdict, a
        budget, the policy's failure, an engine fault): release what only a running episode
        holds (a desktop's container). Idempotent; the next reset starts afresh either way."""

    async def close(self) -> None:
        """Release what the environment holds."""


class TaskIsGroupStart:
    """`shared_state` / `reset_to` of an environment whose group start is its task (each of
    a group's environments runs the task's setup again): for environments keeping the running
    episode as `self.episode`, whose `task` has an `id`."""

    async def _shared_state(self) -> Any:
        if self.episode is None:
            raise RuntimeError("shared_state() before reset()")
        return self.episode.task

    async def _reset_to(self, task: Any, seed: int | None, state: Any) -> EnvReset:
        if state.id != task.id:
            raise ValueError(f"the shared state is task {state.id!r}'s start, not {task.id!r}'s")
        return await self._reset(task, seed)


class EnvironmentWrapper(AgentEnvironment):
    """An environment around another (`env`), passing every call through: subclasses override
    what they change (fault injection, added latency: `_step`, `_reset`, ...) and keep the rest
    of the contract. The wrapped environment's faults arrive classified; the rule applies again
    around the wrapper's own work."""

    def __init__(self, env: AgentEnvironment):
        self.env = env

    @property
    def system_prompt(self) -> str | None:
        return self.env.system_prompt

    def parse_action(self, text: str, action_space: str) -> Any:
        return self.env.parse_action(text, action_space)

    async def _reset(self, task: Any, seed: int | None) -> EnvReset:
        return await self.env.reset(task, seed)

    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        return await self.env.step(action)

    async def _shared_state(self) -> Any:
        return await self.env.shared_state()

    async def _reset_to(self, task: Any, seed: int | None, state: Any) -> EnvReset:
        return await self.env.reset_to(task, seed, state)

    async def judge_current(self) -> Outcome | None:
        return await self.env.judge_current()

    async def end_episode(self) -> None:
        await self.env.end_episode()

    async def close(self) -> None:
        await self.env.close()
