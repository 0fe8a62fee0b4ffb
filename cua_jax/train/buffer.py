"""The rollout buffer between rollout workers and the learner.

Rollout groups (all episodes of one task sampled together) enter whole and leave whole:
splitting a group breaks its zero-sum advantages (EvoCUA-1.5's mini-group batching).
Each group carries the policy version that produced it; in asynchronous training a group
older than the staleness window is dropped and counted, never trained on.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence

from cua_jax.types import Episode


@dataclasses.dataclass
class RolloutGroup:
    """All episodes of one task drawn for one update, with the version that produced them.

    `policy_version` is the oldest version among the episodes the group sampled itself: a group
    is as stale as its stalest member. A DTAC replay (`is_replay`) carries the older version
    that sampled it and is off-policy by design, so it does not age the group.
    """

    group_id: int
    task_id: str
    episodes: list[Episode]

    @property
    def policy_version(self) -> int:
        if not self.episodes:
            raise ValueError(f"group {self.group_id} ({self.task_id}) has no episodes")
        sampled = [e.policy_version for e in self.episodes if not is_replay(e)]
        return min(sampled) if sampled else min(e.policy_version for e in self.episodes)


def is_replay(episode: Episode) -> bool:
    """Whether `episode` is a cached success replayed into a later group (DTAC's AdaPR)."""
    return "replay_of" in episode.info


class RolloutBuffer:
    """A thread-safe FIFO of whole rollout groups with a staleness window.

    staleness_window: a group produced by version v may train the learner at version
    `current` only if current - v <= staleness_window (0 = strictly on-policy).
    capacity: the most groups held; `put` blocks while full, which is what bounds how far
    rollout workers run ahead of the learner.
    """

    def __init__(self, staleness_window: int, capacity: int):
        if staleness_window < 0:
            raise ValueError(f"staleness_window must be >= 0, got {staleness_window}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.staleness_window = staleness_window
        self.capacity = capacity
        self._groups: collections.deque[RolloutGroup] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.dropped_stale_groups = 0
        self.dropped_stale_episodes = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._groups)

    def put(self, group: RolloutGroup, timeout: float | None = None) -> None:
        """Adds a whole group; blocks while the buffer is full. Raises TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or len(self._groups) < self.capacity, timeout):
                raise TimeoutError(f"rollout buffer stayed full ({self.capacity} groups) for {timeout}s")
            if self._closed:
                raise RuntimeError("rollout buffer is closed")
            self._groups.append(group)
            self._cond.notify_all()

    def take(self, num_groups: int, current_version: int, timeout: float | None = None) -> list[RolloutGroup]:
        """Removes and returns `num_groups` fresh groups in arrival order.

        Groups older than the staleness window are dropped on the way (counted in
        dropped_stale_groups / dropped_stale_episodes). Blocks until enough fresh groups
        have arrived; raises TimeoutError after `timeout` seconds, putting back what it took.
        """
        taken: list[RolloutGroup] = []
        with self._cond:
            while len(taken) < num_groups:
                while self._groups and len(taken) < num_groups:
                    group = self._groups.popleft()
                    if current_version - group.policy_version > self.staleness_window:
                        self.dropped_stale_groups += 1
                        self.dropped_stale_episodes += len(group.episodes)
                    else:
                        taken.append(group)
                self._cond.notify_all()
                if len(taken) == num_groups:
                    break
                if self._closed:
                    raise RuntimeError("rollout buffer is closed")
                if not self._cond.wait(timeout):
                    self._groups.extendleft(reversed(taken))
                    raise TimeoutError(f"waited {timeout}s for {num_groups} fresh groups, have {len(taken)}")
        return taken

    def wait_fresh(self, num_groups: int, current_version: int, timeout: float | None = None) -> bool:
        """Whether `num_groups` groups fresh enough for `current_version` are held, waiting up
        to `timeout` seconds for them to arrive; takes nothing (False once closed). A group stale
        at a version stays stale at every later one: stale groups are dropped here (counted, as
        `take` counts them), so they cannot fill the buffer against the fresh ones."""
        with self._cond:

            def ready() -> bool:
                if self._closed:
                    return True
                fresh = [g for g in self._groups if current_version - g.policy_version <= self.staleness_window]
                if len(fresh) < len(self._groups):
                    for group in self._groups:
                        if current_version - group.policy_version > self.staleness_window:
                            self.dropped_stale_groups += 1
                            self.dropped_stale_episodes += len(group.episodes)
                    self._groups = collections.deque(fresh)
                    self._cond.notify_all()  # room for the producers
                return len(fresh) >= num_groups

            return self._cond.wait_for(ready, timeout) and not self._closed

    def snapshot(self) -> list[RolloutGroup]:
        """The groups held, oldest first (for a checkpoint)."""
        with self._cond:
            return list(self._groups)

    def restore(self, groups: Sequence[RolloutGroup], dropped_stale_groups: int, dropped_stale_episodes: int) -> None:
        """Refills an empty buffer from `snapshot`'s groups and the drop counters."""
        with self._cond:
            if self._groups:
                raise RuntimeError("restore needs an empty rollout buffer")
            self._groups.extend(groups)
            self.dropped_stale_groups = int(dropped_stale_groups)
            self.dropped_stale_episodes = int(dropped_stale_episodes)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def whole_group_minibatches(item_counts: Sequence[int], num_minibatches: int) -> list[list[int]]:
    """Splits groups into `num_minibatches` contiguous runs of whole groups.

    item_counts[g] is the number of training items group g yields (it varies: step-wise
    segmentation gives one item per turn). Returns, per mini-batch, the group indices it
    holds; the cut points balance item counts (each cut is placed where the running total
    is nearest the ideal share), and no group is ever split. Every mini-batch is non-empty,
    so num_minibatches may not exceed the number of groups.
    """
    num_groups = len(item_counts)
    if num_minibatches < 1:
        raise ValueError(f"num_minibatches must be >= 1, got {num_minibatches}")
    if num_minibatches > num_groups:
        raise ValueError(f"cannot form {num_minibatches} mini-batches from {num_groups} whole groups")
    if any(c < 0 for c in item_counts):
        raise ValueError(f"item counts must be >= 0, got {list(item_counts)}")
    total = sum(item_counts)
    prefix = [0]
    for c in item_counts:
        prefix.append(prefix[-1] + c)
    cuts = [0]
    for k in range(1, num_minibatches):
        ideal = total * k / num_minibatches
        # Leave at least one group for each later mini-batch and take at least one now.
        lo, hi = cuts[-1] + 1, num_groups - (num_minibatches - k)
        best = min(range(lo, hi + 1), key=lambda j: (abs(prefix[j] - ideal), j))
        cuts.append(best)
    cuts.append(num_groups)
    return [list(range(cuts[i], cuts[i + 1])) for i in range(num_minibatches)]
