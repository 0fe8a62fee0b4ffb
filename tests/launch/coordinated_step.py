"""One process of the coordinated multi-host test (tests/launch/test_multihost_coordinated.py),
started by launch/multihost.sh (or alone, for the single-process reference):

    python tests/launch/coordinated_step.py --config=experiments/configs/tiny.py --out=DIR \
        --config.train.coordinated=true ... [--config.mesh.distributed=true ...] \
        [--resume] [--die_process=1 --die_after_step=2]

It builds the run's trainer as experiments.main does (after joining jax.distributed from
config.mesh, inside liveness.guard_process as launch/multihost.py runs it), takes the on-policy
steps up to config.train.num_steps with real MiniWoB capsules, checkpointing as Trainer.run
does (every train.checkpoint_every steps and the last), and writes DIR/steps/<process>_<step>.json
after each step: what this process collected (each episode of its groups: ids, sampled tokens,
reward, status) and trained (the episode ids of its items), the step's metrics and the sampler's
state after it. Process 0 also writes the parameters after each update, gathered from every
process, to DIR/params_<step>.npz. At the end DIR/result_<process>.json gathers every step's
record, this launch's and earlier launches' of the same DIR.

--resume continues the run checkpointed in config.workdir (Trainer.restore; the sampler's
state right after it goes to DIR/restored_<process>.json). With config.eval.enabled, the launch
that finishes the run evaluates the policy after the last update (Trainer.evaluate, as Trainer.run
ends) into the result. --die_process / --die_after_step:
that process kills itself (SIGKILL) right after the checkpoint of that step count, as a host
that dies would.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pickle
import signal
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config.")
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run checkpointed in the workdir.")
_DIE_PROCESS = flags.DEFINE_integer("die_process", -1, "The process that kills itself (-1: none).")
_DIE_AFTER_STEP = flags.DEFINE_integer("die_after_step", -1, "...right after the checkpoint of this step count.")


def sampler_state(trainer) -> dict:
    """The sampler's state (and the collector's next group id): its arrays as lists, and a digest
    of the whole state dict, which every process of a coordinated run must hold alike."""
    state = trainer.sampler.state_dict()
    pool = state["pool"]
    return {
        "step": int(state["step"]),
        "next_group_id": int(trainer.collector.next_group_id),
        **{key: np.asarray(pool[key]).tolist() for key in ("attempts", "successes", "active")},
        "pass_rate": [None if np.isnan(rate) else float(rate) for rate in np.asarray(pool["pass_rate"], float)],
        "digest": hashlib.sha256(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest(),
    }


def main(argv):
    del argv
    from cua_jax.models.liveness import guard_process
    from cua_jax.models.sharding import initialize_distributed
    from cua_jax.train.settings import mesh_settings

    initialize_distributed(mesh_settings(_CONFIG.value))  # before any JAX computation
    with guard_process():
        run()


def run():
    import jax
    from flax import nnx

    from cua_jax.train.coordinated import host_state
    from cua_jax.train.trainer import build_trainer, prepare_run, warm_start

    start = time.perf_counter()
    setup = prepare_run(_CONFIG.value)
    warm_start(setup)
    trainer = build_trainer(setup)
    process = jax.process_index()
    out = _OUT.value
    os.makedirs(os.path.join(out, "steps"), exist_ok=True)
    try:
        if _RESUME.value:
            assert trainer.restore(), f"--resume: no checkpoint in {trainer.workdir}"
            with open(os.path.join(out, f"restored_{process}.json"), "w") as f:
                json.dump({"step": trainer.step, "version": trainer.version, "sampler": sampler_state(trainer)}, f)
        collect_share = trainer.collector.collect_share
        collected: list = []

        def recording(*args, **kwargs):
            local, groups, extra = collect_share(*args, **kwargs)
            collected.append((local, groups))
            return local, groups, extra

        trainer.collector.collect_share = recording
        built_s = time.perf_counter() - start
        train = trainer.settings.train
        while trainer.step < train.num_steps:
            step = trainer.step
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
            record = {
                "episodes": episodes,
                "all_episode_ids": [e.episode_id for g in groups for e in g.episodes],
                "trained": [item.episode_id for item in trainer.last_batch.items],
                "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
                "engine_version": trainer.workers[0].health().policy_version,
                "sampler": sampler_state(trainer),
                "launch": "resumed" if _RESUME.value else "first",
            }
            with open(os.path.join(out, "steps", f"{process}_{step}.json"), "w") as f:
                json.dump(record, f)
            params = host_state(nnx.state(trainer.learner.model))
            if process == 0:
                flat = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
                np.savez(os.path.join(out, f"params_{step}.npz"), **flat)
            if trainer.step % train.checkpoint_every == 0 or trainer.step == train.num_steps:  # as Trainer.run
                trainer.save()
            if process == _DIE_PROCESS.value and trainer.step == _DIE_AFTER_STEP.value:
                with open(os.path.join(out, f"died_{process}.json"), "w") as f:
                    json.dump({"step": trainer.step, "time": time.time()}, f)
                os.kill(os.getpid(), signal.SIGKILL)
        steps = []
        for path in glob.glob(os.path.join(out, "steps", f"{process}_*.json")):
            with open(path) as f:
                steps.append((int(path.rsplit("_", 1)[1].removesuffix(".json")), json.load(f)))
        steps.sort(key=lambda pair: pair[0])
        assert [step for step, _ in steps] == list(range(train.num_steps)), [step for step, _ in steps]
        # The held-out evaluation after the last update, as Trainer.run ends (every process
        # together, each on its share of the seeds).
        evaluation = trainer.evaluate("after") if trainer.settings.eval.enabled else None
        result = {
            "process": process,
            "devices": [len(jax.devices()), len(jax.local_devices()), jax.process_count()],
            "built_s": built_s,
            "total_s": time.perf_counter() - start,
            "steps": [record for _, record in steps],
            "evaluation": evaluation,
            "worker_type": type(trainer.workers[0]).__name__,
        }
        with open(os.path.join(out, f"result_{process}.json"), "w") as f:
            json.dump(result, f)
    finally:
        trainer.close()


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "out"])
    app.run(main)
