# Single job: the online RL training step and loop (draws, rollouts, advantages, updates, sync).
"""The online RL trainer: task draws -> rollout groups -> quarantine -> advantages -> updates -> weight sync.

One training step (`Trainer.train_step`):

    groups  = collect(step)                 sampler draws B tasks with key fold_in(base, step);
                                            each task runs a group of n episodes on a rollout
                                            worker (its environments: MiniWoB capsules, Docker
                                            desktops; an engine; the agent loop);
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
             1 and the clip fraction exactly 0 (CANOPY App. C). With num_minibatches = k > 1
             and old_logprobs = "recompute" (or "rollout"), k sequential updates of whole groups
             on the one batch, with no asynchrony: the PPO ratio is live from the second on
             (CANOPY App. D's control).
  async      a rollout thread per worker draws tasks and runs groups continuously, tagging every
             episode with the policy version that produced it, into a `RolloutBuffer`; the
             learner takes whole groups, the buffer drops (and counts) groups older than the
             staleness window, mini-batches hold whole groups; checkpoints hold the buffer and
             the draw accounting, so a resumed run loses no episode and trains none twice.

Multi-host (config.train.coordinated): on_policy, each process collects only its share of a
step's groups (`GroupCollector.collect_share`) and trains on its items as its rows of the global
batch (`Trainer.learn_share`; cua_jax/train/coordinated.py); every process's sampler and metrics
cover all the groups, and process 0 writes the run's records. async, each process's rollout
threads collect its share of every draw into its own buffer, and every step takes each process's
share of the batch once all hold theirs (`RolloutFeeder.take_agreed`), fresh for the global
policy version; each checkpoint keeps every process's own rollout state.

Evaluation runs held-out seeds of the evaluation tasks through the evaluation harness
(`cua_jax.eval`) before the first step, every eval.every_steps steps and after the last.
Traces (PNG + JSON, for `python -m experiments.view`) come from evaluations and, every
train.trace_every steps, from the batch. Metrics go to
`MetricWriter` per step; the learning curve is drawn at the end. A run checkpoints with Orbax
(`cua_jax.train.checkpoint`) and resumes exactly: every random draw is a function of the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cua_jax.compilation import use_compilation_cache
from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import make_segmenter
from cua_jax.eval.held_out import (
    evaluate_held_out,
    per_task_gains,
    save_training_traces,
    success_gain,
    traced_episodes,
)
from cua_jax.eval.intervals import slope_interval
from cua_jax.models.sharding import make_mesh
from cua_jax.observe import timeline
from cua_jax.observe.episode_log import EpisodeLog
from cua_jax.observe.metrics import TIMING_PREFIX, MetricWriter, drop_records_from, read_metrics
from cua_jax.observe.plots import plot_learning_curve
from cua_jax.observe.progress import StepProgress
from cua_jax.rollout.agent_loop import reserved_token_ids
from cua_jax.rollout.rollout_worker import EnvWrapper
from cua_jax.train.async_rollouts import RolloutFeeder
from cua_jax.train.batching import MultimodalPositions, batch_tokens, make_minibatches, process_images, score_items
from cua_jax.train.buffer import RolloutBuffer
from cua_jax.train.build import (
    RolloutWorkers,
    build_policy,
    build_rollout_workers,
    export_engine_model,
    load_run_processor,
    local_ray,
    push_weights,
)
from cua_jax.train.checkpoint import TrainCheckpointer, TrainerState
from cua_jax.train.collect import EnvironmentCounters, GroupCollector
from cua_jax.train.coordinated import (
    ProcessGroup,
    agree_batch_shape,
    check_same_state,
    group_summary,
    host_state,
    items_of_whole_batch,
    minibatch_shares,
    process_microbatches,
    step_share,
)
from cua_jax.train.groups import CollectedGroup, PreparedBatch, mean_metrics, prepare_batch
from cua_jax.train.learner import Learner
from cua_jax.train.settings import (
    ConfigError,
    TrainSettings,
    apply_pilot_file,
    seed_pool,
    uncoordinated_processes_message,
)
from cua_jax.train.warm_start import demonstrated_tasks, run_warm_start

# The evaluations at eval.low_temperature (beside the headline ones at eval.temperature) and
# their gain, as keys of Trainer.evaluations and of the run's summary.
LOW_TEMPERATURE_BEFORE, LOW_TEMPERATURE_AFTER = "before_low_temperature", "after_low_temperature"
LOW_TEMPERATURE_GAIN = "gain_low_temperature"


# ---------------------------------------------------------------------------------------
# Building a trainer: the run's setup, the warm start, the trainer
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunSetup:
    """What a run's trainer is built from, before anything copies its policy: the run's settings
    (with rollout.group_size from sampler.pilot.file), the tokenizer, image processor,
    renderer and segmenter, the token ids no reply may hold, the policy, the checkpointer of the
    workdir, and the warm start's metrics once `warm_start` ran (None before)."""

    settings: TrainSettings
    pilot: Any
    tokenizer: Any
    image_processor: Any
    renderer: ChatRenderer
    segmenter: Any
    banned_token_ids: Any
    policy: Any
    checkpointer: TrainCheckpointer
    warm_start_metrics: dict[str, float] | None = None


