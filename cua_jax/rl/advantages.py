"""Group-relative advantages over ragged groups, quarantine, and their spread onto items and tokens.

Episodes of one task form a group, named by an integer group id. Groups may be ragged (the
batch is flat, [E] episodes, with `group_ids` [E] in [0, num_groups)); group statistics use
`jax.ops.segment_sum` with a static `num_groups`, so everything jit-compiles.

Quarantine (CANOPY App. G) is a boolean `valid` mask applied *before* group statistics:
an invalid episode contributes no reward to its group's mean and std and gets advantage 0.
A group whose valid rewards are all equal (one outcome class) gets advantage 0 everywhere.
Advantage 0 alone does not take a quarantined episode out of the loss: its items must also be
dropped (or their loss mask zeroed), so it adds no token to the denominator N of CANOPY eq. 8.

From episodes to the loss:
  rewards --score_terminal_rewards--> scored rewards --ADVANTAGE_ESTIMATORS[name]--> A [E]
  A [E] --broadcast_to_items (ScaleCUA segments) or stepo_item_advantages (EvoCUA-1.5)--> [B]
  [B] --token_advantages--> [B, T] on the loss mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cua_jax.registry import Registry
from cua_jax.rl._checks import check_ids_in_range
from cua_jax.types import EpisodeStatus

# Integer codes of EpisodeStatus inside jitted code (status arrays are int32 [E]).
STATUS_CODES: dict[EpisodeStatus, int] = {
    EpisodeStatus.SUCCESS: 0,
    EpisodeStatus.FAILURE: 1,
    EpisodeStatus.NO_VERDICT: 2,
    EpisodeStatus.QUARANTINED: 3,
}

# ScaleCUA Table 10 "incomplete episode penalty"; CANOPY App. H uses the same constant.
DEFAULT_NO_VERDICT_REWARD = -0.2

# An estimator: (rewards [E], group_ids [E], num_groups, valid [E] | None, config) -> float [E].
Estimator = Callable[..., jax.Array]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """How episode rewards become advantages.

    estimator: a name registered in ADVANTAGE_ESTIMATORS ("grpo", "dr_grpo", "rloo").
    std_eps: added to the group std before dividing (GRPO only).
    no_verdict_reward: the reward of an episode that ran out of turns or tokens.
    negative_scale: multiplies every negative advantage, in [0, 1]. 1 is the estimator as
      published; 0 keeps only the episodes that beat their group's mean, each weighted by its
      margin (reward-weighted filtering as in RAFT / ReST: the policy is pushed towards its own
      successes and never away from its failures, which on a small policy spreads the pushed-off
      probability over every other token).
    """

    estimator: str = "grpo"
    std_eps: float = 1e-6
    no_verdict_reward: float = DEFAULT_NO_VERDICT_REWARD
    negative_scale: float = 1.0

    def __post_init__(self):
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"AdvantageConfig.estimator {self.estimator!r} is unknown; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
            )
        if self.std_eps < 0:
            raise ValueError(f"AdvantageConfig.std_eps must be >= 0, got {self.std_eps}")
        if not 0.0 <= self.negative_scale <= 1.0:
            raise ValueError(f"AdvantageConfig.negative_scale must lie in [0, 1], got {self.negative_scale}")


def score_terminal_rewards(
    rewards: jax.Array,
    status_codes: jax.Array,
    no_verdict_reward: float = DEFAULT_NO_VERDICT_REWARD,
) -> jax.Array:
    """The reward each episode is trained on: no-verdict endings get `no_verdict_reward`.

    Args:
      rewards: float [E], the verifier's reward (meaningless for no-verdict episodes).
      status_codes: int [E], STATUS_CODES of each episode's EpisodeStatus.
      no_verdict_reward: the constant for NO_VERDICT episodes (-0.2 in ScaleCUA / CANOPY).

    Returns:
      float [E]. Quarantined episodes keep their reward; `valid_from_status` drops them.
    """
    rewards = jnp.asarray(rewards, dtype=jnp.result_type(float))
    no_verdict = jnp.asarray(status_codes) == STATUS_CODES[EpisodeStatus.NO_VERDICT]
    return jnp.where(no_verdict, jnp.asarray(no_verdict_reward, rewards.dtype), rewards)


def valid_from_status(status_codes: jax.Array) -> jax.Array:
    """bool [E]: False exactly for quarantined episodes (they leave their group)."""
    return jnp.asarray(status_codes) != STATUS_CODES[EpisodeStatus.QUARANTINED]


class GroupStats(NamedTuple):
    """Statistics of each group's valid rewards, all [G].

    count: number of valid episodes; mean; std: population std (divides by count);
    degenerate: True when the group has fewer than two outcome classes (all valid rewards
    equal, including empty and single-episode groups) and so carries no signal.
    """

    count: jax.Array
    mean: jax.Array
    std: jax.Array
    degenerate: jax.Array


def _valid_or_all(valid: jax.Array | None, like: jax.Array, what: str = "rewards") -> jax.Array:
    if valid is None:
        return jnp.ones(like.shape, dtype=bool)
    valid = jnp.asarray(valid, dtype=bool)
    if valid.shape != like.shape:
        raise ValueError(f"valid mask shape {valid.shape} does not match {what} {like.shape}")
    return valid


def group_stats(
    rewards: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    valid: jax.Array | None = None,
) -> GroupStats:
    """Per-group count, mean, population std and degeneracy over valid episodes.

    Args:
      rewards: float [E].
      group_ids: int [E] in [0, num_groups).
      num_groups: static G.
      valid: optional bool [E]; invalid episodes are excluded from every statistic.

    Returns:
      GroupStats of [G] arrays (an empty group has count 0, mean 0, std 0, degenerate True).
    """
    rewards = jnp.asarray(rewards, dtype=jnp.result_type(float))
    group_ids = jnp.asarray(group_ids, dtype=jnp.int32)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {rewards.shape} and group_ids {group_ids.shape} must be matching 1-D arrays")
    check_ids_in_range("group_stats", "group_ids", group_ids, num_groups)
    valid = _valid_or_all(valid, rewards)
    # `where`, not multiplication: a NaN reward on a quarantined episode must not leak in.
    kept = jnp.where(valid, rewards, 0.0)

    def seg_sum(x):
        return jax.ops.segment_sum(x, group_ids, num_segments=num_groups)

    count = seg_sum(valid.astype(rewards.dtype))
    mean = seg_sum(kept) / jnp.maximum(count, 1.0)
    deviation = jnp.where(valid, rewards - mean[group_ids], 0.0)  # two-pass: stable variance
    std = jnp.sqrt(seg_sum(deviation**2) / jnp.maximum(count, 1.0))
    # Exact equality test, so float rounding of the mean never turns a degenerate group
    # (e.g. three rewards of 0.1) into a tiny non-zero advantage.
    big = jnp.finfo(rewards.dtype).max
    high = jax.ops.segment_max(jnp.where(valid, rewards, -big), group_ids, num_segments=num_groups)
    low = jax.ops.segment_min(jnp.where(valid, rewards, big), group_ids, num_segments=num_groups)
    degenerate = (count < 2) | (high <= low)
    return GroupStats(count=count, mean=mean, std=std, degenerate=degenerate)


def _centered(rewards, group_ids, num_groups, valid):
    """(rewards - group mean, stats, keep) with zeros wherever no signal may flow."""
    rewards = jnp.asarray(rewards, dtype=jnp.result_type(float))
    group_ids = jnp.asarray(group_ids, dtype=jnp.int32)
    valid = _valid_or_all(valid, rewards)
    stats = group_stats(rewards, group_ids, num_groups, valid)
    keep = valid & ~stats.degenerate[group_ids]
    return jnp.where(keep, rewards - stats.mean[group_ids], 0.0), stats, keep


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    valid: jax.Array | None = None,
    config: AdvantageConfig | None = None,
) -> jax.Array:
    """GRPO: A_i = (r_i - mean_g) / (std_g + std_eps), population std over the valid group.

    A lone success among n gets sqrt(n - 1) and each failure -1/sqrt(n - 1) (CANOPY App. B,
    exactly so at std_eps = 0). Args as `group_stats`, plus `config` (static; None means
    AdvantageConfig()); returns float [E].
    """
    config = config or AdvantageConfig()
    centered, stats, keep = _centered(rewards, group_ids, num_groups, valid)
    scale = stats.std[jnp.asarray(group_ids, dtype=jnp.int32)] + config.std_eps
    return jnp.where(keep, centered / jnp.where(keep, scale, 1.0), 0.0)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(
    rewards: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    valid: jax.Array | None = None,
    config: AdvantageConfig | None = None,
) -> jax.Array:
    """Dr. GRPO: A_i = r_i - mean_g (no std division). Args as `group_stats`; returns float [E]."""
    del config  # no estimator-specific settings
    centered, _, _ = _centered(rewards, group_ids, num_groups, valid)
    return centered


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    valid: jax.Array | None = None,
    config: AdvantageConfig | None = None,
) -> jax.Array:
    """RLOO: A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean_g) over the n valid members.

    Args as `group_stats`; returns float [E] (0 for groups with fewer than two valid members).
    """
    del config  # no estimator-specific settings
    centered, stats, _ = _centered(rewards, group_ids, num_groups, valid)
    n = stats.count[jnp.asarray(group_ids, dtype=jnp.int32)]
    return centered * n / jnp.maximum(n - 1.0, 1.0)


def episode_advantages(
    rewards: jax.Array,
    status_codes: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    config: AdvantageConfig | None = None,
    valid: jax.Array | None = None,
) -> jax.Array:
    """The whole episode-level path: score terminals, quarantine, then the configured estimator.

    Args:
      rewards: float [E] verifier rewards; status_codes: int [E] (STATUS_CODES);
      group_ids: int [E]; num_groups: static G; config: AdvantageConfig (static);
      valid: optional extra bool [E] mask (e.g. padding), combined with the quarantine mask.

    Returns:
      float [E] trajectory advantages; 0 for quarantined/invalid episodes and degenerate groups;
      negative ones multiplied by config.negative_scale.
    """
    config = config or AdvantageConfig()
    scored = score_terminal_rewards(rewards, status_codes, config.no_verdict_reward)
    keep = valid_from_status(status_codes)
    if valid is not None:
        keep = keep & jnp.asarray(valid, dtype=bool)
    advantages = ADVANTAGE_ESTIMATORS[config.estimator](scored, group_ids, num_groups, keep, config)
    if config.negative_scale == 1.0:  # static: the published estimator, unchanged
        return advantages
    return jnp.where(advantages < 0, advantages * config.negative_scale, advantages)


def _item_arrays(caller, trajectory_advantages, item_episode, item_valid):
    trajectory_advantages = jnp.asarray(trajectory_advantages)
    item_episode = jnp.asarray(item_episode, dtype=jnp.int32)
    if item_episode.ndim != 1:
        raise ValueError(f"{caller}: item_episode must be 1-D [B], got shape {item_episode.shape}")
    check_ids_in_range(caller, "item_episode", item_episode, trajectory_advantages.shape[0])
    item_valid = _valid_or_all(item_valid, item_episode, "item_episode")
    return trajectory_advantages, item_episode, item_valid


def broadcast_to_items(
    trajectory_advantages: jax.Array,
    item_episode: jax.Array,
    item_valid: jax.Array | None = None,
) -> jax.Array:
    """Each item (segment) gets its trajectory's advantage unchanged (ScaleCUA App. D eq. 3).

    Args:
      trajectory_advantages: float [E].
      item_episode: int [B] in [0, E): the episode each item was cut from.
      item_valid: optional bool [B]; False (padding) items get 0.

    Returns:
      float [B].
    """
    adv, item_episode, item_valid = _item_arrays("broadcast_to_items", trajectory_advantages, item_episode, item_valid)
    return jnp.where(item_valid, adv[item_episode], 0.0)


def stepo_item_advantages(
    trajectory_advantages: jax.Array,
    item_episode: jax.Array,
    item_valid: jax.Array | None = None,
) -> jax.Array:
    """STEPO (EvoCUA-1.5): each of trajectory i's |T_i| step items gets A_i / |T_i|.

    So every trajectory contributes exactly A_i in total, and a group's items sum to zero
    as its trajectories do, whatever their lengths. |T_i| is counted over the items passed
    in: call this on the whole rollout batch, before it is split into mini-batches.

    Args:
      trajectory_advantages: float [E].
      item_episode: int [B] in [0, E): the episode each step item belongs to.
      item_valid: optional bool [B]; False (padding) items are not counted in |T_i| and get 0.

    Returns:
      float [B].
    """
    adv, item_episode, item_valid = _item_arrays(
        "stepo_item_advantages", trajectory_advantages, item_episode, item_valid
    )
    num_steps = jax.ops.segment_sum(item_valid.astype(adv.dtype), item_episode, num_segments=adv.shape[0])
    return jnp.where(item_valid, adv[item_episode] / jnp.maximum(num_steps[item_episode], 1.0), 0.0)


def token_advantages(item_advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Per-token advantages: each item's advantage on its trained tokens, 0 elsewhere.

    Args:
      item_advantages: float [B].
      loss_mask: [B, T], nonzero on the tokens the item trains.

    Returns:
      float [B, T].
    """
    item_advantages = jnp.asarray(item_advantages)
    loss_mask = jnp.asarray(loss_mask)
    if loss_mask.ndim != 2 or loss_mask.shape[0] != item_advantages.shape[0]:
        raise ValueError(f"loss_mask {loss_mask.shape} must be [B, T] with B = {item_advantages.shape[0]}")
    return jnp.where(loss_mask != 0, item_advantages[:, None], 0.0)
