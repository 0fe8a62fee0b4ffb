"""Rollout groups from episodes to a learner batch: training seeds, collected groups (items by
episode), DTAC replay swaps, quarantine before advantages, group-relative advantages over the
whole rollout batch, item advantages (broadcast or STEPO), whole-group mini-batches, and the
batch's episode and group statistics."""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from cua_jax.rl.advantages import (
    STATUS_CODES,
    broadcast_to_items,
    episode_advantages,
    score_terminal_rewards,
    stepo_item_advantages,
)
from cua_jax.rl.coverage import group_outcome_stats
from cua_jax.rollout.agent_loop import Rollout
from cua_jax.tasks.pool import GroupOutcome
from cua_jax.train.batching import group_order
from cua_jax.train.buffer import RolloutGroup, is_replay, whole_group_minibatches
from cua_jax.train.settings import TrainSettings
from cua_jax.types import Episode, EpisodeStatus, Fault, TrainingItem


def draw_group_seeds(key: jax.Array, count: int, train_seeds: Sequence[int], train_seed_max: int) -> list[int]:
    """Problem seeds of `count` training groups: uniformly from `train_seeds` when given
    (fixed pages), else from [0, train_seed_max)."""
    fixed = tuple(int(seed) for seed in train_seeds)
    if fixed:
        return [fixed[int(i)] for i in np.asarray(jax.random.randint(key, (count,), 0, len(fixed)))]
    return [int(x) for x in np.asarray(jax.random.randint(key, (count,), 0, train_seed_max))]


def fault_metric_name(fault: Fault | None) -> str | None:
    """The metric name of a fault's kind (slugged), or None without one: for a scored episode,
    a fault its agent owns (`advantage.agent_faults`)."""
    return None if fault is None else fault.kind.name.lower()


def quarantine_kind(fault: Fault | None) -> str:
    """The metric name of a quarantined episode's fault: its kind's, or "other"."""
    return fault_metric_name(fault) or "other"


@dataclasses.dataclass
class CollectedGroup(RolloutGroup):
    """A rollout group plus the training items of each episode (by episode id)."""

    items: dict[str, list[TrainingItem]] = dataclasses.field(default_factory=dict)
    replayed: bool = False


