"""The task-sampler interface (`TaskSampler`) and what its implementations share.

One interface, used once per training step:

    ids = sampler.sample(key, batch_size)            # explicit jax.random key; deterministic
    outcomes = run the groups                         # [GroupOutcome], one per task id
    replays = sampler.assign_replays(outcomes)        # DTAC: cached successes for all-fail groups
    ... swap each replay into its group, compute advantages, train ...
    sampler.update(outcomes)                          # statistics, replay cache; step += 1
    checkpoint: sampler.state_dict() (holds the pool's state too) / load_state_dict()

The sampler keeps no random state: every draw comes from the key it is given, so a run
restored from `state_dict()` and fed the same keys samples exactly as an uninterrupted one.

Implementations: `cua_jax.tasks.samplers` (uniform, Frontier, DTAC; `build_sampler`),
`cua_jax.tasks.calibration` (the pilot filter and periodic pass-rate calibration, a wrapper);
`cua_jax.tasks.dynamic_sampling` drives a sampler through a DAPO step.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from cua_jax.tasks.pool import GroupOutcome, TaskPool

# Runs one group of `group_size` rollouts per task id with the current policy and returns
# their outcomes in the same order. Calibration and dynamic sampling take one of these.
RunGroups = Callable[[Sequence[str], int], Sequence[GroupOutcome]]


@dataclasses.dataclass(frozen=True)
class Replay:
    """A cached success to swap into group `group_index` in place of one failed episode."""

    group_index: int
    task_id: str
    trajectory: Any


class TaskSampler(abc.ABC):
    """The interface every sampler (and sampler wrapper) implements."""

    @property
    @abc.abstractmethod
    def pool(self) -> TaskPool: ...

    @property
    @abc.abstractmethod
    def step(self) -> int:
        """Completed training steps (calls to `update`)."""

    @abc.abstractmethod
    def sample(self, key: jax.Array, batch_size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        """`batch_size` distinct active task ids not in `exclude`, drawn with `key`."""

    @abc.abstractmethod
    def num_eligible(self, exclude: Sequence[str] = ()) -> int:
        """How many tasks `sample` could draw from with this `exclude`."""

    @abc.abstractmethod
    def assign_replays(self, outcomes: Sequence[GroupOutcome]) -> list[Replay]:
        """Which of this step's groups receive a cached success (call before advantages)."""

    @abc.abstractmethod
    def update(self, outcomes: Sequence[GroupOutcome]) -> None:
        """Records this step's groups (all of them, dropped ones included) and ends the step."""

    def metrics(self) -> dict[str, float]:
        """What the sampler's draws rest on, for the run's metrics (`sampler/...`): by default
        the pool's active tasks and the mean of its pass-rate estimates (NaN-free: tasks with
        an estimate only)."""
        pool = self.pool
        known = pool.pass_rate[~np.isnan(pool.pass_rate)]
        out = {"sampler/active_tasks": float(pool.active.sum()), "sampler/estimated_tasks": float(len(known))}
        if len(known):
            out["sampler/pass_rate_mean"] = float(known.mean())
        return out

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def check_fraction(owner: str, name: str, value: float, *, low_open: bool = False, high_open: bool = False):
    low_ok = value > 0 if low_open else value >= 0
    high_ok = value < 1 if high_open else value <= 1
    if not (low_ok and high_ok):
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{owner}.{name} must lie in {interval}, got {value}")


def check_outcomes_match(task_ids: Sequence[str], outcomes: Sequence[GroupOutcome], who: str) -> None:
    got = [o.task_id for o in outcomes]
    if got != list(task_ids):
        raise ValueError(
            f"{who}: run_groups must return one outcome per requested task id, in order; "
            f"asked for {len(task_ids)} ids, got {len(got)} outcomes"
            + ("" if len(got) != len(task_ids) else " with different ids")
        )
