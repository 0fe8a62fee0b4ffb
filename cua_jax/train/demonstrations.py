"""Demonstrations for the supervised warm start, whoever plays them (the MiniWoB oracle here,
`collect_demonstrations`; code tasks' oracle in code_demonstrations.py): their episodes, run a
few at a time (`agent_loop.run_bounded`), and the successes kept.

    collect_demonstrations(tasks, seeds, runtime=..., segmenter=...)
        the oracle (`cua_jax.rollout.oracle_engine.OracleDemonstrator`, a RolloutEngine) plays
        through the real AgentLoop on real MiniWoB capsules, so every demonstration token
        stream is exactly what an RL rollout of the same episode would be: same system prompt,
        rendering, observations, segmenter. Only successful episodes are kept; the others are
        listed with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import numpy as np

from cua_jax.context.segment import Segmenter
from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, Rollout, run_bounded
from cua_jax.rollout.oracle_engine import OracleDemonstrator
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

    @classmethod
    def joined(cls, parts: Sequence[Demonstrations]) -> Demonstrations:
        """The demonstrations of every part, in order."""
        return cls(
            [r for d in parts for r in d.rollouts],
            [x for d in parts for x in d.rejected],
            [e for d in parts for e in d.oracle_errors],
        )

    @property
    def items(self) -> list[TrainingItem]:
        return [item for rollout in self.rollouts for item in rollout.items]

    @property
    def episodes(self) -> dict[str, Episode]:
        return {rollout.episode.episode_id: rollout.episode for rollout in self.rollouts}

    @property
    def num_response_tokens(self) -> int:
        return int(sum(int(np.sum(item.loss_mask)) for item in self.items))


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


def collect_demonstrations(
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    runtime,
    segmenter: Segmenter,
    agent_config: AgentConfig = AgentConfig(max_turns=15, max_new_tokens=64, max_context_tokens=4096),
    time_limit_s: float | None = 600.0,
    concurrency: int = 4,
    reasoning: bool = True,
) -> Demonstrations:
    """The oracle's episodes on every (task, seed), through the real agent loop.

    runtime: a `CapsuleRuntime` made with include_dom_text=True and the action space of
    `agent_config` (the oracle acts in it). segmenter: the context
    strategy of the RL run (so items match RL rollouts exactly). time_limit_s replaces
    MiniWoB's per-task limit. Episodes run `concurrency` at a time; each (task, seed) is its
    own group (group_id = its index). Only SUCCESS episodes are kept.
    """

    unknown = [task for task in tasks if task not in ORACLE_TASKS]
    if unknown:
        raise ValueError(f"the oracle has no script for {unknown}; it solves {list(ORACLE_TASKS)}")
    if not seeds:
        raise ValueError("collect_demonstrations needs at least one seed")
    renderer = segmenter.renderer
    demonstrators = {
        task: OracleDemonstrator(
            renderer.tokenizer,
            renderer.end_of_turn_id,
            task,
            reasoning=reasoning,
            action_space=agent_config.action_space,
        )
        for task in tasks
    }
    loops = {task: AgentLoop(engine, segmenter, agent_config) for task, engine in demonstrators.items()}
    jobs = [
        (loops[task], task, task, int(seed), g) for g, (task, seed) in enumerate((t, s) for t in tasks for s in seeds)
    ]
    rollouts = asyncio.run(
        run_bounded(jobs, concurrency, lambda: MiniWoBEnvironment(runtime, time_limit_s=time_limit_s))
    )
    kept, rejected = keep_successes(rollouts)
    errors = [message for engine in demonstrators.values() for message in engine.errors]
    return Demonstrations(kept, rejected, errors)
