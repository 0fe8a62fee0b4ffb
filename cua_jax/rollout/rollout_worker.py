"""A rollout worker: one capsule runtime (a shared Chromium), one engine and the agent loops.

`RolloutWorker` runs groups of MiniWoB++ episodes on request and takes weight updates. It
runs in-process, or as a Ray actor (`rollout_worker_actor`), one per CPU group; the actor
builds its engine and browser inside its own process from a picklable engine factory.
`RemoteRolloutWorker` gives an actor the in-process worker's blocking methods, so a caller
(the trainer) drives either kind the same way.

    worker = RemoteRolloutWorker.start(engine_factory, RolloutWorkerConfig(...), num_cpus=1)
    groups = worker.run_groups([("click-button", 3, 0), ("focus-text", 8, 1)], n=4)
    worker.update_weights(host_params, version)

Every group of one `run_groups` call runs concurrently on one event loop, so each turn of
every running episode shares one batched engine call. A weight update may arrive while
groups run (the actor serves a few calls at once); it lands between two engine calls, and
each episode carries the oldest policy version that sampled it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.rollout.agent_loop import (
    AgentConfig,
    AgentEnvironment,
    AgentLoop,
    MiniWoBEnvironment,
    Rollout,
)
from cua_jax.rollout.engine import (
    EngineHealth,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)

# One group request: (MiniWoB task name, problem seed, group id).
GroupRequest = tuple[str, int, int]
EnvWrapper = Callable[[AgentEnvironment], AgentEnvironment]


class CanonicalOrderEngine(RolloutEngine):
    """Serves every batch to `engine` in a canonical order of its requests (by prompt ids, then
    images), and answers in the caller's order.

    Prompts reach a shared engine in the order their environments answered, which varies from
    run to run; the JAX sampler draws row r of a batch from key split r, so without a
    canonical order the same prompts would get different samples in a resumed run.
    """

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    @staticmethod
    def _key(request: GenerationRequest) -> tuple:
        images = b"".join(hashlib.sha1(np.ascontiguousarray(image).tobytes()).digest() for image in request.images)
        return (len(request.prompt_ids), request.prompt_ids.tobytes(), images)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        order = sorted(range(len(requests)), key=lambda i: self._key(requests[i]))
        served = self.engine.generate([requests[i] for i in order], sampling)
        out: list[Generation | None] = [None] * len(requests)
        for position, index in enumerate(order):
            out[index] = served[position]
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.engine.update_weights(params, version)

    def health(self) -> EngineHealth:
        return self.engine.health()

    def sampling_state(self) -> dict[str, int]:
        return engine_sampling_state(self.engine)

    def load_sampling_state(self, state: Mapping[str, int]) -> None:
        load_engine_sampling_state(self.engine, state)

    def close(self) -> None:
        self.engine.close()


def engine_sampling_state(engine: RolloutEngine) -> dict[str, int]:
    """The engine's restorable sampling state (`sampling_state()`); {} for an engine without one
    (vLLM draws from its own internal generator, which cannot be saved)."""
    method = getattr(engine, "sampling_state", None)
    return dict(method()) if method is not None else {}


def load_engine_sampling_state(engine: RolloutEngine, state: Mapping[str, int]) -> None:
    """Restores what `engine_sampling_state` returned; a non-empty state for an engine that
    has none is an error (it was saved from another kind of engine)."""
    method = getattr(engine, "load_sampling_state", None)
    if method is not None:
        method(state)
    elif state:
        raise ValueError(f"{type(engine).__name__} has no sampling state to restore, got {dict(state)}")


@dataclasses.dataclass(frozen=True)
class RolloutWorkerConfig:
    """agent / eval_agent: the agent loops of training and evaluation groups (eval_agent None:
    `agent`). segmenter / segmenter_options: `make_segmenter`'s name and keyword options (e.g.
    (("keep", 5), ("min_removal", 5))). tokenizer_dir: a tokenizer + processor directory
    (None: the shipped tiny pair). include_dom_text / screenshots / time_limit_s: the MiniWoB
    observation (DOM text, screenshots) and time limit (see MiniWoBEnvironment). runtime_seed
    seeds the capsule runtime's draws of unseeded episodes. canonical_order: serve the engine through `CanonicalOrderEngine`, so
    the samples of a batch do not depend on the order its prompts arrived in."""

    agent: AgentConfig = AgentConfig()
    eval_agent: AgentConfig | None = None
    segmenter: str = "sliding_window"
    segmenter_options: tuple[tuple[str, Any], ...] = ()
    tokenizer_dir: str | None = None
    include_dom_text: bool = True
    screenshots: bool = True
    time_limit_s: float | None = None
    runtime_seed: int = 0
    canonical_order: bool = False


class RolloutWorker:
    """Owns a CapsuleRuntime, an engine (built by `engine_factory` here) and two AgentLoops.

    env_wrapper wraps every environment the worker makes (fault injection, added latency); in
    a Ray actor it is pickled into the actor's process, so its state lives there.
    """

    def __init__(
        self,
        engine_factory: Callable[[], RolloutEngine],
        config: RolloutWorkerConfig = RolloutWorkerConfig(),
        env_wrapper: EnvWrapper | None = None,
    ):
        from cua_jax.context.render import ChatRenderer
        from cua_jax.context.segment import make_segmenter
        from cua_jax.context.tokenizer import load_processor
        from cua_jax.envs.capsules import CapsuleRuntime

        self.config = config
        tokenizer, image_processor = load_processor(config.tokenizer_dir)
        self.segmenter = make_segmenter(
            config.segmenter, ChatRenderer(tokenizer, image_processor), **dict(config.segmenter_options)
        )
        engine = engine_factory()
        self.engine = CanonicalOrderEngine(engine) if config.canonical_order else engine
        self.train_loop = AgentLoop(self.engine, self.segmenter, config.agent)
        self.eval_loop = AgentLoop(self.engine, self.segmenter, config.eval_agent or config.agent)
        # The capsules show element ids (marks, DOM text) as the agent's action space needs.
        self.runtime = CapsuleRuntime(
            include_dom_text=config.include_dom_text, action_space=config.agent.action_space, seed=config.runtime_seed
        )
        self.env_wrapper = env_wrapper
        self.envs: list[AgentEnvironment] = []
        # One batch of groups at a time: the environments are shared between calls.
        self._run_lock = threading.Lock()

    def _envs(self, n: int) -> list[AgentEnvironment]:
        while len(self.envs) < n:  # capsules are reused across groups (reset builds a new generation)
            env = MiniWoBEnvironment(self.runtime, time_limit_s=self.config.time_limit_s,
                                     screenshots=self.config.screenshots)
            self.envs.append(self.env_wrapper(env) if self.env_wrapper else env)
        return self.envs[:n]

    def _run(self, loop: AgentLoop, groups: Sequence[tuple[str, str, int | None, int]], n: int) -> list[list[Rollout]]:
        """groups: (task, task_id, seed, group_id) each; n episodes per group, all concurrent."""
        if n < 1:
            raise ValueError(f"a group needs n >= 1 episodes, got {n}")
        with self._run_lock:
            envs = self._envs(n * len(groups))

            async def run_all():
                return await asyncio.gather(*(
                    loop.run_group(envs[k * n:(k + 1) * n], task, task_id=task_id, seed=seed, group_id=group_id)
                    for k, (task, task_id, seed, group_id) in enumerate(groups)
                ))

            return list(asyncio.run(run_all()))

    def run_groups(self, requests: Sequence[GroupRequest], n: int, evaluation: bool = False) -> list[list[Rollout]]:
        """Groups of n episodes, one per (task, seed, group_id) request, all concurrently on one
        event loop, with the evaluation agent loop when `evaluation`. Returns each group's
        rollouts (in environment order), in request order."""
        for request in requests:
            if len(request) != 3:
                raise ValueError(f"a group request is (task, seed, group_id), got {request!r}")
        return self._run(self.eval_loop if evaluation else self.train_loop,
                         [(task, task, seed, group_id) for task, seed, group_id in requests], n)

    def run_group(
        self, task: str, n: int, *, seed: int | None = None, group_id: int = 0, task_id: str | None = None
    ) -> list[Rollout]:
        """n concurrent training episodes of MiniWoB `task` (one seed for the whole group)."""
        return self._run(self.train_loop, [(task, task if task_id is None else task_id, seed, group_id)], n)[0]

    def update_weights(self, params: Any, version: int) -> None:
        """Loads `params` (whatever the engine's update_weights takes) as policy `version`."""
        self.engine.update_weights(params, version)

    def health(self) -> EngineHealth:
        return self.engine.health()

    def sampling_state(self) -> dict[str, int]:
        """The engine's restorable sampling state (see `engine_sampling_state`)."""
        return engine_sampling_state(self.engine)

    def load_sampling_state(self, state: Mapping[str, int]) -> None:
        load_engine_sampling_state(self.engine, state)

    def shutdown(self) -> None:
        """Close the capsules, the browser and the engine. Idempotent."""
        async def close_all():
            await asyncio.gather(*(env.close() for env in self.envs))

        with self._run_lock:
            if self.envs:
                asyncio.run(close_all())
                self.envs = []
            if self.runtime is not None:
                self.runtime.shutdown()
                self.runtime = None
            if self.engine is not None:
                self.engine.close()
                self.engine = None


def rollout_worker_actor(num_cpus: float = 1.0, env_vars: tuple[tuple[str, str], ...] = (), max_concurrency: int = 4):
    """RolloutWorker as a Ray actor class (call `.remote(engine_factory, config, env_wrapper)`).

    max_concurrency > 1 lets health checks, sampling-state reads and weight updates run while
    a batch of groups does (run_groups calls themselves take turns)."""
    import ray

    return ray.remote(RolloutWorker).options(
        num_cpus=num_cpus,
        max_concurrency=max_concurrency,
        runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
    )


class RemoteRolloutWorker:
    """A RolloutWorker in a Ray actor, driven through the in-process worker's blocking methods."""

    def __init__(self, actor: Any):
        self.actor = actor

    @classmethod
    def start(
        cls,
        engine_factory: Callable[[], RolloutEngine],
        config: RolloutWorkerConfig,
        env_wrapper: EnvWrapper | None = None,
        *,
        num_cpus: float = 1.0,
        env_vars: tuple[tuple[str, str], ...] = (),
    ) -> RemoteRolloutWorker:
        """Starts one actor and waits until it has built its engine and browser."""
        return start_remote_workers([(engine_factory, config)], env_wrapper, num_cpus=num_cpus, env_vars=env_vars)[0]

    def run_groups(self, requests: Sequence[GroupRequest], n: int, evaluation: bool = False) -> list[list[Rollout]]:
        import ray

        return ray.get(self.actor.run_groups.remote(list(requests), n, evaluation))

    def run_group(self, task: str, n: int, *, seed: int | None = None, group_id: int = 0,
                  task_id: str | None = None) -> list[Rollout]:
        import ray

        return ray.get(self.actor.run_group.remote(task, n, seed=seed, group_id=group_id, task_id=task_id))

    def update_weights(self, params: Any, version: int) -> None:
        """params may be a Ray object reference (put once, shared by every actor)."""
        import ray

        ray.get(self.actor.update_weights.remote(params, version))

    def health(self) -> EngineHealth:
        import ray

        return ray.get(self.actor.health.remote())

    def sampling_state(self) -> dict[str, int]:
        import ray

        return ray.get(self.actor.sampling_state.remote())

    def load_sampling_state(self, state: Mapping[str, int]) -> None:
        import ray

        ray.get(self.actor.load_sampling_state.remote(dict(state)))

    def shutdown(self) -> None:
        """Closes the worker's browser and engine, then ends the actor. Idempotent."""
        import ray

        if self.actor is None:
            return
        actor, self.actor = self.actor, None
        try:
            ray.get(actor.shutdown.remote())
        finally:
            ray.kill(actor, no_restart=True)


def broadcast_weights(workers: Sequence[RemoteRolloutWorker], params: Any, version: int) -> None:
    """Loads `params` (host arrays) as `version` on every actor: one object-store copy shared
    by all of them, loaded concurrently."""
    import ray

    ref = ray.put(params)
    ray.get([worker.actor.update_weights.remote(ref, version) for worker in workers])


def start_remote_workers(
    specs: Sequence[tuple[Callable[[], RolloutEngine], RolloutWorkerConfig]],
    env_wrapper: EnvWrapper | None = None,
    *,
    num_cpus: float = 1.0,
    env_vars: tuple[tuple[str, str], ...] = (),
) -> list[RemoteRolloutWorker]:
    """One actor per (engine factory, config), started together; returns once every actor has
    built its engine and browser. A start-up error is raised here, after ending every actor."""
    import ray

    actor_class = rollout_worker_actor(num_cpus, env_vars)
    actors = [actor_class.remote(factory, config, env_wrapper) for factory, config in specs]
    try:
        ray.get([actor.health.remote() for actor in actors])
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise
    return [RemoteRolloutWorker(actor) for actor in actors]


def ensure_local_ray(num_cpus: float, object_store_mb: int) -> bool:
    """Starts a local Ray with `num_cpus` logical CPUs (rounded up) and a small object store,
    unless Ray is already initialised. Returns whether this call started it (and so owns its
    shutdown). An already running Ray must have `num_cpus` CPUs to give, or actors would wait
    for them forever."""
    import ray

    needed = math.ceil(num_cpus)
    if ray.is_initialized():
        # Free CPUs, not the total: actors of another run would make ours wait forever.
        available = ray.available_resources().get("CPU", 0.0)
        if available < num_cpus:
            raise RuntimeError(f"the running Ray has {available} CPUs free; this run's actors need {num_cpus}")
        return False
    ray.init(num_cpus=max(needed, 1), object_store_memory=int(object_store_mb) * 2**20, include_dashboard=False)
    return True