def prepare_run(config) -> RunSetup:
    """A run's setup from its config (checked as `TrainSettings`): the processor, the segmenter
    and the policy (a random init or model.init_from), and the workdir with its checkpointer."""
    config, pilot = apply_pilot_file(config)  # rollout.group_size from sampler.pilot.file
    settings = TrainSettings.from_config(config)
    use_compilation_cache(settings.compilation_cache_dir)
    os.makedirs(settings.workdir, exist_ok=True)
    tokenizer, image_processor = load_run_processor(settings.model)
    renderer = ChatRenderer(tokenizer, image_processor)
    segmenter = make_segmenter(settings.segmenter, renderer, **settings.segmenter_options)
    # Vision placeholders can never be part of a reply: the engines never sample them and the
    # learner scores under the same renormalised distribution (no rollout / learner gap).
    banned_token_ids = reserved_token_ids(renderer)
    settings = dataclasses.replace(
        settings, learner=dataclasses.replace(settings.learner, banned_token_ids=banned_token_ids)
    )
    policy = build_policy(settings, settings.seed)
    checkpointer = TrainCheckpointer(
        os.path.join(settings.workdir, "checkpoints"), keep=settings.train.keep_checkpoints
    )
    return RunSetup(
        settings, pilot, tokenizer, image_processor, renderer, segmenter, banned_token_ids, policy, checkpointer
    )


def warm_start(setup: RunSetup) -> dict[str, float]:
    """The run's warm start, the phase between `prepare_run` and `build_trainer`: supervised
    fine-tuning of setup.policy (in place) on the oracle's demonstrations of the training tasks
    (`cua_jax.train.warm_start.run_warm_start`), before anything copies the policy (learner,
    KL reference, engines). Nothing runs without warm_start.steps, or for a workdir with
    checkpoints: a run to resume, whose checkpoint holds the warm start's result. Returns the
    metrics ({} when nothing ran), also kept in setup.warm_start_metrics."""
    if setup.warm_start_metrics is not None:
        raise RuntimeError("the run's warm start already ran")
    settings, metrics = setup.settings, {}
    if settings.warm_start is not None and setup.checkpointer.latest_step() is None:
        processes = ProcessGroup.current() if jax.process_count() > 1 else None
        if processes is None or processes.index == 0:
            demonstrated = demonstrated_tasks(settings.training_tasks, settings.catalog)
            metrics = run_warm_start(
                setup.policy, demonstrated, settings, setup.segmenter, setup.renderer, settings.workdir
            )
        if processes is not None:
            # A coordinated run's warm start runs on process 0 (its first device), and every
            # process then trains from its result (the others wait here).
            metrics = _from_process_zero(setup.policy, metrics, processes)
    setup.warm_start_metrics = metrics
    return metrics


def _from_process_zero(policy, metrics: dict[str, float], processes: ProcessGroup) -> dict[str, float]:
    """Process 0's `policy` parameters (in place) and `metrics` on every process (collectives)."""
    from flax import nnx
    from jax.experimental import multihost_utils

    state = jax.tree.map(np.asarray, nnx.state(policy))
    nnx.update(policy, jax.tree.map(jnp.asarray, multihost_utils.broadcast_one_to_all(state)))
    return processes.exchange(metrics)[0]


