"""The online RL trainer: task draws -> rollout groups -> quarantine -> advantages -> updates -> weight sync.

One training step (`Trainer.train_step`):

    groups  = collect(step)                 sampler draws B tasks with key fold_in(base, step);
                                            each task runs a group of n episodes on a rollout
                                            worker (capsule runtime + engine + agent loop);
                                            DTAC replays and DAPO filtering happen here
    kept    = quarantine(groups)            infrastructure-faulted episodes leave their group
                                            (their items are dropped, reasons counted)
    A       = episode_advantages(kept)      group-relative, over the whole rollout batch
    items   = broadcast / STEPO(A)          one advantage per training item
    updates = learner.train_on_batch(...)   num_minibatches updates, whole groups each
    sync    = engine.update_weights(params, version)

Modes (config.train.mode):
  on_policy  collect and learn alternate; one update per rollout batch (num_minibatches = 1),
             old logprobs = the learner's own (stop-gradient), so the logged ratio is exactly
             1 and the clip fraction exactly 0 (CANOPY App. C).
  async      a rollout thread per worker draws tasks and runs groups continuously, tagging every
             episode with the policy version that produced it, into a `RolloutBuffer`; the
             learner takes whole groups, the buffer drops (and counts) groups older than the
             staleness window, mini-batches hold whole groups.

Evaluation runs held-out seeds of the evaluation tasks before the first step and after the
last (success rate with a Wilson interval; a few episode traces as PNG + JSON). Metrics go to
`MetricWriter` per step; the learning curve is drawn at the end. A run checkpoints with Orbax
(`cua_jax.train.checkpoint`) and resumes exactly: every random draw is a function of the step.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import make_segmenter
from cua_jax.context.tokenizer import load_processor
from cua_jax.envs.actions import ACTION_SPACES
from cua_jax.envs.faults import FaultKind
from cua_jax.models.sharding import MeshConfig, make_mesh
from cua_jax.rl.advantages import (
    STATUS_CODES,
    AdvantageConfig,
    broadcast_to_items,
    episode_advantages,
    score_terminal_rewards,
    stepo_item_advantages,
)
from cua_jax.rl.coverage import group_outcome_stats
from cua_jax.rl.losses import PolicyLossConfig
from cua_jax.rollout.agent_loop import AgentConfig, Rollout, reserved_token_ids
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
from cua_jax.tasks.pool import GroupOutcome, PoolTask, TaskPool
from cua_jax.tasks.sampling import (
    CalibrationConfig,
    DTACConfig,
    DynamicSamplingConfig,
    FrontierConfig,
    UniformConfig,
    build_sampler,
    collect_informative_groups,
)
from cua_jax.train.batching import (
    BatchingConfig,
    MultimodalPositions,
    group_order,
    make_minibatches,
    process_images,
)
from cua_jax.train.buffer import RolloutBuffer, RolloutGroup, whole_group_minibatches
from cua_jax.train.checkpoint import TrainCheckpointer, TrainerState
from cua_jax.train.learner import Learner, LearnerConfig, OptimizerConfig
from cua_jax.types import Episode, EpisodeStatus, TrainingItem

MODES = ("on_policy", "async")
ITEM_ADVANTAGES = ("broadcast", "stepo")
SEGMENTER_OPTIONS = {
    "sliding_window": ("keep", "min_removal"),
    "step_wise": ("keep_images",),
    "compact_context": ("window",),
    "whole_trajectory": (),
}
# Metrics that measure wall-clock time: everything else is a function of the config and seed.
TIMING_PREFIX = "time/"


# ---------------------------------------------------------------------------------------
# Settings: the ml_collections config, checked and turned into the components' configs
# ---------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A bad config value; the message starts with the field's full name (config.x.y)."""


