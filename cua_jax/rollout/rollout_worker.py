# Single job: a rollout worker (its environments, engine and agent loops), in-process or as a Ray actor.
"""A rollout worker: its environments (for each kind of task its catalog holds, the resources
its registry entry opens, `cua_jax.environments.kinds`: a capsule runtime over a shared
Chromium for MiniWoB++, a Docker desktop pool for desktop tasks, a code image whose
environments hold a container each), one engine and the agent loops.

`RolloutWorker` runs groups of episodes on request and takes weight updates. It
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
import concurrent.futures
import dataclasses
import hashlib
import math
import threading
import weakref
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import make_segmenter
from cua_jax.context.tokenizer import load_processor
from cua_jax.environments.kinds import EnvironmentKind, environment_kind, import_kind_modules, kind_names
from cua_jax.envs.contract import AgentEnvironment
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop, Rollout
from cua_jax.rollout.engine import (
    EngineHealth,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)

# One group request: (task id, problem seed, group id). The id is a task of the worker's
# catalog, or (without a catalog entry) a MiniWoB task name.
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

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

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
    seeds the capsule runtime's draws of unseeded episodes. canonical_order: serve the engine
    through `CanonicalOrderEngine`, so the samples of a batch do not depend on the order its
    prompts arrived in. catalog: the tasks requests name (`cua_jax.tasks.sources`; None:
    MiniWoB names only). kind_modules: modules the worker imports first (they register plugin
    kinds, see `cua_jax.environments.kinds`). kind_configs: kind -> its config dataclass
    (`capsules.CapsuleOptions` for "miniwob", `docker_pool.PoolConfig` for "desktop",
    `code_env.CodeEnvConfig` for "code", a plugin's own); a kind it lacks opens with its
    defaults, but desktop, whose pool needs its image."""

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
    catalog: Any = None
    kind_modules: tuple[str, ...] = ()
    kind_configs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def kind_config(self, kind: str) -> Any:
        """The config of kind `kind` (None: its defaults)."""
        return self.kind_configs.get(kind)


