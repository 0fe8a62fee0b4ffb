"""An environment checker in the spirit of gymnasium's `check_env`: does an environment keep
the contract (`cua_jax.envs.contract`) the agent loop relies on?

    await check_env(env, task)                           # one environment, one task of its kind
    check_kind("miniwob", worker_config, "click-button") # a registered kind: opened, made, checked, closed

It runs two episodes on one environment and checks what the agent loop reads: the reset's
instruction and first observation (uint8 [H, W, 3] screenshots, or text with the screen size
its coordinates refer to), an invalid action's feedback (a step that does not raise and does
not end the episode: the environment shows the parser's message), a second reset on the same
environment (environments are reused across groups), the tools' prompt and parser, and that
`end_episode` and `close` are idempotent. A broken rule raises `EnvironmentCheckError` naming
it. The checker never acts on the task (a step that did would need the kind's action format).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from cua_jax.environments.kinds import environment_kind
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvObservation, EnvReset, EnvTransition

CHECK_MESSAGE = "the checker's invalid action"  # the feedback an invalid action must show


class EnvironmentCheckError(AssertionError):
    """An environment broke a rule of the contract; the message names the rule."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise EnvironmentCheckError(message)


def _check_observation(observation: Any, where: str) -> None:
    _require(isinstance(observation, EnvObservation), f"{where}: the observation is {type(observation).__name__}")
    _require(isinstance(observation.images, tuple), f"{where}: images must be a tuple of screenshots")
    for image in observation.images:
        _require(
            isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3,
            f"{where}: a screenshot must be uint8 [H, W, 3], got "
            f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}",
        )
        _require(min(image.shape[:2]) > 0, f"{where}: an empty screenshot {image.shape}")
    _require(isinstance(observation.text, str), f"{where}: the text must be a str")
    _require(bool(observation.images) or bool(observation.text), f"{where}: neither a screenshot nor text")


def _check_reset(start: Any, where: str) -> None:
    _require(isinstance(start, EnvReset), f"{where} returned {type(start).__name__}, not EnvReset")
    _require(isinstance(start.instruction, str) and start.instruction.strip() != "", f"{where}: an empty instruction")
    _check_observation(start.observation, where)
    size = start.screen_size
    _require(
        size is None or (len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)),
        f"{where}: screen_size must be None or (width, height) in pixels, got {size!r}",
    )
    _require(
        size is not None or bool(start.observation.images),
        f"{where}: a text-only observation must give the screen_size its coordinates refer to",
    )


def _check_transition(transition: Any, where: str) -> None:
    _require(isinstance(transition, EnvTransition), f"{where} returned {type(transition).__name__}")
    _require(isinstance(transition.reward, float | int), f"{where}: the reward must be a number")
    if transition.done:
        _require(transition.observation is None, f"{where}: an ended episode has no next observation")
    else:
        _check_observation(transition.observation, where)
        _require(transition.fault is None, f"{where}: a fault without an outcome (a fault ends the episode)")


async def check_env(env: AgentEnvironment, task: Any, *, seed: int | None = 0) -> None:
    """Checks `env` on `task` (module doc); raises EnvironmentCheckError at the first broken
    rule, or what the environment raised (an EnvironmentFault: its infrastructure failed)."""
    _require(isinstance(env, AgentEnvironment), f"{type(env).__name__} is no AgentEnvironment")
    _require(env.system_prompt is None or isinstance(env.system_prompt, str), "system_prompt must be None or a str")
    parsed = env.parse_action("this reply names no action", "coordinates")
    _require(
        isinstance(parsed, A.InvalidAction),
        f"parse_action of a reply naming no action must give an InvalidAction, got {parsed!r}",
    )
    for episode in (1, 2):  # the second reset reuses the environment, as rollout workers do
        start = await env.reset(task, seed)
        _check_reset(start, f"reset (episode {episode})")
        transition = await env.step(A.InvalidAction(CHECK_MESSAGE, "this reply names no action"))
        _check_transition(transition, f"step of an invalid action (episode {episode})")
        _require(
            not transition.done,
            f"an invalid action ended episode {episode} ({transition.outcome}); it is feedback, not an end",
        )
        _require(
            CHECK_MESSAGE in transition.observation.text,
            f"the observation after an invalid action does not show its message: {transition.observation.text!r}",
        )
        await env.end_episode()
        await env.end_episode()
    await env.close()
    await env.close()


def check_kind(name: str, worker_config: Any, task: Any, *, seed: int | None = 0) -> None:
    """Opens the registered kind `name` as a rollout worker would (`worker_config`: a
    `RolloutWorkerConfig`), checks an environment it makes on `task`, and closes it."""
    kind = environment_kind(name)
    resources = kind.open(worker_config)
    try:
        capacity = kind.capacity(resources)
        _require(capacity is None or capacity >= 1, f"kind {name!r}: a capacity of {capacity} runs no episode")
        _require(isinstance(dict(kind.stats(resources)), dict), f"kind {name!r}: stats must be a mapping")
        asyncio.run(check_env(kind.make(resources, worker_config), task, seed=seed))
    finally:
        kind.close(resources)