def _content_key(rollout: Rollout) -> tuple:
    episode = rollout.episode
    return (
        episode.status.value,
        episode.reward,
        tuple(t.response_ids.tobytes() for t in episode.turns),
        episode.quarantine_reason or "",
    )


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
    return CollectedGroup(
        group_id, task_id, [r.episode for r in rollouts], items={r.episode.episode_id: list(r.items) for r in rollouts}
    )


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
    join the group's statistics and its mini-batch like the group's own episodes. It keeps the
    policy version that sampled it, so logs, traces and the viewer show its true age, and
    `info["replay_of"]` names the episode it copies. A replay is off-policy by design: the
    group's staleness (`RolloutGroup.policy_version`) is that of its own sampled episodes, so a
    staleness window never drops a group for the replay it received.
    """
    failed = [
        i
        for i, e in enumerate(group.episodes)
        if e.status is not EpisodeStatus.SUCCESS and e.status is not EpisodeStatus.QUARANTINED
    ]
    if not failed:
        return
    slot = failed[-1]
    old = group.episodes[slot]
    episode = copy.copy(replay.episode)
    episode.episode_id = f"{group.task_id}/g{group.group_id}/replay"
    episode.group_id = group.group_id
    episode.info = {**replay.episode.info, "replay_of": replay.episode.episode_id}
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


def domain_metrics(groups: Sequence[CollectedGroup], domains: Mapping[str, str]) -> dict[str, float]:
    """Per domain (task id -> domain): episodes, success rate over the scored (unquarantined)
    episodes, and quarantines by reason (`quarantine_kind`), as domain/<domain>/... metrics."""
    metrics: dict[str, float] = collections.Counter()
    scored: dict[str, list[bool]] = collections.defaultdict(list)
    for group in groups:
        domain = domains.get(group.task_id, "unknown")
        for episode in group.episodes:
            metrics[f"domain/{domain}/episodes"] += 1
            if episode.status is EpisodeStatus.QUARANTINED:
                metrics[f"domain/{domain}/quarantine/{quarantine_kind(episode.fault)}"] += 1
            else:
                scored[domain].append(episode.status is EpisodeStatus.SUCCESS)
    for domain, outcomes in scored.items():
        metrics[f"domain/{domain}/success_rate"] = float(np.mean(outcomes))
    return dict(metrics)


def prepare_batch(
    groups: Sequence[CollectedGroup],
    settings: TrainSettings,
    num_minibatches: int,
    version: int,
    domains: Mapping[str, str] | None = None,
) -> PreparedBatch:
    """Quarantine, advantages over the whole batch, item advantages, and the mini-batch plan.
    With `domains` (task id -> domain), the metrics hold `domain_metrics` too."""
    metrics: dict[str, float] = collections.Counter()
    if domains is not None:
        metrics.update(domain_metrics(groups, domains))
    as_failure = settings.advantage.quarantine_as_failure
    episodes, group_index, kept_groups, quarantined = [], [], {}, {}
    for g, group in enumerate(groups):
        kept_groups[group.group_id] = []
        for episode in group.episodes:
            if episode.status is EpisodeStatus.QUARANTINED:
                metrics[f"quarantine/{quarantine_kind(episode.fault)}"] += 1
                metrics["quarantine/total"] += 1
                if not as_failure:
                    quarantined[episode.episode_id] = episode.quarantine_reason or ""
                    continue
                # CANOPY App. G's sensitivity check: the faulted episode stays in its group as a
                # failure (reward 0) instead of leaving it; its items, if any, take that advantage.
                metrics["quarantine/scored_as_failure"] += 1
                episode = copy.copy(episode)  # keeps its fault; the group's record is untouched
                episode.status, episode.reward = EpisodeStatus.FAILURE, 0.0
            elif (owned := fault_metric_name(episode.fault)) is not None:
                # a fault the agent caused, scored as its failure: counted all the same
                metrics[f"agent_fault/{owned}"] += 1
                metrics["agent_fault/total"] += 1
            elif any("malformed_results" in turn.info for turn in episode.turns):
                # the judge found an agent's result file malformed in its format (scored 0);
                # desktop episodes note it in their last turn's info
                metrics["agent_fault/malformed_result"] += 1
                metrics["agent_fault/total"] += 1
            episodes.append(episode)
            group_index.append(g)
            kept_groups[group.group_id].append(episode.episode_id)
    num_groups = len(groups)
    metrics = dict(metrics)
    metrics.setdefault("quarantine/total", 0.0)
    metrics.setdefault("agent_fault/total", 0.0)
    if as_failure:
        metrics.setdefault("quarantine/scored_as_failure", 0.0)
    metrics["episodes/total"] = float(sum(len(g.episodes) for g in groups))
    metrics["episodes/trained"] = float(len(episodes))
    metrics["groups/total"] = float(num_groups)
    metrics["groups/replayed"] = float(sum(g.replayed for g in groups))
    if not episodes:
        return PreparedBatch([], np.zeros(0, np.float32), {}, [], kept_groups, quarantined, metrics)

    rewards = np.asarray([e.reward for e in episodes], np.float32)
    status = np.asarray([STATUS_CODES[e.status] for e in episodes], np.int32)
    group_ids = np.asarray(group_index, np.int32)
    credited_rewards, credited_status = rewards, status
    if settings.advantage.permute_rewards:
        # The control run: each episode is credited with the outcome of another episode of the
        # batch (a permutation drawn from the seed and the policy version), so the advantages keep
        # their distribution but no longer say which replies succeeded.
        order = np.random.default_rng([settings.seed, int(version)]).permutation(len(episodes))
        credited_rewards, credited_status = rewards[order], status[order]
    advantages = np.asarray(
        episode_advantages(
            credited_rewards, credited_status, group_ids, num_groups, settings.advantage.estimator_config
        )
    )
    success = np.asarray([e.status is EpisodeStatus.SUCCESS for e in episodes])
    # Live coverage per difficulty tier (CANOPY §3.2): the informative share of each tier's groups.
    catalog = settings.catalog
    group_tiers = np.asarray([catalog[g.task_id].tier if g.task_id in catalog else 0 for g in groups], np.int32)
    num_tiers = int(max((catalog[t].tier for t in catalog.task_ids), default=0)) + 1
    coverage = group_outcome_stats(success, group_ids, num_groups, group_tiers=group_tiers, num_tiers=num_tiers)
    scored = np.asarray(score_terminal_rewards(rewards, status, settings.advantage.no_verdict_reward))

    items, item_episode = [], []
    for e, episode in enumerate(episodes):
        for item in groups[group_index[e]].items[episode.episode_id]:
            items.append(item)
            item_episode.append(e)
    item_episode = np.asarray(item_episode, np.int32)
    spread = stepo_item_advantages if settings.advantage.item_advantages == "stepo" else broadcast_to_items
    item_advantages = np.asarray(spread(advantages, item_episode), np.float32) if items else np.zeros(0, np.float32)

    lags = [version - e.policy_version for e in episodes if not is_replay(e)]
    replay_ages = [version - e.policy_version for e in episodes if is_replay(e)]
    if replay_ages:  # how old the replayed successes were when trained on (their own sampling version)
        metrics["replay/age_mean"] = float(np.mean(replay_ages))
        metrics["replay/age_max"] = float(np.max(replay_ages))
    metrics.update(
        {
            "reward/mean": float(scored.mean()),
            "success/rate": float(success.mean()),
            "advantage/abs_mean": float(np.abs(advantages).mean()),
            "groups/informative_fraction": float(coverage.informative_fraction),
            "groups/all_pass_fraction": float(coverage.all_success_fraction),
            "groups/all_fail_fraction": float(coverage.all_fail_fraction),
            **{
                f"groups/tier_{t}/informative_fraction": float(coverage.tier_informative_fraction[t])
                for t in range(num_tiers)
                if coverage.tier_num_groups[t] > 0
            },
            "episode/turns": float(np.mean([e.num_turns for e in episodes])),
            "episode/response_tokens": float(np.mean([e.info.get("response_tokens", 0) for e in episodes])),
            "episode/items": float(len(items) / len(episodes)),
            "episode/no_verdict_fraction": float(np.mean(status == STATUS_CODES[EpisodeStatus.NO_VERDICT])),
            "episode/invalid_actions": float(np.mean([e.info.get("invalid_actions", 0) for e in episodes])),
            "policy/lag_mean": float(np.mean(lags)) if lags else 0.0,
            "policy/lag_max": float(np.max(lags)) if lags else 0.0,
            "batch/items": float(len(items)),
        }
    )
    # Code episodes: how many files the judge left out (changed outside the package's sources).
    outside = [
        e.turns[-1].info["changes_outside_sources_count"]
        for e in episodes
        if e.turns and "changes_outside_sources_count" in e.turns[-1].info
    ]
    if outside:
        metrics["episode/changes_outside_sources"] = float(np.mean(outside))
        metrics["episode/changed_outside_sources_fraction"] = float(np.mean([n > 0 for n in outside]))
    plan: list[list[int]] = []
    if items:
        order = group_order(items)
        ids_in_order = [items[g[0]].group_id for g in order]
        usable = min(num_minibatches, len(order))
        plan = [[ids_in_order[k] for k in mb] for mb in whole_group_minibatches([len(g) for g in order], usable)]
    return PreparedBatch(
        items, item_advantages, {e.episode_id: e for e in episodes}, plan, kept_groups, quarantined, metrics
    )


def mean_metrics(records: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each metric over the updates of a step (extrema: min / max; a p99 takes the
    largest, as the learner merges micro-batches)."""
    out: dict[str, float] = {}
    for key in records[0]:
        values = [r[key] for r in records]
        largest = key.endswith(("_max", "_p99"))
        out[key] = min(values) if key.endswith("_min") else max(values) if largest else float(np.mean(values))
    return out