class RolloutWorker:
    """Owns the resources of its kinds of environment (a CapsuleRuntime for MiniWoB), an engine
    (built by `engine_factory` here) and two AgentLoops.

    env_wrapper wraps every environment the worker makes (fault injection, added latency); in
    a Ray actor it is pickled into the actor's process, so its state lives there.
    """

    def __init__(
        self,
        engine_factory: Callable[[], RolloutEngine],
        config: RolloutWorkerConfig = RolloutWorkerConfig(),
        env_wrapper: EnvWrapper | None = None,
    ):

        self.config = config
        tokenizer, image_processor = load_processor(config.tokenizer_dir)
        self.segmenter = make_segmenter(
            config.segmenter, ChatRenderer(tokenizer, image_processor), **dict(config.segmenter_options)
        )
        engine = engine_factory()
        self.engine = CanonicalOrderEngine(engine) if config.canonical_order else engine
        self.train_loop = AgentLoop(self.engine, self.segmenter, config.agent)
        self.eval_loop = AgentLoop(self.engine, self.segmenter, config.eval_agent or config.agent)
        self._eval_loops: dict[float, AgentLoop] = {}  # the evaluation loop at other temperatures
        # The kinds this worker runs and the resources each shares, opened in registration order.
        self.kinds: dict[str, EnvironmentKind] = {}
        self.resources: dict[str, Any] = {}
        try:
            import_kind_modules(config.kind_modules)
            names = {"miniwob"} if config.catalog is None else config.catalog.kinds
            for name in names - set(kind_names()):
                environment_kind(name)  # raises, naming the registered kinds
            self.kinds = {name: environment_kind(name) for name in kind_names() if name in names}
            for name, kind in self.kinds.items():
                self.resources[name] = kind.open(config)
        except BaseException:
            self._close_environments()
            self.engine.close()
            raise
        self.env_wrapper = env_wrapper
        self.envs: dict[str, list[AgentEnvironment]] = {name: [] for name in self.kinds}
        # One batch of groups at a time: the environments are shared between calls.
        self._run_lock = threading.Lock()
        # Streaming (`submit_group`): an event loop of its own in a thread, with its own environments.
        self._stream_loop: asyncio.AbstractEventLoop | None = None
        self._stream_thread: threading.Thread | None = None
        self._stream_envs: dict[str, list[AgentEnvironment]] = {}
        self._stream_groups: dict[str, asyncio.Semaphore] = {}
        # environment -> the task id of its last group (entries go with their environments)
        self._last_tasks: weakref.WeakKeyDictionary[AgentEnvironment, str] = weakref.WeakKeyDictionary()

    @property
    def runtime(self) -> Any:
        """The MiniWoB capsule runtime (None without MiniWoB tasks)."""
        return self.resources.get("miniwob")

    def _new_env(self, kind: str) -> AgentEnvironment:
        return self.kinds[kind].make(self.resources[kind], self.config)

    def _envs(self, kind: str, n: int) -> list[AgentEnvironment]:
        """n environments of `kind`, reused across groups (a reset starts each one afresh)."""
        envs = self.envs[kind]
        while len(envs) < n:
            env = self._new_env(kind)
            envs.append(self.env_wrapper(env) if self.env_wrapper else env)
        return envs[:n]

    def _capacity(self, kind: str) -> int | None:
        """Episodes of `kind` the worker's resources carry at once (None: unbounded)."""
        return self.kinds[kind].capacity(self.resources[kind])

    def _check_capacity(self, kind: str, n: int) -> None:
        capacity = self._capacity(kind)
        if capacity is not None and n > capacity:
            raise ValueError(
                f"a group of {n} {kind} episodes needs {n} at once, but the worker's {kind} environments "
                f"carry {capacity}"
            )

    def _group_gate(self, kind: str, n: int) -> asyncio.Semaphore | None:
        """At most as many groups of n episodes of `kind` as its capacity holds run at once: a
        group waiting for room has not started, so the batcher never waits for its episodes."""
        capacity = self._capacity(kind)
        return None if capacity is None else asyncio.Semaphore(max(1, capacity // n))

    def resolve(self, task_id: str) -> tuple[str, Any]:
        """(environment kind, what its reset takes) of a requested task id."""
        if self.config.catalog is not None and task_id in self.config.catalog:
            task = self.config.catalog[task_id]
            return task.kind, task.spec
        if self.config.catalog is not None:
            raise KeyError(f"task {task_id!r} is not in the worker's task catalog")
        return "miniwob", task_id

    def _run(self, loop: AgentLoop, groups: Sequence[tuple[str, int | None, int]], n: int) -> list[list[Rollout]]:
        """groups: (task_id, seed, group_id) each; n episodes per group, all concurrent."""
        if n < 1:
            raise ValueError(f"a group needs n >= 1 episodes, got {n}")
        resolved = [self.resolve(task_id) for task_id, _, _ in groups]
        for kind in {kind for kind, _ in resolved}:
            self._check_capacity(kind, n)
        with self._run_lock:
            needed = {kind: n * sum(k == kind for k, _ in resolved) for kind in self.envs}
            assigned: list[list[AgentEnvironment]] = [[] for _ in groups]
            for kind, count in needed.items():
                indices = [i for i, (k, _) in enumerate(resolved) if k == kind]
                shares = assign_by_last_task(
                    self._envs(kind, count), [groups[i][0] for i in indices], n, self._last_tasks
                )
                for i, share in zip(indices, shares):
                    assigned[i] = share

            async def run_all():
                gates = {kind: self._group_gate(kind, n) for kind in self.kinds}

                async def run_one(envs, kind, spec, task_id, seed, group_id):
                    return await _gated(
                        gates[kind], loop.run_group(envs, spec, task_id=task_id, seed=seed, group_id=group_id)
                    )

                return await asyncio.gather(
                    *(
                        run_one(envs, kind, spec, *group)
                        for envs, (kind, spec), group in zip(assigned, resolved, groups)
                    )
                )

            return list(asyncio.run(run_all()))

    def run_groups(
        self, requests: Sequence[GroupRequest], n: int, evaluation: bool = False, temperature: float | None = None
    ) -> list[list[Rollout]]:
        """Groups of n episodes, one per (task, seed, group_id) request, all concurrently on one
        event loop, with the evaluation agent loop when `evaluation`. `temperature` (evaluation
        only) samples at that temperature instead of the evaluation agent's own, all else equal
        (0: greedy). Returns each group's rollouts (in environment order), in request order."""
        for request in requests:
            if len(request) != 3:
                raise ValueError(f"a group request is (task, seed, group_id), got {request!r}")
        if temperature is not None and not evaluation:
            raise ValueError("run_groups: a temperature override is for evaluation groups only")
        loop = self.eval_loop if evaluation else self.train_loop
        if temperature is not None and float(temperature) != loop.config.temperature:
            loop = self._eval_loop_at(float(temperature))
        return self._run(loop, list(requests), n)

    def _eval_loop_at(self, temperature: float) -> AgentLoop:
        """The evaluation agent loop at another sampling temperature (made once, then kept)."""
        loop = self._eval_loops.get(temperature)
        if loop is None:
            config = dataclasses.replace(self.eval_loop.config, temperature=temperature)
            loop = self._eval_loops[temperature] = AgentLoop(self.engine, self.segmenter, config)
        return loop

    def run_group(self, task: str, n: int, *, seed: int | None = None, group_id: int = 0) -> list[Rollout]:
        """n concurrent training episodes of `task` (one seed for the whole group)."""
        return self._run(self.train_loop, [(task, seed, group_id)], n)[0]

    # -- streaming: groups submitted one at a time, all running on one event loop ----------

    def submit_group(self, request: GroupRequest, n: int) -> concurrent.futures.Future:
        """Starts a training group of n episodes on the worker's streaming event loop (started
        on first use) and returns the future of its rollouts, resolved when its last episode
        ends. Every group in flight shares the loop's generation batcher, so generation is
        batched across all of them; the environments are the streaming loop's own."""
        if self._stream_loop is None:
            self._stream_loop = asyncio.new_event_loop()
            self._stream_thread = threading.Thread(
                target=self._stream_loop.run_forever, daemon=True, name="rollout-stream"
            )
            self._stream_thread.start()
        return asyncio.run_coroutine_threadsafe(_stream_group(self, request, n), self._stream_loop)

    def _wrapped(self, env: AgentEnvironment) -> AgentEnvironment:
        return self.env_wrapper(env) if self.env_wrapper else env

    def _stop_streaming(self) -> None:
        """Closes the streaming loop's environments and stops the loop (groups in flight end)."""
        if self._stream_loop is None:
            return
        loop, envs = self._stream_loop, [env for kind in self._stream_envs.values() for env in kind]

        async def close_all():
            await asyncio.gather(*(env.close() for env in envs), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=120)
        loop.call_soon_threadsafe(loop.stop)
        self._stream_thread.join(timeout=120)
        self._stream_loop, self._stream_envs, self._stream_groups = None, {}, {}

    def update_weights(self, params: Any, version: int) -> None:
        """Loads `params` (whatever the engine's update_weights takes) as policy `version`."""
        self.engine.update_weights(params, version)

    def health(self) -> EngineHealth:
        return self.engine.health()

    def engine_stats(self) -> dict[str, float]:
        """The engine's work counters (`RolloutEngine.stats`)."""
        return self.engine.stats()

    def environment_stats(self) -> dict[str, float]:
        """The worker's environment counters since it started, each kind's `stats` (under
        "capsules/": its capsule runtime's `counters`: warm failures, crashes, fork methods)."""
        return {
            name: value
            for kind, entry in self.kinds.items()
            for name, value in entry.stats(self.resources[kind]).items()
        }

    def sampling_state(self) -> dict[str, int]:
        """The engine's restorable sampling state (see `engine_sampling_state`)."""
        return engine_sampling_state(self.engine)

    def load_sampling_state(self, state: Mapping[str, int]) -> None:
        load_engine_sampling_state(self.engine, state)

    def shutdown(self) -> None:
        """Close the capsules, the browser and the engine. Idempotent."""

        async def close_all(envs):
            await asyncio.gather(*(env.close() for env in envs))

        self._stop_streaming()
        with self._run_lock:
            envs = [env for kind in self.envs.values() for env in kind]
            if envs:
                asyncio.run(close_all(envs))
                self.envs = {kind: [] for kind in self.envs}
            self._close_environments()
            if self.engine is not None:
                self.engine.close()
                self.engine = None

    def _close_environments(self) -> None:
        while self.resources:
            kind, resources = self.resources.popitem()  # the last opened closes first
            self.kinds[kind].close(resources)


async def _gated(gate: asyncio.Semaphore | None, coroutine):
    if gate is None:
        return await coroutine
    async with gate:
        return await coroutine


def assign_by_last_task(
    envs: Sequence[AgentEnvironment], task_ids: Sequence[str], n: int, last_tasks: MutableMapping[Any, str]
) -> list[list[AgentEnvironment]]:
    """n of `envs` for each of `task_ids` (len(envs) >= n * len(task_ids)), each group given
    first the environments whose last group ran its task, in order, then the rest in order;
    `last_tasks` (environment -> task id) is updated. An environment that ran the task last may
    begin the next episode in the page it holds (env.capsules.episodes_per_page)."""
    remaining = list(envs)
    shares: list[list[AgentEnvironment]] = []
    for task_id in task_ids:
        same = [env for env in remaining if last_tasks.get(env) == task_id][:n]
        shares.append(same)
        taken = {id(env) for env in same}
        remaining = [env for env in remaining if id(env) not in taken]
    for share in shares:
        while len(share) < n:
            share.append(remaining.pop(0))
    for task_id, share in zip(task_ids, shares):
        for env in share:
            last_tasks[env] = task_id
    return shares


async def _stream_group(worker: RolloutWorker, request: GroupRequest, n: int) -> list[Rollout]:
    """One streamed group on `worker`'s streaming loop (module level: a class with a coroutine
    method would make Ray run RolloutWorker as an asyncio actor, where asyncio.run fails)."""
    task_id, seed, group_id = request
    kind, spec = worker.resolve(task_id)
    worker._check_capacity(kind, n)
    free = worker._stream_envs.setdefault(kind, [])
    while len(free) < n:
        free.append(worker._wrapped(worker._new_env(kind)))
    [envs] = assign_by_last_task(free, [task_id], n, worker._last_tasks)
    for env in envs:
        free.remove(env)
    try:
        if kind not in worker._stream_groups:  # the gate of the first group's size, as before
            worker._stream_groups[kind] = worker._group_gate(kind, n)
        group = worker.train_loop.run_group(envs, spec, task_id=task_id, seed=seed, group_id=group_id)
        return await _gated(worker._stream_groups[kind], group)
    finally:
        free.extend(envs)


def rollout_worker_actor(
    num_cpus: float = 1.0, env_vars: tuple[tuple[str, str], ...] = (), max_concurrency: int = 4, **options: Any
):
    """RolloutWorker as a Ray actor class (call `.remote(engine_factory, config, env_wrapper)`).

    max_concurrency > 1 lets health checks, sampling-state reads and weight updates run while
    a batch of groups does (run_groups calls themselves take turns)."""
    import ray

    return ray.remote(RolloutWorker).options(
        num_cpus=num_cpus,
        max_concurrency=max_concurrency,
        runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
        **options,
    )


class SharedPlacementGroup:
    """A placement group the actors of one start_remote_workers call share: removed when the
    last of them has shut down, so its bundles go back to the cluster."""

    def __init__(self, group: Any, holders: int):
        self.group = group
        self.holders = holders

    def release(self) -> None:
        from cua_jax.rollout.workers import release_bundles  # deferred, as below: it imports Ray and JAX

        self.holders -= 1
        if self.holders == 0:
            group, self.group = self.group, None
            release_bundles(group)


class RemoteRolloutWorker:
    """A RolloutWorker in a Ray actor, driven through the in-process worker's blocking methods.
    placement: the placement group its actor runs in, shared with its siblings (None: none)."""

    def __init__(self, actor: Any, placement: SharedPlacementGroup | None = None):
        self.actor = actor
        self.placement = placement

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

    def run_groups(
        self, requests: Sequence[GroupRequest], n: int, evaluation: bool = False, temperature: float | None = None
    ) -> list[list[Rollout]]:
        import ray

        return ray.get(self.actor.run_groups.remote(list(requests), n, evaluation, temperature))

    def run_group(self, task: str, n: int, *, seed: int | None = None, group_id: int = 0) -> list[Rollout]:
        import ray

        return ray.get(self.actor.run_group.remote(task, n, seed=seed, group_id=group_id))

    def update_weights(self, params: Any, version: int) -> None:
        """params may be a Ray object reference (put once, shared by every actor)."""
        import ray

        ray.get(self.actor.update_weights.remote(params, version))

    def health(self) -> EngineHealth:
        import ray

        return ray.get(self.actor.health.remote())

    def engine_stats(self) -> dict[str, float]:
        import ray

        return ray.get(self.actor.engine_stats.remote())

    def environment_stats(self) -> dict[str, float]:
        import ray

        return ray.get(self.actor.environment_stats.remote())

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
            if self.placement is not None:
                self.placement.release()


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
    placement: str = "",
    resources: tuple[tuple[str, float], ...] = (),
    placement_timeout_s: float = 600.0,
) -> list[RemoteRolloutWorker]:
    """One actor per (engine factory, config), started together; returns once every actor has
    built its engine and browser. A start-up error is raised here, after ending every actor.
    `resources`: custom Ray resources each actor reserves (a rollout node's label); `placement`:
    a placement-group strategy over one bundle per actor (`workers.reserve_bundles`), "" for none."""
    import ray

    # Deferred, as Ray is: rollout.workers imports JAX, which a worker without Ray actors never needs.
    from cua_jax.rollout.workers import bundle_strategy, release_bundles, reserve_bundles

    group = reserve_bundles(len(specs), num_cpus, 0.0, resources, placement, placement_timeout_s)
    shared = SharedPlacementGroup(group, len(specs)) if group is not None else None
    extra = {"resources": dict(resources)} if resources else {}
    actors = []
    try:
        for i, (factory, config) in enumerate(specs):
            placed = rollout_worker_actor(num_cpus, env_vars, **extra, **bundle_strategy(group, i))
            actors.append(placed.remote(factory, config, env_wrapper))
        ray.get([actor.health.remote() for actor in actors])
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        release_bundles(group)  # its bundles would stay reserved for actors that no longer exist
        raise
    return [RemoteRolloutWorker(actor, shared) for actor in actors]


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
