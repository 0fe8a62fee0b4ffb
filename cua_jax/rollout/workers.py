"""Rollout engines hosted in Ray actors, and a router that spreads requests over them.

`EngineActor` holds one engine (vLLM or the JAX sampler) built by a factory inside the
actor process; on GPU one actor per device group, on a small CPU machine one or two.

`Router` is itself a `RolloutEngine`:
* generate splits a batch into contiguous chunks, one per actor, and gathers the results
  in request order;
* policy versions stay consistent: generate calls hold a shared lock and update_weights
  the exclusive one, so a weight update waits for in-flight generations to finish and no
  batch mixes versions (each Generation also carries the version that produced it);
* a dead actor's chunk is retried at once on an actor in service (up to max_retries times;
  then generate raises `EngineFault`, which quarantines the waiting episodes); the dead
  actor is restarted by Ray (max_restarts) and, in a background thread, re-synced with the
  latest weights the router pushed before it serves again.

Across nodes, `RouterConfig.placement` reserves one placement-group bundle per actor (its CPUs,
GPUs and `resources`, e.g. a custom resource that only rollout nodes advertise) before any actor
starts, so the engines land where the bundles were granted, and a restarted actor returns to its
own bundle.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cua_jax.rollout.engine import (
    EngineFault,
    EngineHealth,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)
from cua_jax.rollout.vllm_engine import hf_host_arrays, key_table_for_directory


class EngineActor:
    """One engine inside a Ray actor. Run with max_concurrency >= 2 so health checks
    answer while a generation is running."""

    def __init__(self, engine_factory: Callable[[], RolloutEngine]):
        self._engine = engine_factory()
        self._in_flight = 0
        self._count_lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        with self._count_lock:
            self._in_flight += 1
        try:
            return self._engine.generate(requests, sampling)
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def update_weights(self, params: Any, version: int) -> None:
        self._engine.update_weights(params, version)

    def health(self) -> EngineHealth:
        return self._engine.health()

    def stats(self) -> dict[str, float]:
        return self._engine.stats()

    def in_flight(self) -> int:
        """Number of generate calls running right now."""
        return self._in_flight


class _SharedExclusiveLock:
    """Many holders in shared mode (generate) or one in exclusive mode (update_weights).

    A waiting exclusive holder blocks new shared holders, so weight updates are not starved.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    def acquire_shared(self):
        with self._cond:
            while self._exclusive or self._waiting_exclusive:
                self._cond.wait()
            self._shared += 1

    def release_shared(self):
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    def acquire_exclusive(self):
        with self._cond:
            self._waiting_exclusive += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting_exclusive -= 1
            self._exclusive = True

    def release_exclusive(self):
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


