"""Coordinated collection across processes (config.train.coordinated): each process of a
multi-host run collects its share of a step's groups and trains on them as its shard of the
global batch.

A step's draw is the same on every process (a function of the run's base key and the step, and
of the sampler's state, which every process updates with every group's outcome). The draw's
groups are dealt to the processes by `partition_groups` (whole groups, balanced by expected
cost); process p runs only its own. After the groups ran, the processes exchange their groups'
summaries (`group_summary`: the episodes without their screenshots, and training items without
their arrays; a few kilobytes per group) with `ProcessGroup.exchange`, so every process updates
its sampler with every outcome and computes the step's metrics over the whole batch, exactly as
one process collecting everything would. Training data stays where it was collected: each
process's items, with the advantages of its own groups, become its rows of the global
micro-batches (`process_microbatches` + `Learner.global_batch`), at the shapes the processes
agree on first (`agree_batch_shape`: the micro-batches' count and lengths, and with shared
prefix rows each process's block of them), and the learner's jitted passes reduce the loss
totals (numerator, token-mean denominator, metric sums) over the whole mesh.

In async mode each process's rollout threads collect its share of every draw with no exchange
(`GroupCollector.draw_share`), and a step takes `step_share` groups from each process's buffer,
all at once (`RolloutFeeder.take_agreed`), before training as above.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.models.vision import ImageGrid, bucket_count, pad_image_count
from cua_jax.train.batching import (
    BatchingConfig,
    ImageKey,
    MultimodalPositions,
    TrainBatch,
    bucket_length,
    collate,
    group_order,
    same_patches,
    shared_prefix_length,
)
from cua_jax.train.groups import CollectedGroup
from cua_jax.types import TrainingItem


def partition_groups(costs: Sequence[float], num_processes: int) -> list[int]:
    """The process that runs each group of a step's draw: the owner of group g is
    `partition_groups(costs, P)[g]`.

    Greedy longest-processing-time: the groups, most expensive first (draw order among equal
    costs), go one at a time to the process with the least cost so far (the lowest index among
    equal loads), so equal costs are dealt round robin (g -> g mod P). A pure function of the
    costs and the process count: every process computes the same partition.
    """
    if num_processes < 1:
        raise ValueError(f"partition_groups: num_processes must be >= 1, got {num_processes}")
    if any(c < 0 for c in costs):
        raise ValueError(f"partition_groups: costs must be >= 0, got {list(costs)}")
    load = [0.0] * num_processes
    owners = [0] * len(costs)
    for g in sorted(range(len(costs)), key=lambda g: (-costs[g], g)):
        p = min(range(num_processes), key=lambda p: (load[p], p))
        owners[g] = p
        load[p] += costs[g]
    return owners


def step_share(batch_tasks: int, num_processes: int, index: int) -> int:
    """The groups process `index` adds to each step of a coordinated async run: its share of a
    draw of `batch_tasks` equal-cost groups (`partition_groups`), so every step trains
    `batch_tasks` groups in all."""
    return partition_groups([1.0] * batch_tasks, num_processes).count(index)


def allgather_objects(value: Any) -> list[Any]:
    """Every process's `value` (picklable), by process index, through JAX's collectives (every
    process must call it, in the same order). One process: [value]."""
    import jax

    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    blob = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([blob.size], np.int32))).reshape(-1)
    padded = np.zeros(1 << int(sizes.max() - 1).bit_length(), np.uint8)  # a power of two: few programs
    padded[: blob.size] = blob
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [pickle.loads(gathered[p, : int(sizes[p])].tobytes()) for p in range(len(sizes))]


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """This process's place in a coordinated run: its index, the process count, and `exchange`
    (value -> every process's value, by process index; a collective every process calls in the
    same order). `current()` is JAX's processes; tests build one over threads."""

    index: int
    count: int
    exchange: Callable[[Any], list[Any]]

    @classmethod
    def current(cls) -> ProcessGroup:
        import jax

        return cls(jax.process_index(), jax.process_count(), allgather_objects)

    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        """The sum over the processes of each key's value (a key some process lacks counts 0
        there), in process order: the same floats on every process."""
        totals: dict[str, float] = {}
        for part in self.exchange(dict(values)):
            for key, value in part.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        return totals


