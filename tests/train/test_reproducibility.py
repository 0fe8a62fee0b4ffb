"""What a run computes does not depend on timing: which concurrent episode finishes first,
how long an environment takes to answer. (Pure Python: fake environments, scripted engines.)"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import SlidingWindow
from cua_jax.context.tokenizer import load_processor
from cua_jax.envs.contract import AgentEnvironment, EnvObservation, EnvReset, EnvTransition
from cua_jax.envs.faults import episode_outcome
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, Rollout, run_bounded
from cua_jax.rollout.engine import EngineHealth, FinishReason, Generation, RolloutEngine
from cua_jax.types import Episode


class _NoEnvironment:
    def __init__(self, runtime, time_limit_s=None):
        pass

    async def close(self):
        pass


class _SlowLoop:
    """run_episode answers after a random delay, so jobs finish in a random order."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.finished: list[str] = []

    async def run_episode(self, env, task, *, task_id, seed, group_id, episode_id):
        await asyncio.sleep(self.rng.random() * 0.01)
        self.finished.append(episode_id)
        return Rollout(Episode(episode_id=episode_id, task_id=task_id, group_id=group_id, instruction="", turns=[]), [])


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_demonstrations_come_out_in_job_order_whatever_order_episodes_finish(concurrency):
    """collect_demonstrations / evaluate_model_in_process keep (task, seed) order: the SFT batches and
    the held-out data do not depend on which concurrent episode finished first."""
    tasks, seeds = ("b", "a", "c"), (3, 1, 2)
    expected = [f"{t}/s{s}" for t in tasks for s in seeds]
    finish_orders = set()
    for trial in range(5):
        loop = _SlowLoop(random.Random(trial))
        jobs = [(loop, t, t, s, g) for g, (t, s) in enumerate((t, s) for t in tasks for s in seeds)]
        rollouts = asyncio.run(run_bounded(jobs, concurrency, lambda: _NoEnvironment(None)))
        assert [r.episode.episode_id for r in rollouts] == expected
        finish_orders.add(tuple(loop.finished))
    if concurrency > 1:
        assert len(finish_orders) > 1  # the test did shuffle the finishing order


class _JitteryEnvironment(AgentEnvironment):
    """Episode `index` answers after random delays and ends after 1 + index % 3 steps."""

    def __init__(self, index: int, rng: random.Random):
        self.index, self.rng, self.steps = index, rng, 0

    def _observation(self) -> EnvObservation:
        image = np.full((8, 8, 3), self.index, np.uint8)
        return EnvObservation((image,), f"page {self.index} step {self.steps}")

    async def _reset(self, task, seed) -> EnvReset:
        await asyncio.sleep(self.rng.random() * 0.005)
        self.steps = 0
        return EnvReset(f"task {self.index}", self._observation())

    async def _step(self, action) -> EnvTransition:
        await asyncio.sleep(self.rng.random() * 0.005)
        self.steps += 1
        if self.steps >= 1 + self.index % 3:
            return EnvTransition(None, 1.0, episode_outcome(verdict=1.0))
        return EnvTransition(self._observation())


class _BatchRecorder(RolloutEngine):
    """Answers every request with the same short reply; records each batch's prompts."""

    def __init__(self, reply: np.ndarray):
        self.reply = reply
        self.batches: list[tuple[bytes, ...]] = []

    def generate(self, requests, sampling):
        self.batches.append(tuple(r.prompt_ids.tobytes() for r in requests))
        return [
            Generation(self.reply.copy(), np.zeros(len(self.reply), np.float32), FinishReason.STOP, 0) for _ in requests
        ]

    def update_weights(self, params, version):
        raise NotImplementedError

    def health(self):
        return EngineHealth(True, 0)


def test_generation_batches_do_not_depend_on_environment_timing():
    """With batch_wait_s None (the trainer's batch_wait_s = 0), a batch goes out when every
    running episode waits: each engine call holds the same prompts (their order within it is
    fixed by the trainer's CanonicalOrderEngine), however long the environments take. The
    sampler's numerics depend on a batch's shape (padding to the longest prompt, rows) at the
    level of float rounding, so this is what keeps the samples a function of the seeds."""
    tokenizer, image_processor = load_processor()
    renderer = ChatRenderer(tokenizer, image_processor)
    reply = np.asarray([*tokenizer.encode("no action", add_special_tokens=False), renderer.end_of_turn_id], np.int32)
    config = AgentConfig(max_turns=4, max_new_tokens=16, max_context_tokens=4096, batch_wait_s=None)
    seen = []
    for trial in range(4):
        engine = _BatchRecorder(reply)
        loop = AgentLoop(engine, SlidingWindow(renderer, keep=2, min_removal=1), config)
        rng = random.Random(trial)
        envs = [_JitteryEnvironment(i, rng) for i in range(6)]

        async def run_all():
            return await asyncio.gather(
                *(loop.run_episode(env, "task", seed=0, episode_id=f"e{i}") for i, env in enumerate(envs))  # noqa: B023 - awaited within this iteration
            )

        rollouts = asyncio.run(run_all())
        assert [r.episode.num_turns for r in rollouts] == [1 + i % 3 for i in range(6)]
        seen.append([sorted(batch) for batch in engine.batches])
    assert [len(batch) for batch in seen[0]] == [6, 4, 2]
    assert all(batches == seen[0] for batches in seen)
