"""One process of the coordinated multi-host test (tests/launch/test_multihost_coordinated.py),
started by launch/multihost.sh (or alone, for the single-process reference):

    python tests/launch/coordinated_step.py --config=experiments/configs/tiny.py --out=DIR \
        --config.train.coordinated=true ... [--config.mesh.distributed=true ...]

It builds the run's trainer as experiments.main does (after joining jax.distributed from
config.mesh), takes config.train.num_steps on-policy steps with real MiniWoB capsules, and
writes to DIR/result_<process>.json what this process collected (each episode of its groups:
ids, sampled tokens, reward, status) and trained (the episode ids of its items), with each
step's metrics; process 0 also writes the parameters after each update, gathered from every
process, to DIR/params_<step>.npz.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config.")
_OUT = flags.DEFINE_string("out", None, "Output directory.")


def main(argv):
    del argv
    import jax
    from flax import nnx

    from cua_jax.models.sharding import initialize_distributed
    from cua_jax.train.coordinated import host_state
    from cua_jax.train.settings import mesh_settings
    from cua_jax.train.trainer import build_trainer, prepare_run, warm_start

    initialize_distributed(mesh_settings(_CONFIG.value))  # before any JAX computation
    start = time.perf_counter()
    setup = prepare_run(_CONFIG.value)
    warm_start(setup)
    trainer = build_trainer(setup)
    process = jax.process_index()
    steps = []
    try:
        collect_share = trainer.collector.collect_share
        collected: list = []

        def recording(*args, **kwargs):
            local, groups, extra = collect_share(*args, **kwargs)
            collected.append((local, groups))
            return local, groups, extra

        trainer.collector.collect_share = recording
        built_s = time.perf_counter() - start
        for step in range(trainer.settings.train.num_steps):
            metrics = trainer.train_step()
            local, groups = collected[-1]
            episodes = [
                {
                    "episode_id": e.episode_id,
                    "group_id": e.group_id,
                    "task_id": e.task_id,
                    "status": e.status.value,
                    "reward": float(e.reward),
                    "tokens": [t.response_ids.astype(int).tolist() for t in e.turns],
                    "logprobs": [t.response_logprobs.astype(float).tolist() for t in e.turns],
                    "items": [i.ids.astype(int).tolist() for i in g.items[e.episode_id]],
                }
                for g in local
                for e in g.episodes
            ]
            steps.append(
                {
                    "episodes": episodes,
                    "all_episode_ids": [e.episode_id for g in groups for e in g.episodes],
                    "trained": [item.episode_id for item in trainer.last_batch.items],
                    "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
                    "engine_version": trainer.workers[0].engine.health().policy_version,
                }
            )
            params = host_state(nnx.state(trainer.learner.model))
            if process == 0:
                flat = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
                np.savez(os.path.join(_OUT.value, f"params_{step}.npz"), **flat)
        result = {
            "process": process,
            "devices": [len(jax.devices()), len(jax.local_devices()), jax.process_count()],
            "built_s": built_s,
            "total_s": time.perf_counter() - start,
            "steps": steps,
        }
        with open(os.path.join(_OUT.value, f"result_{process}.json"), "w") as f:
            json.dump(result, f)
    finally:
        trainer.close()


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "out"])
    app.run(main)
