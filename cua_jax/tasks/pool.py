"""The task pool: tasks of any kind plus the per-task statistics the samplers read.

A pool task has an id, a domain, a difficulty tier, a feasibility flag and a payload: any
JSON-serialisable dict with a "kind" field (an OSWorld task, a MiniWoB task name and seed,
...). The pool never interprets the payload; the rollout side does.

Per task the pool keeps (index i follows the order the tasks were given in):
  attempts[i], successes[i]   int64: rollouts with a verdict, and the successful ones;
  pass_rate[i]                float32: the EMA pass rate of ScaleCUA eq. 1, NaN until the
                              task's first estimate (a pilot or its first group);
  last_step_sampled[i]        int64: the training step that last drew the task, -1 if never;
  active[i]                   bool: whether samplers may draw the task (pilot and
                              calibration filtering switch this);
  a replay cache of successful trajectories (DTAC positive replay), each with the step it
  was cached at and how often it has been replayed.

`state_dict()` / `load_state_dict()` carry all of this; `save_state` / `load_state` write a
state dict to one file atomically, so the pool and its sampler go into the training
checkpoint and a resumed run samples exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

STATE_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PoolTask:
    """One task of the pool.

    task_id: unique, non-empty.
    domain: the application or ability family; calibration and reports group by it.
    tier: difficulty tier, an int >= 0 (0 easiest).
    feasible: False for tasks whose correct answer is to declare failure (DTAC's ICS channel).
    payload: JSON-serialisable dict with a string "kind"; opaque to the pool.
    """

    task_id: str
    domain: str
    tier: int
    feasible: bool
    payload: Mapping[str, Any]

    def __post_init__(self):
        if not isinstance(self.task_id, str) or not self.task_id:
            raise ValueError(f"PoolTask.task_id must be a non-empty string, got {self.task_id!r}")
        where = f"PoolTask {self.task_id!r}"
        if not isinstance(self.domain, str) or not self.domain:
            raise ValueError(f"{where}: domain must be a non-empty string, got {self.domain!r}")
        if isinstance(self.tier, bool) or not isinstance(self.tier, (int, np.integer)) or self.tier < 0:
            raise ValueError(f"{where}: tier must be an int >= 0, got {self.tier!r}")
        if not isinstance(self.feasible, (bool, np.bool_)):
            raise ValueError(f"{where}: feasible must be a bool, got {self.feasible!r}")
        if not isinstance(self.payload, Mapping):
            raise ValueError(f"{where}: payload must be a dict, got {type(self.payload).__name__}")
        kind = self.payload.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f'{where}: payload needs a non-empty string field "kind", got {kind!r}')
        try:
            json.dumps(self.payload)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: payload is not JSON-serialisable: {err}") from err

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "domain": self.domain,
            "tier": int(self.tier),
            "feasible": bool(self.feasible),
            "payload": dict(self.payload),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> PoolTask:
        """Builds a task from a plain record; a missing field raises naming it."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a pool task record must be a dict, got {type(record).__name__}")
        missing = [f for f in ("task_id", "domain", "tier", "feasible", "payload") if f not in record]
        if missing:
            raise ValueError(f"pool task record {record.get('task_id', '<no task_id>')!r} lacks field(s) {missing}")
        return cls(
            task_id=record["task_id"],
            domain=record["domain"],
            tier=record["tier"],
            feasible=record["feasible"],
            payload=record["payload"],
        )