def _item_summary(item: TrainingItem) -> TrainingItem:
    empty = np.zeros(0, np.int32)
    return dataclasses.replace(item, ids=empty, loss_mask=empty, rollout_logprobs=np.zeros(0, np.float32), images=[])


def group_summary(group: CollectedGroup) -> CollectedGroup:
    """What the other processes need of a group: its episodes with their turns' screenshots
    dropped, and its training items (one per item, so counts stay exact) without their arrays.
    Enough for the sampler's outcome, the step's metrics and the episode log."""
    episodes = []
    for episode in group.episodes:
        episode = dataclasses.replace(episode, turns=[dataclasses.replace(t, images=[]) for t in episode.turns])
        episodes.append(episode)
    return dataclasses.replace(
        group,
        episodes=episodes,
        items={episode_id: [_item_summary(i) for i in items] for episode_id, items in group.items.items()},
    )


@dataclasses.dataclass(frozen=True)
class MicrobatchShape:
    """What every process's part of one global micro-batch must agree on: the rows' padded
    length and, with shared prefix rows, each process's prefix block (rows, padded length)."""

    length: int
    prefix: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """A step's global micro-batches (`MicrobatchShape` each), and the whole batch's item count
    and forward tokens (prefix tokens once per group and micro-batch, as `batch_tokens` counts)."""

    microbatches: tuple[MicrobatchShape, ...]
    items: int
    tokens: int


