"""A policy model's episodes straight through an in-process JAX sampler and the agent loop, on
MiniWoB capsules: `evaluate_model_in_process(model, tasks, seeds, runtime=..., segmenter=...)`,
greedy by default, scored as the valid-action rate, the first-turn valid-action rate and the
success rate (`PolicyEvaluation`). The warm start's benchmark and the base policy's pretraining
use it on a bare model, before any trainer or rollout worker exists.

How it differs from the evaluation harness (`harness.evaluate`), so the two are not one:
it needs no rollout workers, suite or `EvalPolicy` (the model and a capsule runtime are enough);
it runs one episode per (task, seed), with group ids counting up from 0 in (task, seed) order
and the episodes' sampling drawn from one engine seeded with engine_seed; quarantined
episodes are counted apart and never run again (the harness reruns them up to max_reruns
times); nothing is written to disk or resumed; and it reports valid-action rates, which the
harness's tables (mean@k, pass@k, best@k, Wilson intervals) do not.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from flax import nnx

from cua_jax.context.segment import Segmenter
from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, run_bounded
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from cua_jax.types import Episode, EpisodeStatus


@dataclasses.dataclass
class PolicyEvaluation:
    """A policy's episodes on held-out (task, seed) pairs and their rates.

    valid_action_rate: parsed actions / turns. first_turn_valid_rate: episodes whose first
    reply parsed / episodes with a turn. success_rate: SUCCESS / non-quarantined episodes.
    """

    episodes: list[Episode]

    def _scored(self) -> list[Episode]:
        return [e for e in self.episodes if e.status is not EpisodeStatus.QUARANTINED]

    @property
    def turns(self) -> int:
        return sum(e.num_turns for e in self._scored())

    @property
    def valid_action_rate(self) -> float:
        turns = [t for e in self._scored() for t in e.turns]
        return sum(t.action is not None for t in turns) / max(len(turns), 1)

    @property
    def first_turn_valid_rate(self) -> float:
        firsts = [e.turns[0] for e in self._scored() if e.turns]
        return sum(t.action is not None for t in firsts) / max(len(firsts), 1)

    @property
    def success_rate(self) -> float:
        scored = self._scored()
        return sum(e.status is EpisodeStatus.SUCCESS for e in scored) / max(len(scored), 1)

    def summary(self) -> dict[str, float]:
        return {
            "episodes": float(len(self._scored())),
            "quarantined": float(len(self.episodes) - len(self._scored())),
            "turns": float(self.turns),
            "valid_action_rate": self.valid_action_rate,
            "first_turn_valid_rate": self.first_turn_valid_rate,
            "success_rate": self.success_rate,
        }


def evaluate_model_in_process(
    model: nnx.Module,
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    runtime,
    segmenter: Segmenter,
    agent_config: AgentConfig = AgentConfig(max_turns=4, max_new_tokens=64, max_context_tokens=4096, temperature=0.0),
    time_limit_s: float | None = 600.0,
    concurrency: int = 4,
    engine_seed: int = 0,
) -> PolicyEvaluation:
    """`model` (a Qwen3-VL policy) on every (task, seed) through `JaxSamplerEngine` and the agent
    loop; greedy unless agent_config says otherwise. Episodes of `concurrency` environments share
    each batched engine call."""

    renderer = segmenter.renderer
    engine = JaxSamplerEngine(
        model,
        seed=engine_seed,
        image_processor=renderer.image_processor,
        pad_id=int(renderer.tokenizer.pad_token_id or 0),
    )
    loop = AgentLoop(engine, segmenter, agent_config)
    jobs = [(loop, task, task, int(seed), g) for g, (task, seed) in enumerate((t, s) for t in tasks for s in seeds)]
    rollouts = asyncio.run(
        run_bounded(jobs, concurrency, lambda: MiniWoBEnvironment(runtime, time_limit_s=time_limit_s))
    )
    return PolicyEvaluation([r.episode for r in rollouts])