def build_trainer(setup: RunSetup, *, env_wrapper: EnvWrapper | None = None) -> Trainer:
    """The trainer of a prepared run: its learner (on the mesh settings.mesh asks for), its
    rollout workers (on a local Ray when the config wants one; vLLM engines load the policy
    exported to the workdir), the collector with its sampler over the training tasks.

    A run whose config asks for a warm start needs `warm_start(setup)` first (which does nothing
    when resuming). env_wrapper: wraps every environment (fault injection, added latency)."""
    if setup.warm_start_metrics is None:
        if setup.settings.warm_start is not None:
            raise RuntimeError(
                "config.warm_start.steps > 0: the run's warm start (cua_jax.train.trainer.warm_start) must run before "
                "build_trainer"
            )
        setup.warm_start_metrics = {}
    from flax import nnx

    settings, policy = setup.settings, setup.policy
    if jax.process_count() > 1 and not settings.train.coordinated:  # the count JAX detected, too
        raise ConfigError(f"config.train.coordinated: {uncoordinated_processes_message(jax.process_count())}")
    if jax.process_count() > 1:
        check_same_state(nnx.state(policy), ProcessGroup.current(), "the policy to train")
    base_key = jax.random.key(settings.seed)
    m = settings.mesh
    mesh = make_mesh(m, devices=jax.devices()[: max(1, m.data) * max(1, m.fsdp) * max(1, m.tensor)])
    learner = Learner(policy, settings.learner, mesh=mesh)
    engine_params = draw_share = None
    if settings.train.coordinated:
        try:  # each process's rows of a micro-batch: one block of learner.rows / process count
            learner.process_rows(settings.batching.rows)
        except ValueError as error:
            raise ConfigError(f"config.learner.rows: {error}") from None
        if settings.train.mode == "async":  # each process's rollout threads draw its share of every draw
            draw_share = ProcessGroup.current()
            if settings.rollout.batch_tasks < draw_share.count:
                raise ConfigError(
                    f"config.rollout.batch_tasks: async coordinated mode gives each of the {draw_share.count} "
                    f"processes a share of every step's groups, so a step needs at least one group per process; "
                    f"got {settings.rollout.batch_tasks}"
                )
        # Every process's engines start from a host copy of the (sharded) policy.
        engine_params = host_state(nnx.state(learner.model))
    ray = contextlib.ExitStack()  # the local Ray the worker actors run on, if this run started it
    ray.enter_context(local_ray(settings.rollout))
    try:
        engine_model_dir = (
            export_engine_model(
                policy, settings.workdir, setup.tokenizer, setup.image_processor, host_params=engine_params
            )
            if settings.rollout.engine == "vllm"
            else None
        )
        workers: RolloutWorkers = build_rollout_workers(
            settings,
            policy,
            int(setup.tokenizer.pad_token_id or 0),
            env_wrapper,
            setup.banned_token_ids,
            engine_model_dir,
            params=engine_params,
        )
    except BaseException:
        ray.close()
        raise
    pool = settings.catalog.pool(settings.domain_weights, settings.training_tasks)
    if setup.pilot is not None:
        seed_pool(pool, setup.pilot, settings.training_tasks, settings.pilot.file)
    collector = GroupCollector(settings, base_key, workers[0], pool, draw_share)
    return Trainer(setup, learner, workers, ray, collector)


# ---------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------