@dataclasses.dataclass(frozen=True)
class GroupOutcome:
    """The outcome of one rollout group, as the trainer reports it to the sampler.

    attempts counts the group's episodes with a verdict (successes, failures and no-verdict
    terminals); quarantined episodes are left out (CANOPY App. G). A group whose episodes were
    all quarantined has attempts == 0 and leaves the pass-rate estimate untouched.
    success_trajectory: optionally one successful episode of the group, for the replay cache.
    """

    task_id: str
    successes: int
    attempts: int
    success_trajectory: Any = None

    def __post_init__(self):
        for name in ("successes", "attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"GroupOutcome for task {self.task_id!r}: {name} must be an int >= 0, got {value!r}")
        if self.successes > self.attempts:
            raise ValueError(
                f"GroupOutcome for task {self.task_id!r}: successes {self.successes} exceed attempts {self.attempts}"
            )
        if self.success_trajectory is not None and self.successes == 0:
            raise ValueError(
                f"GroupOutcome for task {self.task_id!r}: a success_trajectory was given for a group without successes"
            )


@dataclasses.dataclass
class CachedTrajectory:
    """A successful trajectory kept for positive replay."""

    trajectory: Any
    step_cached: int
    replays: int = 0


class TaskPool:
    """Tasks plus per-task statistics; see the module docstring for the fields."""

    def __init__(self, tasks: Sequence[PoolTask], prior: np.ndarray | None = None):
        """prior: float [N] > 0, a fixed weight per task every sampler multiplies into its own
        (per-domain sampling weights: `cua_jax.tasks.sources.TaskCatalog.pool`); None: ones."""
        tasks = tuple(tasks)
        if not tasks:
            raise ValueError("TaskPool needs at least one task")
        for task in tasks:
            if not isinstance(task, PoolTask):
                raise ValueError(f"TaskPool takes PoolTask objects, got {type(task).__name__}")
        self.tasks = tasks
        self._index = {}
        for i, task in enumerate(tasks):
            if task.task_id in self._index:
                raise ValueError(f"TaskPool: duplicate task_id {task.task_id!r}")
            self._index[task.task_id] = i
        n = len(tasks)
        self.feasible = np.array([bool(t.feasible) for t in tasks], dtype=bool)
        self.tiers = np.array([int(t.tier) for t in tasks], dtype=np.int64)
        self.domains = tuple(sorted({t.domain for t in tasks}))
        domain_code = {d: c for c, d in enumerate(self.domains)}
        self.domain_ids = np.array([domain_code[t.domain] for t in tasks], dtype=np.int64)
        self.prior = np.ones(n, np.float32) if prior is None else np.asarray(prior, np.float32)
        if self.prior.shape != (n,) or not (np.all(np.isfinite(self.prior)) and np.all(self.prior > 0)):
            raise ValueError(f"TaskPool: prior must be {n} finite weights > 0, got {prior!r}")

        self.attempts = np.zeros(n, dtype=np.int64)
        self.successes = np.zeros(n, dtype=np.int64)
        self.pass_rate = np.full(n, np.nan, dtype=np.float32)
        self.last_step_sampled = np.full(n, -1, dtype=np.int64)
        self.active = np.ones(n, dtype=bool)
        self.replay_cache: dict[int, list[CachedTrajectory]] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def task_ids(self) -> list[str]:
        return [t.task_id for t in self.tasks]

    def indices_of(self, task_ids: Iterable[str]) -> np.ndarray:
        """int64 [K] pool indices of the given ids; an unknown id raises KeyError naming it."""
        out = []
        for task_id in task_ids:
            try:
                out.append(self._index[task_id])
            except KeyError:
                raise KeyError(f"task {task_id!r} is not in the pool") from None
        return np.asarray(out, dtype=np.int64)

    def ids_of(self, indices: Iterable[int]) -> list[str]:
        return [self.tasks[int(i)].task_id for i in indices]

    # -- statistics ---------------------------------------------------------------------

    def record_outcomes(self, outcomes: Sequence[GroupOutcome], alpha: float) -> None:
        """Adds the groups' counts and moves each task's EMA pass rate (ScaleCUA eq. 1).

        Groups of the same task in one call are pooled into one rate before the single EMA
        step, so the result does not depend on their order. A task without an estimate yet
        takes its first observed rate as the estimate.
        """
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"EMA alpha must lie in (0, 1], got {alpha}")
        if not outcomes:
            return
        idx = self.indices_of(o.task_id for o in outcomes)
        succ = np.zeros(len(self), dtype=np.int64)
        att = np.zeros(len(self), dtype=np.int64)
        np.add.at(succ, idx, [o.successes for o in outcomes])
        np.add.at(att, idx, [o.attempts for o in outcomes])
        self.successes += succ
        self.attempts += att
        observed = att > 0
        rate = np.divide(succ, att, out=np.zeros(len(self)), where=observed)
        self.pass_rate = np.array(_ema_update_jit(self.pass_rate, rate.astype(np.float32), observed, alpha))

    def set_pass_rates(self, indices: np.ndarray, successes: np.ndarray, attempts: np.ndarray) -> None:
        """Replaces the estimates of `indices` by fresh rates (a pilot or a calibration pass).

        The counts are added to the running totals; tasks with attempts == 0 keep their estimate.
        """
        indices = np.asarray(indices, dtype=np.int64)
        successes = np.asarray(successes, dtype=np.int64)
        attempts = np.asarray(attempts, dtype=np.int64)
        np.add.at(self.successes, indices, successes)
        np.add.at(self.attempts, indices, attempts)
        seen = attempts > 0
        self.pass_rate[indices[seen]] = successes[seen] / attempts[seen]

    def mark_sampled(self, indices: np.ndarray, step: int) -> None:
        self.last_step_sampled[np.asarray(indices, dtype=np.int64)] = step

    # -- replay cache -------------------------------------------------------------------

    def cache_success(self, index: int, trajectory: Any, step: int, capacity: int) -> None:
        """Keeps `trajectory` for task `index`; past `capacity` the oldest entry is dropped."""
        if capacity < 1:
            raise ValueError(f"replay cache capacity must be >= 1, got {capacity}")
        entries = self.replay_cache.setdefault(int(index), [])
        entries.append(CachedTrajectory(trajectory=trajectory, step_cached=step))
        del entries[: max(0, len(entries) - capacity)]

    def take_replay(self, index: int, max_replays: int) -> Any | None:
        """One cached success of task `index` to replay, or None if none is left.

        The least-replayed entry goes first (ties: the oldest). Its count is incremented, and
        an entry that reaches `max_replays` leaves the cache, so no trajectory is replayed more
        than `max_replays` times.
        """
        if max_replays < 1:
            raise ValueError(f"max_replays must be >= 1, got {max_replays}")
        entries = self.replay_cache.get(int(index))
        if not entries:
            return None
        pick = min(range(len(entries)), key=lambda k: (entries[k].replays, k))
        entry = entries[pick]
        entry.replays += 1
        if entry.replays >= max_replays:
            del entries[pick]
        if not entries:
            del self.replay_cache[int(index)]
        return entry.trajectory

    # -- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All mutable state (copies), keyed by name; the task list itself is rebuilt from
        the task files on restore and checked against `task_ids`."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "task_ids": self.task_ids,
            "attempts": self.attempts.copy(),
            "successes": self.successes.copy(),
            "pass_rate": self.pass_rate.copy(),
            "last_step_sampled": self.last_step_sampled.copy(),
            "active": self.active.copy(),
            "replay_cache": {
                # Not dataclasses.asdict: it would turn a dataclass trajectory (an Episode)
                # into a dict.
                self.tasks[i].task_id: [
                    {"trajectory": e.trajectory, "step_cached": e.step_cached, "replays": e.replays} for e in entries
                ]
                for i, entries in sorted(self.replay_cache.items())
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise ValueError(
                f"task pool state has format_version {state.get('format_version')!r}; "
                f"this code reads {STATE_FORMAT_VERSION}"
            )
        if list(state["task_ids"]) != self.task_ids:
            saved, here = set(state["task_ids"]), set(self.task_ids)
            raise ValueError(
                "task pool state does not match this pool's tasks: "
                f"{len(saved - here)} saved ids are missing here (e.g. {sorted(saved - here)[:3]}), "
                f"{len(here - saved)} ids are new (e.g. {sorted(here - saved)[:3]}), "
                "or the order differs"
            )
        n = len(self)
        arrays = {
            "attempts": np.int64,
            "successes": np.int64,
            "pass_rate": np.float32,
            "last_step_sampled": np.int64,
            "active": bool,
        }
        for name, dtype in arrays.items():
            value = np.array(state[name], dtype=dtype)
            if value.shape != (n,):
                raise ValueError(f"task pool state field {name!r} has shape {value.shape}, expected ({n},)")
            setattr(self, name, value)
        self.replay_cache = {
            int(self.indices_of([task_id])[0]): [CachedTrajectory(**e) for e in entries]
            for task_id, entries in state["replay_cache"].items()
        }


def ema_update(
    pass_rate: jax.Array, observed_rate: jax.Array, observed: jax.Array, alpha: float | jax.Array
) -> jax.Array:
    """ScaleCUA eq. 1: p <- (1 - alpha) p + alpha * (successes / n) where a group was observed.

    Args:
      pass_rate: float [N] current estimates, NaN where a task has none yet.
      observed_rate: float [N] this iteration's group success rate (ignored where not observed).
      observed: bool [N] tasks that received a group with attempts > 0.
      alpha: EMA smoothing factor in (0, 1].

    Returns:
      float [N]: the new estimates; a task without an estimate takes its observed rate.
    """
    pass_rate = jnp.asarray(pass_rate)
    observed_rate = jnp.asarray(observed_rate, dtype=pass_rate.dtype)
    moved = (1.0 - alpha) * pass_rate + alpha * observed_rate
    return jnp.where(observed, jnp.where(jnp.isnan(pass_rate), observed_rate, moved), pass_rate)


_ema_update_jit = jax.jit(ema_update)


def save_state(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Writes a pool or sampler state dict to `path` atomically (temp file, then rename).

    The state holds numpy arrays, plain values and the cached trajectories, which may be any
    picklable object (e.g. `cua_jax.types.Episode`), so the file is a pickle.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_task_state_")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(dict(state), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a state written by `save_state` (a checkpoint this project wrote; pickle is
    not safe against files from elsewhere)."""
    with open(path, "rb") as f:
        state = pickle.load(f)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a task state file (got {type(state).__name__})")
    return state
