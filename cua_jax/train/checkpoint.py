"""Orbax checkpoints of a training run: everything a resumed run needs to continue exactly.

One checkpoint (a step directory under <workdir>/checkpoints, written atomically by Orbax)
holds three items:

  train_state  the learner's parameters, optimizer state and step (sharded arrays,
               `StandardSave`; restored onto the learner's own shardings);
  host_state   numpy arrays: the run's base PRNG key data, the policy version, the next group
               id, and, pickled into uint8 arrays (so they are written in the same atomic
               commit), each rollout worker's engine sampling state (the JAX sampler's call
               counter; read and set through the workers, in-process or Ray actors alike) and
               the task pool + sampler state;
  config       the run's config as JSON (what was trained, for the record).

Every random draw of the trainer is a function of (base key, step) or of the engines'
call counters, so restoring these and the parameters makes a resumed run on CPU reproduce
the uninterrupted run's metrics exactly (tests/train/test_trainer.py). A vLLM engine has no
sampling state to save: its resumed samples differ from the uninterrupted run's.
"""

from __future__ import annotations

import os
import pickle
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

if TYPE_CHECKING:
    from cua_jax.train.trainer import Trainer


def _pack(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()


def _unpack(array: np.ndarray) -> Any:
    return pickle.loads(np.asarray(array, np.uint8).tobytes())


class TrainCheckpointer:
    """Saves and restores a `Trainer` under `directory`, keeping the newest `keep` steps."""

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

    @staticmethod
    def host_state(trainer: "Trainer") -> dict[str, np.ndarray]:
        return {
            "base_key": np.asarray(jax.random.key_data(trainer.base_key)),
            "step": np.asarray(trainer.step, np.int64),
            "version": np.asarray(trainer.version, np.int64),
            "next_group_id": np.asarray(trainer.next_group_id, np.int64),
            "engine_sampling": _pack([worker.sampling_state() for worker in trainer.workers]),
            "sampler": _pack(trainer.sampler.state_dict()),
            "evaluations": _pack(trainer.evaluations),
        }

    def save(self, trainer: "Trainer") -> None:
        """Writes the trainer's state as checkpoint `trainer.step` and waits for it to land."""
        self.manager.save(
            trainer.step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardSave(trainer.learner.train_state()),
                host_state=ocp.args.StandardSave(self.host_state(trainer)),
                config=ocp.args.JsonSave(trainer.config.to_dict()),
            ),
        )
        self.manager.wait_until_finished()

    def restore_latest(self, trainer: "Trainer") -> int | None:
        """Loads the newest checkpoint into `trainer` (learner, engines, sampler, counters).

        Returns its step, or None when the directory holds no checkpoint.
        """
        step = self.manager.latest_step()
        if step is None:
            return None
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer.learner.train_state())
        host_target = self.host_state(trainer)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardRestore(target),
                host_state=ocp.args.StandardRestore(),
            ),
        )
        host = restored["host_state"]
        missing = set(host_target) - set(host)
        if missing:
            raise ValueError(f"checkpoint {self.directory}/{step} lacks host state {sorted(missing)}")
        saved_key = np.asarray(host["base_key"])
        if not np.array_equal(saved_key, host_target["base_key"]):
            raise ValueError(
                f"checkpoint {self.directory}/{step} was written with another seed; "
                "resume with the config it was trained with (config.seed)"
            )
        sampling = _unpack(host["engine_sampling"])
        if len(sampling) != len(trainer.workers):
            raise ValueError(
                f"checkpoint {self.directory}/{step} has {len(sampling)} rollout workers' state, "
                f"the config asks for {len(trainer.workers)} (config.rollout.num_workers)"
            )
        trainer.learner.load_train_state(restored["train_state"])
        trainer.step = int(host["step"])
        trainer.next_group_id = int(host["next_group_id"])
        trainer.sampler.load_state_dict(_unpack(host["sampler"]))
        trainer.evaluations = _unpack(host["evaluations"])
        trainer.version = int(host["version"]) - 1
        trainer.sync_weights()  # engines get the restored parameters at the saved version
        for worker, state in zip(trainer.workers, sampling):
            worker.load_sampling_state(state)
        return step

    def close(self) -> None:
        self.manager.close()
