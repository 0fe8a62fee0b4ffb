"""Supervised warm start: the MiniWoB oracle's demonstrations, then token-mean NLL fine-tuning.

A random policy never writes a parseable tool call, so online RL would start with no signal.
The warm start teaches the reply format (and what the oracle does) before RL:

    collect_demonstrations(tasks, seeds, runtime=..., segmenter=...)
        the oracle (`cua_jax.rollout.oracle_engine.OracleDemonstrator`, a RolloutEngine) plays
        through the real AgentLoop on real MiniWoB capsules, so every demonstration token stream is exactly what an RL
        rollout of the same episode would be: same system prompt, rendering, observations,
        segmenter. Only successful episodes are kept; the others are listed with the reason.
    SupervisedRun(model, DemonstrationData(items, ...), config).run(config.steps)
        the `Learner` with its supervised objective ("sft": token-mean negative log-likelihood
        of the items' loss-mask tokens, the oracle's replies) under the config's optimizer,
        one update per batch; batches are `batching.collate`'s, one compiled step per shape
        bucket. Resumable; keeps the loss curve.
    evaluate_policy(model, tasks, seeds, ...)
        the policy through the JAX sampler engine and the agent loop (greedy by default):
        valid-action rate, first-turn valid-action rate, success rate.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from cua_jax.context.segment import Segmenter
from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.envs import actions as A
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop
from cua_jax.rollout.oracle_engine import OracleDemonstrator
from cua_jax.train.batching import (
    BatchingConfig,
    ImageKey,
    MultimodalPositions,
    TrainBatch,
    bucket_count,
    bucket_length,
    collate,
    process_images,
)
from cua_jax.train.demonstrations import Demonstrations, keep_successes, run_bounded
from cua_jax.train.learner import SCHEDULES, Learner, LearnerConfig, OptimizerConfig
from cua_jax.types import Episode, EpisodeStatus, TrainingItem


def collect_demonstrations(
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    runtime,
    segmenter: Segmenter,
    agent_config: AgentConfig = AgentConfig(max_turns=15, max_new_tokens=64, max_context_tokens=4096),
    time_limit_s: float | None = 600.0,
    concurrency: int = 4,
    reasoning: bool = True,
) -> Demonstrations:
    """The oracle's episodes on every (task, seed), through the real agent loop.

    runtime: a `CapsuleRuntime` made with include_dom_text=True and the action space of
    `agent_config` (the oracle acts in it). segmenter: the context
    strategy of the RL run (so items match RL rollouts exactly). time_limit_s replaces
    MiniWoB's per-task limit. Episodes run `concurrency` at a time; each (task, seed) is its
    own group (group_id = its index). Only SUCCESS episodes are kept.
    """
    from cua_jax.envs.miniwob_oracle import ORACLE_TASKS

    unknown = [task for task in tasks if task not in ORACLE_TASKS]
    if unknown:
        raise ValueError(f"the oracle has no script for {unknown}; it solves {list(ORACLE_TASKS)}")
    if not seeds:
        raise ValueError("collect_demonstrations needs at least one seed")
    renderer = segmenter.renderer
    demonstrators = {
        task: OracleDemonstrator(
            renderer.tokenizer,
            renderer.end_of_turn_id,
            task,
            reasoning=reasoning,
            action_space=agent_config.action_space,
        )
        for task in tasks
    }
    loops = {task: AgentLoop(engine, segmenter, agent_config) for task, engine in demonstrators.items()}
    jobs = [
        (loops[task], task, task, int(seed), g) for g, (task, seed) in enumerate((t, s) for t in tasks for s in seeds)
    ]
    rollouts = asyncio.run(
        run_bounded(jobs, concurrency, lambda: MiniWoBEnvironment(runtime, time_limit_s=time_limit_s))
    )
    kept, rejected = keep_successes(rollouts)
    errors = [message for engine in demonstrators.values() for message in engine.errors]
    return Demonstrations(kept, rejected, errors)


# ------------------------------------------------------------------------------------
# Supervised fine-tuning
# ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """The supervised fine-tuning run.

    steps: optimizer steps. rows: items per step (the batch). learning_rate / warmup_steps /
    weight_decay / max_grad_norm: AdamW as `learner.OptimizerConfig`. schedule: after the
    warmup, "constant" or "cosine" (decay to min_lr_ratio x learning_rate at the last step).
    length_multiple: item lengths are padded to a multiple of it (one compiled step per
    distinct (length, image count) bucket). seed: batch order.
    seq_chunk / vocab_chunk: chunking of the log-softmax (`cua_jax.models.scoring`).
    """

    steps: int = 200
    rows: int = 4
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    length_multiple: int = 256
    seed: int = 0
    seq_chunk: int = 256
    vocab_chunk: int = 32768

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"WarmStartConfig.steps must be >= 0, got {self.steps}")
        if self.rows < 1:
            raise ValueError(f"WarmStartConfig.rows must be >= 1, got {self.rows}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"WarmStartConfig.schedule {self.schedule!r} is unknown; choose one of {SCHEDULES}")

    def optimizer(self) -> OptimizerConfig:
        return OptimizerConfig(
            learning_rate=self.learning_rate,
            warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            schedule=self.schedule,
            decay_steps=max(self.steps - self.warmup_steps, 1),
            min_lr_ratio=self.min_lr_ratio,
        )

    def learner(self) -> LearnerConfig:
        """The learner of the run: the supervised objective under `optimizer()`."""
        return LearnerConfig(
            objective="sft", optimizer=self.optimizer(), seq_chunk=self.seq_chunk, vocab_chunk=self.vocab_chunk
        )


class DemonstrationData:
    """Items and their image patches, batched by shape bucket.

    Items are grouped by (padded length, padded image count); a batch holds items of one
    group only, so each batch shape is one of a few compiled programs.
    """

    def __init__(
        self,
        items: Sequence[TrainingItem],
        episodes: Mapping[str, Episode],
        image_processor,
        multimodal: MultimodalPositions | None,
        rows: int,
        length_multiple: int,
        pad_id: int = 0,
    ):
        if not items:
            raise ValueError("no demonstration items to train on")
        self.items = list(items)
        self.rows = rows
        self.multimodal = multimodal
        self.batching = BatchingConfig(rows=rows, length_multiple=length_multiple, pad_id=pad_id)
        self.patches: dict[ImageKey, np.ndarray] = process_images(self.items, episodes, image_processor)
        self.buckets: dict[tuple[int, int], list[int]] = {}
        for i, item in enumerate(self.items):
            key = (bucket_length(len(item), length_multiple), bucket_count(len(item.images)))
            self.buckets.setdefault(key, []).append(i)

    def batch(self, indices: Sequence[int]) -> TrainBatch:
        chosen = [self.items[i] for i in indices]
        length = max(bucket_length(len(item), self.batching.length_multiple) for item in chosen)
        return collate(
            chosen,
            np.ones(len(chosen), np.float32),
            self.batching,
            pixel_patches=self.patches,
            multimodal=self.multimodal,
            length=length,
        )

    def epoch(self, rng: np.random.Generator) -> list[list[int]]:
        """Every item once: shuffled within its bucket, cut into batches of `rows`, batches shuffled."""
        batches = []
        for indices in self.buckets.values():
            order = rng.permutation(indices).tolist()
            batches.extend(order[i : i + self.rows] for i in range(0, len(order), self.rows))
        return [batches[i] for i in rng.permutation(len(batches))]

    def all_batches(self) -> Iterator[TrainBatch]:
        for indices in self.buckets.values():
            for i in range(0, len(indices), self.rows):
                yield self.batch(indices[i : i + self.rows])


class SupervisedRun:
    """Supervised fine-tuning of `model` on `data`: a `Learner` with the supervised objective
    (`WarmStartConfig.learner`), one update per batch of `rows` items, epochs in a seeded
    order, with a state that can be saved and restored (a resumed run continues exactly: same
    parameters, optimizer state, batch order and step count).

    The learner owns the model's parameters while it trains (its updates donate them);
    `sync_model()` writes its current ones back into `model` (in place) and returns it.
    `losses` holds one NLL per step.
    """

    def __init__(self, model: nnx.Module, data: DemonstrationData, config: WarmStartConfig = WarmStartConfig()):
        self.model, self.data, self.config = model, data, config
        self.learner = Learner(model, config.learner())
        self.rng = np.random.default_rng(config.seed)
        self.losses: list[float] = []
        self.pending: list[list[int]] = []
        self.shapes: set = set()
        self.seconds = 0.0

    @property
    def step(self) -> int:
        return len(self.losses)

    def run(self, until: int, on_step: Callable[[int, float], None] | None = None) -> None:
        """Train until `until` steps are done in all (no-op when already there); on_step(step,
        loss) is called after every step (a progress bar)."""
        start = time.perf_counter()
        while len(self.losses) < until:
            if not self.pending:
                self.pending = self.data.epoch(self.rng)
            batch = self.data.batch(self.pending.pop())
            self.shapes.add((batch.length, None if batch.image_grid is None else len(batch.image_grid.thw)))
            self.losses.append(self.learner.update([batch])["loss"])
            if not math.isfinite(self.losses[-1]):
                raise FloatingPointError(f"supervised step {len(self.losses)}: the loss is {self.losses[-1]}")
            if on_step is not None:
                on_step(len(self.losses), self.losses[-1])
        self.seconds += time.perf_counter() - start

    def sync_model(self) -> nnx.Module:
        nnx.update(self.model, self.learner.params, self.learner.frozen)
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """Host copies of everything a resumed run needs (picklable)."""
        return {
            "learner": jax.device_get(self.learner.train_state()),
            "rng": self.rng.bit_generator.state,
            "losses": list(self.losses),
            "pending": [list(b) for b in self.pending],
            "seconds": self.seconds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.learner.load_train_state(state["learner"])
        self.rng.bit_generator.state = state["rng"]
        self.losses = list(state["losses"])
        self.pending = [list(b) for b in state["pending"]]
        self.seconds = float(state["seconds"])
        self.sync_model()


# ------------------------------------------------------------------------------------
# Does the policy read its click points off the page?
# ------------------------------------------------------------------------------------

# The numbers of a reply's click target: a tool call's grid point (`actions.render_action`),
# or an element id, either the tool call's or the reasoning line's `[id]` (`oracle_engine.reasoning_line`).
_CLICK_TARGET = re.compile(r'"coordinate": \[([^\]]*)\]|"element": (\d+)|\[(\d+)\]')


def click_point_items(items: Sequence[TrainingItem], tokenizer) -> list[TrainingItem]:
    """The items with their loss mask narrowed to the digit tokens of the replies' click points
    (inside a tool call's `"coordinate": [x, y]`; in element actions, the id where a reply first
    writes it: the reasoning line's `[id]`, or else the tool call's `"element": id`, as a later
    copy of the id in the same reply says nothing about reading the page); items with no click
    point are dropped.

    The supervised loss over these (`Learner.evaluate`) is the policy's NLL per click-point
    digit of the oracle's replies. The page lists every element's click point
    (`miniwob.dom_to_text`), so a policy that reads its target's point off the page drives it
    towards 0, and one that guesses points from where targets usually are stays near
    `click_point_prior_nll`.
    """
    narrowed = []
    for item in items:
        trained = np.flatnonzero(item.loss_mask)
        pieces = [tokenizer.decode([int(item.ids[i])]) for i in trained]
        starts = np.cumsum([0] + [len(piece) for piece in pieces[:-1]])
        digits = np.array([piece.strip().isdigit() for piece in pieces], dtype=bool)
        mask = np.zeros_like(item.loss_mask)
        text = "".join(pieces)
        reply_ends = [m.end() for m in re.finditer(r"<\|im_end\|>|</tool_call>", text)]
        id_scored = set()  # replies (by index) whose element id was already scored
        for match in _CLICK_TARGET.finditer(text):
            group = next(g for g in (1, 2, 3) if match.group(g) is not None)
            if group > 1:
                reply = bisect.bisect_right(reply_ends, match.start())
                if reply in id_scored:
                    continue
                id_scored.add(reply)
            inside = (starts >= match.start(group)) & (starts < match.end(group))
            mask[trained[inside & digits]] = 1
        if mask.any():
            narrowed.append(dataclasses.replace(item, loss_mask=mask))
    return narrowed


def click_points(demonstrations: Demonstrations) -> list[tuple[int, ...]]:
    """The grid points (x, y) or element ids (id,) the oracle clicked or filled, every one of
    every demonstration."""
    points: list[tuple[int, ...]] = []
    for rollout in demonstrations.rollouts:
        for turn in rollout.episode.turns:
            if isinstance(turn.action, A.Click):
                points.append((turn.action.x, turn.action.y))
            elif isinstance(turn.action, A.ELEMENT_ACTIONS):
                points.append((turn.action.element,))
    return points


def click_point_prior_nll(train: Sequence[tuple[int, ...]], held_out: Sequence[tuple[int, ...]]) -> float:
    """Nats per digit of the held-out click points under a page-blind prior fitted to the
    training ones: each digit's frequency at its place (axis, number of digits, position),
    add-one smoothed over the ten digits. The number of digits is given, as a policy's digit
    NLL does not count the tokens that end a number; a policy whose click-point NLL is not
    clearly below this does not read its points off the page."""
    if not held_out:
        raise ValueError("click_point_prior_nll needs at least one held-out point")

    def placed_digits(points):  # ((axis, number of digits, position), digit) of every digit
        for point in points:
            for axis, value in enumerate(point):
                digits = str(int(value))
                yield from (((axis, len(digits), place), int(digit)) for place, digit in enumerate(digits))

    counts: collections.defaultdict = collections.defaultdict(lambda: np.zeros(10))
    for place, digit in placed_digits(train):
        counts[place][digit] += 1
    nats = [
        -math.log((counts[place][digit] + 1.0) / (counts[place].sum() + 10.0))
        for place, digit in placed_digits(held_out)
    ]
    return sum(nats) / len(nats)


@dataclasses.dataclass
class HeldOutScorer:
    """How a policy scores the oracle's replies on held-out pages (never trained on), with the
    pages' data built once so that a long run can score them again and again:
    held_out_nll (nats per reply token), held_out_click_nll (nats per click-target digit,
    `click_point_items`) and click_prior_nll (the same digits under the page-blind prior fitted
    to the training demonstrations' clicks, `click_point_prior_nll`). A click-target NLL near
    the prior's says the policy guesses where targets usually are instead of reading them off
    the page."""

    replies: DemonstrationData
    clicks: DemonstrationData | None
    prior_nll: float | None

    @classmethod
    def build(
        cls,
        train: Demonstrations,
        held_out: Demonstrations,
        renderer,
        multimodal: MultimodalPositions | None,
        config: WarmStartConfig = WarmStartConfig(),
    ) -> HeldOutScorer:
        pad_id = int(renderer.tokenizer.pad_token_id or 0)

        def data(items):
            return DemonstrationData(
                items,
                held_out.episodes,
                renderer.image_processor,
                multimodal,
                config.rows,
                config.length_multiple,
                pad_id=pad_id,
            )

        clicks = click_point_items(held_out.items, renderer.tokenizer)
        prior = click_point_prior_nll(click_points(train), click_points(held_out)) if clicks else None
        return cls(data(held_out.items), data(clicks) if clicks else None, prior)

    def __call__(self, learner: Learner) -> dict[str, float]:
        """The scores of `learner`'s current policy (its loss on these pages: for a learner
        with the supervised objective, the NLL per token)."""
        report = {"held_out_nll": learner.evaluate(self.replies.all_batches())["loss"]}
        if self.clicks is not None:
            report["held_out_click_nll"] = learner.evaluate(self.clicks.all_batches())["loss"]
            report["click_prior_nll"] = float(self.prior_nll)
        return report


# ------------------------------------------------------------------------------------
# Evaluation through the JAX sampler engine
# ------------------------------------------------------------------------------------


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


def evaluate_policy(
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
    from cua_jax.rollout.jax_engine import JaxSamplerEngine

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


# ------------------------------------------------------------------------------------
# The whole warm start
# ------------------------------------------------------------------------------------


def warm_start(
    model: nnx.Module,
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    runtime,
    segmenter: Segmenter,
    config: WarmStartConfig = WarmStartConfig(),
    agent_config: AgentConfig = AgentConfig(max_turns=15, max_new_tokens=64, max_context_tokens=4096),
    time_limit_s: float | None = 600.0,
    concurrency: int = 4,
    reasoning: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[SupervisedRun, Demonstrations]:
    """Demonstrations of every (task, seed), then `config.steps` of supervised fine-tuning of
    `model` (updated in place) on them; on_step(step, loss) is called after every step.

    agent_config must be the RL run's (its budgets shape the token streams); the segmenter's
    renderer gives the image processor. Returns the finished run and the demonstrations.
    """
    demonstrations = collect_demonstrations(
        tasks,
        seeds,
        runtime=runtime,
        segmenter=segmenter,
        agent_config=agent_config,
        time_limit_s=time_limit_s,
        concurrency=concurrency,
        reasoning=reasoning,
    )
    return fine_tune(model, demonstrations, tasks, segmenter, config, on_step), demonstrations


def fine_tune(
    model: nnx.Module,
    demonstrations: Demonstrations,
    tasks: Sequence[str],
    segmenter: Segmenter,
    config: WarmStartConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> SupervisedRun:
    """`config.steps` of supervised fine-tuning of `model` (in place) on `demonstrations`' items."""
    if not demonstrations.rollouts:
        raise RuntimeError(f"the oracle succeeded on no episode of {list(tasks)}: {demonstrations.rejected[:5]}")
    multimodal = MultimodalPositions.of(model.config) if hasattr(model, "visual") else None
    data = DemonstrationData(
        demonstrations.items,
        demonstrations.episodes,
        segmenter.renderer.image_processor,
        multimodal,
        config.rows,
        config.length_multiple,
        pad_id=int(segmenter.renderer.tokenizer.pad_token_id or 0),
    )
    run = SupervisedRun(model, data, config)
    run.run(config.steps, on_step)
    run.sync_model()
    return run


