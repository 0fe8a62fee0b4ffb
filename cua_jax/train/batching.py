"""Training items -> padded device batches with static shapes, in whole rollout groups.

A `TrainBatch` is one micro-batch: `rows` sequences (B) padded to a bucketed length (L).
Rows past the real items are padding rows: segment 0 everywhere and an empty loss mask,
so they count in no loss denominator. Bucketing keeps the set of shapes small, so the
jitted train step compiles once per (B, L[, images]) bucket instead of once per batch:

  L = `bucket_length(max item length)`: the next multiple of `length_multiple`, or the
      next power of two >= max(n, length_multiple) with `length_pow2`.
  images: the images of all rows, in row order, concatenated into pixel_values [N, D];
      the image count is padded to the next power of two with blank copies of the last
      grid. A padding image has no placeholder tokens, so the model never reads its
      features (image features are matched to placeholders in order and the extra ones
      are left over); its only cost is the vision tower's work on it.

Mini-batches (one optimizer update each) hold whole groups (`whole_group_minibatches`),
so a group's zero-sum advantages are never split across updates; each mini-batch is cut
into micro-batches of `rows` rows, whose gradients the learner accumulates exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import struct

from cua_jax.models.qwen3_vl import rope_index
from cua_jax.models.scoring import SharedPrefix, image_model_inputs
from cua_jax.models.vision import ImageGrid, bucket_count, image_content_key, pad_image_count
from cua_jax.rl.advantages import token_advantages
from cua_jax.train.buffer import whole_group_minibatches
from cua_jax.types import Episode, ImageSpan, TrainingItem

# (episode_id, turn, index): names one screenshot, as an ImageSpan locates it in its episode.
ImageKey = tuple[str, int, int]


@struct.dataclass
class TrainBatch:
    """One padded micro-batch (B rows, L tokens); every array field is a device-ready array.

    ids: int32 [B, L]; padding holds `pad_id`.
    segment_ids: int32 [B, L]; 1 on an item's tokens, 0 on padding (attention and scoring
      skip segment 0).
    positions: int32 [B, L] (text: 0.. along the item, 0 on padding) or [3, B, L] (Qwen3-VL
      multimodal positions from `rope_index`).
    loss_mask: float32 [B, L], 1 on the tokens to train.
    rollout_logprobs: float32 [B, L], the engine's logprobs (0 off the mask).
    advantages: float32 [B, L], each item's advantage on its loss mask, 0 elsewhere.
    item_valid: bool [B], False on padding rows.
    old_logprobs / ref_logprobs: float32 [B, L] or None; filled by the learner (recomputed
      old policy, frozen reference) once per rollout batch.
    pixel_values: float32 [N, D] or None: the patches of every image, row order, N bucketed.
    patch_offsets: int32 [B + 1] or None: row b's patches are pixel_values[off[b]:off[b+1]].
    image_grid: the (t, h, w) grid of each image in pixel_values (static: part of the
      compiled program), or None without images.
    prefix: the rows' shared prefix rows (`SharedPrefix`; config.share_prefix), or None: the
      rows are whole sequences. With a prefix, a row holds the rest of its item and its arrays
      (positions included) are that part's.
    image_features: the images already encoded by a frozen vision tower and laid out over the
      ids (the models' `image_features` input), set by the learner in place of pixel_values.
    """

    ids: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    loss_mask: jax.Array
    rollout_logprobs: jax.Array
    advantages: jax.Array
    item_valid: jax.Array
    old_logprobs: jax.Array | None = None
    ref_logprobs: jax.Array | None = None
    pixel_values: jax.Array | None = None
    patch_offsets: jax.Array | None = None
    image_grid: ImageGrid | None = struct.field(pytree_node=False, default=None)
    prefix: SharedPrefix | None = None
    image_features: tuple | None = None

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])

    def model_inputs(self) -> dict:
        """The image inputs of the model's forward (empty for text-only batches)."""
        return image_model_inputs(self.pixel_values, self.image_grid, self.image_features)


@dataclasses.dataclass(frozen=True)
class MultimodalPositions:
    """What `rope_index` needs to build Qwen3-VL's [3, B, L] positions (from Qwen3VLConfig)."""

    image_token_id: int
    spatial_merge_size: int

    @classmethod
    def of(cls, vl_config) -> MultimodalPositions:
        return cls(vl_config.image_token_id, vl_config.vision.spatial_merge_size)


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """Shapes of the micro-batches.

    rows: sequences per micro-batch (B); a multiple of the mesh's data x fsdp size.
    length_multiple / length_pow2: the length bucket (see module doc).
    max_length: items longer than this are an error (None: no limit).
    pad_id: token id in padding positions (never attended or trained).
    share_prefix: the items of a group share one prefix row (their common prompt), run once
      (`collate`).
    suffix_length_multiple: with share_prefix, the rows (what follows the prefix: replies and
      later turns, far shorter than the prompt) pad to a multiple of this instead (None:
      length_multiple); prefix rows keep length_multiple.
    """

    rows: int = 8
    length_multiple: int = 64
    length_pow2: bool = False
    max_length: int | None = None
    pad_id: int = 0
    share_prefix: bool = False
    suffix_length_multiple: int | None = None

    def __post_init__(self):
        if self.rows < 1:
            raise ValueError(f"BatchingConfig.rows must be >= 1, got {self.rows}")
        if self.length_multiple < 1:
            raise ValueError(f"BatchingConfig.length_multiple must be >= 1, got {self.length_multiple}")
        if self.suffix_length_multiple is not None and self.suffix_length_multiple < 1:
            raise ValueError(f"BatchingConfig.suffix_length_multiple must be >= 1, got {self.suffix_length_multiple}")


def bucket_length(n: int, multiple: int = 64, pow2: bool = False) -> int:
    """The padded length for a longest item of n tokens: >= max(n, 1), a multiple of `multiple`
    (or, with pow2, the next power of two >= max(n, multiple))."""
    n = max(int(n), 1)
    if pow2:
        return 1 << (max(n, multiple) - 1).bit_length()
    return -(-n // multiple) * multiple


def _check_item(i: int, item: TrainingItem, max_length: int | None) -> None:
    n = len(item)
    for name in ("loss_mask", "rollout_logprobs"):
        shape = np.shape(getattr(item, name))
        if shape != (n,):
            raise ValueError(f"item {i} ({item.episode_id}): {name} has shape {shape}, ids have ({n},)")
    if max_length is not None and n > max_length:
        raise ValueError(f"item {i} ({item.episode_id}) has {n} tokens, more than max_length {max_length}")


def item_positions(item: TrainingItem, multimodal: MultimodalPositions | None) -> np.ndarray:
    """An item's positions in its sequence: int32 [L] (text: 0..L-1) or [3, L] (Qwen3-VL's
    multimodal positions from `rope_index`, over its images' grids)."""
    if multimodal is None:
        return np.arange(len(item), dtype=np.int32)

    spans = sorted(item.images, key=lambda s: s.start)
    positions, _ = rope_index(
        np.asarray(item.ids)[None],
        [tuple(int(x) for x in s.grid_thw) for s in spans] or None,
        image_token_id=multimodal.image_token_id,
        spatial_merge_size=multimodal.spatial_merge_size,
    )
    return positions[:, 0].astype(np.int32)


def first_trained(item: TrainingItem) -> int:
    """The index of the item's first loss-mask token (its length when none is trained)."""
    on = np.flatnonzero(np.asarray(item.loss_mask) != 0)
    return int(on[0]) if len(on) else len(item)


def shared_prefix_length(items: Sequence[TrainingItem], same_image=None) -> int:
    """Where items that begin alike split into a shared prefix row and their own rows: s such
    that every item has the same tokens [0, s), none trains any of them, the token that predicts
    each item's first trained token is at s or after (it opens the item's row), no image run
    crosses s, and every image in [0, s) is the same in all items (`same_image(item_a, span_a,
    item_b, span_b)`; None: by grid). 0 when there is nothing to share."""
    first = items[0]
    n = min(len(item) for item in items)
    common = n
    for item in items[1:]:
        differs = np.flatnonzero(np.asarray(item.ids[:n]) != np.asarray(first.ids[:n]))
        common = min(common, int(differs[0]) if len(differs) else n)
    split = min(common, min(first_trained(item) for item in items)) - 1
    for span in sorted(first.images, key=lambda s: s.start):
        if span.start >= split:
            break
        if span.end > split:
            split = span.start
            break
        for item in items[1:]:
            other = next((o for o in item.images if (o.start, o.end) == (span.start, span.end)), None)
            same = other is not None and (
                same_image(first, span, item, other)
                if same_image is not None
                else tuple(other.grid_thw) == tuple(span.grid_thw)
            )
            if not same:
                split = span.start
                break
        else:
            continue
        break
    return max(split, 0)


def same_patches(pixel_patches: Mapping[ImageKey, np.ndarray] | None):
    """The `same_image` test of `shared_prefix_length` by the images' patches (None without
    patches: by grid)."""
    if not pixel_patches:
        return None

    def same_image(a, span_a, c, span_c):
        pa = pixel_patches[(a.episode_id, span_a.turn, span_a.index)]
        pc = pixel_patches[(c.episode_id, span_c.turn, span_c.index)]
        return pa is pc or np.array_equal(pa, pc)

    return same_image


def _image_arrays(images: Sequence[tuple[TrainingItem, ImageSpan]], pixel_patches, rows: int, pad: bool = True):
    """(pixel_values [N, D], patch_offsets [rows + 1], ImageGrid) of `images` ((item, span) in
    row-major placeholder order, with each item's row), the count bucketed with blank copies
    (pad; without: the images alone, for a process's part of a global micro-batch)."""
    patches, grids, offsets = [], [], np.zeros((rows + 1,), np.int32)
    for row, item, span in images:
        key = (item.episode_id, span.turn, span.index)
        if key not in pixel_patches:
            raise ValueError(f"collate: no pixel patches for image {key} of row {row}")
        p = np.asarray(pixel_patches[key], np.float32)
        t, h, w = span.grid_thw
        if p.ndim != 2 or p.shape[0] != t * h * w:
            raise ValueError(
                f"collate: image {key} has patches of shape {p.shape}, its grid {span.grid_thw} needs {t * h * w} rows"
            )
        patches.append(p)
        grids.append(tuple(int(x) for x in span.grid_thw))
        offsets[row + 1 :] += p.shape[0]
    if pad:
        pad_image_count(patches, grids)
    return np.concatenate(patches, axis=0), offsets, ImageGrid(tuple(grids))


def collate(
    items: Sequence[TrainingItem],
    item_advantages: Sequence[float] | np.ndarray,
    config: BatchingConfig,
    *,
    pixel_patches: Mapping[ImageKey, np.ndarray] | None = None,
    multimodal: MultimodalPositions | None = None,
    length: int | None = None,
    prefix_shape: tuple[int, int] | None = None,
    prefix_offset: int = 0,
    pad_images: bool = True,
) -> TrainBatch:
    """Pads `items` (at most config.rows) into one micro-batch of numpy arrays.

    Args:
      items: the micro-batch's training items, one per row.
      item_advantages: float [len(items)], each item's advantage (from
        `cua_jax.rl.advantages.broadcast_to_items` or `stepo_item_advantages`).
      config: shapes, and whether items of a group share a prefix row (config.share_prefix).
      pixel_patches: the processor's patches of each screenshot, [t*h*w, D] for an ImageSpan
        with grid (t, h, w), keyed by (episode_id, turn, index). Required when items have images.
      multimodal: build Qwen3-VL [3, B, L] positions (None: text positions [B, L]).
      length: force this padded length (>= the longest row) instead of the bucket.
      prefix_shape: with config.share_prefix, force the prefix rows' (count, padded length)
        instead of their buckets (a prefix block even without items); prefix_offset is added to
        every row's prefix index. Both for a process's part of a global micro-batch
        (`cua_jax.train.coordinated`), whose prefix rows follow other processes'.
      pad_images: bucket the image count with blank images (False: the rows' images alone, which
        `cua_jax.train.coordinated.join_process_images` joins with other processes' and pads).

    With config.share_prefix, the items of each group (group_id) split at
    `shared_prefix_length`: the shared tokens form one prefix row of `TrainBatch.prefix` and each
    item's row holds the rest (its positions those of its whole sequence), so the learner runs a
    group's prompt once (`cua_jax.models.scoring.prefixed_hidden_states`).

    Returns:
      TrainBatch with numpy leaves (shapes in its docstring); `jax.device_put` it.
    """

    b = config.rows
    if len(items) > b:
        raise ValueError(f"collate: {len(items)} items do not fit in a micro-batch of {b} rows")
    adv = np.asarray(item_advantages, np.float32)
    if adv.shape != (len(items),):
        raise ValueError(f"collate: item_advantages has shape {adv.shape}, expected ({len(items)},)")
    for i, item in enumerate(items):
        _check_item(i, item, config.max_length)
    if any(item.images for item in items):
        if pixel_patches is None:
            raise ValueError("collate: items have images but no pixel_patches were given")
        if multimodal is None:
            raise ValueError("collate: items have images but the model takes text only (multimodal=None)")

    # Each row's first token (0, or its group's split) and its group's prefix row.
    starts = np.zeros(len(items), np.int64)
    prefix_rows: list[tuple[TrainingItem, int]] = []  # (the group's first item, its split)
    row_prefix = np.zeros(b, np.int32)
    if config.share_prefix:
        same_image = same_patches(pixel_patches)
        for members in group_order(items):
            split = shared_prefix_length([items[i] for i in members], same_image)
            for i in members:
                starts[i] = split
                row_prefix[i] = len(prefix_rows)
            prefix_rows.append((items[members[0]], split))
    longest = max((len(item) - int(start) for item, start in zip(items, starts)), default=1)
    if length is None:
        multiple = config.length_multiple
        if config.share_prefix and config.suffix_length_multiple is not None:
            multiple = config.suffix_length_multiple
        length = bucket_length(longest, multiple, config.length_pow2)
    elif length < longest:
        raise ValueError(f"collate: length {length} is shorter than the longest item ({longest})")

    ids = np.full((b, length), config.pad_id, np.int32)
    segment_ids = np.zeros((b, length), np.int32)
    loss_mask = np.zeros((b, length), np.float32)
    rollout_logprobs = np.zeros((b, length), np.float32)
    item_valid = np.zeros((b,), bool)
    positions = np.zeros((3, b, length) if multimodal is not None else (b, length), np.int32)
    images = []
    for row, (item, start) in enumerate(zip(items, starts)):
        n = len(item) - int(start)
        ids[row, :n] = item.ids[start:]
        segment_ids[row, :n] = 1
        loss_mask[row, :n] = np.asarray(item.loss_mask[start:]) != 0
        rollout_logprobs[row, :n] = np.where(loss_mask[row, :n] > 0, item.rollout_logprobs[start:], 0.0)
        positions[..., row, :n] = item_positions(item, multimodal)[..., start:]
        item_valid[row] = True
        images += [(row, item, span) for span in sorted(item.images, key=lambda s: s.start) if span.start >= start]
    padded_adv = np.zeros((b,), np.float32)
    padded_adv[: len(items)] = adv
    advantages = np.asarray(token_advantages(padded_adv, loss_mask), np.float32)
    pixel_values = patch_offsets = image_grid = None
    if images:
        pixel_values, patch_offsets, image_grid = _image_arrays(images, pixel_patches, b, pad_images)

    prefix = None
    if prefix_rows or (config.share_prefix and prefix_shape is not None):
        g = bucket_count(len(prefix_rows))
        lp = bucket_length(
            max((split for _, split in prefix_rows), default=1), config.length_multiple, config.length_pow2
        )
        if prefix_shape is not None:
            if prefix_shape[0] < len(prefix_rows) or prefix_shape[1] < max((s for _, s in prefix_rows), default=0):
                raise ValueError(
                    f"collate: prefix_shape {prefix_shape} does not hold {len(prefix_rows)} prefix rows of up to "
                    f"{max((s for _, s in prefix_rows), default=0)} tokens"
                )
            g, lp = prefix_shape
        row_prefix += prefix_offset
        p_ids = np.full((g, lp), config.pad_id, np.int32)
        p_segments = np.zeros((g, lp), np.int32)
        p_positions = np.zeros((3, g, lp) if multimodal is not None else (g, lp), np.int32)
        p_images = []
        for r, (item, split) in enumerate(prefix_rows):
            p_ids[r, lp - split :] = item.ids[:split]
            p_segments[r, lp - split :] = 1
            p_positions[..., r, lp - split :] = item_positions(item, multimodal)[..., :split]
            p_images += [(r, item, span) for span in sorted(item.images, key=lambda s: s.start) if span.end <= split]
        p_pixels, _, p_grid = (None, None, None)
        if p_images:
            p_pixels, _, p_grid = _image_arrays(p_images, pixel_patches, g, pad_images)
        prefix = SharedPrefix(p_ids, p_segments, p_positions, row_prefix, p_pixels, p_grid)
    return TrainBatch(
        ids=ids,
        segment_ids=segment_ids,
        positions=positions,
        loss_mask=loss_mask,
        rollout_logprobs=rollout_logprobs,
        advantages=advantages,
        item_valid=item_valid,
        pixel_values=pixel_values,
        patch_offsets=patch_offsets,
        image_grid=image_grid,
        prefix=prefix,
    )


def batch_tokens(batch: TrainBatch) -> int:
    """The real (unpadded) tokens a forward pass over `batch` runs: its rows' and its prefix rows'."""
    n = int(np.asarray(batch.segment_ids != 0).sum())
    if batch.prefix is not None:
        n += int(np.asarray(batch.prefix.segment_ids != 0).sum())
    return n


def group_order(items: Sequence[TrainingItem]) -> list[list[int]]:
    """Item indices per group, groups in order of first appearance, items in input order."""
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.group_id, []).append(i)
    return list(groups.values())


def make_minibatches(
    items: Sequence[TrainingItem],
    item_advantages: Sequence[float] | np.ndarray,
    config: BatchingConfig,
    num_minibatches: int,
    *,
    pixel_patches: Mapping[ImageKey, np.ndarray] | None = None,
    multimodal: MultimodalPositions | None = None,
) -> list[list[TrainBatch]]:
    """A rollout batch's items -> `num_minibatches` mini-batches of whole groups, each a list of
    micro-batches of `config.rows` rows (the last one padded).

    item_advantages: float [len(items)], aligned with items. Groups are the items' group_id;
    `whole_group_minibatches` balances item counts across mini-batches. Within a mini-batch,
    items keep group order, and every micro-batch gets the bucket of its own longest item.
    """
    adv = np.asarray(item_advantages, np.float32)
    if adv.shape != (len(items),):
        raise ValueError(f"make_minibatches: item_advantages has shape {adv.shape}, expected ({len(items)},)")
    groups = group_order(items)
    plan = whole_group_minibatches([len(g) for g in groups], num_minibatches)
    minibatches = []
    for group_indices in plan:
        order = [i for g in group_indices for i in groups[g]]
        micro = []
        for start in range(0, len(order), config.rows):
            chunk = order[start : start + config.rows]
            micro.append(
                collate(
                    [items[i] for i in chunk], adv[chunk], config, pixel_patches=pixel_patches, multimodal=multimodal
                )
            )
        minibatches.append(micro)
    return minibatches


def process_images(
    items: Sequence[TrainingItem], episodes: Mapping[str, Episode], image_processor
) -> dict[ImageKey, np.ndarray]:
    """Runs the image processor once on every distinct screenshot the items reference.

    episodes: Episode by episode_id. Returns the patches [t*h*w, D] per (episode_id, turn,
    index); screenshots with the same pixels (a group's shared first page) share one array.
    Raises when the processor's grid disagrees with the item's ImageSpan.
    """
    out: dict[ImageKey, np.ndarray] = {}
    by_content: dict[bytes, tuple[tuple[int, ...], np.ndarray]] = {}
    for item in items:
        for span in item.images:
            key = (item.episode_id, span.turn, span.index)
            if key in out:
                continue
            image = np.ascontiguousarray(episodes[item.episode_id].turns[span.turn].images[span.index])
            content = image_content_key(image)
            if content not in by_content:
                processed = image_processor(images=[image], return_tensors="np")
                grid = tuple(int(x) for x in np.asarray(processed["image_grid_thw"])[0])
                by_content[content] = (grid, np.asarray(processed["pixel_values"], np.float32))
            grid, patches = by_content[content]
            if grid != tuple(span.grid_thw):
                raise ValueError(f"image {key}: the processor gives grid {grid}, the item's span says {span.grid_thw}")
            out[key] = patches
    return out


def score_items(
    learner,
    items: Sequence[TrainingItem],
    episodes: Mapping[str, Episode],
    config: BatchingConfig,
    image_processor,
    multimodal: MultimodalPositions | None,
) -> list[np.ndarray]:
    """The learner's per-token logprobs of each item ([len(item.ids)] each, aligned with its
    ids), one item per row (`Learner.score`), under its current parameters."""
    out = []
    config = dataclasses.replace(config, share_prefix=False)  # one whole item per row: logprobs align with its ids
    for item in items:
        patches = process_images([item], episodes, image_processor)
        micro = make_minibatches(
            [item], np.zeros(1, np.float32), config, 1, pixel_patches=patches, multimodal=multimodal
        )[0][0]
        out.append(np.asarray(learner.score(micro))[0, : len(item.ids)])
    return out