def _chunks(count: int, rows: int, microbatches: int | None = None) -> list[list[int]]:
    """Item indices of each micro-batch of `rows` rows (the items in order), `microbatches` of them."""
    n = -(-count // rows) if microbatches is None else microbatches
    return [list(range(m * rows, min((m + 1) * rows, count))) for m in range(n)]


def _chunk_stats(
    items: Sequence[TrainingItem], config: BatchingConfig, pixel_patches: Mapping[ImageKey, np.ndarray] | None = None
) -> tuple[int, int, int, int]:
    """(longest row, prefix rows, longest prefix, forward tokens) of one micro-batch's items, as
    `collate` lays them out (with `pixel_patches`, a prefix shares only images of equal patches)."""
    if not config.share_prefix:
        return max((len(i) for i in items), default=1), 0, 0, int(sum(len(i) for i in items))
    longest, splits, tokens = 1, [], 0
    same_image = same_patches(pixel_patches)
    for members in group_order(items):
        group = [items[i] for i in members]
        split = shared_prefix_length(group, same_image)
        splits.append(split)
        longest = max([longest] + [len(i) - split for i in group])
        tokens += split + sum(len(i) - split for i in group)
    return longest, len(splits), max(splits, default=0), tokens


def agree_batch_shape(
    items: Sequence[TrainingItem],
    config: BatchingConfig,
    local_rows: int,
    processes: ProcessGroup,
    shards: int = 1,
    pixel_patches: Mapping[ImageKey, np.ndarray] | None = None,
) -> BatchShape:
    """The step's global micro-batches from this process's `items` (an exchange): as many as
    the process with the most items needs at `local_rows` rows each (the others pad with empty
    micro-batches), each padded to the bucket of its longest row on any process; with shared
    prefix rows, every process's prefix block holds as many rows as the process with the most
    groups there needs (bucketed, then a multiple of `shards`, the row shards a process's
    devices cut its block into) at the bucket of the longest prefix. pixel_patches: the items'
    screenshots' patches (`process_images`), as `collate` is given them."""
    mine = [_chunk_stats([items[i] for i in chunk], config, pixel_patches) for chunk in _chunks(len(items), local_rows)]
    counts, every = zip(*processes.exchange((len(items), mine)))
    multiple = config.length_multiple
    if config.share_prefix and config.suffix_length_multiple is not None:
        multiple = config.suffix_length_multiple
    shapes = []
    for m in range(max(max(len(e) for e in every), 1)):
        stats = [e[m] for e in every if m < len(e)] or [(1, 0, 0, 0)]
        length = bucket_length(max(s[0] for s in stats), multiple, config.length_pow2)
        prefix = None
        if config.share_prefix:
            rows = max(bucket_count(max(s[1] for s in stats)), 1)
            rows = -(-rows // shards) * shards
            prefix = (rows, bucket_length(max(s[2] for s in stats), config.length_multiple, config.length_pow2))
        shapes.append(MicrobatchShape(length, prefix))
    return BatchShape(tuple(shapes), sum(counts), sum(stat[3] for e in every for stat in e))


def items_of_whole_batch(
    items: Sequence[TrainingItem], whole_items: Sequence[TrainingItem], whole_advantages: np.ndarray
) -> np.ndarray:
    """The advantages the whole batch's items (`prepare_batch` of every group's summary, whose
    items keep each episode's order) give this process's `items`: for advantages that span
    groups (advantage.permute_rewards' permutation over the batch), as one process computes them."""
    by_item: dict[tuple[str, int], float] = {}
    seen: collections.Counter[str] = collections.Counter()
    for item, advantage in zip(whole_items, np.asarray(whole_advantages, np.float32)):
        by_item[(item.episode_id, seen[item.episode_id])] = advantage
        seen[item.episode_id] += 1
    seen.clear()
    out = []
    for item in items:
        out.append(by_item[(item.episode_id, seen[item.episode_id])])
        seen[item.episode_id] += 1
    return np.asarray(out, np.float32)


def minibatch_shares(
    items: Sequence[TrainingItem], item_advantages: np.ndarray, minibatch_groups: Sequence[Sequence[int]]
) -> list[tuple[list[TrainingItem], np.ndarray]]:
    """This process's (items, advantages) of each mini-batch of the whole batch's plan
    (`PreparedBatch.minibatch_groups` of every group's summary: the group ids of each mini-batch,
    as one process collecting everything cuts them); empty where it holds none of its groups."""
    advantages = np.asarray(item_advantages, np.float32)
    out = []
    for group_ids in minibatch_groups:
        members = set(group_ids)
        take = [i for i, item in enumerate(items) if item.group_id in members]
        out.append(([items[i] for i in take], advantages[take]))
    return out


def process_microbatches(
    items: Sequence[TrainingItem],
    item_advantages: np.ndarray,
    config: BatchingConfig,
    local_rows: int,
    shape: BatchShape,
    multimodal: MultimodalPositions | None = None,
    block: int = 0,
    pixel_patches: Mapping[ImageKey, np.ndarray] | None = None,
    processes: ProcessGroup | None = None,
) -> list[TrainBatch]:
    """This process's rows of each global micro-batch: its items in order (whole groups, as
    `prepare_batch` lists them), `local_rows` per micro-batch at the agreed shapes, padded with
    empty micro-batches up to the agreed count (numpy; `Learner.global_batch` places them).
    block: this process's block among the processes' (`Learner.process_rows`), which places its
    prefix rows after those of the blocks before it.

    Screenshots (a vision-language policy: `multimodal`, with pixel_patches from
    `process_images` and `processes`, whose every member calls this with the same shape): a
    micro-batch's images are replicated over the mesh, so each micro-batch carries every
    process's images (`join_process_images`, one exchange for all the micro-batches, which
    every process joins whether or not its own items have images), in the row-major
    placeholder order of the global rows."""
    join = processes is not None and multimodal is not None
    if any(item.images for item in items) and (pixel_patches is None or not join):
        raise ValueError("process_microbatches: items with images need their pixel_patches and the processes")
    local = dataclasses.replace(config, rows=local_rows)
    adv = np.asarray(item_advantages, np.float32)
    out = []
    for chunk, micro in zip(_chunks(len(items), local_rows, len(shape.microbatches)), shape.microbatches):
        offset = block * micro.prefix[0] if micro.prefix is not None else 0
        out.append(
            collate(
                [items[i] for i in chunk],
                adv[chunk],
                local,
                pixel_patches=pixel_patches,
                multimodal=multimodal,
                length=micro.length,
                prefix_shape=micro.prefix,
                prefix_offset=offset,
                pad_images=not join,
            )
        )
    if join:
        out = join_process_images(out, block, processes)
    return out


def _process_images_of(batch: TrainBatch) -> tuple:
    """What the other processes need of a micro-batch part's images: (patches of its rows'
    images [N, D] or None, each row's patch count, their grids; its prefix block's patches or
    None, their grids)."""
    counts = np.zeros(batch.rows, np.int64) if batch.patch_offsets is None else np.diff(batch.patch_offsets)
    grids = () if batch.image_grid is None else tuple(batch.image_grid.thw)
    prefix = batch.prefix
    p_pixels = None if prefix is None else prefix.pixel_values
    p_grids = () if prefix is None or prefix.image_grid is None else tuple(prefix.image_grid.thw)
    return batch.pixel_values, counts, grids, p_pixels, p_grids


def _joined(pixels: Sequence[np.ndarray | None], grids: Sequence[tuple]) -> tuple[np.ndarray | None, ImageGrid | None]:
    """The parts' images (each part's patches [N, D] of the images of its `grids`), one part
    after the other, the count bucketed with blank copies as `collate` pads one process's; or
    (None, None) where no part has any."""
    images, joined_grids = [], []
    for patches, part_grids in zip(pixels, grids):
        if patches is None:
            continue
        sizes = [t * h * w for t, h, w in part_grids]
        images += np.split(patches, np.cumsum(sizes)[:-1])
        joined_grids += list(part_grids)
    if not images:
        return None, None
    pad_image_count(images, joined_grids)
    return np.concatenate(images, axis=0), ImageGrid(tuple(joined_grids))


def join_process_images(parts: Sequence[TrainBatch], block: int, processes: ProcessGroup) -> list[TrainBatch]:
    """This process's micro-batch parts (`collate` with pad_images=False), each with the images
    of every process's part of its global micro-batch: rows' images in block order, then blank
    images up to the bucketed count; patch_offsets over the global rows; the prefix blocks'
    images likewise. One exchange (a collective every process calls with as many parts); the
    images are then the same arrays on every process, which `Learner.global_batch` places
    replicated. Exact: the global micro-batch holds the images one process collating all the
    rows would, in the same order."""
    every = sorted(processes.exchange((block, [_process_images_of(part) for part in parts])), key=lambda e: e[0])
    out = []
    for m, part in enumerate(parts):
        mine = [e[1][m] for e in every]
        pixels, grid = _joined([x[0] for x in mine], [x[2] for x in mine])
        offsets = None
        if pixels is not None:
            offsets = np.concatenate([[0], np.cumsum(np.concatenate([x[1] for x in mine]))]).astype(np.int32)
        part = part.replace(pixel_values=pixels, patch_offsets=offsets, image_grid=grid)
        if part.prefix is not None:
            p_pixels, p_grid = _joined([x[3] for x in mine], [x[4] for x in mine])
            part = part.replace(prefix=part.prefix.replace(pixel_values=p_pixels, image_grid=p_grid))
        out.append(part)
    return out


def host_state(state: Any) -> Any:
    """A host (numpy) copy of `state`'s arrays, each whole on every process (a collective when
    they are sharded over several processes): what a process's own engines load."""
    import jax

    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, state)
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), state)


def state_fingerprint(state: Any) -> str:
    """A digest of `state`'s arrays (process-local: each leaf's local value), in tree order."""
    import hashlib

    import jax

    digest = hashlib.sha1()
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def check_same_state(state: Any, processes: ProcessGroup, what: str) -> None:
    """Raises unless every process holds the same `state` (an exchange of `state_fingerprint`):
    a coordinated run's processes each hand the learner their own copy of the policy, and a
    global array made from them is only right where the copies are equal (a host that loaded
    another checkpoint, or skipped the warm start, would train on a mixed policy)."""
    prints = processes.exchange(state_fingerprint(state))
    differ = [p for p, fingerprint in enumerate(prints) if fingerprint != prints[0]]
    if differ:
        raise RuntimeError(
            f"{what} differs between processes: process(es) {differ} hold another one than process 0 "
            "(every process must load the same model.init_from, and a warm start's result is sent from process 0)"
        )
