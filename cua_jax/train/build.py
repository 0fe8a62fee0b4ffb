"""What a run is built from: its policy (a random init, or a Hugging Face directory in
model.init_from), its tokenizer and image processor, and its rollout workers (environments:
capsules and / or a Docker desktop pool; agent loops; an engine: the JAX sampler in process
or in a Ray actor, or vLLM engines in Ray actors behind a router)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.context.tokenizer import load_processor
from cua_jax.environments.kinds import environment_kind
from cua_jax.models.checkpoint import read_hf_config
from cua_jax.models.hf_policy import check_policy_directory, export_policy, load_policy, token_id_bound
from cua_jax.models.registry import TINY_MODELS
from cua_jax.rollout.jax_engine import JaxEngineFactory
from cua_jax.rollout.rollout_worker import (
    EnvWrapper,
    RemoteRolloutWorker,
    RolloutWorker,
    RolloutWorkerConfig,
    broadcast_weights,
    ensure_local_ray,
    start_remote_workers,
)
from cua_jax.rollout.vllm_engine import VllmEngineConfig, VllmEngineFactory
from cua_jax.rollout.workers import Router, RouterConfig, vllm_host_weights
from cua_jax.train.settings import LOADED_POLICIES, ConfigError, ModelSettings, RolloutSettings, TrainSettings, _require

RolloutWorkers = list[RolloutWorker] | list[RemoteRolloutWorker]


def build_policy(settings: TrainSettings, seed: int):
    """The policy model a config names: a random init of the tiny Qwen3-VL, Qwen3 or Qwen3.5, or
    the Qwen3-VL / Qwen3 / Qwen3.5 checkpoint in model.init_from (`cua_jax.models.hf_policy.load_policy`)."""

    model = settings.model
    precision = dict(dtype=model.compute_dtype, param_dtype=model.param_dtype, remat=model.remat)
    if model.name in LOADED_POLICIES:
        return load_policy(model.init_from, **precision)[0]
    return TINY_MODELS[model.name](model.num_layers, seed, **precision)


def check_init_from(model: ModelSettings):
    """model.init_from's `PolicyDirectory`; ConfigError naming model.init_from unless it holds a
    checkpoint of the kind model.name says (`cua_jax.models.hf_policy.check_policy_directory`:
    config, shards, architecture, a tokenizer that fits the vocabulary)."""

    where = f"config.model.init_from: {model.init_from!r}"
    try:
        found = check_policy_directory(model.init_from)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from None
    if found.kind != model.name:
        raise ConfigError(f"{where} holds a {found.architecture} ({found.kind!r}), but model.name is {model.name!r}")
    return found


def load_run_processor(model: ModelSettings):
    """The run's (tokenizer, image processor) (`ModelSettings.tokenizer_source`), with model.init_from checked
    first when the policy is loaded from it: a checkpoint whose vocabulary holds the tokenizer's."""

    policy = check_init_from(model) if model.name in LOADED_POLICIES else None
    tokenizer, image_processor = load_processor(model.tokenizer_source)
    # A tokenizer from init_from itself was checked against its vocabulary with the directory.
    if policy is not None and model.tokenizer_dir and token_id_bound(tokenizer) > policy.vocab_size:
        raise ConfigError(
            f"config.model.tokenizer_dir: {model.tokenizer_dir!r}: its tokenizer's ids reach "
            f"{token_id_bound(tokenizer)}, past model.init_from's vocabulary ({policy.vocab_size})"
        )
    return tokenizer, image_processor


def rollout_worker_config(settings: TrainSettings, worker: int) -> RolloutWorkerConfig:
    """Worker `worker`'s agent loops, segmenter and capsules, as the run's config names them.

    The engine is served in canonical request order: the JAX sampler draws row r of a batch
    from key split r, so this makes a resumed run sample what the uninterrupted one did."""
    env = settings.env
    return RolloutWorkerConfig(
        agent=settings.agent,
        eval_agent=settings.eval_agent,
        segmenter=settings.segmenter,
        segmenter_options=tuple(sorted(settings.segmenter_options.items())),
        tokenizer_dir=settings.model.tokenizer_source,
        include_dom_text=env.include_dom_text,
        screenshots=env.observation == "screenshot",
        time_limit_s=env.time_limit_s,
        runtime_seed=settings.seed * 1000 + worker,
        canonical_order=True,
        catalog=settings.catalog,
        kind_modules=settings.kind_modules,
        kind_configs=prepared_kind_configs(settings),
    )


