"""Orbax checkpoints of a training run: everything a resumed run needs to continue exactly.

One checkpoint (a step directory under <workdir>/checkpoints, written atomically by Orbax)
holds three items:

  train_state  the learner's parameters, optimizer state and step (sharded arrays,
               `StandardSave`; restored onto the learner's own shardings);
  host_state   the trainer's `TrainerState` record as numpy arrays: the run's base PRNG key
               data, the step, the policy version, the next group id, and, pickled into uint8
               arrays (so they are written in the same atomic commit), each rollout worker's
               engine sampling state (the JAX sampler's call counter), the task pool +
               sampler state, the evaluations so far and, in async mode, the rollout
               buffer's groups and draw accounting;
  config       the run's config as JSON (what was trained; `read_saved_config` reads it).

A coordinated async run (config.train.coordinated, train.mode "async") also keeps every
process's own `TrainerState` (its rollout buffer, unfinished draws, sampler and engines' state,
which differ between the processes) in <workdir>/process_states/<step>/process_<index>.npz,
beside the Orbax directory (which is Orbax's alone). Each process writes its file before the
checkpoint is saved (the trainer puts a barrier between the two), so a committed checkpoint
always has every process's file; a file of a step that never committed (a kill during the save)
is never read, and is removed at a later save.

The checkpointer only moves records: the trainer makes its `TrainerState` and applies a
restored one (`Trainer.trainer_state` / `Trainer.load_trainer_state`), so no field of the
trainer is written from here.

Every random draw of the trainer is a function of (base key, step) or of the engines'
call counters, so restoring these and the parameters makes a resumed run on CPU reproduce
the uninterrupted run's metrics exactly (tests/train/test_trainer.py). A vLLM engine has no
sampling state to save: its resumed samples differ from the uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import pickle
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import SingleDeviceSharding

from cua_jax.train.build import build_policy
from cua_jax.train.settings import TrainSettings


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """What a trainer holds besides the learner's arrays.

    base_key: the run's base PRNG key data (uint32 array; a check that the seed matches).
    step: completed training steps. version: the policy version the engines hold.
    next_group_id: the next rollout group's id. engine_sampling: each rollout worker's engine
    sampling state. sampler: the task sampler's state dict. evaluations: held-out results so far.
    """

    base_key: np.ndarray
    step: int
    version: int
    next_group_id: int
    engine_sampling: list[dict[str, int]]
    sampler: dict[str, Any]
    evaluations: dict[str, Any]
    rollouts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "base_key": np.asarray(self.base_key),
            "step": np.asarray(self.step, np.int64),
            "version": np.asarray(self.version, np.int64),
            "next_group_id": np.asarray(self.next_group_id, np.int64),
            "engine_sampling": _pack(self.engine_sampling),
            "sampler": _pack(self.sampler),
            "evaluations": _pack(self.evaluations),
            "rollouts": _pack(self.rollouts),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], where: str) -> TrainerState:
        missing = {field.name for field in dataclasses.fields(cls)} - set(arrays) - {"rollouts"}
        if missing:
            raise ValueError(f"checkpoint {where} lacks host state {sorted(missing)}")
        return cls(
            base_key=np.asarray(arrays["base_key"]),
            step=int(arrays["step"]),
            version=int(arrays["version"]),
            next_group_id=int(arrays["next_group_id"]),
            engine_sampling=_unpack(arrays["engine_sampling"]),
            sampler=_unpack(arrays["sampler"]),
            evaluations=_unpack(arrays["evaluations"]),
            rollouts=_unpack(arrays["rollouts"]) if "rollouts" in arrays else {},
        )


def _pack(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()


def _unpack(array: np.ndarray) -> Any:
    return pickle.loads(np.asarray(array, np.uint8).tobytes())


class TrainCheckpointer:
    """Saves and restores (learner train state, `TrainerState`, config) under `directory`,
    keeping the newest `keep` steps."""

    def __init__(self, directory: str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, train_state: Any, state: TrainerState, config: dict[str, Any]) -> None:
        """Writes checkpoint `state.step` and waits for it to land."""
        self.manager.save(
            state.step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardSave(train_state),
                host_state=ocp.args.StandardSave(state.to_arrays()),
                config=ocp.args.JsonSave(config),
            ),
        )
        self.manager.wait_until_finished()

    def restore_latest(self, train_state_like: Any) -> tuple[Any, TrainerState] | None:
        """(train state, TrainerState) of the newest checkpoint, the arrays placed like
        `train_state_like` (the learner's own); None when the directory holds no checkpoint."""
        step = self.manager.latest_step()
        if step is None:
            return None
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, train_state_like)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardRestore(target),
                host_state=ocp.args.StandardRestore(),
            ),
        )
        return restored["train_state"], TrainerState.from_arrays(restored["host_state"], f"{self.directory}/{step}")

    # -- each process's own state (coordinated async runs) ------------------------------------

    @property
    def workdir(self) -> str:
        return os.path.dirname(self.directory)

    def write_process_state(self, state: TrainerState, index: int) -> None:
        """Process `index`'s own state for checkpoint `state.step` (atomically: a whole file or
        none). Call it on every process, then a barrier, then `save`."""
        path = process_state_path(self.workdir, state.step, index)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = path + ".partial"
        with open(partial, "wb") as f:
            np.savez(f, **state.to_arrays())
        os.replace(partial, path)

    def read_process_state(self, step: int, index: int, count: int) -> TrainerState:
        """`read_process_state` of this checkpointer's workdir."""
        return read_process_state(self.workdir, step, index, count)

    def prune_process_states(self, index: int, keep_step: int) -> None:
        """Removes process `index`'s files of the steps the manager no longer keeps (and of
        steps that never committed), never `keep_step`'s (the one just saved)."""
        root = os.path.join(self.workdir, PROCESS_STATES)
        kept = set(self.manager.all_steps()) | {keep_step}
        for name in os.listdir(root) if os.path.isdir(root) else []:
            if name.isdigit() and int(name) not in kept:
                path = process_state_path(self.workdir, int(name), index)
                if os.path.exists(path):
                    os.remove(path)
                with contextlib.suppress(OSError):  # another process's file may still be there
                    os.rmdir(os.path.dirname(path))

    def close(self) -> None:
        self.manager.close()