def _field_error(section: str, fields: Sequence[str], error: Exception) -> ConfigError:
    """Names the field of `section` that `error`'s message talks about (the earliest mentioned)."""
    message = str(error)
    mentioned = [(message.find(name), name) for name in fields if name in message]
    where = f"config.{section}" + (f".{min(mentioned)[1]}" if mentioned else "")
    return ConfigError(f"{where}: {message}")


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config.{field}: {message}")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The checked form of a run's config (see experiments/configs/base.py for the fields)."""

    config: Any  # the ml_collections.ConfigDict it came from
    learner: LearnerConfig
    batching: BatchingConfig
    advantage: AdvantageConfig
    agent: AgentConfig
    eval_agent: AgentConfig
    mesh: MeshConfig
    sampler_kind: str
    sampler_configs: dict
    calibration: CalibrationConfig | None
    dynamic: DynamicSamplingConfig | None
    segmenter_options: dict
    warm_start: Any = None  # cua_jax.train.warm_start.WarmStartConfig, or None (no warm start)

    @classmethod
    def from_config(cls, config) -> "TrainSettings":
        c = config

        def build(section: str, kind, **values):
            try:
                return kind(**values)
            except (ValueError, TypeError) as error:
                raise _field_error(section, list(values), error) from error

        _require(c.train.mode in MODES, "train.mode", f"{c.train.mode!r} is not one of {MODES}")
        _require(c.train.num_steps >= 0, "train.num_steps", f"must be >= 0, got {c.train.num_steps}")
        _require(c.rollout.group_size >= 1, "rollout.group_size", f"must be >= 1, got {c.rollout.group_size}")
        _require(c.rollout.batch_tasks >= 1, "rollout.batch_tasks", f"must be >= 1, got {c.rollout.batch_tasks}")
        _require(c.rollout.num_workers >= 1, "rollout.num_workers", f"must be >= 1, got {c.rollout.num_workers}")
        _require(c.rollout.engine in ("jax", "vllm"), "rollout.engine", f"{c.rollout.engine!r} is not one of ('jax', 'vllm')")
        if c.rollout.engine == "vllm":
            _require(c.rollout.worker_backend == "local", "rollout.worker_backend",
                     "with rollout.engine 'vllm' the rollout workers run in the trainer's process and the vLLM "
                     "engines in Ray actors (rollout.vllm.engines per worker); set 'local'")
            for name in ("engines", "max_num_seqs", "threads"):
                _require(c.rollout.vllm[name] >= 1, f"rollout.vllm.{name}", f"must be >= 1, got {c.rollout.vllm[name]}")
            _require(c.rollout.vllm.max_retries >= 0, "rollout.vllm.max_retries",
                     f"must be >= 0, got {c.rollout.vllm.max_retries}")
            _require(c.rollout.vllm.kv_cache_mb >= 0, "rollout.vllm.kv_cache_mb", f"must be >= 0, got {c.rollout.vllm.kv_cache_mb}")
            _require(c.rollout.vllm.log_level in ("DEBUG", "INFO", "WARNING", "ERROR"), "rollout.vllm.log_level",
                     f"{c.rollout.vllm.log_level!r} is not one of ('DEBUG', 'INFO', 'WARNING', 'ERROR')")
            _require(c.rollout.vllm.dtype in ("float32", "bfloat16"), "rollout.vllm.dtype",
                     f"{c.rollout.vllm.dtype!r} is not one of ('float32', 'bfloat16')")
        _require(c.env.observation in OBSERVATIONS, "env.observation", f"{c.env.observation!r} is not one of {OBSERVATIONS}")
        if c.env.observation == "text":
            _require(c.env.include_dom_text, "env.include_dom_text",
                     "env.observation 'text' shows the page as DOM text only: set it True")
        elif c.model.name in TEXT_POLICIES:
            _require(False, "env.observation",
                     f"model.name {c.model.name!r} is a text-only policy: set env.observation = 'text'")
        _require(c.rollout.worker_backend in WORKER_BACKENDS, "rollout.worker_backend",
                 f"{c.rollout.worker_backend!r} is not one of {WORKER_BACKENDS}")
        _require(c.rollout.worker_cpus > 0, "rollout.worker_cpus", f"must be > 0, got {c.rollout.worker_cpus}")
        _require(c.rollout.ray_object_store_mb >= 80, "rollout.ray_object_store_mb",
                 f"Ray needs an object store of at least 80 MiB, got {c.rollout.ray_object_store_mb}")
        _require(c.env.kind == "miniwob", "env.kind", f"{c.env.kind!r}: the trainer's environments are 'miniwob'")
        _require(len(c.env.tasks) >= 1, "env.tasks", "needs at least one task")
        from cua_jax.envs.miniwob import task_names

        known = set(task_names())
        for task in tuple(c.env.tasks) + tuple(c.eval.tasks):
            _require(task in known, "env.tasks" if task in c.env.tasks else "eval.tasks", f"unknown MiniWoB task {task!r}")
        _require(len(c.env.task_tiers) == len(c.env.tasks), "env.task_tiers",
                 f"has {len(c.env.task_tiers)} entries for {len(c.env.tasks)} tasks")
        pool = task_pool(c.env.tasks, c.env.task_tiers, c.env.drop_hardest_tier)
        # A batch draws distinct tasks: caught here, not after the warm start and evaluation.
        _require(c.rollout.batch_tasks <= len(pool), "rollout.batch_tasks",
                 f"{c.rollout.batch_tasks} distinct tasks per batch, but the task pool holds {len(pool)} "
                 f"({', '.join(task for task, _ in pool)}); raise env.tasks or lower rollout.batch_tasks")
        _require(c.env.action_space in ACTION_SPACES, "env.action_space",
                 f"{c.env.action_space!r} is not one of {ACTION_SPACES}")
        _require(c.env.train_seed_max >= 1, "env.train_seed_max", f"must be >= 1, got {c.env.train_seed_max}")
        _require(c.env.eval_seed_start >= c.env.train_seed_max, "env.eval_seed_start",
                 f"{c.env.eval_seed_start} overlaps the training seeds [0, {c.env.train_seed_max}): not held out")
        outside = [seed for seed in c.env.train_seeds if not 0 <= int(seed) < c.env.train_seed_max]
        _require(not outside, "env.train_seeds", f"{outside} lie outside the training seeds [0, {c.env.train_seed_max})")
        _require(c.advantage.item_advantages in ITEM_ADVANTAGES, "advantage.item_advantages",
                 f"{c.advantage.item_advantages!r} is not one of {ITEM_ADVANTAGES}")
        _require(c.advantage.reward == "sparse", "advantage.reward", f"{c.advantage.reward!r}: only 'sparse' verifier rewards")
        _require(c.context.segmenter in SEGMENTER_OPTIONS, "context.segmenter",
                 f"{c.context.segmenter!r} is not one of {sorted(SEGMENTER_OPTIONS)}")
        _require(c.learner.num_minibatches >= 1, "learner.num_minibatches", f"must be >= 1, got {c.learner.num_minibatches}")
        _require(c.learner.num_minibatches <= c.rollout.batch_tasks, "learner.num_minibatches",
                 f"{c.learner.num_minibatches} mini-batches of whole groups need at least as many tasks per batch "
                 f"(rollout.batch_tasks = {c.rollout.batch_tasks})")
        if c.train.mode == "on_policy":
            _require(c.train.staleness_window == 0, "train.staleness_window", "must be 0 in on_policy mode")
            _require(c.learner.num_minibatches == 1, "learner.num_minibatches",
                     "on_policy mode takes exactly one update per rollout batch; set 1")
        else:
            _require(c.train.staleness_window >= 0, "train.staleness_window", f"must be >= 0, got {c.train.staleness_window}")
            _require(not c.train.dapo, "train.dapo", "DAPO filtering is supported in on_policy mode only")
            _require(c.train.buffer_groups >= 0, "train.buffer_groups", f"must be >= 0, got {c.train.buffer_groups}")
        if c.learner.old_logprobs == "current":
            _require(c.train.mode == "on_policy" and c.learner.num_minibatches == 1, "learner.old_logprobs",
                     "'current' equals the sampling policy only strictly on-policy; use 'recompute' or 'rollout'")
        _require(c.train.checkpoint_every >= 1, "train.checkpoint_every", f"must be >= 1, got {c.train.checkpoint_every}")
        _require(c.warm_start.steps >= 0, "warm_start.steps", f"must be >= 0, got {c.warm_start.steps}")
        if c.warm_start.steps > 0:
            from cua_jax.envs.miniwob_oracle import ORACLE_TASKS

            _require(c.env.include_dom_text, "warm_start.steps",
                     "the warm start's oracle reads the page as DOM text: set env.include_dom_text = True")
            unsolved = [task for task in c.env.tasks if task not in ORACLE_TASKS]
            _require(not unsolved, "warm_start.steps",
                     f"the oracle has no demonstrations for {unsolved} (it solves {sorted(ORACLE_TASKS)})")
            _require(c.warm_start.demos_per_task >= 1, "warm_start.demos_per_task",
                     f"must be >= 1, got {c.warm_start.demos_per_task}")
            _require(c.warm_start.demos_per_task <= c.env.train_seed_max, "warm_start.demos_per_task",
                     f"{c.warm_start.demos_per_task} demonstration seeds do not fit in the training seeds "
                     f"[0, {c.env.train_seed_max})")
            _require(c.warm_start.concurrency >= 1, "warm_start.concurrency",
                     f"must be >= 1, got {c.warm_start.concurrency}")
            _require(c.warm_start.held_out_seeds >= 0, "warm_start.held_out_seeds",
                     f"must be >= 0, got {c.warm_start.held_out_seeds}")
        _require(0 < c.eval.confidence < 1, "eval.confidence", f"must lie in (0, 1), got {c.eval.confidence}")
        _require(c.model.num_layers >= 0, "model.num_layers", f"must be >= 0, got {c.model.num_layers}")
        _require(c.model.name in POLICIES, "model.name", f"{c.model.name!r} is not a known policy {POLICIES}")
        from cua_jax.models.configs import MODEL_DTYPES

        for name in ("param_dtype", "compute_dtype"):
            _require(c.model[name] in MODEL_DTYPES, f"model.{name}", f"{c.model[name]!r} is not one of {tuple(MODEL_DTYPES)}")
        _require(isinstance(c.model.remat, bool), "model.remat", f"must be True or False, got {c.model.remat!r}")
        if c.model.name in LOADED_POLICIES:
            _require(bool(c.model.init_from), "model.init_from",
                     f"model.name {c.model.name!r} loads a Hugging Face directory: set model.init_from")
            _require(c.model.num_layers == 0, "model.num_layers", "a loaded checkpoint keeps its own layers; leave it 0")
        else:
            _require(not c.model.init_from, "model.init_from",
                     f"model.name {c.model.name!r} is a random init; set model.name to one of {LOADED_POLICIES} "
                     "to load a checkpoint")
        for name in ("num_seeds", "group_size", "concurrent_groups"):
            _require(c.eval[name] >= 1, f"eval.{name}", f"must be >= 1, got {c.eval[name]}")

        loss = build("loss", PolicyLossConfig, **{
            **c.loss.to_dict(),
            "dual_clip_c": c.loss.dual_clip_c or None,
            "fixed_denominator": c.loss.fixed_denominator or None,
        })
        optimizer = build("optimizer", OptimizerConfig, **{**c.optimizer.to_dict(), "max_grad_norm": c.optimizer.max_grad_norm or None})
        learner = build("learner", LearnerConfig, optimizer=optimizer, loss=loss, old_logprobs=c.learner.old_logprobs,
                        freeze_vision=c.learner.freeze_vision, temperature=c.rollout.temperature or 1.0,
                        seq_chunk=c.learner.seq_chunk, vocab_chunk=c.learner.vocab_chunk)
        batching = build("learner", BatchingConfig, rows=c.learner.rows, length_multiple=c.learner.length_multiple,
                         max_length=c.learner.max_length or None)
        advantage = build("advantage", AdvantageConfig, estimator=c.advantage.estimator, std_eps=c.advantage.std_eps,
                          no_verdict_reward=c.advantage.no_verdict_reward)
        # Budgets and sampling both loops share; turns, context and sampling have eval's own fields.
        shared = dict(max_new_tokens=c.rollout.max_new_tokens, no_verdict_reward=c.advantage.no_verdict_reward,
                      batch_wait_s=c.rollout.batch_wait_s or None,
                      max_response_tokens=c.rollout.max_response_tokens or None,
                      max_observation_tokens=c.rollout.max_observation_tokens or None,
                      prompt_style=c.rollout.prompt_style, action_space=c.env.action_space)
        agent = build("rollout", AgentConfig, max_turns=c.rollout.max_turns,
                      max_context_tokens=c.rollout.max_context_tokens, temperature=c.rollout.temperature,
                      top_p=c.rollout.top_p, top_k=c.rollout.top_k, **shared)
        eval_agent = build("eval", AgentConfig, max_turns=c.eval.max_turns,
                           max_context_tokens=c.eval.max_context_tokens, temperature=c.eval.temperature,
                           top_p=c.eval.top_p, top_k=c.eval.top_k, seed_per_turn=c.eval.seed_per_turn,
                           seed=c.seed if c.eval.seed_per_turn else None, **shared)
        mesh = build("mesh", MeshConfig, data=c.mesh.data, fsdp=c.mesh.fsdp, tensor=c.mesh.tensor)
        s = c.sampler
        sampler_configs = {
            "uniform": build("sampler", UniformConfig, ema_alpha=s.ema_alpha),
            "frontier": build("sampler", FrontierConfig, ema_alpha=s.ema_alpha, mu=s.mu, sigma=s.sigma, gamma=s.gamma,
                              pool_factor=s.pool_factor, unknown_pass_rate=s.unknown_pass_rate),
            "dtac": build("sampler", DTACConfig, ema_alpha=s.ema_alpha, p_low=s.p_low, p_high=s.p_high,
                          max_replays_per_trajectory=s.max_replays_per_trajectory,
                          replay_cache_size=s.replay_cache_size, rho_inf=s.rho_inf,
                          unknown_pass_rate=s.unknown_pass_rate),
        }
        _require(s.kind in sampler_configs, "sampler.kind", f"{s.kind!r} is not one of {sorted(sampler_configs)}")
        calibration = None
        if s.calibration:
            calibration = build("sampler", CalibrationConfig, p_min=s.p_min, p_max=s.p_max, pilot=s.pilot,
                                pilot_group_size=s.pilot_group_size, every_k_steps=s.calibrate_every,
                                sample_size=s.calibration_sample_size, group_size=s.calibration_group_size)
        dynamic = None
        if c.train.dapo:
            dynamic = build("train", DynamicSamplingConfig, max_rounds=c.train.dapo_max_rounds,
                            oversample=c.train.dapo_oversample)
        warm_start = None
        if c.warm_start.steps > 0:
            from cua_jax.train.warm_start import WarmStartConfig

            warm_start = build("warm_start", WarmStartConfig, steps=c.warm_start.steps, rows=c.warm_start.rows,
                               learning_rate=c.warm_start.learning_rate, warmup_steps=c.warm_start.warmup_steps,
                               schedule=c.warm_start.schedule, min_lr_ratio=c.warm_start.min_lr_ratio,
                               length_multiple=c.learner.length_multiple, seed=c.seed,
                               seq_chunk=c.learner.seq_chunk, vocab_chunk=c.learner.vocab_chunk)
        options = {name: c.context[name] for name in SEGMENTER_OPTIONS[c.context.segmenter]}
        return cls(config, learner, batching, advantage, agent, eval_agent, mesh, s.kind,
                   {s.kind: sampler_configs[s.kind]}, calibration, dynamic, options, warm_start)