def prepared_kind_configs(settings: TrainSettings) -> dict[str, Any]:
    """Every kind's config, each kind the run's tasks hold prepared by its registry entry
    (`EnvironmentKind.prepare`: the desktop image resolved to the exact tag of the current
    sources, built when missing)."""
    return {
        name: environment_kind(name).prepare(config) if name in settings.catalog.kinds else config
        for name, config in settings.kind_configs.items()
    }


ENGINE_MODEL_DIR = "engine_model"  # under the workdir: the policy as the vLLM engines load it


def export_engine_model(policy, workdir: str, tokenizer, image_processor, host_params: Any = None) -> str:
    """Writes the policy, with the run's tokenizer, chat template and image processor, as the
    Hugging Face directory the vLLM engines start from (<workdir>/engine_model); later
    policy versions reach them by weight sync.

    host_params: a coordinated run's host copy of the policy's state (`host_state`, whole on
    every process): each process writes it to <workdir>/engine_model/process_<index> for its
    own engines, so no host depends on another's disk."""
    from flax import nnx

    directory = os.path.join(workdir, ENGINE_MODEL_DIR)
    if host_params is None:
        export_policy(policy, directory, tokenizer=tokenizer, image_processor=image_processor)
        return directory
    directory = os.path.join(directory, f"process_{jax.process_index()}")
    local = nnx.merge(nnx.graphdef(policy), host_params)
    export_policy(local, directory, tokenizer=tokenizer, image_processor=image_processor, local=True)
    return directory


@dataclasses.dataclass(frozen=True)
class VllmRouterFactory:
    """Builds one rollout worker's engine: a `Router` over rollout.vllm.engines vLLM engines,
    each in a Ray actor of its own, serving `model_dir` (Ray must be running)."""

    model_dir: str
    engine: Any  # cua_jax.rollout.vllm_engine.VllmEngineConfig
    router: Any  # cua_jax.rollout.workers.RouterConfig

    def __call__(self):
        return Router(VllmEngineFactory(self.engine), self.router, host_weights=vllm_host_weights(self.model_dir))


def vllm_router_factories(
    settings: TrainSettings, model_dir: str, multimodal: bool, banned_token_ids: tuple[int, ...] = ()
) -> list[VllmRouterFactory]:
    """One `VllmRouterFactory` per rollout worker, as config.rollout.vllm names them (engine
    seeds seed * 1000 + worker); the engines never sample `banned_token_ids`. A context
    budget past the policy's positions is a ConfigError naming the field."""

    rollout = settings.rollout
    v = rollout.vllm
    hf = read_hf_config(model_dir)
    positions = (hf.get("text_config") or hf).get("max_position_embeddings")
    contexts = {"rollout.max_context_tokens": rollout.max_context_tokens}
    if settings.eval.enabled:
        contexts["eval.max_context_tokens"] = settings.eval.max_context_tokens
    for field, tokens in contexts.items():
        # vLLM refuses a longer context than the model's positions.
        _require(
            positions is None or tokens <= positions,
            field,
            f"{tokens} tokens exceed the policy's max_position_embeddings ({positions}), vLLM's longest context",
        )
    engine = VllmEngineConfig(
        model_dir,
        dtype=v.dtype,
        max_model_len=max(contexts.values()),
        kv_cache_bytes=int(v.kv_cache_mb) * 2**20 or None,
        gpu_memory_utilization=v.gpu_memory_utilization,
        max_num_seqs=v.max_num_seqs,
        banned_token_ids=tuple(banned_token_ids),
        # A prompt never holds more screenshots than an episode has turns.
        limit_images_per_prompt=max(rollout.max_turns, settings.eval.max_turns) if multimodal else 0,
    )
    threads = str(int(v.threads))
    router = RouterConfig(
        num_engines=v.engines,
        cpus_per_engine=v.cpus_per_engine,
        gpus_per_engine=v.gpus_per_engine,
        max_retries=v.max_retries,
        placement=v.placement,
        resources=((v.node_resource, 1.0),) if v.node_resource else (),
        env_vars=(
            ("OMP_NUM_THREADS", threads),
            ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            ("JAX_PLATFORMS", "cpu"),
            ("TOKENIZERS_PARALLELISM", "false"),
            ("VLLM_LOGGING_LEVEL", v.log_level),
        ),
    )
    return [
        VllmRouterFactory(model_dir, dataclasses.replace(engine, seed=settings.seed * 1000 + w), router)
        for w in range(rollout.num_workers)
    ]