# ---- reading a run's directory ------------------------------------------------------------

CHECKPOINTS = "checkpoints"
PROCESS_STATES = "process_states"  # each process's own TrainerState, beside CHECKPOINTS


def _manager(workdir: str | os.PathLike):
    directory = pathlib.Path(workdir).resolve() / CHECKPOINTS
    if not directory.is_dir():
        raise ValueError(f"{workdir} is not a training run's workdir: it has no {CHECKPOINTS}/ directory")
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))


def process_state_path(workdir: str | os.PathLike, step: int, index: int) -> str:
    """Where process `index`'s own state of checkpoint `step` lies (coordinated async runs)."""
    return os.path.join(os.fspath(workdir), PROCESS_STATES, str(step), f"process_{index}.npz")


def read_process_state(workdir: str | os.PathLike, step: int, index: int, count: int) -> TrainerState:
    """Process `index`'s own state saved with checkpoint `step` by a coordinated async run of
    `count` processes; ValueError when the file is missing or another number of processes
    wrote the checkpoint."""
    path = process_state_path(workdir, step, index)
    folder = os.path.dirname(path)
    written = sorted(n for n in os.listdir(folder) if n.endswith(".npz")) if os.path.isdir(folder) else []
    if len(written) != count or not os.path.exists(path):
        raise ValueError(
            f"checkpoint {step} holds the own state of {len(written)} processes in {folder} ({written}), "
            f"this run has {count} (config.mesh.num_processes); process {index} needs process_{index}.npz"
        )
    with np.load(path) as arrays:
        return TrainerState.from_arrays(dict(arrays), path)


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
    """The steps checkpointed under <workdir>/checkpoints, ascending."""
    manager = _manager(workdir)
    try:
        return sorted(manager.all_steps())
    finally:
        manager.close()


def resolve_step(workdir: str | os.PathLike, step: int | None) -> int:
    """`step`, or the latest checkpointed step when None; ValueError listing the steps present
    when that step has no checkpoint."""
    steps = checkpoint_steps(workdir)
    if not steps:
        raise ValueError(f"{workdir}/{CHECKPOINTS} holds no checkpoint")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ValueError(f"{workdir}/{CHECKPOINTS} has no checkpoint of step {step}; steps present: {steps}")
    return step


def read_saved_config(workdir: str | os.PathLike, step: int) -> dict[str, Any]:
    """The run's config as the trainer saved it with checkpoint `step` (the checkpoint's `config`
    item, JSON of `config.to_dict()`)."""
    manager = _manager(workdir)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    finally:
        manager.close()
    return restored["config"]


def restore_policy(workdir: str | os.PathLike, step: int, settings: TrainSettings):
    """The run's policy with the parameters of checkpoint `step`, on the host CPU.

    The policy's structure comes from `build_policy` under `nnx.eval_shape` (no parameters are
    initialised); the checkpoint's train state holds the trainable `params` and the `frozen` rest,
    split as the learner splits them (`trainable_filter`, with learner.freeze_vision)."""
    abstract = nnx.eval_shape(lambda: build_policy(settings, settings.seed))
    if settings.learner.freeze_vision:
        abstract.freeze_vision = True
    trainable = abstract.trainable_filter() if hasattr(abstract, "trainable_filter") else nnx.Param
    graphdef, params, frozen = nnx.split(abstract, trainable, ...)
    target = {"params": params, "frozen": frozen}
    host = SingleDeviceSharding(jax.devices("cpu")[0])
    restore_args = jax.tree.map(
        lambda leaf: ocp.ArrayRestoreArgs(sharding=host, global_shape=leaf.shape, dtype=leaf.dtype), target
    )
    manager = _manager(workdir)
    try:
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
            ),
        )
    finally:
        manager.close()
    state = restored["train_state"]
    return nnx.merge(graphdef, state["params"], state["frozen"])
