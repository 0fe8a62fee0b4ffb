"""Demonstrations for the supervised warm start, whoever plays them (the MiniWoB oracle in
warm_start.py, code tasks' oracle in code_demonstrations.py): running their episodes a few at
a time and keeping the successes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cua_jax.rollout.agent_loop import Rollout
from cua_jax.types import Episode, EpisodeStatus, TrainingItem


@dataclasses.dataclass
class Demonstrations:
    """Successful oracle rollouts (episodes with their training items) and the rejected ones.

    rejected: (episode_id, status, reason) of every episode not kept; oracle_errors: the
    oracle's messages for pages it could not read.
    """

    rollouts: list[Rollout]
    rejected: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    oracle_errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def items(self) -> list[TrainingItem]:
        return [item for rollout in self.rollouts for item in rollout.items]

    @property
    def episodes(self) -> dict[str, Episode]:
        return {rollout.episode.episode_id: rollout.episode for rollout in self.rollouts}

    @property
    def num_response_tokens(self) -> int:
        return int(sum(int(np.sum(item.loss_mask)) for item in self.items))


async def run_bounded(jobs, concurrency: int, make_env: Callable[[], Any]) -> list[Rollout]:
    """Runs (loop, task, task_id, seed, group_id) jobs, at most `concurrency` at once, each
    on an environment of `make_env()` that is reused for the next job."""
    queue: asyncio.Queue = asyncio.Queue()
    for index, job in enumerate(jobs):
        queue.put_nowait((index, job))
    results: list[Rollout | None] = [None] * len(jobs)

    async def worker():
        env = make_env()
        try:
            while not queue.empty():
                index, (loop, task, task_id, seed, group_id) = queue.get_nowait()
                results[index] = await loop.run_episode(
                    env, task, task_id=task_id, seed=seed, group_id=group_id, episode_id=f"{task_id}/s{seed}"
                )
        finally:
            await env.close()

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(jobs))))))
    return [r for r in results if r is not None]


def keep_successes(rollouts: Sequence[Rollout]) -> tuple[list[Rollout], list[tuple[str, str, str]]]:
    """(the SUCCESS rollouts with items, (episode id, status, reason) of the others)."""
    kept, rejected = [], []
    for rollout in rollouts:
        episode = rollout.episode
        if episode.status is EpisodeStatus.SUCCESS and rollout.items:
            kept.append(rollout)
        else:
            reason = episode.quarantine_reason or episode.info.get("end_reason") or episode.info.get("budget") or ""
            rejected.append((episode.episode_id, episode.status.value, str(reason)))
    return kept, rejected
