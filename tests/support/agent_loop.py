"""Scripted engines and helpers of the agent-loop tests: `ScriptedOracleEngine` (the MiniWoB
oracle's next action read off the prompt, logprob 0), `FixedReplyEngine`, and the
`scripted_oracle_engine` factory (imported by its package path, so a Ray actor can import it)."""

from __future__ import annotations

import asyncio

import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.tokenizer import load_processor
from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.envs import actions as A
from cua_jax.envs.miniwob_oracle import oracle_action
from cua_jax.rollout.engine import EngineHealth, FinishReason, Generation, RolloutEngine
from cua_jax.rollout.oracle_engine import observation_from_prompt
from tests.support.items import assert_items_equal  # noqa: F401 - the agent-loop tests' import point

LONG_TIME_LIMIT_S = 600.0  # MiniWoB's 10 s limit is shorter than a CPU-sampled turn


class ScriptedOracleEngine(RolloutEngine):
    """A scripted policy for tests: the MiniWoB oracle's next action, read off the prompt.

    The prompt's first user message starts with the instruction (MiniWoB's utterance); its last
    user message holds the page's DOM as text (include_dom_text=True). The response is the
    rendered action plus the end-of-turn token, each token with logprob 0.
    """

    def __init__(self, tokenizer, task: str, end_of_turn_id: int):
        self.tokenizer = tokenizer
        self.task = task
        self.end_of_turn_id = end_of_turn_id
        self.version = 0
        self.calls = 0

    def generate(self, requests, sampling):
        self.calls += 1
        out = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
            observation = observation_from_prompt(text, self.task, request.images[-1])
            ids = self.tokenizer.encode(A.render_action(oracle_action(observation)), add_special_tokens=False)
            ids = np.asarray([*ids, self.end_of_turn_id], np.int32)
            out.append(Generation(ids, np.zeros(len(ids), np.float32), FinishReason.STOP, self.version))
        return out

    def update_weights(self, params, version):
        self.version = version

    def health(self):
        return EngineHealth(True, self.version)


class FixedReplyEngine(RolloutEngine):
    """A scripted policy for tests: engine call i answers every request with replies[i] (the
    last reply once they run out), logprob 0 per token."""

    def __init__(self, replies):
        self.replies = [np.asarray(reply, np.int32) for reply in replies]
        self.calls = 0

    def generate(self, requests, sampling):
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return [Generation(reply.copy(), np.zeros(len(reply), np.float32), FinishReason.STOP, 0) for _ in requests]

    def update_weights(self, params, version):
        raise NotImplementedError("a fixed-reply policy has no weights")

    def health(self):
        return EngineHealth(True, 0)


def scripted_oracle_engine(task: str) -> ScriptedOracleEngine:
    """The scripted oracle policy for `task` with the shipped tokenizer (an engine factory)."""
    tokenizer, image_processor = load_processor()
    return ScriptedOracleEngine(tokenizer, task, ChatRenderer(tokenizer, image_processor).end_of_turn_id)


def run(coro):
    return asyncio.run(coro)


async def with_envs(runtime, n, body, **env_kwargs):
    envs = [MiniWoBEnvironment(runtime, **env_kwargs) for _ in range(n)]
    try:
        return await body(envs)
    finally:
        await asyncio.gather(*(env.close() for env in envs))
