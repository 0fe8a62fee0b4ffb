"""The records the capsule runtime hands out: snapshots, step results, publications."""

from __future__ import annotations

import dataclasses

from cua_jax.envs import actions as A
from cua_jax.envs.faults import Fault
from cua_jax.envs.miniwob import MiniWoBObservation
from cua_jax.envs.miniwob_state import PageState
from cua_jax.types import EpisodeStatus


@dataclasses.dataclass(frozen=True)
class CapsuleSnapshot:
    """Everything needed to rebuild a capsule: task, seed, action prefix, clock, and the
    captured page state when capture is exact for it (`miniwob_state`); otherwise
    `replay_reason` says why a rebuild replays the prefix instead."""

    task: str
    seed: int
    actions: tuple[A.Action, ...]
    elapsed_ms: float | None  # None once the episode has ended
    source_env: str
    source_generation: int
    page_state: PageState | None = None
    replay_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one step.

    reward / env_reward: MiniWoB's raw reward and its time-scaled reward (0 until done).
    status: SUCCESS / FAILURE once done, QUARANTINED when the infrastructure ended the
    episode (then `quarantine_reason` says why), None while the episode runs.
    invalid_action: the parser's or the environment's message when the action was not
    performed (the page is unchanged). generation: the capsule generation that served it.
    fault: the infrastructure fault behind a quarantine; `quarantine_reason` is its reason.
    """

    observation: MiniWoBObservation | None
    reward: float
    env_reward: float
    done: bool
    success: bool
    status: EpisodeStatus | None
    generation: int
    invalid_action: str | None = None
    quarantine_reason: str | None = None
    reason: str | None = None  # MiniWoB's reason for the reward, e.g. "timed out"
    fault: Fault | None = None


@dataclasses.dataclass(frozen=True)
class PublicationRecord:
    """One publish of a route: which generation replaced which, and the in-flight count then."""

    env_id: str
    operation: str
    previous_generation: int | None
    generation: int
    in_flight_at_publish: int