class Trainer:
    """Online RL of a computer-use policy on MiniWoB++ capsules (see the module doc), built by
    `build_trainer` from a prepared run (`prepare_run`, then its `warm_start`).

    setup: the run (its settings: a config of experiments/configs/base.py's shape, checked).
    learner: over setup.policy. workers: the rollout workers; ray: closes the local Ray
    they run on, if the run started it. collector: draws and runs the training groups.
    """

    def __init__(self, setup: RunSetup, learner: Learner, workers: RolloutWorkers, ray, collector: GroupCollector):
        self.settings = setup.settings
        self.workdir = self.settings.workdir
        self.base_key = collector.base_key
        self.tokenizer, self.image_processor = setup.tokenizer, setup.image_processor
        self.renderer, self.segmenter = setup.renderer, setup.segmenter
        self.banned_token_ids = setup.banned_token_ids
        self.checkpointer = setup.checkpointer
        self.warm_start_metrics: dict[str, float] = setup.warm_start_metrics or {}
        policy = setup.policy
        self.multimodal = MultimodalPositions.of(policy.config) if hasattr(policy, "encode_images") else None
        self.learner = learner
        self._ray = ray
        self.workers = workers
        self.collector = collector
        self.sampler = collector.sampler
        self.pool = collector.pool
        self.environment_counters = EnvironmentCounters()
        self.eval_tasks = tuple(self.settings.eval.tasks) or self.settings.training_tasks
        self.domains = self.settings.catalog.domains()
        self.episode_log = EpisodeLog(os.path.join(self.workdir, "episodes.jsonl"))
        # Coordinated collection (train.coordinated): this process's place among the run's
        # processes; process 0 alone writes the run's records (metrics, episodes, summary).
        self.processes: ProcessGroup | None = ProcessGroup.current() if self.settings.train.coordinated else None
        self.writes_records = self.processes is None or self.processes.index == 0
        # A coordinated async run: each process's rollout threads, buffer and sampler are its
        # own, so each checkpoint keeps every process's own TrainerState too.
        self.own_rollouts = self.processes is not None and self.settings.train.mode == "async"

        self.step = 0  # completed training steps
        self.version = 0  # policy version the engines hold
        self.feeder: RolloutFeeder | None = None  # async mode's rollout threads
        self._restored_rollouts: dict[str, Any] = {}  # a checkpoint's feeder state, until the threads start
        self.last_batch: PreparedBatch | None = None
        self.last_minibatch_item_counts: list[int] = []
        self.history: list[dict[str, float]] = []
        self.evaluations: dict[str, dict[str, float]] = {}
        self._writer = None
        if self.warm_start_metrics:
            self._log(0, self.warm_start_metrics)

    # -- metrics --------------------------------------------------------------------------

    @property
    def writer(self) -> MetricWriter:
        if self._writer is None:
            self._writer = MetricWriter(self.workdir)
        return self._writer

    def _log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.writes_records:
            return
        self.writer.write(step, metrics)
        self.writer.flush()

    # -- rollouts -------------------------------------------------------------------------

    def collect(self, step: int, worker: Any = None) -> tuple[list[CollectedGroup], dict[str, float]]:
        """Step `step`'s rollout groups on `worker` (default: every worker); `GroupCollector.collect`."""
        return self.collector.collect(step, worker if worker is not None else list(self.workers))

    # -- learning -------------------------------------------------------------------------

    def learn(self, groups: Sequence[CollectedGroup]) -> dict[str, float]:
        """Quarantine, advantages, updates on `groups`, then weight sync. Returns the metrics."""
        if self.processes is not None:
            raise RuntimeError("a coordinated run learns through learn_share (train_step)")
        t0 = time.perf_counter()
        with timeline.span("learner_host"):
            batch = prepare_batch(groups, self.settings, self.settings.num_minibatches, self.version, self.domains)
            self.episode_log.append(self.step, [e for g in groups for e in g.episodes], self.domains)
        self.last_batch = batch
        metrics = dict(batch.metrics)
        if not batch.items:
            metrics["learner/skipped"] = 1.0
            metrics[TIMING_PREFIX + "learn_s"] = time.perf_counter() - t0
            return metrics
        trace_every = self.settings.train.trace_every
        if trace_every and self.step % trace_every == 0:
            self._trace(batch)
        with timeline.span("learner_host"):
            pixel_patches = process_images(batch.items, batch.episodes, self.image_processor)
            minibatches = make_minibatches(
                batch.items,
                batch.item_advantages,
                self.settings.batching,
                len(batch.minibatch_groups),
                pixel_patches=pixel_patches,
                multimodal=self.multimodal,
            )
        self.last_minibatch_item_counts = [
            int(sum(np.asarray(mb.item_valid).sum() for mb in micro)) for micro in minibatches
        ]
        tokens = [batch_tokens(mb) for micro in minibatches for mb in micro]
        # Tokens one forward pass over the rollout batch runs (shared prefixes counted once each).
        return self._update_and_sync(minibatches, float(sum(tokens)), metrics, t0)

    def learn_share(self, local: Sequence[CollectedGroup], groups: Sequence[CollectedGroup]) -> dict[str, float]:
        """`learn` in a coordinated run (a collective: every process calls it each step), from
        two lists: this process's groups (`local`) and every group's summary (`groups`, in the
        same order on every process: `GroupCollector.collect_share`'s draw order, or in async
        mode each process's groups after those of the processes before it). Quarantine and
        advantages run per group on the process that collected it; this process's items become
        its rows of the global micro-batches (`Learner.global_batch`), whose loss totals the
        learner reduces over the whole mesh; the step's metrics are computed from every group's
        summary, as one process collecting everything computes them. Weight sync: every
        process's engines."""
        t0 = time.perf_counter()
        settings = self.settings
        with timeline.span("learner_host"):
            batch = prepare_batch(local, settings, 1, self.version, self.domains)
            # The mini-batch plan is the whole batch's, as one process would cut it.
            whole = prepare_batch(groups, settings, settings.num_minibatches, self.version, self.domains)
            if self.writes_records:
                self.episode_log.append(self.step, [e for g in groups for e in g.episodes], self.domains)
        self.last_batch = batch
        metrics = dict(whole.metrics)
        if not whole.items:  # the same on every process: none trains
            metrics["learner/skipped"] = 1.0
            metrics[TIMING_PREFIX + "learn_s"] = time.perf_counter() - t0
            return metrics
        item_advantages = batch.item_advantages
        if settings.advantage.permute_rewards:  # a permutation over the whole batch: its advantages
            item_advantages = items_of_whole_batch(batch.items, whole.items, whole.item_advantages)
        minibatches, shapes = [], []
        with timeline.span("learner_host"):
            rows = self.learner.process_rows(settings.batching.rows)
            pixel_patches = process_images(batch.items, batch.episodes, self.image_processor)
            for items, advantages in minibatch_shares(batch.items, item_advantages, whole.minibatch_groups):
                shape, mine = self._global_parts(items, advantages, settings.batching, rows, pixel_patches)
                minibatches.append([self.learner.global_batch(mb) for mb in mine])
                shapes.append(shape)
        self.last_minibatch_item_counts = [shape.items for shape in shapes]
        trace_every = settings.train.trace_every
        if trace_every and self.step % trace_every == 0:
            self._trace_share(batch, item_advantages, whole, pixel_patches)
        return self._update_and_sync(minibatches, float(sum(shape.tokens for shape in shapes)), metrics, t0)

    def _global_parts(self, items, advantages, config, rows, pixel_patches) -> tuple[Any, list]:
        """(the agreed shape, this process's parts of the global micro-batches) of its `items`
        at `rows` (`Learner.process_rows`): `agree_batch_shape` then `process_microbatches`,
        collectives every process calls."""
        shape = agree_batch_shape(items, config, rows.rows, self.processes, rows.shards, pixel_patches)
        parts = process_microbatches(
            items,
            advantages,
            config,
            rows.rows,
            shape,
            self.multimodal,
            rows.block,
            pixel_patches=pixel_patches,
            processes=self.processes,
        )
        return shape, parts

    def _update_and_sync(self, minibatches: Any, forward_tokens: float, metrics: dict, t0: float) -> dict[str, float]:
        """The step's updates on `minibatches`, then the weights to the engines: `metrics` gains
        the learner's means, the update count, `forward_tokens` and the learn / sync times
        (learning timed from `t0`)."""
        updates = self.learner.train_on_batch(minibatches)
        metrics.update({f"learner/{k}": v for k, v in mean_metrics(updates).items()})
        metrics["learner/updates"] = float(len(updates))
        metrics["learner/forward_tokens"] = forward_tokens
        t1 = time.perf_counter()
        with timeline.span("sync"):
            self.sync_weights()
        metrics[TIMING_PREFIX + "learn_s"] = t1 - t0
        metrics[TIMING_PREFIX + "sync_s"] = time.perf_counter() - t1
        return metrics

    def _trace(self, batch: PreparedBatch) -> None:
        """eval.num_traces episodes of the batch for the viewer, with the learner's logprobs before the update."""

        def score(indices):
            return score_items(
                self.learner,
                [batch.items[i] for i in indices],
                batch.episodes,
                self.settings.batching,
                self.image_processor,
                self.multimodal,
            )

        save_training_traces(
            os.path.join(self.workdir, "traces", f"train_{self.step:06d}"),
            batch,
            score,
            self.version,
            self.settings.eval.num_traces,
            self.tokenizer,
        )

    def _trace_share(
        self, batch: PreparedBatch, item_advantages: np.ndarray, whole: PreparedBatch, pixel_patches: dict
    ) -> None:
        """`_trace` in a coordinated run (a collective): the episodes one process would trace,
        chosen from the whole batch's summary (`traced_episodes`), each scored by the learner on
        the process that collected it (its rows of global micro-batches), and saved by process
        0 with the episodes' screenshots and logprobs that the others send it."""
        settings, processes = self.settings, self.processes
        chosen = traced_episodes(whole, settings.eval.num_traces)
        wanted = set(chosen)
        indices = [i for i, item in enumerate(batch.items) if item.episode_id in wanted]
        items = [batch.items[i] for i in indices]
        config = dataclasses.replace(settings.batching, share_prefix=False)  # whole items: logprobs align with ids
        rows = self.learner.process_rows(config.rows)
        _, parts = self._global_parts(items, np.zeros(len(items), np.float32), config, rows, pixel_patches)
        scored = []
        for m, part in enumerate(parts):
            logprobs = self.learner.score(self.learner.global_batch(part))[rows.block * rows.rows :]
            for r, item in enumerate(items[m * rows.rows : (m + 1) * rows.rows]):
                scored.append(logprobs[r, : len(item.ids)])
        mine = (
            {e: batch.episodes[e] for e in wanted if e in batch.episodes},
            items,
            np.asarray(item_advantages, np.float32)[indices],
            scored,
        )
        every = processes.exchange(mine if processes.index != 0 else None)
        if processes.index != 0:
            return
        every[0] = mine
        episodes = {e: episode for part in every for e, episode in part[0].items()}
        position = {e: k for k, e in enumerate(chosen)}
        order = sorted(
            ((item, advantage, logprobs) for part in every for item, advantage, logprobs in zip(*part[1:])),
            key=lambda entry: position[entry[0].episode_id],
        )  # stable: an episode's items keep their order
        traced = dataclasses.replace(
            whole,
            items=[item for item, _, _ in order],
            item_advantages=np.asarray([advantage for _, advantage, _ in order], np.float32),
            episodes=episodes,
        )
        save_training_traces(
            os.path.join(self.workdir, "traces", f"train_{self.step:06d}"),
            traced,
            lambda indices: [order[i][2] for i in indices],
            self.version,
            settings.eval.num_traces,
            self.tokenizer,
            chosen=chosen,
        )

    def sync_weights(self) -> None:
        """Pushes the learner's parameters to every engine as the next policy version."""
        self.version += 1
        self._push_weights()

    def _push_weights(self) -> None:
        """The learner's parameters to every engine as policy `self.version` (`push_weights`).
        Coordinated: each process gathers the sharded parameters into a host copy (a collective)
        and hands it to its own engines (in-process, Ray actors or vLLM), which hold the whole
        policy."""
        from flax import nnx

        state = nnx.state(self.learner.model)
        if self.processes is not None:
            state = host_state(state)
        push_weights(self.workers, self.settings.rollout, state, self.version)

    # -- on-policy ------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        """One strictly on-policy step: collect with the current policy, one update, sync."""
        t0 = time.perf_counter()
        with timeline.window("rollout"):
            if self.processes is not None:
                local, groups, extra = self.collector.collect_share(self.step, list(self.workers), self.processes)
            else:
                groups, extra = self.collect(self.step)
        rollout_s = time.perf_counter() - t0
        with timeline.window("learn"):
            metrics = self.learn(groups) if self.processes is None else self.learn_share(local, groups)
        metrics.update(extra)
        metrics[TIMING_PREFIX + "rollout_s"] = rollout_s
        return self._finish_step(metrics)

    def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        metrics["policy/version"] = float(self.version)
        metrics.update(self.collector.sampler_metrics)
        # capsules/...: what the workers' environments counted since the previous step; buffer/...:
        # the stale groups dropped so far (every process's, in a coordinated run)
        counts = self.environment_counters.read(self.workers)
        if self.buffer is not None:
            counts["buffer/dropped_stale_groups"] = float(self.buffer.dropped_stale_groups)
            counts["buffer/dropped_stale_episodes"] = float(self.buffer.dropped_stale_episodes)
        metrics.update(counts if self.processes is None else self.processes.all_reduce_sum(counts))
        self._log(self.step, metrics)
        self.history.append(metrics)
        self.step += 1
        return metrics

    # -- asynchronous ---------------------------------------------------------------------

    @property
    def step_groups(self) -> int:
        """The groups this process trains at each async step: rollout.batch_tasks, or in a
        coordinated run its share of them (`step_share`)."""
        batch_tasks = self.settings.rollout.batch_tasks
        if self.processes is None:
            return batch_tasks
        return step_share(batch_tasks, self.processes.count, self.processes.index)

    def start_rollouts(self) -> None:
        """Starts one rollout thread per worker feeding the buffer (async mode: `RolloutFeeder`).
        A coordinated run's processes each buffer their share of train.buffer_groups."""
        rollout, train = self.settings.rollout, self.settings.train
        if self.feeder is None:
            capacity = train.buffer_groups or 2 * rollout.batch_tasks
            self.feeder = RolloutFeeder(
                train.staleness_window,
                -(-capacity * self.step_groups // rollout.batch_tasks),
                rollout.max_episodes_in_flight,
            )
            if self._restored_rollouts:  # a resumed run: its saved groups first, its unfinished draws again
                self.feeder.load_state_dict(self._restored_rollouts)
                self._restored_rollouts = {}
        self.feeder.start(self.workers, self.collect, self.collector, rollout.group_size)

    def stop_rollouts(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()
            self.feeder = None

    @property
    def buffer(self) -> RolloutBuffer | None:
        return None if self.feeder is None else self.feeder.buffer

    def async_step(self, timeout_s: float = 3600.0) -> dict[str, float]:
        """One learner step of async mode: take fresh whole groups from the buffer, update, sync.
        Coordinated (a collective): every process takes its share from its own buffer, fresh
        for the global policy version, once every process holds its share
        (`RolloutFeeder.take_agreed`); the processes exchange the groups' summaries and train
        as `learn_share` does, the whole batch's groups in process order."""
        if self.feeder is None:
            raise RuntimeError("async_step needs start_rollouts() first")
        if self.processes is None:
            groups, wait_s = self.feeder.take(self.step_groups, self.version, timeout_s)
            metrics = self.learn(groups)
        else:
            local, wait_s = self.feeder.take_agreed(self.step_groups, self.version, self.processes, timeout_s)
            every = self.processes.exchange([group_summary(g) for g in local])
            metrics = self.learn_share(local, [summary for share in every for summary in share])
        metrics[TIMING_PREFIX + "rollout_wait_s"] = wait_s
        return self._finish_step(metrics)

    # -- evaluation -----------------------------------------------------------------------

    def evaluate(self, label: str, temperature: float | None = None) -> dict[str, float]:
        """Held-out success of the current policy through the evaluation harness, over every
        worker (`cua_jax.eval.held_out.evaluate_held_out`; its files under evals/<label>_<step>),
        logged, kept in evaluations[label], with a few traces spread over the tasks. A
        coordinated run's processes evaluate together (a collective), each its share of the seeds.
        `temperature` replaces eval.temperature (the same seeds and sampling seeds)."""
        folder = f"{label}_{self.step:06d}"
        result = evaluate_held_out(
            self.workers,
            self.eval_tasks,
            self.settings.eval,
            self.settings.env.eval_seed_start,
            self.settings.catalog,
            os.path.join(self.workdir, "evals", folder),
            os.path.join(self.workdir, "traces", label),
            self.tokenizer,
            self.version,
            temperature=temperature,
            processes=self.processes,
        )
        self._log(self.step, {f"eval_{label}/{k}": v for k, v in result.items() if k != "outcomes"})
        self.evaluations[label] = result
        return result

    def compare_evaluations(
        self, first: str = "before", second: str = "after", name: str = "gain"
    ) -> dict[str, Any] | None:
        """The gain in held-out success from evaluation `first` to `second` (`success_gain`;
        paired by seed when each seed ran one episode: larger groups share a seed's
        difficulty), with each task's under "per_task" (`per_task_gains`), stored as
        evaluations[name] and logged under eval_<name>/."""
        if first not in self.evaluations or second not in self.evaluations:
            return None
        a, b = self.evaluations[first], self.evaluations[second]
        paired, confidence = self.settings.eval.group_size == 1, self.settings.eval.confidence
        gain = self.evaluations[name] = {
            **success_gain(a, b, confidence, paired),
            "per_task": per_task_gains(a, b, self.eval_tasks, confidence, paired),
        }
        metrics = {f"eval_{name}/{k}": v for k, v in gain.items() if k != "per_task"}
        for task, task_gain in gain["per_task"].items():
            metrics.update({f"eval_{name}/{task}/{k}": v for k, v in task_gain.items()})
        self._log(self.step, metrics)
        return gain

    # -- the run --------------------------------------------------------------------------

    def restore(self) -> bool:
        """Loads the latest checkpoint of the workdir, if any. Returns whether one was loaded.
        A coordinated async run loads each process's own state of it.

        Metric and episode records of steps after the checkpoint (written before a kill) are
        removed from metrics.jsonl and episodes.jsonl, since those steps run again."""
        restored = self.checkpointer.restore_latest(self.learner.train_state())
        if restored is None:
            return False
        train_state, state = restored
        if self.own_rollouts:
            own = self.checkpointer.read_process_state(state.step, self.processes.index, self.processes.count)
            if (own.step, own.version) != (state.step, state.version):
                raise ValueError(
                    f"checkpoint {state.step} (version {state.version}) holds process {self.processes.index}'s "
                    f"state of step {own.step} (version {own.version})"
                )
            state = own
        self.load_trainer_state(train_state, state)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.writes_records:
            drop_records_from(os.path.join(self.workdir, "metrics.jsonl"), self.step)
            self.episode_log.drop_steps_from(self.step)
        return True

    def save(self) -> None:
        """Checkpoints the run (a collective in a multi-host run). A coordinated async run
        writes each process's own state first, and every process waits for all of them
        before the checkpoint commits, so a committed checkpoint has them all."""
        state = self.trainer_state()
        if self.own_rollouts:
            self.checkpointer.write_process_state(state, self.processes.index)
            self.processes.exchange(None)  # a barrier: every process's state is written
        self.checkpointer.save(self.learner.train_state(), state, self.settings.config_dict)
        if self.own_rollouts:
            self.checkpointer.prune_process_states(self.processes.index, state.step)

    def trainer_state(self) -> TrainerState:
        """The run's state besides the learner's arrays (what a checkpoint's host_state holds)."""
        return TrainerState(
            base_key=np.asarray(jax.random.key_data(self.base_key)),
            step=self.step,
            version=self.version,
            next_group_id=self.collector.next_group_id,
            engine_sampling=[worker.sampling_state() for worker in self.workers],
            sampler=self.sampler.state_dict(),
            evaluations=self.evaluations,
            rollouts=self.feeder.state_dict() if self.feeder is not None else self._restored_rollouts,
        )

    def load_trainer_state(self, train_state: Any, state: TrainerState) -> None:
        """Continues from a checkpoint: the learner's arrays, the counters, the sampler, and the
        engines' weights (pushed at the saved policy version) and sampling state."""
        if not np.array_equal(state.base_key, np.asarray(jax.random.key_data(self.base_key))):
            raise ValueError(
                f"the checkpoint of step {state.step} was written with another seed; "
                "resume with the config it was trained with (config.seed)"
            )
        if len(state.engine_sampling) != len(self.workers):
            raise ValueError(
                f"the checkpoint of step {state.step} has {len(state.engine_sampling)} rollout workers' "
                f"state, the config asks for {len(self.workers)} (config.rollout.num_workers)"
            )
        self.learner.load_train_state(train_state)
        self.step, self.version, self.collector.next_group_id = state.step, state.version, state.next_group_id
        self.sampler.load_state_dict(state.sampler)
        self.evaluations, self._restored_rollouts = state.evaluations, state.rollouts
        self._push_weights()
        for worker, sampling in zip(self.workers, state.engine_sampling):
            worker.load_sampling_state(sampling)

    def run(self) -> dict[str, Any]:
        """Evaluate, train config.train.num_steps steps (checkpointing), evaluate, plot."""
        train, evaluation = self.settings.train, self.settings.eval
        low = evaluation.low_temperature if evaluation.low_temperature >= 0 else None
        if evaluation.enabled and self.step == 0:
            if "before" not in self.evaluations:
                self.evaluate("before")
            if low is not None and LOW_TEMPERATURE_BEFORE not in self.evaluations:
                self.evaluate(LOW_TEMPERATURE_BEFORE, temperature=low)
        asynchronous = train.mode == "async"
        if asynchronous and self.step < train.num_steps:
            self.start_rollouts()
        try:
            with StepProgress(
                train.progress_bar,
                train.num_steps,
                self.step,
                self.settings.name,
                show_gap=self.settings.rollout.engine == "vllm",
            ) as progress:
                while self.step < train.num_steps:
                    metrics = self.async_step() if asynchronous else self.train_step()
                    if (
                        evaluation.enabled
                        and evaluation.every_steps
                        and self.step % evaluation.every_steps == 0
                        and self.step < train.num_steps
                    ):
                        self.evaluate(f"step_{self.step}")
                    if self.step % train.checkpoint_every == 0 or self.step == train.num_steps:
                        self.save()
                    progress.step(metrics)
        finally:
            if asynchronous:
                self.stop_rollouts()
        if evaluation.enabled:
            self.evaluate("after")
            self.compare_evaluations()
            if low is not None:
                self.evaluate(LOW_TEMPERATURE_AFTER, temperature=low)
                self.compare_evaluations(LOW_TEMPERATURE_BEFORE, LOW_TEMPERATURE_AFTER, LOW_TEMPERATURE_GAIN)
        trend = curve = None
        if self.writes_records:  # in a coordinated run, process 0 alone writes the run's records
            trend = self.training_trend()
            if trend is not None:
                self._log(self.step, {f"train_trend/{k}": v for k, v in trend.items()})
            self.writer.flush()
            curve = plot_learning_curve(self.workdir, self.settings.name)
        summary = {
            "steps": self.step,
            "evaluations": self.evaluations,
            "curve": curve,
            "warm_start": self.warm_start_metrics,
            "training_trend": trend,
        }
        if self.writes_records:
            with open(os.path.join(self.workdir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
        return summary

    def training_trend(self) -> dict[str, float] | None:
        """The least-squares slope of training success per update over this run's steps (each
        update's batch is drawn on fresh pages), with its interval at eval.confidence
        (`slope_interval`), and the fitted rates at the first and last update; None with fewer
        than 3 updates."""
        self.writer.flush()
        points = [
            (r["step"], r["success/rate"])
            for r in read_metrics(self.writer.jsonl_path)
            if "success/rate" in r and np.isfinite(r["success/rate"])
        ]
        if len({step for step, _ in points}) < 3:
            return None
        steps, rates = zip(*points)
        slope, low, high = slope_interval(steps, rates, self.settings.eval.confidence)
        mean_step, mean_rate = float(np.mean(steps)), float(np.mean(rates))
        return {
            "slope": slope,
            "ci_low": low,
            "ci_high": high,
            "updates": float(len(points)),
            "fitted_first": mean_rate + slope * (min(steps) - mean_step),
            "fitted_last": mean_rate + slope * (max(steps) - mean_step),
        }

    def close(self) -> None:
        self.stop_rollouts()
        try:
            for worker in self.workers:
                worker.shutdown()
        finally:
            self.workers = []
            self._ray.close()
        self.checkpointer.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
