"""One process of the multi-host test (tests/launch/test_multihost.py), started by
launch/multihost.sh (or alone, for the single-process reference):

    python tests/launch/multihost_step.py --config=experiments/configs/tiny.py --out=DIR \
        --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2 [--config.mesh.distributed=true ...]

It joins jax.distributed from config.mesh, builds the global mesh, takes two sharded policy-
gradient steps of a small Qwen3 on a fixed batch (the same on every process), and writes to
DIR: the steps' metrics and the parameters gathered from every host (result_<process>.npz),
an Orbax checkpoint of the train state restored into a learner of other weights (whose
gathered parameters are written too), and the policy exported as a HF directory (process 0
writes, every process takes part in the gathers).
"""

from __future__ import annotations

import os

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from tests.support.models import SMALL_QWEN3

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (its mesh block is used).")
_OUT = flags.DEFINE_string("out", None, "Output directory.")


def _items(seed: int = 1, num_groups: int = 4, group_size: int = 2):
    from cua_jax.types import TrainingItem

    rng = np.random.default_rng(seed)
    items, advantages = [], []
    for g in range(num_groups):
        group = rng.normal(size=group_size)
        group -= group.mean()
        for k in range(group_size):
            n = int(rng.integers(12, 33))
            ids = rng.integers(3, SMALL_QWEN3["vocab_size"], n).astype(np.int32)
            mask = np.zeros(n, np.int32)
            mask[n // 2 :] = 1
            logp = np.where(mask > 0, rng.uniform(-5.5, -4.0, n), 0.0).astype(np.float32)
            items.append(TrainingItem(ids, mask, logp, [], f"ep{g}-{k}", g, (0,)))
            advantages.append(group[k])
    return items, np.asarray(advantages, np.float32)


def main(argv):
    del argv
    from cua_jax.models.liveness import guard_process
    from cua_jax.models.sharding import initialize_distributed
    from cua_jax.train.settings import mesh_settings

    mesh_config = mesh_settings(_CONFIG.value)
    initialize_distributed(mesh_config)  # before any JAX computation
    with guard_process():  # as launch/multihost.py: a normal end marks this process done
        run(mesh_config)


def run(mesh_config):
    import jax
    from flax import nnx
    from jax.experimental import multihost_utils

    from cua_jax.models.qwen3 import Qwen3ForCausalLM, export_qwen3, tiny_qwen3_config
    from cua_jax.models.sharding import make_mesh
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.batching import BatchingConfig, make_minibatches
    from cua_jax.train.checkpoint import TrainCheckpointer, TrainerState
    from cua_jax.train.learner import Learner, LearnerConfig, OptimizerConfig

    mesh = make_mesh(mesh_config)
    out, process = _OUT.value, jax.process_index()

    def gathered(tree):
        return {
            jax.tree_util.keystr(path): np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        }

    config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-2, eps=1e-3, max_grad_norm=1.0),
        loss=PolicyLossConfig(aggregation="token_mean", kl_coef=1e-2),
    )
    learner = Learner(Qwen3ForCausalLM(tiny_qwen3_config(**SMALL_QWEN3), rngs=nnx.Rngs(0)), config, mesh=mesh)
    items, advantages = _items()
    [micro] = make_minibatches(items, advantages, BatchingConfig(rows=8, length_multiple=32), 1)
    metrics = [learner.update(micro) for _ in range(2)]
    result = {f"metric/{k}": np.asarray([m[k] for m in metrics]) for k in ("loss", "grad_norm", "entropy")}
    result.update({f"param/{k}": v for k, v in gathered(learner.params).items()})
    result["devices"] = np.asarray([len(jax.devices()), len(jax.local_devices()), jax.process_count()])

    checkpointer = TrainCheckpointer(os.path.join(out, "checkpoints"))
    host_state = TrainerState(
        base_key=np.zeros(2, np.uint32),
        step=2,
        version=2,
        next_group_id=0,
        engine_sampling=[],
        sampler={},
        evaluations={},
    )
    checkpointer.save(learner.train_state(), host_state, {"test": "multihost"})
    other = Learner(Qwen3ForCausalLM(tiny_qwen3_config(**SMALL_QWEN3), rngs=nnx.Rngs(7)), config, mesh=mesh)
    restored, restored_host = checkpointer.restore_latest(other.train_state())
    other.load_train_state(restored)
    checkpointer.close()
    result.update({f"restored/{k}": v for k, v in gathered(other.params).items()})
    result["restored_step"] = np.asarray(restored_host.step)
    export_qwen3(learner.model, os.path.join(out, "export"))
    np.savez(os.path.join(out, f"result_{process}.npz"), **result)
    multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "out"])
    app.run(main)