def run_warm_start(
    policy, tasks: Sequence[str], config, settings, segmenter, renderer, workdir: str
) -> dict[str, float]:
    """A training run's warm start: supervised fine-tuning of `policy` (in place) on the
    oracle's demonstrations of `tasks` (config.warm_start.demos_per_task training seeds),
    collected through the run's agent loop and segmenter on a capsule runtime of its own, and
    scored on held-out pages when config.warm_start.held_out_seeds. Returns the warm start's
    metrics; the loss curve and the record go to <workdir>/warm_start.json."""
    from cua_jax.envs.capsules import CapsuleOptions
    from cua_jax.observe.metrics import TIMING_PREFIX

    c = config
    # The demonstrations' budgets are the larger of training's and evaluation's, so a
    # multi-step oracle episode is not cut short; the token stream is the same either way.
    agent = dataclasses.replace(settings.agent, max_turns=max(c.rollout.max_turns, c.eval.max_turns))
    progress, on_step = None, None
    if c.train.progress_bar:
        from tqdm import tqdm

        progress = tqdm(total=c.warm_start.steps, desc=f"{c.name} warm start", unit="step")

        def on_step(step: int, loss: float) -> None:
            progress.update(1)
            progress.set_postfix(nll=f"{loss:.3f}")

    start = time.perf_counter()
    held_out = {}
    catalog = settings.catalog
    code = [catalog[t].spec for t in tasks if catalog[t].kind == "code"]
    miniwob = [t for t in tasks if catalog[t].kind == "miniwob"]
    seeds = range(c.warm_start.demos_per_task)
    try:
        parts = []
        if code:  # the code oracle's fixes on code containers
            from cua_jax.train.code_demonstrations import collect_code_demonstrations

            parts.append(
                collect_code_demonstrations(
                    code,
                    seeds,
                    code_env=settings.code_env,
                    segmenter=segmenter,
                    agent_config=agent,
                    concurrency=c.warm_start.concurrency,
                )
            )
        with contextlib.ExitStack() as stack:
            if miniwob:
                runtime = stack.enter_context(
                    CapsuleOptions.from_config(c.env.capsules).runtime(
                        include_dom_text=True, action_space=c.env.action_space, seed=c.seed
                    )
                )
                parts.append(
                    collect_demonstrations(
                        miniwob,
                        seeds,
                        runtime=runtime,
                        segmenter=segmenter,
                        agent_config=agent,
                        time_limit_s=c.env.time_limit_s,
                        concurrency=c.warm_start.concurrency,
                    )
                )
            demonstrations = Demonstrations(
                [r for d in parts for r in d.rollouts],
                [x for d in parts for x in d.rejected],
                [e for d in parts for e in d.oracle_errors],
            )
            run = fine_tune(policy, demonstrations, tasks, segmenter, settings.warm_start, on_step)
            if miniwob and c.warm_start.held_out_seeds:
                # Past the evaluation seeds: outside training's range and unseen by "before".
                first = c.env.eval_seed_start + c.eval.num_seeds
                unseen = collect_demonstrations(
                    miniwob,
                    range(first, first + c.warm_start.held_out_seeds),
                    runtime=runtime,
                    segmenter=segmenter,
                    agent_config=agent,
                    time_limit_s=c.env.time_limit_s,
                    concurrency=c.warm_start.concurrency,
                )
                if unseen.rollouts:
                    scorer = HeldOutScorer.build(
                        demonstrations, unseen, renderer, run.data.multimodal, settings.warm_start
                    )
                    held_out = scorer(run.learner)
    finally:
        if progress is not None:
            progress.close()
    wall = time.perf_counter() - start
    record = {
        "losses": run.losses,
        "demonstrations": len(demonstrations.rollouts),
        "items": len(demonstrations.items),
        "response_tokens": demonstrations.num_response_tokens,
        "rejected": demonstrations.rejected,
        "oracle_errors": demonstrations.oracle_errors,
        "sft_seconds": run.seconds,
        "wall_seconds": wall,
        "compiled_shapes": len(run.shapes),
        **held_out,
    }
    with open(os.path.join(workdir, "warm_start.json"), "w") as f:
        json.dump(record, f, indent=2)
    tail = run.losses[-10:]
    return {
        "warm_start/demonstrations": float(len(demonstrations.rollouts)),
        "warm_start/rejected": float(len(demonstrations.rejected)),
        "warm_start/items": float(len(demonstrations.items)),
        "warm_start/loss_first": run.losses[0],
        "warm_start/loss_last10": float(np.mean(tail)),
        **{f"warm_start/{name}": value for name, value in held_out.items()},
        TIMING_PREFIX + "warm_start_s": wall,
    }
