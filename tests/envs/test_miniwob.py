"""MiniWoB++ on real Chromium: the oracle's rewards, random actions, bad input, time limits."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob import (
    TASK_HEIGHT,
    TASK_WIDTH,
    EpisodeEndedError,
    UnknownTaskError,
    check_task,
    task_names,
)
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS, OracleUnsupportedError, oracle_action
from cua_jax.types import EpisodeStatus
from tests.support.miniwob import BASIC_TASKS

pytestmark = [pytest.mark.browser]

SEEDS_PER_TASK = 5  # 95% of 5 seeds means every seed
RANDOM_EPISODES_PER_TASK = 3
RANDOM_STEPS = 5
MAX_ORACLE_STEPS = 12


@pytest.fixture(scope="module")
def runtime():
    rt = CapsuleRuntime(include_dom_text=True, call_timeout_s=600)
    yield rt
    rt.shutdown()


async def _oracle_episode(rt: CapsuleRuntime, env: str, seed: int):
    observation = await rt.areset(env, seed=seed)
    for _ in range(MAX_ORACLE_STEPS):
        result = await rt.astep(env, A.parse_action(A.render_action(oracle_action(observation))))
        assert result.invalid_action is None, result.invalid_action
        if result.done:
            return result
        observation = result.observation
    return result


def random_action(rng: random.Random) -> A.Action:
    """A uniformly random click on the grid, or now and then random typing."""
    if rng.random() < 0.8:
        return A.Click("left_click", rng.randint(0, A.GRID), rng.randint(0, A.GRID))
    return A.Type("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5)))


def test_task_names_come_from_the_installed_package():
    names = task_names()
    assert set(BASIC_TASKS) <= set(ORACLE_TASKS) <= set(names)
    assert len(names) > 100
    assert check_task("click-button") == "click-button"


def test_unknown_task_is_refused_with_suggestions(runtime):
    with pytest.raises(UnknownTaskError, match="click-button"):
        runtime.create("click-buton")
    with pytest.raises(UnknownTaskError, match="unknown MiniWoB task"):
        runtime.create("../core/core")


def test_observation_fields(runtime):
    env = runtime.create("click-button", seed=3)
    obs = runtime.observe(env)
    assert obs.screenshot.shape == (TASK_HEIGHT, TASK_WIDTH, 3) and obs.screenshot.dtype == np.uint8
    assert obs.screen_size == (TASK_WIDTH, TASK_HEIGHT)
    assert obs.utterance.startswith("Click on the")
    assert any(e.tag == "BUTTON" for e in obs.dom)
    assert "BUTTON" in obs.dom_text
    # The same seed gives the same problem; another seed another one.
    assert runtime.reset(env, seed=3).same_as(obs)
    assert not any(runtime.reset(env, seed=s).same_as(obs) for s in (4, 5))
    runtime.close(env)


def test_oracle_earns_reward_on_at_least_95_percent_of_seeds(runtime):
    async def run_task(task: str) -> list[float]:
        env = await runtime.acreate(task, seed=0)
        rewards = []
        for seed in range(SEEDS_PER_TASK):
            result = await _oracle_episode(runtime, env, seed)
            assert result.done, f"{task} seed {seed}: the oracle did not finish"
            assert result.status in (EpisodeStatus.SUCCESS, EpisodeStatus.FAILURE)
            rewards.append(result.reward)
        await runtime.aclose(env)
        return rewards

    async def run_all() -> dict[str, list[float]]:
        # Two tasks at a time: MiniWoB's 10 s limits are wall-clock time.
        out = {}
        for i in range(0, len(BASIC_TASKS), 2):
            pair = BASIC_TASKS[i : i + 2]
            for task, rewards in zip(pair, await asyncio.gather(*(run_task(t) for t in pair))):
                out[task] = rewards
        return out

    rewards = runtime.run_async(run_all())
    rates = {task: float(np.mean([r > 0 for r in rs])) for task, rs in rewards.items()}
    print("oracle success rates:", rates)
    assert set(rates) == set(BASIC_TASKS)
    for task, rate in rates.items():
        assert rate >= 0.95, (task, rewards[task])


def test_uniformly_random_actions_rarely_earn_reward(runtime):
    async def run_task(task: str) -> list[bool]:
        rng = random.Random(task)
        env = await runtime.acreate(task, seed=0)
        outcomes = []
        for episode in range(RANDOM_EPISODES_PER_TASK):
            await runtime.areset(env, seed=1000 + episode)
            result = None
            for _ in range(RANDOM_STEPS):
                result = await runtime.astep(env, random_action(rng))
                if result.done:
                    break
            outcomes.append(result.success)
        await runtime.aclose(env)
        return outcomes

    async def run_all() -> list[bool]:
        outcomes = []
        for i in range(0, len(BASIC_TASKS), 4):
            for o in await asyncio.gather(*(run_task(t) for t in BASIC_TASKS[i : i + 4])):
                outcomes.extend(o)
        return outcomes

    outcomes = runtime.run_async(run_all())
    rate = float(np.mean(outcomes))
    print(f"random success rate: {rate:.3f} over {len(outcomes)} episodes")
    assert len(outcomes) == len(BASIC_TASKS) * RANDOM_EPISODES_PER_TASK
    assert rate <= 0.25


def test_malformed_and_unsupported_actions_are_invalid_steps(runtime):
    env = runtime.create("enter-text", seed=7)
    before = runtime.observe(env)
    for action in (
        "click the button please",
        '<tool_call>{"name": "computer_use", "arguments": {"action": "fly"}}',
        A.WriteFile("/tmp/x", "y"),
    ):
        result = runtime.step(env, action)
        assert result.invalid_action, action
        assert not result.done and result.status is None and result.reward == 0.0
        assert result.observation.same_as(before)
    runtime.close(env)


def test_action_after_the_episode_ended_is_an_error_and_reset_recovers(runtime):
    env = runtime.create("focus-text", seed=2)
    result = runtime.step(env, oracle_action(runtime.observe(env)))
    assert result.done and result.success and result.status == EpisodeStatus.SUCCESS
    assert 0 < result.env_reward <= result.reward == 1.0
    with pytest.raises(EpisodeEndedError, match="reset"):
        runtime.step(env, A.Click("left_click", 500, 500))
    obs = runtime.reset(env, seed=2)
    assert runtime.step(env, oracle_action(obs)).success
    runtime.close(env)


def test_terminal_agent_action_ends_the_episode_as_a_failure(runtime):
    env = runtime.create("click-button", seed=1)
    result = runtime.step(env, A.Done())
    assert result.done and not result.success and result.reward == -1.0
    assert result.status == EpisodeStatus.FAILURE and "agent ended" in result.reason
    runtime.close(env)


def test_miniwob_time_limit_ends_the_episode(runtime):
    env = runtime.create("click-button", seed=1)
    result = runtime.step(env, A.Wait(10.5))  # MiniWoB's default limit is 10 s
    assert result.done and result.reward == -1.0 and result.reason == "timed out"
    assert result.status == EpisodeStatus.FAILURE
    runtime.close(env)


def test_oracle_refuses_tasks_it_has_no_script_for(runtime):
    env = runtime.create("book-flight", seed=1)
    with pytest.raises(OracleUnsupportedError, match="book-flight"):
        oracle_action(runtime.observe(env))
    runtime.close(env)


def test_a_hung_page_quarantines_its_capsule_and_spares_the_others(runtime):
    hung, healthy = runtime.create("click-button", seed=1), runtime.create("click-button", seed=2)
    runtime.evaluate(hung, "setTimeout(function () { for (;;) {} }, 0)")  # the page's thread never returns
    step_timeout, runtime.step_timeout_s = runtime.step_timeout_s, 3.0
    try:
        result = runtime.step(hung, A.Click("left_click", 500, 500))
    finally:
        runtime.step_timeout_s = step_timeout
    assert result.status == EpisodeStatus.QUARANTINED and "did not answer" in result.quarantine_reason
    assert runtime.step(healthy, oracle_action(runtime.observe(healthy))).success
    runtime.close(hung)
    runtime.close(healthy)


def test_runtime_time_limit_replaces_miniwob_limits_for_every_generation():
    rt = CapsuleRuntime(time_limit_s=1.5)
    try:
        env = rt.create("click-button", seed=1)
        assert rt.evaluate(env, "core.EPISODE_MAX_TIME") == 1500
        twin = rt.fork(env)
        assert rt.evaluate(twin, "core.EPISODE_MAX_TIME") == 1500
        result = rt.step(env, A.Wait(2.0))
        assert result.done and result.reason == "timed out"
        rt.reset(env, seed=2)
        assert rt.evaluate(env, "core.EPISODE_MAX_TIME") == 1500
    finally:
        rt.shutdown()
    with pytest.raises(ValueError, match="time_limit_s"):
        CapsuleRuntime(time_limit_s=0)
