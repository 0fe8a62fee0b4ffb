"""Tests of the batcher: padding, buckets, token advantages, images, whole-group mini-batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.train.batching import (
    BatchingConfig,
    MultimodalPositions,
    bucket_count,
    bucket_length,
    collate,
    group_order,
    make_minibatches,
)
from cua_jax.types import ImageSpan, TrainingItem


def make_item(rng, length, group, episode=None, images=()):
    ids = rng.integers(3, 100, length).astype(np.int32)
    mask = (rng.random(length) < 0.5).astype(np.int32)
    mask[-1] = 1  # every item trains at least one token
    logp = np.where(mask > 0, -rng.random(length), 0.0).astype(np.float32)
    return TrainingItem(ids, mask, logp, list(images), episode or f"ep{group}", group, (0,))


@given(st.integers(0, 5000), st.integers(1, 256), st.booleans())
def test_bucket_length_is_the_smallest_bucket_that_fits(n, multiple, pow2):
    got = bucket_length(n, multiple, pow2)
    assert got >= max(n, 1)
    if pow2:
        assert got & (got - 1) == 0 and got >= multiple
        assert got // 2 < max(n, multiple)
    else:
        assert got % multiple == 0 and got - multiple < max(n, 1)


@given(st.integers(0, 300))
def test_bucket_count_is_next_power_of_two(n):
    got = bucket_count(n)
    if n == 0:
        assert got == 0
    else:
        assert got >= n and got & (got - 1) == 0 and got // 2 < n


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=6), st.integers(6, 8), st.integers(0, 2**31 - 1))
def test_collate_matches_numpy_reference(lengths, rows, seed):
    rng = np.random.default_rng(seed)
    items = [make_item(rng, n, g) for g, n in enumerate(lengths)]
    adv = rng.normal(size=len(items)).astype(np.float32)
    config = BatchingConfig(rows=rows, length_multiple=32, pad_id=0)
    batch = collate(items, adv, config)
    L = bucket_length(max(lengths), 32)
    assert batch.ids.shape == (rows, L) and batch.positions.shape == (rows, L)
    for name in ("segment_ids", "loss_mask", "rollout_logprobs", "advantages"):
        assert getattr(batch, name).shape == (rows, L)
    for row in range(rows):
        if row < len(items):
            item, n = items[row], len(items[row])
            np.testing.assert_array_equal(batch.ids[row, :n], item.ids)
            np.testing.assert_array_equal(batch.segment_ids[row], (np.arange(L) < n).astype(np.int32))
            np.testing.assert_array_equal(batch.positions[row, :n], np.arange(n))
            np.testing.assert_array_equal(batch.loss_mask[row, :n], item.loss_mask)
            np.testing.assert_array_equal(batch.advantages[row, :n], adv[row] * item.loss_mask)
            np.testing.assert_array_equal(batch.rollout_logprobs[row, :n], item.rollout_logprobs)
            assert batch.item_valid[row]
        else:
            n = 0
            assert not batch.item_valid[row]
        # Everything past an item's end (and all of a padding row) is inert.
        assert np.all(batch.ids[row, n:] == 0) and np.all(batch.segment_ids[row, n:] == 0)
        assert np.all(batch.loss_mask[row, n:] == 0) and np.all(batch.advantages[row, n:] == 0)
        assert np.all(batch.positions[row, n:] == 0)
    assert batch.pixel_values is None and batch.image_grid is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=10), st.integers(1, 10), st.integers(1, 4), st.integers(0, 1000)
)
def test_minibatches_hold_whole_groups_and_every_item_once(group_sizes, num_minibatches, rows, seed):
    num_minibatches = min(num_minibatches, len(group_sizes))
    rng = np.random.default_rng(seed)
    items = [
        make_item(rng, int(rng.integers(2, 9)), g, episode=f"ep{g}-{k}")
        for g, size in enumerate(group_sizes)
        for k in range(size)
    ]
    order = rng.permutation(len(items))
    items = [items[i] for i in order]
    # The advantage identifies the item, so it can be traced through the batches.
    adv = np.arange(1, len(items) + 1, dtype=np.float32)
    config = BatchingConfig(rows=rows, length_multiple=8)
    minibatches = make_minibatches(items, adv, config, num_minibatches)
    assert len(minibatches) == num_minibatches
    seen_groups = []
    seen_items = []
    for micro in minibatches:
        groups = set()
        for batch in micro:
            assert batch.rows == rows
            for row in np.flatnonzero(batch.item_valid):
                index = int(batch.advantages[row][batch.loss_mask[row] > 0][0]) - 1
                seen_items.append(index)
                groups.add(items[index].group_id)
        seen_groups.append(groups)
    assert sorted(seen_items) == list(range(len(items)))
    for a in range(len(seen_groups)):
        for b in range(a + 1, len(seen_groups)):
            assert not seen_groups[a] & seen_groups[b], "a group was split across mini-batches"


def test_group_order_is_first_appearance():
    rng = np.random.default_rng(0)
    items = [make_item(rng, 4, g) for g in (5, 2, 5, 7, 2)]
    assert group_order(items) == [[0, 2], [1, 4], [3]]


def test_collate_rejects_bad_input():
    rng = np.random.default_rng(0)
    items = [make_item(rng, 10, 0), make_item(rng, 12, 1)]
    with pytest.raises(ValueError, match="do not fit"):
        collate(items, [0.0, 1.0], BatchingConfig(rows=1))
    with pytest.raises(ValueError, match="item_advantages"):
        collate(items, [0.0], BatchingConfig(rows=2))
    with pytest.raises(ValueError, match="max_length"):
        collate(items, [0.0, 1.0], BatchingConfig(rows=2, max_length=11))
    with pytest.raises(ValueError, match="shorter than the longest"):
        collate(items, [0.0, 1.0], BatchingConfig(rows=2), length=11)
    broken = make_item(rng, 10, 2)
    broken.loss_mask = broken.loss_mask[:5]
    with pytest.raises(ValueError, match="loss_mask has shape"):
        collate([broken], [0.0], BatchingConfig(rows=2))


IMAGE_TOKEN = 99
MM = MultimodalPositions(image_token_id=IMAGE_TOKEN, spatial_merge_size=2)
PATCH_DIM = 12


def image_item(rng, episode, group, grids):
    """Text, then per image a run of placeholders of its merged size, then text."""
    ids, spans = [5, 6, 7], []
    for k, grid in enumerate(grids):
        t, h, w = grid
        start = len(ids)
        ids += [IMAGE_TOKEN] * (t * h * w // 4)
        spans.append(ImageSpan(start, len(ids), turn=k, index=0, grid_thw=grid))
        ids += [8, 9]
    ids = np.asarray(ids, np.int32)
    mask = np.zeros(len(ids), np.int32)
    mask[-2:] = 1
    return TrainingItem(ids, mask, np.where(mask > 0, -0.5, 0).astype(np.float32), spans, episode, group, (0,))


def test_collate_images_concatenates_patches_in_row_order_and_buckets_the_count():
    from cua_jax.models.qwen3_vl import rope_index

    rng = np.random.default_rng(0)
    items = [image_item(rng, "a", 0, [(1, 4, 4), (1, 2, 4)]), image_item(rng, "b", 0, [(1, 4, 2)])]
    patches = {}
    for item in items:
        for span in item.images:
            t, h, w = span.grid_thw
            patches[(item.episode_id, span.turn, span.index)] = rng.normal(size=(t * h * w, PATCH_DIM)).astype(
                np.float32
            )
    batch = collate(
        items, [1.0, -1.0], BatchingConfig(rows=4, length_multiple=16), pixel_patches=patches, multimodal=MM
    )
    # 3 images -> 4 (a blank copy of the last grid).
    assert batch.image_grid.thw == ((1, 4, 4), (1, 2, 4), (1, 4, 2), (1, 4, 2))
    assert batch.pixel_values.shape == (16 + 8 + 8 + 8, PATCH_DIM)
    np.testing.assert_array_equal(batch.patch_offsets, [0, 24, 32, 32, 32])
    np.testing.assert_array_equal(batch.pixel_values[:16], patches[("a", 0, 0)])
    np.testing.assert_array_equal(batch.pixel_values[16:24], patches[("a", 1, 0)])
    np.testing.assert_array_equal(batch.pixel_values[24:32], patches[("b", 0, 0)])
    assert np.all(batch.pixel_values[32:] == 0)
    # Positions are rope_index's over the real images only.
    want, _ = rope_index(
        batch.ids,
        ((1, 4, 4), (1, 2, 4), (1, 4, 2)),
        image_token_id=IMAGE_TOKEN,
        spatial_merge_size=2,
        attention_mask=batch.segment_ids != 0,
    )
    assert batch.positions.shape == (3, 4, 16)
    np.testing.assert_array_equal(batch.positions, want)


def test_collate_images_errors_name_the_problem():
    rng = np.random.default_rng(0)
    item = image_item(rng, "a", 0, [(1, 4, 4)])
    with pytest.raises(ValueError, match="no pixel_patches"):
        collate([item], [0.0], BatchingConfig(rows=1), multimodal=MM)
    with pytest.raises(ValueError, match="no pixel patches for image"):
        collate([item], [0.0], BatchingConfig(rows=1), pixel_patches={}, multimodal=MM)
    with pytest.raises(ValueError, match="needs 16 rows"):
        collate([item], [0.0], BatchingConfig(rows=1), pixel_patches={("a", 0, 0): np.zeros((8, 4))}, multimodal=MM)
    with pytest.raises(ValueError, match="text only"):
        collate([item], [0.0], BatchingConfig(rows=1), pixel_patches={("a", 0, 0): np.zeros((16, 4))})


def test_process_images_runs_the_processor_once_per_screenshot_and_checks_grids():
    from cua_jax.context.tokenizer import build_image_processor, image_grid_thw
    from cua_jax.train.batching import process_images
    from cua_jax.types import Episode, Turn

    processor = build_image_processor()
    rng = np.random.default_rng(0)
    shots = [rng.integers(0, 256, (64, 96, 3), dtype=np.uint8), rng.integers(0, 256, (96, 64, 3), dtype=np.uint8)]
    turns = [Turn("obs", [shot], np.zeros(1, np.int32), np.zeros(1, np.float32)) for shot in shots]
    episode = Episode("ep", "task", 0, "do it", turns)
    grids = [image_grid_thw(processor, *shot.shape[:2]) for shot in shots]
    spans = [ImageSpan(0, 1, turn, 0, grid) for turn, grid in enumerate(grids)]
    items = [make_item(rng, 4, 0, "ep", images=spans), make_item(rng, 4, 0, "ep", images=spans[1:])]
    patches = process_images(items, {"ep": episode}, processor)
    assert set(patches) == {("ep", 0, 0), ("ep", 1, 0)}
    for turn, grid in enumerate(grids):
        want = processor(images=[shots[turn]], return_tensors="np")["pixel_values"]
        np.testing.assert_array_equal(patches[("ep", turn, 0)], want)
        assert patches[("ep", turn, 0)].shape[0] == int(np.prod(grid))
    wrong = [make_item(rng, 4, 0, "ep", images=[ImageSpan(0, 1, 0, 0, (1, 2, 2))])]
    with pytest.raises(ValueError, match="the processor gives grid"):
        process_images(wrong, {"ep": episode}, processor)