def ray_cpus_needed(rollout: RolloutSettings) -> float:
    """Logical CPUs the run's Ray actors reserve (0: the run needs no Ray)."""
    if rollout.engine == "vllm":
        return rollout.num_workers * rollout.vllm.engines * rollout.vllm.cpus_per_engine
    if rollout.worker_backend == "ray":
        return rollout.num_workers * rollout.worker_cpus
    return 0.0


@contextlib.contextmanager
def local_ray(rollout: RolloutSettings):
    """A local Ray for the run's actors (`ray_cpus_needed`) while the context lasts, when the run
    needs one and none is running; one already running is left as it was."""

    needed = ray_cpus_needed(rollout)
    owned = ensure_local_ray(needed, rollout.ray_object_store_mb) if needed else False
    try:
        yield
    finally:
        if owned:
            import ray

            ray.shutdown()


def build_rollout_workers(
    settings: TrainSettings,
    policy,
    pad_id: int,
    env_wrapper: EnvWrapper | None,
    banned_token_ids: tuple[int, ...] = (),
    engine_model_dir: str | None = None,
    params: Any = None,
) -> RolloutWorkers:
    """config.rollout.num_workers workers. With rollout.engine "jax", each holds a JAX sampler
    engine with a copy of `policy` (seeded seed * 1000 + worker) that never samples
    `banned_token_ids`: in this process ("local"), or each in a Ray actor ("ray") that builds
    its engine from the policy's parameters as host arrays. With "vllm", each (in this process)
    routes its generations to vLLM engines in Ray actors serving `engine_model_dir`
    (`export_engine_model`). Ray must be running for both: `ensure_local_ray`. params: the
    policy's state the JAX engines start from (default `nnx.state(policy)`; a coordinated run
    passes a host copy, so each process's engines hold the whole policy locally)."""
    from flax import nnx

    rollout = settings.rollout
    if rollout.engine == "vllm":
        if engine_model_dir is None:
            raise ValueError("rollout.engine 'vllm' needs the exported engine model directory")
        multimodal = hasattr(policy, "encode_images") and settings.env.observation == "screenshot"
        factories = vllm_router_factories(settings, engine_model_dir, multimodal, banned_token_ids)
        specs = [(factory, rollout_worker_config(settings, w)) for w, factory in enumerate(factories)]
        return start_local_workers(specs, env_wrapper)
    remote = rollout.worker_backend == "ray"
    state = nnx.state(policy) if params is None else params
    params = jax.tree.map(np.asarray, state) if remote else state  # the local factory copies it
    specs = [
        (
            JaxEngineFactory(
                type(policy),
                policy.config,
                params,
                seed=settings.seed * 1000 + w,
                pad_id=pad_id,
                tokenizer_dir=settings.model.tokenizer_source,
                banned_token_ids=banned_token_ids,
                interrupt_tokens=rollout.partial_rollout_tokens,
                share_prompts=rollout.share_prompts,
                prefix_cache_tokens=rollout.prefix_cache_tokens,
                shared_prefix_attention=rollout.shared_prefix_attention,
            ),
            rollout_worker_config(settings, w),
        )
        for w in range(rollout.num_workers)
    ]
    if remote:
        resource = rollout.worker_node_resource
        return start_remote_workers(
            specs,
            env_wrapper,
            num_cpus=rollout.worker_cpus,
            placement=rollout.worker_placement,
            resources=((resource, 1.0),) if resource else (),
        )
    return start_local_workers(specs, env_wrapper)


def start_local_workers(specs, env_wrapper: EnvWrapper | None) -> list[RolloutWorker]:
    """In-process rollout workers, one per (engine factory, RolloutWorkerConfig); those already
    started are shut down when a later one fails to start."""
    workers: list[RolloutWorker] = []
    try:
        for factory, worker_config in specs:
            workers.append(RolloutWorker(factory, worker_config, env_wrapper))
    except BaseException:
        for worker in workers:
            worker.shutdown()
        raise
    return workers


def push_weights(workers: RolloutWorkers, rollout: RolloutSettings, state, version: int) -> None:
    """The learner's parameters (an nnx.State) to every worker's engine as policy `version`: a
    device copy per in-process JAX engine (the learner donates its own arrays to the next
    update), one host (numpy) copy shared by Ray actors, the state itself to vLLM routers
    (they turn it into host arrays before returning)."""
    if rollout.engine == "vllm":
        for worker in workers:
            worker.update_weights(state, version)
        return
    if rollout.worker_backend == "ray":
        broadcast_weights(workers, jax.tree.map(np.asarray, state), version)
        return
    for worker in workers:
        worker.update_weights(jax.tree.map(jnp.copy, state), version)
