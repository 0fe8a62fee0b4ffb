"""DAPO dynamic sampling: drop a step's degenerate (all-success / all-fail) groups and draw
more tasks until the batch holds enough informative ones; and the CANOPY coverage statistics
of a list of group outcomes (`outcome_stats`) it decides by.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from cua_jax.rl.coverage import GroupOutcomeStats, group_outcome_stats
from cua_jax.tasks.pool import GroupOutcome
from cua_jax.tasks.sampler_interface import Replay, RunGroups, TaskSampler, check_outcomes_match

_group_outcome_stats_jit = jax.jit(group_outcome_stats, static_argnames=("num_groups", "num_tiers"))


def outcome_stats(
    outcomes: Sequence[GroupOutcome],
    replayed: Sequence[bool] | None = None,
    tiers: Sequence[int] | None = None,
    num_tiers: int = 0,
) -> GroupOutcomeStats:
    """CANOPY coverage statistics (`cua_jax.rl.coverage`) of a list of group outcomes.

    A replayed group counts one of its failures as a success, as the trainer sees it.

    Args:
      outcomes: [G] groups.
      replayed: optional bool [G], groups that received a replayed success.
      tiers: optional int [G] difficulty tiers, with `num_tiers`.
    """
    num_groups = len(outcomes)
    extra = np.zeros(num_groups, np.int64) if replayed is None else np.asarray(replayed, np.int64)
    attempts = np.array([o.attempts for o in outcomes], dtype=np.int64)
    successes = np.minimum(np.array([o.successes for o in outcomes], dtype=np.int64) + extra, attempts)
    group_ids = np.repeat(np.arange(num_groups), attempts)
    position = np.arange(group_ids.shape[0]) - np.repeat(np.cumsum(attempts) - attempts, attempts)
    success = position < np.repeat(successes, attempts)
    # Pad groups and episodes to powers of two so that the jitted statistics compile once per
    # bucket: padding episodes are invalid and padding groups empty, which the stats ignore.
    group_slots, episode_slots = _bucket(num_groups), _bucket(group_ids.shape[0])
    pad = episode_slots - group_ids.shape[0]
    tier_slots = None
    if tiers is not None:
        tier_slots = np.zeros(group_slots, np.int64)
        tier_slots[:num_groups] = tiers
    stats = _group_outcome_stats_jit(
        np.concatenate([success, np.zeros(pad, bool)]),
        np.concatenate([group_ids, np.zeros(pad, np.int64)]),
        group_slots,
        valid=np.arange(episode_slots) < group_ids.shape[0],
        group_tiers=tier_slots,
        num_tiers=num_tiers,
    )
    per_group = ("group_size", "group_successes", "informative", "all_success", "all_fail")
    return stats._replace(**{name: np.asarray(getattr(stats, name))[:num_groups] for name in per_group})


def _bucket(size: int) -> int:
    return 1 << max(0, size - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO dynamic sampling: drop degenerate (all-success / all-fail) groups and draw more
    tasks until the batch holds `batch_size` informative groups.

    max_rounds: sampling rounds per step, the first included (DAPO's cap on generation
      batches); a batch still short after them is returned short, with the count.
    oversample: each extra round draws ceil(oversample * missing) tasks.
    repeat_tasks: once every eligible task has been drawn this step, a round draws from all of
      them again, each a new group on new pages. For pools not much larger than a batch (a few
      MiniWoB tasks, where a new page of the same task is DAPO's new prompt); without it such
      a step ends short when the pool runs out.
    """

    max_rounds: int = 3
    oversample: float = 1.0
    repeat_tasks: bool = False

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"DynamicSamplingConfig.max_rounds must be >= 1, got {self.max_rounds}")
        if self.oversample < 1.0:
            raise ValueError(f"DynamicSamplingConfig.oversample must be >= 1, got {self.oversample}")


@dataclasses.dataclass
class DynamicBatch:
    """A step's groups after dynamic sampling.

    groups: the kept informative groups (at most batch_size), in draw order.
    replays: replayed successes, `group_index` into `groups`.
    dropped: the degenerate groups (and informative ones beyond a full batch).
    rounds: sampling rounds used. rollouts: episodes run (kept and dropped).
    missing: batch_size - len(groups); > 0 when the round cap or the pool ran out.
    """

    groups: list[GroupOutcome]
    replays: list[Replay]
    dropped: list[GroupOutcome]
    rounds: int
    rollouts: int
    missing: int


def collect_informative_groups(
    key: jax.Array,
    sampler: TaskSampler,
    run_groups: RunGroups,
    batch_size: int,
    group_size: int,
    config: DynamicSamplingConfig = DynamicSamplingConfig(),
) -> DynamicBatch:
    """One training step's groups under DAPO dynamic sampling, ending the sampler's step.

    Each round draws tasks not yet drawn this step (with `config.repeat_tasks`, all of them
    again once none is left), runs their groups, applies the sampler's replays, and keeps the
    informative groups; every group run (kept or dropped) updates the sampler's statistics
    once the step's groups are collected. A replay given to a group that is dropped because the
    batch is already full still counts against its trajectory's cap. With repeated tasks the
    step's groups are told apart by position, not by task id.
    """
    drawn: list[str] = []
    every_outcome: list[GroupOutcome] = []
    kept: list[GroupOutcome] = []
    kept_replays: list[Replay] = []
    dropped: list[GroupOutcome] = []
    rounds = 0
    for _ in range(config.max_rounds):
        missing = batch_size - len(kept)
        exclude = drawn
        if config.repeat_tasks and sampler.num_eligible(drawn) == 0:
            exclude = []
        count = min(
            math.ceil(config.oversample * missing) if rounds else missing,
            sampler.num_eligible(exclude),
        )
        if missing == 0 or count == 0:
            break
        key, round_key = jax.random.split(key)
        task_ids = sampler.sample(round_key, count, exclude=exclude)
        outcomes = list(run_groups(task_ids, group_size))
        check_outcomes_match(task_ids, outcomes, "collect_informative_groups")
        rounds += 1
        drawn.extend(task_ids)
        every_outcome.extend(outcomes)
        replays = {r.group_index: r for r in sampler.assign_replays(outcomes)}
        replayed = [g in replays for g in range(len(outcomes))]
        informative = np.asarray(outcome_stats(outcomes, replayed).informative)
        for g, outcome in enumerate(outcomes):
            if informative[g] and len(kept) < batch_size:
                if g in replays:
                    kept_replays.append(dataclasses.replace(replays[g], group_index=len(kept)))
                kept.append(outcome)
            else:
                dropped.append(outcome)
    sampler.update(every_outcome)
    return DynamicBatch(
        groups=kept,
        replays=kept_replays,
        dropped=dropped,
        rounds=rounds,
        rollouts=sum(o.attempts for o in every_outcome),
        missing=batch_size - len(kept),
    )