PLACEMENT_STRATEGIES = ("", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def reserve_bundles(
    count: int, cpus: float, gpus: float, resources: tuple[tuple[str, float], ...], strategy: str, timeout_s: float
) -> Any:
    """A Ray placement group of `count` bundles ({CPU: cpus, GPU: gpus, **resources}) with
    `strategy`, once the cluster has granted it; None without a strategy. A cluster that does
    not grant it within timeout_s raises, naming the bundle."""
    if not strategy:
        return None
    if strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(f"placement must be one of {PLACEMENT_STRATEGIES}, got {strategy!r}")
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {name: amount for name, amount in {"CPU": cpus, "GPU": gpus, **dict(resources)}.items() if amount > 0}
    group = placement_group([bundle] * count, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(
            f"the cluster did not grant {count} bundles of {bundle} ({strategy}) within {timeout_s} s"
        ) from None
    return group


def release_bundles(group: Any) -> None:
    """Removes a placement group from `reserve_bundles`, giving its bundles back (None: nothing)."""
    if group is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)


def bundle_strategy(group: Any, index: int) -> dict[str, Any]:
    """Actor options placing an actor in bundle `index` of `group` ({} without a group)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)}


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """How many engine actors, their resources, and the failure policy.

    max_retries: how often one chunk of a batch is retried after its actor died.
    restart_timeout_s: how long to wait for Ray to bring a dead actor back.
    env_vars: the actors' environment (e.g. thread limits for vLLM on CPU).
    placement: "" lets Ray place each actor; otherwise a placement-group strategy (PACK,
      SPREAD, STRICT_PACK, STRICT_SPREAD) over one bundle per actor.
    resources: custom Ray resources each actor reserves, as (name, amount) pairs.
    placement_timeout_s: how long to wait for the placement group's bundles.
    """

    num_engines: int = 1
    cpus_per_engine: float = 1.0
    gpus_per_engine: float = 0.0
    max_retries: int = 2
    restart_timeout_s: float = 600.0
    env_vars: tuple[tuple[str, str], ...] = ()
    placement: str = ""
    resources: tuple[tuple[str, float], ...] = ()
    placement_timeout_s: float = 600.0

    def __post_init__(self):
        if self.placement not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement must be one of {PLACEMENT_STRATEGIES}, got {self.placement!r}")
        if self.num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {self.num_engines}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")


class Router(RolloutEngine):
    """Spreads generate calls over `config.num_engines` EngineActors (see module doc).

    engine_factory builds the engine inside each actor (it is pickled to the actors).
    host_weights turns the policy's params into what the engines' update_weights take,
    on the driver, once per update (e.g. `vllm_host_weights(model_dir)`); it is put in
    the object store once and shared by every actor.
    """

    def __init__(
        self,
        engine_factory: Callable[[], RolloutEngine],
        config: RouterConfig,
        host_weights: Callable[[Any], Any] = lambda params: params,
        initial_version: int = 0,
    ):
        import ray

        self.config = config
        self._host_weights = host_weights
        self._version = initial_version
        self._weights_ref = None  # the latest pushed weights, re-sent to restarted actors
        self._lock = _SharedExclusiveLock()
        self._state = threading.Condition()  # guards _available, _version, _weights_ref
        self._available = set(range(config.num_engines))
        self._recoveries: list[threading.Thread] = []
        options = dict(
            num_cpus=config.cpus_per_engine,
            num_gpus=config.gpus_per_engine,
            resources=dict(config.resources) or None,
            max_restarts=-1,
            max_concurrency=4,
            runtime_env={"env_vars": dict(config.env_vars)} if config.env_vars else None,
        )
        actor_cls = ray.remote(EngineActor)
        self.placement_group = reserve_bundles(
            config.num_engines,
            config.cpus_per_engine,
            config.gpus_per_engine,
            config.resources,
            config.placement,
            config.placement_timeout_s,
        )
        self.actors = []
        try:
            for i in range(config.num_engines):
                placed = actor_cls.options(**options, **bundle_strategy(self.placement_group, i))
                self.actors.append(placed.remote(engine_factory))
            # Start-up failures surface here, not in the first generate.
            ray.get([actor.health.remote() for actor in self.actors])
        except BaseException:
            self.close()  # the actors and the placement group's bundles go back to the cluster
            raise

    # -- generation ------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        import ray

        if not requests:
            return []
        self._lock.acquire_shared()
        try:
            targets = self._wait_available()
            bounds = np.linspace(0, len(requests), min(len(targets), len(requests)) + 1).astype(int)
            chunks = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
            pending = {
                i: (targets[i], self._submit(targets[i], requests, sampling, chunk)) for i, chunk in enumerate(chunks)
            }
            results: dict[int, list[Generation]] = {}
            attempts = {i: 0 for i in pending}
            while pending:
                for i, (actor_index, ref) in list(pending.items()):
                    try:
                        results[i] = ray.get(ref)
                        del pending[i]
                    except ray.exceptions.RayActorError as error:
                        attempts[i] += 1
                        self._start_recovery(actor_index)
                        if attempts[i] > self.config.max_retries:
                            raise EngineFault(
                                f"engine actor {actor_index} died serving requests {chunks[i]} "
                                f"(attempt {attempts[i]}): {type(error).__name__}"
                            ) from error
                        target = self._wait_available()[0]
                        pending[i] = (target, self._submit(target, requests, sampling, chunks[i]))
            return [g for i in range(len(chunks)) for g in results[i]]
        finally:
            self._lock.release_shared()

    def _submit(self, actor_index, requests, sampling, chunk):
        start, end = chunk
        # Per-request seeds stay those of the unsplit batch.
        chunk_sampling = (
            sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + start)
        )
        return self.actors[actor_index].generate.remote(list(requests[start:end]), chunk_sampling)

    def _wait_available(self) -> list[int]:
        """The actors that serve the current weights, waiting while all are recovering."""
        with self._state:
            while not self._available:
                self._state.wait(timeout=self.config.restart_timeout_s)
                if not self._available and not any(t.is_alive() for t in self._recoveries):
                    raise RuntimeError("no engine is available and none is recovering")
            return sorted(self._available)

    def _start_recovery(self, index: int) -> None:
        """Takes actor `index` out of service and brings it back in a background thread."""
        with self._state:
            if index not in self._available:
                return  # already recovering
            self._available.discard(index)
            thread = threading.Thread(target=self._recover, args=(index,), daemon=True)
            self._recoveries = [t for t in self._recoveries if t.is_alive()] + [thread]
        thread.start()

    def _recover(self, index: int) -> None:
        """Waits until Ray has restarted actor `index`, syncs the latest weights, re-admits it."""
        import ray

        actor = self.actors[index]
        deadline = time.monotonic() + self.config.restart_timeout_s
        while True:
            try:
                health = ray.get(actor.health.remote(), timeout=self.config.restart_timeout_s)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    with self._state:
                        self._state.notify_all()
                    return  # stays out of service; health() reports it
                time.sleep(1.0)
        served = health.policy_version
        while True:
            with self._state:
                version, ref = self._version, self._weights_ref
                if ref is None or served == version:
                    self._available.add(index)
                    self._state.notify_all()
                    return
            # Outside the lock: an update_weights may run meanwhile; the loop re-checks.
            ray.get(actor.update_weights.remote(ref, version))
            served = version

    # -- weights ----------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        import ray

        host = self._host_weights(params)
        self._lock.acquire_exclusive()  # waits for in-flight generate calls
        try:
            with self._state:
                self._weights_ref, self._version = ray.put(host), version
                targets = sorted(self._available)
            refs = [(i, self.actors[i].update_weights.remote(self._weights_ref, version)) for i in targets]
            for index, ref in refs:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._start_recovery(index)  # it re-syncs to this version once back
        finally:
            self._lock.release_exclusive()

    def wait_recovered(self, timeout_s: float | None = None) -> bool:
        """Blocks until background recoveries finish; True when every engine is in service."""
        for thread in list(self._recoveries):
            thread.join(timeout_s)
        with self._state:
            return len(self._available) == len(self.actors)

    # -- lifecycle --------------------------------------------------------------------

    def engine_health(self, timeout_s: float = 60.0) -> list[EngineHealth]:
        """Each actor's health; an actor that does not answer is reported unhealthy."""
        import ray

        out = []
        for actor in self.actors:
            try:
                out.append(ray.get(actor.health.remote(), timeout=timeout_s))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
                out.append(EngineHealth(healthy=False, policy_version=-1, detail=repr(error)))
        return out

    def stats(self) -> dict[str, float]:
        """The engines' counters (`RolloutEngine.stats`), summed over the actors that answer."""
        import ray

        total: dict[str, float] = {}
        for actor in self.actors:
            try:
                for key, value in ray.get(actor.stats.remote(), timeout=60.0).items():
                    total[key] = total.get(key, 0.0) + value
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
        return total

    def health(self) -> EngineHealth:
        engines = self.engine_health()
        sick = [i for i, h in enumerate(engines) if not h.healthy]
        stale = [i for i, h in enumerate(engines) if h.healthy and h.policy_version != self._version]
        detail = f"unhealthy engines {sick}" if sick else (f"stale engines {stale}" if stale else "")
        return EngineHealth(healthy=not sick and not stale, policy_version=self._version, detail=detail)

    @property
    def policy_version(self) -> int:
        return self._version

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        release_bundles(self.placement_group)
        self.placement_group = None


def vllm_host_weights(model_dir: str) -> Callable[[Any], dict[str, np.ndarray]]:
    """A Router `host_weights` for vLLM engines serving `model_dir`: params -> {HF name: numpy}."""

    return functools.partial(hf_host_arrays, key_table=key_table_for_directory(model_dir))
