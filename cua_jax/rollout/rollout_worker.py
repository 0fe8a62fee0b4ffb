"""A rollout worker: one capsule runtime (a shared Chromium), one engine and the agent loop.

`RolloutWorker` runs groups of MiniWoB++ episodes on request and takes weight updates
between groups. Run it in-process, or as a Ray actor (`rollout_worker_actor`), one per
CPU group; the actor builds its engine and browser inside its own process.

    worker = rollout_worker_actor(num_cpus=1).remote(engine_factory, RolloutWorkerConfig(...))
    rollouts = ray.get(worker.run_group.remote("click-button", n=8, seed=3, group_id=0))
    ray.get(worker.update_weights.remote(params, version))

Calls to one worker are served one at a time (Ray's default), so a weight update lands
between groups and each group's episodes carry the version that produced them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, MiniWoBEnvironment, Rollout
from cua_jax.rollout.engine import EngineHealth, RolloutEngine


@dataclasses.dataclass(frozen=True)
class RolloutWorkerConfig:
    """agent: the agent loop's knobs. segmenter / segmenter_options: `make_segmenter`'s name
    and keyword options (e.g. (("keep", 5), ("min_removal", 5))). tokenizer_dir: a tokenizer +
    processor directory (None: the shipped tiny pair). include_dom_text / time_limit_s: the
    MiniWoB observation and time limit (see MiniWoBEnvironment). runtime_seed seeds the
    capsule runtime's draws of unseeded episodes."""

    agent: AgentConfig = AgentConfig()
    segmenter: str = "sliding_window"
    segmenter_options: tuple[tuple[str, Any], ...] = ()
    tokenizer_dir: str | None = None
    include_dom_text: bool = True
    time_limit_s: float | None = None
    runtime_seed: int = 0


class RolloutWorker:
    """Owns a CapsuleRuntime, an engine (built by `engine_factory` here) and an AgentLoop."""

    def __init__(self, engine_factory: Callable[[], RolloutEngine], config: RolloutWorkerConfig = RolloutWorkerConfig()):
        from cua_jax.context.render import ChatRenderer
        from cua_jax.context.segment import make_segmenter
        from cua_jax.context.tokenizer import load_processor
        from cua_jax.envs.capsules import CapsuleRuntime

        self.config = config
        tokenizer, image_processor = load_processor(config.tokenizer_dir)
        self.segmenter = make_segmenter(
            config.segmenter, ChatRenderer(tokenizer, image_processor), **dict(config.segmenter_options)
        )
        self.engine = engine_factory()
        self.loop = AgentLoop(self.engine, self.segmenter, config.agent)
        self.runtime = CapsuleRuntime(include_dom_text=config.include_dom_text, seed=config.runtime_seed)
        self.envs: list[MiniWoBEnvironment] = []

    def run_group(
        self, task: str, n: int, *, seed: int | None = None, group_id: int = 0, task_id: str | None = None
    ) -> list[Rollout]:
        """n concurrent episodes of MiniWoB `task` (one seed for the whole group)."""
        if n < 1:
            raise ValueError(f"a group needs n >= 1 episodes, got {n}")
        while len(self.envs) < n:  # capsules are reused across groups (reset builds a new generation)
            self.envs.append(MiniWoBEnvironment(self.runtime, time_limit_s=self.config.time_limit_s))
        return asyncio.run(self.loop.run_group(self.envs[:n], task, task_id=task_id, seed=seed, group_id=group_id))

    def update_weights(self, params: Any, version: int) -> None:
        self.engine.update_weights(params, version)

    def health(self) -> EngineHealth:
        return self.engine.health()

    def shutdown(self) -> None:
        """Close the capsules, the browser and the engine. Idempotent."""
        async def close_all():
            await asyncio.gather(*(env.close() for env in self.envs))

        if self.envs:
            asyncio.run(close_all())
            self.envs = []
        self.runtime.shutdown()
        self.engine.close()


def rollout_worker_actor(num_cpus: float = 1.0, env_vars: tuple[tuple[str, str], ...] = ()):
    """RolloutWorker as a Ray actor class (call `.remote(engine_factory, config)` on it)."""
    import ray

    return ray.remote(RolloutWorker).options(
        num_cpus=num_cpus, runtime_env={"env_vars": dict(env_vars)} if env_vars else None
    )
