"""Supervised fine-tuning on demonstrations (the warm start's, `cua_jax.train.warm_start`):

SupervisedRun(model, DemonstrationData(items, ...), config).run(config.steps)
    the `Learner` with its supervised objective ("sft": token-mean negative log-likelihood
    of the items' loss-mask tokens, the oracle's replies) under the config's optimizer,
    one update per batch; batches are `batching.collate`'s, one compiled step per shape
    bucket. Resumable; keeps the loss curve.
fine_tune(model, demonstrations, tasks, segmenter, config)
    the same run over a `Demonstrations`' items, with the model updated in place.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from cua_jax.checks import require_at_least
from cua_jax.context.segment import Segmenter
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
from cua_jax.train.demonstrations import Demonstrations
from cua_jax.train.learner import SCHEDULES, Learner, LearnerConfig, OptimizerConfig
from cua_jax.types import Episode, TrainingItem


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """The supervised fine-tuning run (config.warm_start holds its fields by these names, the
    learner's chunking and length multiple and the run's seed aside).

    steps: optimizer steps (a run's warm start: 0, none). rows: items per step (the batch).
    learning_rate / warmup_steps / weight_decay / max_grad_norm: AdamW as
    `learner.OptimizerConfig`. schedule: after the warmup, "constant" or "cosine" (decay to
    min_lr_ratio x learning_rate at the last step). length_multiple: item lengths are padded to a
    multiple of it (one compiled step per distinct (length, image count) bucket). seed: batch order.
    seq_chunk / vocab_chunk: chunking of the log-softmax (`cua_jax.models.scoring`).
    demos_per_task: the oracle's demonstrations per task, on training seeds 0 .. demos_per_task - 1.
    concurrency: oracle episodes run at once. held_out_seeds: demonstrations per task on seeds
    past the evaluation seeds, never trained on, scored after the warm start (0: none).
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
    demos_per_task: int = 8
    concurrency: int = 4
    held_out_seeds: int = 0

    def __post_init__(self):
        require_at_least(self, ("rows", "demos_per_task", "concurrency"), 1)
        require_at_least(self, ("steps", "held_out_seeds"), 0)
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
