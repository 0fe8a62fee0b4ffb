import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.train.buffer import RolloutBuffer, RolloutGroup, whole_group_minibatches
from cua_jax.types import Episode


def _group(group_id: int, version: int, size: int = 2) -> RolloutGroup:
    episodes = [
        Episode(
            episode_id=f"{group_id}-{i}",
            task_id=f"task{group_id}",
            group_id=group_id,
            instruction="",
            turns=[],
            policy_version=version,
        )
        for i in range(size)
    ]
    return RolloutGroup(group_id=group_id, task_id=f"task{group_id}", episodes=episodes)


def test_group_version_is_its_stalest_episode():
    group = _group(0, version=5)
    group.episodes[1].policy_version = 3
    assert group.policy_version == 3


def test_stale_groups_are_dropped_and_counted():
    buffer = RolloutBuffer(staleness_window=1, capacity=10)
    for gid, version in enumerate([3, 4, 5, 5]):
        buffer.put(_group(gid, version, size=3))
    taken = buffer.take(2, current_version=5)
    # version 3 is 2 behind (dropped); 4 and 5 are within the window.
    assert [g.group_id for g in taken] == [1, 2]
    assert buffer.dropped_stale_groups == 1
    assert buffer.dropped_stale_episodes == 3
    assert len(buffer) == 1


def test_on_policy_window_keeps_only_current_version():
    buffer = RolloutBuffer(staleness_window=0, capacity=10)
    buffer.put(_group(0, 1))
    buffer.put(_group(1, 2))
    assert [g.group_id for g in buffer.take(1, current_version=2)] == [1]
    assert buffer.dropped_stale_groups == 1


def test_take_waits_for_producers_and_times_out_without_losing_groups():
    buffer = RolloutBuffer(staleness_window=0, capacity=4)
    buffer.put(_group(0, 0))
    with pytest.raises(TimeoutError):
        buffer.take(2, current_version=0, timeout=0.05)
    assert len(buffer) == 1  # the group taken before the timeout was put back

    def produce():
        buffer.put(_group(1, 0))

    thread = threading.Thread(target=produce)
    thread.start()
    taken = buffer.take(2, current_version=0, timeout=5)
    thread.join()
    assert [g.group_id for g in taken] == [0, 1]


def test_wait_fresh_takes_nothing_and_drops_stale_groups_that_block_fresh_ones():
    buffer = RolloutBuffer(staleness_window=1, capacity=2)
    buffer.put(_group(0, 0))
    buffer.put(_group(1, 2))
    assert buffer.wait_fresh(1, current_version=2, timeout=0)
    assert not buffer.wait_fresh(2, current_version=2, timeout=0.05)
    assert len(buffer) == 1 and buffer.dropped_stale_groups == 1  # version 0 is stale at version 2
    buffer.put(_group(2, 0))  # a full buffer: the producer of a fresh group waits for room
    producer = threading.Thread(target=lambda: buffer.put(_group(3, 3), timeout=5))
    producer.start()
    assert buffer.wait_fresh(2, current_version=3, timeout=5)  # the stale group made room
    producer.join()
    assert [g.group_id for g in buffer.take(2, current_version=3, timeout=0)] == [1, 3]
    assert buffer.dropped_stale_groups == 2 and buffer.dropped_stale_episodes == 4


def test_put_blocks_when_full():
    buffer = RolloutBuffer(staleness_window=0, capacity=1)
    buffer.put(_group(0, 0))
    with pytest.raises(TimeoutError):
        buffer.put(_group(1, 0), timeout=0.05)


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="staleness_window"):
        RolloutBuffer(staleness_window=-1, capacity=1)
    with pytest.raises(ValueError, match="mini-batches"):
        whole_group_minibatches([1, 2], 3)


def _reference_best_cost(item_counts, k):
    """Brute-force reference: the smallest max deviation from the ideal share."""
    import itertools

    n = len(item_counts)
    total = sum(item_counts)
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        sizes = [sum(item_counts[bounds[i] : bounds[i + 1]]) for i in range(k)]
        cost = max(abs(s - total / k) for s in sizes)
        best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=9), st.integers(1, 9))
def test_whole_group_minibatches_partition_groups(item_counts, k):
    k = min(k, len(item_counts))
    batches = whole_group_minibatches(item_counts, k)
    assert len(batches) == k
    assert all(batches), "every mini-batch holds at least one group"
    flat = [g for batch in batches for g in batch]
    assert flat == list(range(len(item_counts))), "each group appears once, whole, in order"
    # Balance: never worse than twice the largest group plus the optimum deviation.
    total = sum(item_counts)
    sizes = [sum(item_counts[g] for g in batch) for batch in batches]
    worst = max(abs(s - total / k) for s in sizes)
    assert worst <= _reference_best_cost(item_counts, k) + max(item_counts)


def test_whole_group_minibatches_balances_a_ragged_case():
    # Steps per group vary 1..10; four mini-batches of whole groups.
    counts = [10, 1, 1, 8, 2, 2, 6, 4, 3, 3]
    batches = whole_group_minibatches(counts, 4)
    sizes = [int(np.sum([counts[g] for g in b])) for b in batches]
    assert sum(sizes) == 40
    assert max(sizes) - min(sizes) <= 10
