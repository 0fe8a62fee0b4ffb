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

import numpy as np

from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, run_bounded
from cua_jax.rollout.engine import (
    EngineHealth,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)
from cua_jax.train.demonstrations import Demonstrations, keep_successes


class CodeOracleEngine(RolloutEngine):
    """Replies with a code task's oracle tool calls in order (logprob 0 per token): a request
    whose prompt already holds the script's first t replies gets reply t. A reply longer than
    max_new_tokens (a policy could not write it) is cut there and noted in `errors`."""

    def __init__(self, tokenizer, end_of_turn_id: int, task_id: str, script: Sequence[str]):
        if not script:
            raise ValueError(f"{task_id}: the oracle's script is empty")
        self.tokenizer, self.end_of_turn_id = tokenizer, int(end_of_turn_id)
        self.task_id, self.script = task_id, list(script)
        self.errors: list[str] = []

    def reply_index(self, prompt_text: str) -> int:
        """How many of the script's replies the prompt already holds, in order."""
        done, position = 0, 0
        for reply in self.script:
            found = prompt_text.find(reply, position)
            if found < 0:
                break
            done, position = done + 1, found + len(reply)
        return min(done, len(self.script) - 1)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
            reply = self.script[self.reply_index(text)]
            ids = np.asarray([*self.tokenizer.encode(reply, add_special_tokens=False), self.end_of_turn_id], np.int32)
            finish = FinishReason.STOP
            if len(ids) > sampling.max_new_tokens:
                self.errors.append(
                    f"{self.task_id}: the oracle's reply has {len(ids)} tokens, more than "
                    f"max_new_tokens ({sampling.max_new_tokens})"
                )
                ids, finish = ids[: sampling.max_new_tokens], FinishReason.LENGTH
            out.append(Generation(ids, np.zeros(len(ids), np.float32), finish, 0))
        return out

    def update_weights(self, params: Any, version: int) -> None:
        raise NotImplementedError("the code oracle has no weights")

    def health(self) -> EngineHealth:
        return EngineHealth(True, 0)


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
    from cua_jax.environments.code_env import CodeEnvironment
    from cua_jax.envs.code_actions import render_code_action
    from cua_jax.tasks.code_suite import oracle_actions

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
