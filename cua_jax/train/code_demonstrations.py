"""Oracle demonstrations of code tasks for the warm start: each task's fix (`code_suite.
oracle_actions`: the reverse patch as one str_replace, then submit) played through the real
agent loop on a code container, so the demonstrations' token streams are the RL run's.

    demonstrations = collect_code_demonstrations(tasks, seeds, code_env=..., segmenter=..., agent_config=...)

Only episodes the task's tests judge a success are kept (`demonstrations.Demonstrations`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cua_jax.envs.code_actions import render_code_action
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, run_bounded
from cua_jax.rollout.oracle_engine import CodeOracleEngine
from cua_jax.tasks.code_suite import oracle_actions
from cua_jax.train.demonstrations import Demonstrations, keep_successes


def collect_code_demonstrations(
    tasks: Sequence[Any],
    seeds: Sequence[int],
    *,
    code_env: Any,
    segmenter,
    agent_config: AgentConfig,
    concurrency: int = 2,
):
    """The oracle's episodes of every code task (`code_tasks.CodeTask`) x seed (a code task's
    instance is its bug: seeds only number the episodes), `concurrency` at a time, each on a
    `CodeEnvironment` of `code_env` (a `CodeEnvConfig`) reused for the next; only successes
    are kept. Returns `demonstrations.Demonstrations`."""
    from cua_jax.environments.code_env import CodeEnvironment  # deferred: the Docker client

    if not seeds:
        raise ValueError("collect_code_demonstrations needs at least one seed")
    renderer = segmenter.renderer
    engines = {
        task.id: CodeOracleEngine(
            renderer.tokenizer, renderer.end_of_turn_id, task.id, [render_code_action(a) for a in oracle_actions(task)]
        )
        for task in tasks
    }
    loops = {task_id: AgentLoop(engine, segmenter, agent_config) for task_id, engine in engines.items()}
    jobs = [
        (loops[task.id], task, task.id, int(seed), g)
        for g, (task, seed) in enumerate((t, s) for t in tasks for s in seeds)
    ]
    rollouts = asyncio.run(run_bounded(jobs, concurrency, lambda: CodeEnvironment(code_env)))
    kept, rejected = keep_successes(rollouts)
    return Demonstrations(kept, rejected, [message for engine in engines.values() for message in engine.errors])