# ---------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial success rate.

    Args: successes, trials (>= 0 ints, successes <= trials); confidence in (0, 1).
    Returns (low, high) in [0, 1]; (0, 1) when trials == 0.
    """
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"wilson_interval: need 0 <= successes <= trials, got {successes} / {trials}")
    if trials == 0:
        return 0.0, 1.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # The interval always holds p; clamping removes rounding at the ends (k = 0 or k = n).
    return min(max(0.0, centre - half), p), max(min(1.0, centre + half), p)


def difference_interval(successes_a: int, trials_a: int, successes_b: int, trials_b: int,
                        confidence: float = 0.95) -> tuple[float, float, float]:
    """The difference of two independent binomial success rates, p_b - p_a, with Newcombe's
    hybrid score interval (Newcombe 1998, method 10: built from each rate's Wilson interval).

    Returns (difference, low, high) in [-1, 1]. The interval excludes 0 when the two rates
    differ at the given confidence. Applied to before / after evaluations on the same seeds it
    ignores the pairing; `paired_difference_interval` uses it.
    """
    p_a = successes_a / trials_a if trials_a else 0.0
    p_b = successes_b / trials_b if trials_b else 0.0
    low_a, high_a = wilson_interval(successes_a, trials_a, confidence)
    low_b, high_b = wilson_interval(successes_b, trials_b, confidence)
    difference = p_b - p_a
    low = difference - math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2)
    high = difference + math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2)
    return difference, max(-1.0, low), min(1.0, high)


def draw_group_seeds(key: jax.Array, count: int, train_seeds: Sequence[int], train_seed_max: int) -> list[int]:
    """Problem seeds of `count` training groups: uniformly from `train_seeds` when given
    (fixed pages), else from [0, train_seed_max)."""
    fixed = tuple(int(seed) for seed in train_seeds)
    if fixed:
        return [fixed[int(i)] for i in np.asarray(jax.random.randint(key, (count,), 0, len(fixed)))]
    return [int(x) for x in np.asarray(jax.random.randint(key, (count,), 0, train_seed_max))]


def task_pool(tasks: Sequence[str], tiers: Sequence[int], drop_hardest_tier: bool) -> list[tuple[str, int]]:
    """(task, tier) of a run's task pool: `tasks` with their tiers, less the hardest tier
    (when above 0) if `drop_hardest_tier`."""
    top = max(tiers, default=0)
    return [(task, int(tier)) for task, tier in zip(tasks, tiers) if not (drop_hardest_tier and tier == top and top > 0)]


def paired_difference_interval(both: int, first_only: int, second_only: int, neither: int,
                               confidence: float = 0.95) -> tuple[float, float, float]:
    """The difference of two success rates measured on the same units (before / after on the
    same held-out seeds), p_second - p_first, with Newcombe's square-and-add interval for
    paired data (Newcombe 1998, "Improved confidence intervals for the difference between
    binomial proportions based on paired data", method 10).

    The four counts are the 2x2 table of (first, second) outcomes per unit: both succeeded,
    only the first, only the second, neither. Each rate's Wilson interval is combined with the
    estimated correlation phi of the two outcomes (shrunk towards 0 by N/2 when positive, as in
    the method), so outcomes that agree across the pair narrow the interval.

    Returns (difference, low, high) in [-1, 1].
    """
    counts = (both, first_only, second_only, neither)
    if min(counts) < 0:
        raise ValueError(f"paired counts must be non-negative, got {counts}")
    n = sum(counts)
    if n == 0:
        return 0.0, -1.0, 1.0
    first, second = both + first_only, both + second_only
    p_first, p_second = first / n, second / n
    low_first, high_first = wilson_interval(first, n, confidence)
    low_second, high_second = wilson_interval(second, n, confidence)
    margins = first * (n - first) * second * (n - second)
    agreement = both * neither - first_only * second_only
    if margins == 0 or 0 <= agreement <= n / 2:
        phi = 0.0
    elif agreement > n / 2:
        phi = (agreement - n / 2) / math.sqrt(margins)
    else:
        phi = agreement / math.sqrt(margins)
    difference = p_second - p_first

    def half_width(down_second: float, up_first: float) -> float:
        return math.sqrt(max(down_second**2 + up_first**2 - 2 * phi * down_second * up_first, 0.0))

    low = difference - half_width(p_second - low_second, high_first - p_first)
    high = difference + half_width(high_second - p_second, p_first - low_first)
    return difference, max(-1.0, low), min(1.0, high)


def quarantine_kind(reason: str | None) -> str:
    """The metric name of a quarantine reason: its FaultKind (the text before ':'), slugged."""
    head = (reason or "").split(":", 1)[0].strip()
    for kind in FaultKind:
        if head == kind.value:
            return kind.name.lower()
    return "other"


@dataclasses.dataclass
class CollectedGroup(RolloutGroup):
    """A rollout group plus the training items of each episode (by episode id)."""

    items: dict[str, list[TrainingItem]] = dataclasses.field(default_factory=dict)
    replayed: bool = False


def _content_key(rollout: Rollout) -> tuple:
    episode = rollout.episode
    return (episode.status.value, episode.reward, tuple(t.response_ids.tobytes() for t in episode.turns),
            episode.quarantine_reason or "")


def group_from_rollouts(group_id: int, task_id: str, rollouts: Sequence[Rollout]) -> CollectedGroup:
    """The group of `rollouts`, its episodes in a canonical order (by content).

    The episodes of a group are exchangeable (same task, same seed); which environment got
    which sample depends on arrival order at the engine, so ordering by content makes the
    batch, and the run, a function of the samples alone. An episode that sampled nothing
    (quarantined at reset) takes the newest version of its group, so it never makes the
    group look stale.
    """
    rollouts = sorted(rollouts, key=_content_key)
    versions = [r.episode.policy_version for r in rollouts if r.episode.turns]
    for r in rollouts:
        if not r.episode.turns and versions:
            r.episode.policy_version = max(versions)
    return CollectedGroup(group_id, task_id, [r.episode for r in rollouts],
                          items={r.episode.episode_id: list(r.items) for r in rollouts})


def group_outcome(group: CollectedGroup, keep_success: bool) -> GroupOutcome:
    """The sampler's view of a group: quarantined episodes are not attempts (CANOPY App. G)."""
    scored = [e for e in group.episodes if e.status is not EpisodeStatus.QUARANTINED]
    winners = [e for e in scored if e.status is EpisodeStatus.SUCCESS]
    trajectory = None
    if keep_success and winners:
        trajectory = Rollout(winners[0], group.items[winners[0].episode_id])
    return GroupOutcome(group.task_id, len(winners), len(scored), success_trajectory=trajectory)


def swap_in_replay(group: CollectedGroup, replay: Rollout) -> None:
    """Puts a cached success in place of the group's last failed episode (DTAC positive replay).

    The replayed episode is renamed into the group (ids `<task>/g<group>/replay`), so its items
    join the group's statistics and its mini-batch like the group's own episodes.
    """
    failed = [i for i, e in enumerate(group.episodes) if e.status is not EpisodeStatus.SUCCESS
              and e.status is not EpisodeStatus.QUARANTINED]
    if not failed:
        return
    slot = failed[-1]
    old = group.episodes[slot]
    episode = copy.copy(replay.episode)
    episode.episode_id = f"{group.task_id}/g{group.group_id}/replay"
    episode.group_id = group.group_id
    episode.policy_version = old.policy_version  # a replay is as fresh as the group it joins
    group.items.pop(old.episode_id, None)
    group.items[episode.episode_id] = [
        dataclasses.replace(item, episode_id=episode.episode_id, group_id=group.group_id) for item in replay.items
    ]
    group.episodes[slot] = episode
    group.replayed = True


@dataclasses.dataclass
class PreparedBatch:
    """A rollout batch after quarantine and advantages, ready for the learner.

    items / item_advantages: aligned, quarantined episodes' items already dropped.
    minibatch_groups: the group ids of each mini-batch (whole groups).
    metrics: episode / group statistics of the batch.
    """

    items: list[TrainingItem]
    item_advantages: np.ndarray
    episodes: dict[str, Episode]
    minibatch_groups: list[list[int]]
    kept_groups: dict[int, list[str]]  # group id -> ids of its episodes left after quarantine
    quarantined: dict[str, str]  # episode id -> quarantine reason
    metrics: dict[str, float]


def prepare_batch(groups: Sequence[CollectedGroup], settings: TrainSettings, num_minibatches: int,
                  version: int) -> PreparedBatch:
    """Quarantine, advantages over the whole batch, item advantages, and the mini-batch plan."""
    metrics: dict[str, float] = collections.Counter()
    episodes, group_index, kept_groups, quarantined = [], [], {}, {}
    for g, group in enumerate(groups):
        kept_groups[group.group_id] = []
        for episode in group.episodes:
            if episode.status is EpisodeStatus.QUARANTINED:
                metrics[f"quarantine/{quarantine_kind(episode.quarantine_reason)}"] += 1
                metrics["quarantine/total"] += 1
                quarantined[episode.episode_id] = episode.quarantine_reason or ""
                continue
            episodes.append(episode)
            group_index.append(g)
            kept_groups[group.group_id].append(episode.episode_id)
    num_groups = len(groups)
    metrics = dict(metrics)
    metrics.setdefault("quarantine/total", 0.0)
    metrics["episodes/total"] = float(sum(len(g.episodes) for g in groups))
    metrics["episodes/trained"] = float(len(episodes))
    metrics["groups/total"] = float(num_groups)
    metrics["groups/replayed"] = float(sum(g.replayed for g in groups))
    if not episodes:
        return PreparedBatch([], np.zeros(0, np.float32), {}, [], kept_groups, quarantined, metrics)

    rewards = np.asarray([e.reward for e in episodes], np.float32)
    status = np.asarray([STATUS_CODES[e.status] for e in episodes], np.int32)
    group_ids = np.asarray(group_index, np.int32)
    advantages = np.asarray(episode_advantages(rewards, status, group_ids, num_groups, settings.advantage))
    success = np.asarray([e.status is EpisodeStatus.SUCCESS for e in episodes])
    coverage = group_outcome_stats(success, group_ids, num_groups)
    scored = np.asarray(score_terminal_rewards(rewards, status, settings.advantage.no_verdict_reward))

    items, item_episode = [], []
    for e, episode in enumerate(episodes):
        for item in groups[group_index[e]].items[episode.episode_id]:
            items.append(item)
            item_episode.append(e)
    item_episode = np.asarray(item_episode, np.int32)
    spread = stepo_item_advantages if settings.config.advantage.item_advantages == "stepo" else broadcast_to_items
    item_advantages = np.asarray(spread(advantages, item_episode), np.float32) if items else np.zeros(0, np.float32)

    lags = [version - e.policy_version for e in episodes]
    metrics.update({
        "reward/mean": float(scored.mean()),
        "success/rate": float(success.mean()),
        "advantage/abs_mean": float(np.abs(advantages).mean()),
        "groups/informative_fraction": float(coverage.informative_fraction),
        "groups/all_pass_fraction": float(coverage.all_success_fraction),
        "groups/all_fail_fraction": float(coverage.all_fail_fraction),
        "episode/turns": float(np.mean([e.num_turns for e in episodes])),
        "episode/response_tokens": float(np.mean([e.info.get("response_tokens", 0) for e in episodes])),
        "episode/items": float(len(items) / len(episodes)),
        "episode/no_verdict_fraction": float(np.mean(status == STATUS_CODES[EpisodeStatus.NO_VERDICT])),
        "episode/invalid_actions": float(np.mean([e.info.get("invalid_actions", 0) for e in episodes])),
        "policy/lag_mean": float(np.mean(lags)),
        "policy/lag_max": float(np.max(lags)),
        "batch/items": float(len(items)),
    })
    plan: list[list[int]] = []
    if items:
        order = group_order(items)
        ids_in_order = [items[g[0]].group_id for g in order]
        usable = min(num_minibatches, len(order))
        plan = [[ids_in_order[k] for k in mb] for mb in whole_group_minibatches([len(g) for g in order], usable)]
    return PreparedBatch(items, item_advantages, {e.episode_id: e for e in episodes}, plan, kept_groups, quarantined,
                         metrics)


def mean_metrics(records: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each metric over the updates of a step (extrema: min / max; a p99 takes the
    largest, as the learner merges micro-batches)."""
    out: dict[str, float] = {}
    for key in records[0]:
        values = [r[key] for r in records]
        largest = key.endswith(("_max", "_p99"))
        out[key] = min(values) if key.endswith("_min") else max(values) if largest else float(np.mean(values))
    return out


# ---------------------------------------------------------------------------------------
# Rollout workers (cua_jax.rollout.rollout_worker: in-process, or one Ray actor each)
# ---------------------------------------------------------------------------------------

WORKER_BACKENDS = ("local", "ray")
RolloutWorkers = list[RolloutWorker] | list[RemoteRolloutWorker]


# Random inits (the shipped tokenizer) and Hugging Face checkpoints (model.init_from).
LOADED_POLICIES = ("qwen3_vl", "qwen3")
POLICIES = ("tiny_qwen3_vl", "tiny_qwen3") + LOADED_POLICIES
TEXT_POLICIES = ("tiny_qwen3", "qwen3")
OBSERVATIONS = ("screenshot", "text")


def tokenizer_dir(config) -> str | None:
    """Where the run's tokenizer and image processor come from: model.tokenizer_dir, else the
    checkpoint in model.init_from, else None (the shipped tiny pair)."""
    return config.model.tokenizer_dir or config.model.init_from or None


def build_policy(settings: TrainSettings, seed: int):
    """The policy model a config names: a random init of the tiny Qwen3-VL or Qwen3, or the
    Qwen3-VL / Qwen3 checkpoint in model.init_from (`cua_jax.models.hf_policy.load_policy`)."""
    from flax import nnx

    from cua_jax.models.hf_policy import load_policy
    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

    model = settings.config.model
    precision = dict(dtype=model.compute_dtype, param_dtype=model.param_dtype, remat=model.remat)
    if model.name in LOADED_POLICIES:
        return load_policy(model.init_from, **precision)[0]
    if model.name == "tiny_qwen3":
        from cua_jax.context.tokenizer import VOCAB_SIZE
        from cua_jax.models.configs import tiny_qwen3_config
        from cua_jax.models.qwen3 import Qwen3ForCausalLM

        overrides = {"num_hidden_layers": model.num_layers} if model.num_layers else {}
        return Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=VOCAB_SIZE, **overrides, **precision), rngs=nnx.Rngs(seed))
    overrides = {"num_hidden_layers": model.num_layers} if model.num_layers else {}
    return Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(**overrides, **precision), rngs=nnx.Rngs(seed))


def check_init_from(config) -> None:
    """Raise ConfigError naming model.init_from unless it holds a checkpoint of the kind
    model.name says (`cua_jax.models.hf_policy.check_policy_directory`: config, shards,
    architecture, a tokenizer that fits the vocabulary)."""
    from cua_jax.models.hf_policy import check_policy_directory

    where = f"config.model.init_from: {config.model.init_from!r}"
    try:
        found = check_policy_directory(config.model.init_from)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from None
    if found.kind != config.model.name:
        raise ConfigError(f"{where} holds a {found.architecture} ({found.kind!r}), but model.name is "
                          f"{config.model.name!r}")


def load_run_processor(config):
    """The run's (tokenizer, image processor) (`tokenizer_dir`), with model.init_from checked
    first when the policy is loaded from it: a checkpoint whose vocabulary holds the tokenizer's."""
    from cua_jax.models.hf_policy import token_id_bound

    if config.model.name in LOADED_POLICIES:
        check_init_from(config)
    tokenizer, image_processor = load_processor(tokenizer_dir(config))
    if config.model.name in LOADED_POLICIES and config.model.tokenizer_dir:
        from cua_jax.models.hf_policy import check_policy_directory

        vocab = check_policy_directory(config.model.init_from).vocab_size
        if token_id_bound(tokenizer) > vocab:
            raise ConfigError(f"config.model.tokenizer_dir: {config.model.tokenizer_dir!r}: its tokenizer's ids reach "
                              f"{token_id_bound(tokenizer)}, past model.init_from's vocabulary ({vocab})")
    return tokenizer, image_processor


def rollout_worker_config(settings: TrainSettings, worker: int) -> RolloutWorkerConfig:
    """Worker `worker`'s agent loops, segmenter and capsules, as the run's config names them.

    The engine is served in canonical request order: the JAX sampler draws row r of a batch
    from key split r, so this makes a resumed run sample what the uninterrupted one did."""
    c = settings.config
    return RolloutWorkerConfig(
        agent=settings.agent, eval_agent=settings.eval_agent, segmenter=c.context.segmenter,
        segmenter_options=tuple(sorted(settings.segmenter_options.items())),
        tokenizer_dir=tokenizer_dir(c), include_dom_text=c.env.include_dom_text,
        screenshots=c.env.observation == "screenshot", time_limit_s=c.env.time_limit_s, runtime_seed=c.seed * 1000 + worker, canonical_order=True,
    )


ENGINE_MODEL_DIR = "engine_model"  # under the workdir: the policy as the vLLM engines load it


def export_engine_model(policy, workdir: str, tokenizer, image_processor) -> str:
    """Writes the policy, with the run's tokenizer, chat template and image processor, as the
    Hugging Face directory the vLLM engines start from (<workdir>/engine_model); later
    policy versions reach them by weight sync."""
    from cua_jax.models.hf_policy import export_policy

    directory = os.path.join(workdir, ENGINE_MODEL_DIR)
    export_policy(policy, directory, tokenizer=tokenizer, image_processor=image_processor)
    return directory


@dataclasses.dataclass(frozen=True)
class VllmRouterFactory:
    """Builds one rollout worker's engine: a `Router` over rollout.vllm.engines vLLM engines,
    each in a Ray actor of its own, serving `model_dir` (Ray must be running)."""

    model_dir: str
    engine: Any  # cua_jax.rollout.vllm_engine.VllmEngineConfig
    router: Any  # cua_jax.rollout.workers.RouterConfig

    def __call__(self):
        from cua_jax.rollout.vllm_engine import VllmEngineFactory
        from cua_jax.rollout.workers import Router, vllm_host_weights

        return Router(VllmEngineFactory(self.engine), self.router, host_weights=vllm_host_weights(self.model_dir))


def vllm_router_factory(settings: TrainSettings, model_dir: str, multimodal: bool, worker: int,
                        banned_token_ids: tuple[int, ...] = ()) -> VllmRouterFactory:
    """Worker `worker`'s `VllmRouterFactory`, as config.rollout.vllm names it; its engines never
    sample `banned_token_ids`."""
    from cua_jax.rollout.vllm_engine import VllmEngineConfig
    from cua_jax.rollout.workers import RouterConfig

    from cua_jax.models.checkpoint import read_hf_config

    c = settings.config
    v = c.rollout.vllm
    hf = read_hf_config(model_dir)
    positions = (hf.get("text_config") or hf).get("max_position_embeddings")
    contexts = {"rollout.max_context_tokens": c.rollout.max_context_tokens}
    if c.eval.enabled:
        contexts["eval.max_context_tokens"] = c.eval.max_context_tokens
    for field, tokens in contexts.items():
        # vLLM refuses a longer context than the model's positions.
        _require(positions is None or tokens <= positions, field,
                 f"{tokens} tokens exceed the policy's max_position_embeddings ({positions}), vLLM's longest context")
    engine = VllmEngineConfig(
        model_dir, dtype=v.dtype, max_model_len=max(contexts.values()),
        kv_cache_bytes=int(v.kv_cache_mb) * 2**20 or None, gpu_memory_utilization=v.gpu_memory_utilization,
        seed=c.seed * 1000 + worker, max_num_seqs=v.max_num_seqs, banned_token_ids=tuple(banned_token_ids),
        # A prompt never holds more screenshots than an episode has turns.
        limit_images_per_prompt=max(c.rollout.max_turns, c.eval.max_turns) if multimodal else 0,
    )
    threads = str(int(v.threads))
    router = RouterConfig(
        num_engines=v.engines, cpus_per_engine=v.cpus_per_engine, gpus_per_engine=v.gpus_per_engine,
        max_retries=v.max_retries,
        env_vars=(("OMP_NUM_THREADS", threads), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                  ("JAX_PLATFORMS", "cpu"), ("TOKENIZERS_PARALLELISM", "false"), ("VLLM_LOGGING_LEVEL", v.log_level)),
    )
    return VllmRouterFactory(model_dir, engine, router)


def ray_cpus_needed(config) -> float:
    """Logical CPUs the run's Ray actors reserve (0: the run needs no Ray)."""
    c = config
    if c.rollout.engine == "vllm":
        return c.rollout.num_workers * c.rollout.vllm.engines * c.rollout.vllm.cpus_per_engine
    if c.rollout.worker_backend == "ray":
        return c.rollout.num_workers * c.rollout.worker_cpus
    return 0.0


def build_rollout_workers(settings: TrainSettings, policy, pad_id: int, env_wrapper: EnvWrapper | None,
                          banned_token_ids: tuple[int, ...] = (), engine_model_dir: str | None = None) -> RolloutWorkers:
    """config.rollout.num_workers workers. With rollout.engine "jax", each holds a JAX sampler
    engine with a copy of `policy` (seeded c.seed * 1000 + worker) that never samples
    `banned_token_ids`: in this process ("local"), or each in a Ray actor ("ray") that builds
    its engine from the policy's parameters as host arrays. With "vllm", each (in this process)
    routes its generations to vLLM engines in Ray actors serving `engine_model_dir`
    (`export_engine_model`). Ray must be running for both: `ensure_local_ray`."""
    from flax import nnx

    c = settings.config
    if c.rollout.engine == "vllm":
        if engine_model_dir is None:
            raise ValueError("rollout.engine 'vllm' needs the exported engine model directory")
        multimodal = hasattr(policy, "encode_images") and c.env.observation == "screenshot"
        specs = [(vllm_router_factory(settings, engine_model_dir, multimodal, w, banned_token_ids),
                  rollout_worker_config(settings, w))
                 for w in range(c.rollout.num_workers)]
        return _local_workers(specs, env_wrapper)
    remote = c.rollout.worker_backend == "ray"
    state = nnx.state(policy)
    params = jax.tree.map(np.asarray, state) if remote else state  # the local factory copies it
    specs = [
        (JaxEngineFactory(type(policy), policy.config, params, seed=c.seed * 1000 + w, pad_id=pad_id,
                          tokenizer_dir=tokenizer_dir(c), banned_token_ids=banned_token_ids),
         rollout_worker_config(settings, w))
        for w in range(c.rollout.num_workers)
    ]
    if remote:
        return start_remote_workers(specs, env_wrapper, num_cpus=c.rollout.worker_cpus)
    return _local_workers(specs, env_wrapper)


def _local_workers(specs, env_wrapper: EnvWrapper | None) -> list[RolloutWorker]:
    workers: list[RolloutWorker] = []
    try:
        for factory, worker_config in specs:
            workers.append(RolloutWorker(factory, worker_config, env_wrapper))
    except BaseException:
        for worker in workers:
            worker.shutdown()
        raise
    return workers


# ---------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------


class Trainer:
    """Online RL of a computer-use policy on MiniWoB++ capsules (see the module doc).

    config: an ml_collections.ConfigDict of experiments/configs/base.py's shape.
    env_wrapper: wraps every environment (fault injection, added latency).
    """

    def __init__(self, config, *, env_wrapper: EnvWrapper | None = None):

        self.settings = TrainSettings.from_config(config)
        self.config = config
        c = config
        self.workdir = c.workdir
        os.makedirs(self.workdir, exist_ok=True)
        self.base_key = jax.random.key(c.seed)
        self.tokenizer, self.image_processor = load_run_processor(c)
        self.renderer = ChatRenderer(self.tokenizer, self.image_processor)
        self.segmenter = make_segmenter(c.context.segmenter, self.renderer, **self.settings.segmenter_options)
        # Vision placeholders can never be part of a reply: the engines never sample them and the
        # learner scores under the same renormalised distribution (no rollout / learner gap).
        self.banned_token_ids = reserved_token_ids(self.renderer)
        self.settings = dataclasses.replace(
            self.settings, learner=dataclasses.replace(self.settings.learner, banned_token_ids=self.banned_token_ids))

        policy = build_policy(self.settings, c.seed)
        self.checkpointer = TrainCheckpointer(os.path.join(self.workdir, "checkpoints"), keep=c.train.keep_checkpoints)
        # The warm start runs before anything copies the policy (learner, KL reference, engines);
        # a workdir with checkpoints is a run to resume, whose checkpoint holds its result.
        self.warm_start_metrics: dict[str, float] = {}
        if self.settings.warm_start is not None and self.checkpointer.latest_step() is None:
            self.warm_start_metrics = self._warm_start(policy)
        self.multimodal = MultimodalPositions.of(policy.config) if hasattr(policy, "encode_images") else None
        mesh = make_mesh(self.settings.mesh, devices=jax.devices()[: self._mesh_size()])
        self.learner = Learner(policy, self.settings.learner, mesh=mesh)
        # Whether this trainer started the local Ray its worker actors run on (and so stops it).
        self._owns_ray = False
        if ray_cpus_needed(c):
            self._owns_ray = ensure_local_ray(ray_cpus_needed(c), c.rollout.ray_object_store_mb)
        try:
            engine_model_dir = (export_engine_model(policy, self.workdir, self.tokenizer, self.image_processor)
                                if c.rollout.engine == "vllm" else None)
            self.workers: RolloutWorkers = build_rollout_workers(
                self.settings, policy, int(self.tokenizer.pad_token_id or 0), env_wrapper, self.banned_token_ids,
                engine_model_dir)
        except BaseException:
            self._shutdown_ray()
            raise

        tasks = [PoolTask(task, "miniwob", tier, True, {"kind": "miniwob", "task": task})
                 for task, tier in self.training_tasks()]
        self.pool = TaskPool(tasks)
        kind = self.settings.sampler_kind
        self.sampler = build_sampler(kind, self.pool, **{kind: self.settings.sampler_configs[kind]},
                                     calibration=self.settings.calibration,
                                     run_groups=self._run_outcome_groups if self.settings.calibration else None)
        self.eval_tasks = tuple(c.eval.tasks) or tuple(t.task_id for t in tasks)

        self.step = 0  # completed training steps
        self.version = 0  # policy version the engines hold
        self.next_group_id = 0
        self.buffer: RolloutBuffer | None = None
        self.last_batch: PreparedBatch | None = None
        self.last_minibatch_item_counts: list[int] = []
        self.history: list[dict[str, float]] = []
        self.evaluations: dict[str, dict[str, float]] = {}
        # Reentrant: under DAPO, collect() holds it across its rounds, whose group runs take it
        # again for group ids.
        self._sampler_lock = threading.RLock()
        self._rollout_threads: list[threading.Thread] = []
        self._rollout_error: BaseException | None = None
        self._stop = threading.Event()
        self._writer = None
        if self.warm_start_metrics:
            self._log(0, self.warm_start_metrics)

    def training_tasks(self) -> list[tuple[str, int]]:
        """(task, tier) of the run's task pool (`task_pool`)."""
        c = self.config
        return task_pool(c.env.tasks, c.env.task_tiers, c.env.drop_hardest_tier)

    def _warm_start(self, policy) -> dict[str, float]:
        """Supervised fine-tuning of `policy` (in place) on the oracle's demonstrations of the
        training tasks, collected through this run's agent loop and segmenter on a capsule
        runtime of its own. Returns the warm start's metrics; the loss curve goes to
        <workdir>/warm_start.json."""
        from cua_jax.envs.capsules import CapsuleRuntime
        from cua_jax.train.warm_start import (
            collect_demonstrations,
            held_out_report,
            warm_start,
        )

        c = self.config
        tasks = [task for task, _ in self.training_tasks()]
        # The demonstrations' budgets are the larger of training's and evaluation's, so a
        # multi-step oracle episode is not cut short; the token stream is the same either way.
        agent = dataclasses.replace(self.settings.agent, max_turns=max(c.rollout.max_turns, c.eval.max_turns))
        progress, on_step = None, None
        if c.train.progress_bar:
            from tqdm import tqdm

            progress = tqdm(total=c.warm_start.steps, desc=f"{c.name} warm start", unit="step")

            def on_step(step: int, loss: float) -> None:
                progress.update(1)
                progress.set_postfix(nll=f"{loss:.3f}")

        start = time.perf_counter()
        held_out = {}
        try:
            with CapsuleRuntime(include_dom_text=True, action_space=c.env.action_space, seed=c.seed) as runtime:
                result, demonstrations = warm_start(
                    policy, tasks, range(c.warm_start.demos_per_task), runtime=runtime, segmenter=self.segmenter,
                    config=self.settings.warm_start, agent_config=agent, time_limit_s=c.env.time_limit_s,
                    concurrency=c.warm_start.concurrency, on_step=on_step,
                )
                if c.warm_start.held_out_seeds:
                    # Past the evaluation seeds: outside training's range and unseen by "before".
                    first = c.env.eval_seed_start + c.eval.num_seeds
                    unseen = collect_demonstrations(
                        tasks, range(first, first + c.warm_start.held_out_seeds), runtime=runtime,
                        segmenter=self.segmenter, agent_config=agent, time_limit_s=c.env.time_limit_s,
                        concurrency=c.warm_start.concurrency)
                    if unseen.rollouts:
                        held_out = held_out_report(policy, demonstrations, unseen, self.renderer, self.settings.warm_start)
        finally:
            if progress is not None:
                progress.close()
        wall = time.perf_counter() - start
        record = {"losses": result.losses, "demonstrations": len(demonstrations.rollouts),
                  "items": len(demonstrations.items), "response_tokens": demonstrations.num_response_tokens,
                  "rejected": demonstrations.rejected, "oracle_errors": demonstrations.oracle_errors,
                  "sft_seconds": result.seconds, "wall_seconds": wall, "compiled_shapes": result.compiled_shapes,
                  **held_out}
        with open(os.path.join(self.workdir, "warm_start.json"), "w") as f:
            json.dump(record, f, indent=2)
        tail = result.losses[-10:]
        return {
            "warm_start/demonstrations": float(len(demonstrations.rollouts)),
            "warm_start/rejected": float(len(demonstrations.rejected)),
            "warm_start/items": float(len(demonstrations.items)),
            "warm_start/loss_first": result.losses[0],
            "warm_start/loss_last10": float(np.mean(tail)),
            **{f"warm_start/{name}": value for name, value in held_out.items()},
            TIMING_PREFIX + "warm_start_s": wall,
        }

    def _mesh_size(self) -> int:
        m = self.settings.mesh
        return max(1, m.data) * max(1, m.fsdp) * max(1, m.tensor)

    # -- metrics --------------------------------------------------------------------------

    @property
    def writer(self):
        if self._writer is None:
            from cua_jax.observe.metrics import MetricWriter

            self._writer = MetricWriter(self.workdir)
        return self._writer

    def _log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.writer.write(step, metrics)
        self.writer.flush()

    # -- rollouts -------------------------------------------------------------------------

    def _group_seeds(self, key: jax.Array, count: int) -> list[int]:
        return draw_group_seeds(key, count, self.config.env.train_seeds, self.config.env.train_seed_max)

    def _run_groups(self, worker: RolloutWorker | RemoteRolloutWorker, task_ids: Sequence[str], key: jax.Array) -> list[CollectedGroup]:
        with self._sampler_lock:
            first = self.next_group_id
            self.next_group_id += len(task_ids)
        requests = [(task_id, seed, first + k) for k, (task_id, seed)
                    in enumerate(zip(task_ids, self._group_seeds(key, len(task_ids))))]
        results = worker.run_groups(requests, self.config.rollout.group_size)
        return [group_from_rollouts(gid, task_id, rollouts) for (task_id, _, gid), rollouts in zip(requests, results)]

    def _run_outcome_groups(self, task_ids: Sequence[str], group_size: int) -> list[GroupOutcome]:
        """Calibration's rollouts (`RunGroups`): groups of `group_size`, outcomes only."""
        key = jax.random.fold_in(jax.random.fold_in(self.base_key, 1_000_003), self.sampler.step)
        requests = [(task_id, seed, -1 - k) for k, (task_id, seed)
                    in enumerate(zip(task_ids, self._group_seeds(key, len(task_ids))))]
        results = self.workers[0].run_groups(requests, group_size)
        return [group_outcome(group_from_rollouts(gid, task_id, rollouts), keep_success=False)
                for (task_id, _, gid), rollouts in zip(requests, results)]

    def collect(self, step: int, worker: RolloutWorker | RemoteRolloutWorker | None = None) -> tuple[list[CollectedGroup], dict[str, float]]:
        """One step's rollout groups: draw, run, replay; the sampler's statistics are updated."""
        worker = worker or self.workers[0]
        key = jax.random.fold_in(self.base_key, step)
        draw_key, seed_key = jax.random.split(key)
        keep_success = self.settings.sampler_kind == "dtac"
        batch_tasks, n = self.config.rollout.batch_tasks, self.config.rollout.group_size
        if self.settings.dynamic is not None:
            ran: dict[str, CollectedGroup] = {}
            rounds = [0]

            def run_groups(task_ids, group_size):
                rounds[0] += 1
                groups = self._run_groups(worker, task_ids, jax.random.fold_in(seed_key, rounds[0]))
                ran.update({g.task_id: g for g in groups})
                return [group_outcome(g, keep_success) for g in groups]

            with self._sampler_lock:
                dynamic = collect_informative_groups(draw_key, self.sampler, run_groups, batch_tasks, n, self.settings.dynamic)
            groups = [ran[o.task_id] for o in dynamic.groups]
            for replay in dynamic.replays:
                swap_in_replay(groups[replay.group_index], replay.trajectory)
            extra = {"dapo/dropped_groups": float(len(dynamic.dropped)), "dapo/rounds": float(dynamic.rounds),
                     "dapo/missing_groups": float(dynamic.missing), "dapo/rollouts": float(dynamic.rollouts)}
            return groups, extra
        with self._sampler_lock:
            task_ids = self.sampler.sample(draw_key, batch_tasks)
        groups = self._run_groups(worker, task_ids, seed_key)
        outcomes = [group_outcome(g, keep_success) for g in groups]
        with self._sampler_lock:
            for replay in self.sampler.assign_replays(outcomes):
                swap_in_replay(groups[replay.group_index], replay.trajectory)
            self.sampler.update(outcomes)
        return groups, {}

    # -- learning -------------------------------------------------------------------------

    def learn(self, groups: Sequence[CollectedGroup]) -> dict[str, float]:
        """Quarantine, advantages, updates on `groups`, then weight sync. Returns the metrics."""
        t0 = time.perf_counter()
        batch = prepare_batch(groups, self.settings, self.config.learner.num_minibatches, self.version)
        self.last_batch = batch
        metrics = dict(batch.metrics)
        if not batch.items:
            metrics["learner/skipped"] = 1.0
            metrics[TIMING_PREFIX + "learn_s"] = time.perf_counter() - t0
            return metrics
        pixel_patches = process_images(batch.items, batch.episodes, self.image_processor)
        minibatches = make_minibatches(batch.items, batch.item_advantages, self.settings.batching,
                                       len(batch.minibatch_groups), pixel_patches=pixel_patches,
                                       multimodal=self.multimodal)
        self.last_minibatch_item_counts = [int(sum(np.asarray(mb.item_valid).sum() for mb in micro)) for micro in minibatches]
        updates = self.learner.train_on_batch(minibatches)
        metrics.update({f"learner/{k}": v for k, v in mean_metrics(updates).items()})
        metrics["learner/updates"] = float(len(updates))
        t1 = time.perf_counter()
        self.sync_weights()
        metrics[TIMING_PREFIX + "learn_s"] = t1 - t0
        metrics[TIMING_PREFIX + "sync_s"] = time.perf_counter() - t1
        return metrics

    def sync_weights(self) -> None:
        """Pushes the learner's parameters to every engine as the next policy version."""
        self.version += 1
        self._push_weights()

    def _push_weights(self) -> None:
        """The learner's parameters to every engine as policy `self.version`: a device copy per
        in-process JAX engine, one host (numpy) copy shared by Ray actors, the state itself to
        vLLM routers (they convert it to host arrays at once)."""
        from flax import nnx

        state = nnx.state(self.learner.model)
        if self.config.rollout.engine == "vllm":
            # The router turns the parameters into host arrays before returning.
            for worker in self.workers:
                worker.update_weights(state, self.version)
            return
        if self.config.rollout.worker_backend == "ray":
            broadcast_weights(self.workers, jax.tree.map(np.asarray, state), self.version)
            return
        for worker in self.workers:
            # A copy per engine: the learner donates its own arrays to the next update.
            worker.update_weights(jax.tree.map(jnp.copy, state), self.version)

    # -- on-policy ------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        """One strictly on-policy step: collect with the current policy, one update, sync."""
        t0 = time.perf_counter()
        groups, extra = self.collect(self.step)
        rollout_s = time.perf_counter() - t0
        metrics = self.learn(groups)
        metrics.update(extra)
        metrics[TIMING_PREFIX + "rollout_s"] = rollout_s
        return self._finish_step(metrics)

    def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        metrics["policy/version"] = float(self.version)
        if self.buffer is not None:
            metrics["buffer/dropped_stale_groups"] = float(self.buffer.dropped_stale_groups)
            metrics["buffer/dropped_stale_episodes"] = float(self.buffer.dropped_stale_episodes)
        self._log(self.step, metrics)
        self.history.append(metrics)
        self.step += 1
        return metrics

    # -- asynchronous ---------------------------------------------------------------------

    def start_rollouts(self) -> None:
        """Starts one rollout thread per worker feeding the buffer (async mode)."""
        c = self.config
        capacity = c.train.buffer_groups or 2 * c.rollout.batch_tasks
        if self.buffer is None:
            self.buffer = RolloutBuffer(c.train.staleness_window, capacity)
        self._stop.clear()
        # Rollout draws take their own step numbers, after every learner step ever taken,
        # so they never reuse a key; a thread's k-th batch uses draw index (worker, k).
        for w, worker in enumerate(self.workers):
            thread = threading.Thread(target=self._rollout_loop, args=(w, worker), daemon=True, name=f"rollout-{w}")
            thread.start()
            self._rollout_threads.append(thread)

    def _rollout_loop(self, w: int, worker: RolloutWorker | RemoteRolloutWorker) -> None:
        draw = 0
        try:
            while not self._stop.is_set():
                step_index = (self.step + draw) * len(self.workers) + w
                draw += 1
                groups, _ = self.collect(step_index, worker)
                for group in groups:
                    while not self._stop.is_set():
                        try:
                            self.buffer.put(group, timeout=0.5)
                            break
                        except TimeoutError:
                            continue
        except RuntimeError as error:
            if not self._stop.is_set():
                self._rollout_error = error
        except BaseException as error:  # noqa: BLE001 - surfaced to the learner thread
            self._rollout_error = error

    def stop_rollouts(self) -> None:
        self._stop.set()
        if self.buffer is not None:
            self.buffer.close()
        for thread in self._rollout_threads:
            thread.join()
        self._rollout_threads = []
        self.buffer = None

    def async_step(self, timeout_s: float = 3600.0) -> dict[str, float]:
        """One learner step of async mode: take fresh whole groups from the buffer, update, sync."""
        if self.buffer is None:
            raise RuntimeError("async_step needs start_rollouts() first")
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        while True:
            if self._rollout_error is not None:
                raise RuntimeError("a rollout thread failed") from self._rollout_error
            try:
                groups = self.buffer.take(self.config.rollout.batch_tasks, self.version, timeout=1.0)
                break
            except TimeoutError:
                if time.perf_counter() > deadline:
                    raise
        wait_s = time.perf_counter() - t0
        metrics = self.learn(groups)
        metrics[TIMING_PREFIX + "rollout_wait_s"] = wait_s
        return self._finish_step(metrics)

    # -- evaluation -----------------------------------------------------------------------

    def evaluate(self, label: str) -> dict[str, float]:
        """Success on held-out seeds of the evaluation tasks, with a Wilson interval; traces saved."""
        c = self.config
        worker = self.workers[0]
        requests = [(task, c.env.eval_seed_start + s, -(1 + t * c.eval.num_seeds + s))
                    for t, task in enumerate(self.eval_tasks) for s in range(c.eval.num_seeds)]
        episodes: list[Episode] = []
        for start in range(0, len(requests), c.eval.concurrent_groups):
            results = worker.run_groups(requests[start:start + c.eval.concurrent_groups], c.eval.group_size, evaluation=True)
            episodes.extend(r.episode for rollouts in results for r in rollouts)
        scored = [e for e in episodes if e.status is not EpisodeStatus.QUARANTINED]
        successes = sum(e.status is EpisodeStatus.SUCCESS for e in scored)
        low, high = wilson_interval(successes, len(scored), c.eval.confidence)
        turns = [t for e in scored for t in e.turns]
        result = {
            "success_rate": successes / max(len(scored), 1), "ci_low": low, "ci_high": high,
            "successes": float(successes),
            "episodes": float(len(scored)), "quarantined": float(len(episodes) - len(scored)),
            "turns": float(np.mean([e.num_turns for e in scored])) if scored else 0.0,
            "valid_action_rate": sum(t.action is not None for t in turns) / max(len(turns), 1),
        }
        for task in self.eval_tasks:
            of_task = [e for e in scored if e.task_id == task]
            result[f"success/{task}"] = sum(e.status is EpisodeStatus.SUCCESS for e in of_task) / max(len(of_task), 1)
        self._log(self.step, {f"eval_{label}/{k}": v for k, v in result.items()})
        # Per-episode outcomes by episode id ("task/g<id>/e<k>": the same ids on the same seeds
        # in every evaluation), for the paired comparison of two evaluations.
        result["outcomes"] = {e.episode_id: int(e.status is EpisodeStatus.SUCCESS) for e in scored}
        self.evaluations[label] = result
        # Traces spread over the evaluation tasks (requests are ordered task by task).
        stride = max(1, len(episodes) // max(c.eval.num_traces, 1))
        save_traces(os.path.join(self.workdir, "traces", label), episodes[::stride][: c.eval.num_traces])
        return result

    def compare_evaluations(self, first: str = "before", second: str = "after") -> dict[str, float] | None:
        """The gain in held-out success from evaluation `first` to `second`, with Newcombe's
        interval for independent samples (`difference_interval`) and, when both evaluations ran
        one episode per held-out seed, the interval paired by seed
        (`paired_difference_interval`, on the episodes scored in both; "gained" / "lost" count
        the seeds that changed outcome). Stored as evaluations["gain"] and logged."""
        if first not in self.evaluations or second not in self.evaluations:
            return None
        a, b = self.evaluations[first], self.evaluations[second]
        confidence = self.config.eval.confidence
        difference, low, high = difference_interval(int(a["successes"]), int(a["episodes"]), int(b["successes"]),
                                                    int(b["episodes"]), confidence)
        gain = {"difference": difference, "ci_low": low, "ci_high": high, "confidence": confidence}
        # Paired by seed: one episode per (task, seed) (eval.group_size 1), scored in both.
        # Episodes of one seed would share its difficulty, so larger groups are not paired.
        if self.config.eval.group_size == 1 and "outcomes" in a and "outcomes" in b:
            common = sorted(set(a["outcomes"]) & set(b["outcomes"]))
            table = collections.Counter((a["outcomes"][k], b["outcomes"][k]) for k in common)
            counts = (table[1, 1], table[1, 0], table[0, 1], table[0, 0])
            paired, paired_low, paired_high = paired_difference_interval(*counts, confidence)
            gain.update({"paired_episodes": float(len(common)), "paired_difference": paired,
                         "paired_ci_low": paired_low, "paired_ci_high": paired_high,
                         "lost": float(counts[1]), "gained": float(counts[2])})
        self.evaluations["gain"] = gain
        self._log(self.step, {f"eval_gain/{k}": v for k, v in gain.items()})
        return gain

    # -- the run --------------------------------------------------------------------------

    def restore(self) -> bool:
        """Loads the latest checkpoint of the workdir, if any. Returns whether one was loaded.

        Metric records of steps after the checkpoint (written before a kill) are removed from
        metrics.jsonl, since those steps run again."""
        restored = self.checkpointer.restore_latest(self.learner.train_state())
        if restored is None:
            return False
        self.load_trainer_state(*restored)
        path = os.path.join(self.workdir, "metrics.jsonl")
        if os.path.exists(path):
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            with open(path) as f:
                lines = [line for line in f if line.strip() and json.loads(line)["step"] < self.step]
            with open(path, "w") as f:
                f.writelines(lines)
        return True

    def save(self) -> None:
        self.checkpointer.save(self.learner.train_state(), self.trainer_state(), self.config.to_dict())

    def trainer_state(self) -> TrainerState:
        """The run's state besides the learner's arrays (what a checkpoint's host_state holds)."""
        return TrainerState(
            base_key=np.asarray(jax.random.key_data(self.base_key)), step=self.step, version=self.version,
            next_group_id=self.next_group_id, engine_sampling=[worker.sampling_state() for worker in self.workers],
            sampler=self.sampler.state_dict(), evaluations=self.evaluations,
        )

    def load_trainer_state(self, train_state: Any, state: TrainerState) -> None:
        """Continues from a checkpoint: the learner's arrays, the counters, the sampler, and the
        engines' weights (pushed at the saved policy version) and sampling state."""
        if not np.array_equal(state.base_key, np.asarray(jax.random.key_data(self.base_key))):
            raise ValueError(f"the checkpoint of step {state.step} was written with another seed; "
                             "resume with the config it was trained with (config.seed)")
        if len(state.engine_sampling) != len(self.workers):
            raise ValueError(f"the checkpoint of step {state.step} has {len(state.engine_sampling)} rollout workers' "
                             f"state, the config asks for {len(self.workers)} (config.rollout.num_workers)")
        self.learner.load_train_state(train_state)
        self.step, self.version, self.next_group_id = state.step, state.version, state.next_group_id
        self.sampler.load_state_dict(state.sampler)
        self.evaluations = state.evaluations
        self._push_weights()
        for worker, sampling in zip(self.workers, state.engine_sampling):
            worker.load_sampling_state(sampling)

    def run(self) -> dict[str, Any]:
        """Evaluate, train config.train.num_steps steps (checkpointing), evaluate, plot."""
        c = self.config
        if c.eval.enabled and "before" not in self.evaluations and self.step == 0:
            self.evaluate("before")
        progress = None
        if c.train.progress_bar:
            from tqdm import tqdm

            progress = tqdm(total=c.train.num_steps, initial=self.step, desc=c.name, unit="step")
        asynchronous = c.train.mode == "async"
        if asynchronous and self.step < c.train.num_steps:
            self.start_rollouts()
        try:
            while self.step < c.train.num_steps:
                metrics = self.async_step() if asynchronous else self.train_step()
                if self.step % c.train.checkpoint_every == 0 or self.step == c.train.num_steps:
                    self.save()
                if progress is not None:
                    progress.update(1)
                    shown = dict(reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                                 success=f"{metrics.get('success/rate', float('nan')):.2f}")
                    if c.rollout.engine == "vllm":
                        # The on-policy check: the engine's logprobs against the learner's.
                        shown["gap_max"] = f"{metrics.get('learner/rollout_logprob_gap_max', float('nan')):.1e}"
                    progress.set_postfix(**shown)
        finally:
            if asynchronous:
                self.stop_rollouts()
            if progress is not None:
                progress.close()
        if c.eval.enabled:
            self.evaluate("after")
            self.compare_evaluations()
        curve = self.plot()
        summary = {"steps": self.step, "evaluations": self.evaluations, "curve": curve,
                   "warm_start": self.warm_start_metrics}
        with open(os.path.join(self.workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        return summary

    def plot(self) -> str | None:
        from cua_jax.observe.plots import plot_curves

        path = self.writer.jsonl_path
        self.writer.flush()
        keys = ["reward/mean", "success/rate", "groups/informative_fraction", "learner/loss", "learner/entropy"]
        return plot_curves(path, keys, os.path.join(self.workdir, "learning_curve.png"), title=self.config.name)

    def close(self) -> None:
        self.stop_rollouts()
        try:
            for worker in self.workers:
                worker.shutdown()
        finally:
            self.workers = []
            self._shutdown_ray()
        self.checkpointer.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _shutdown_ray(self) -> None:
        """Stops the local Ray this trainer started, if it did."""
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save_traces(directory: str, episodes: Sequence[Episode]) -> None:
    """Each episode as <directory>/<k>/turn_<t>.png screenshots plus trace.json (actions, rewards)."""
    from PIL import Image

    for k, episode in enumerate(episodes):
        folder = os.path.join(directory, f"{k:02d}")
        os.makedirs(folder, exist_ok=True)
        turns = []
        for t, turn in enumerate(episode.turns):
            shots = []
            for i, image in enumerate(turn.images):
                name = f"turn_{t:02d}_{i}.png"
                Image.fromarray(np.asarray(image, np.uint8)).save(os.path.join(folder, name))
                shots.append(name)
            turns.append({"screenshots": shots, "observation_text": turn.observation_text,
                          "response": turn.response_text, "action": repr(turn.action),
                          "invalid_action": turn.info.get("invalid_action"), "reward": turn.reward})
        record = {"episode_id": episode.episode_id, "task_id": episode.task_id, "instruction": episode.instruction,
                  "status": episode.status.value, "reward": episode.reward,
                  "quarantine_reason": episode.quarantine_reason, "turns": turns}
        with open(os.path.join(folder, "trace.json"), "w") as f:
            json.dump(record, f, indent=2)
