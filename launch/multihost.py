"""One process of a multi-host run: python -m launch.multihost --config=CONFIG [--config.x=y ...]

launch/multihost.sh starts it on every host with config.mesh.distributed, coordinator_address,
num_processes and process_id set. It joins jax.distributed (mesh_settings(config)) before any
JAX computation, which a process must do before it builds a model, then runs experiments.main
with the same flags: every process builds the global mesh over all hosts' devices.

What is tested across processes (tests/launch/test_multihost.py): the sharded train step,
Orbax save / restore and the HF export gather. Rollout collection is coordinated across the
processes with config.train.coordinated = True, which launch/multihost.sh passes and a run of
several processes needs (cua_jax/train/coordinated.py; tested by
tests/launch/test_multihost_coordinated.py against one process): each process runs only its
share of every step's groups on its own engines, trains on them as its shard of the global
batch, and every process's sampler, metrics and loss cover all of them; process 0 writes the
run's records.

The work runs inside `liveness.guard_process`: when another process dies, this one stops with
exit status 75 and an error naming it (process index and host) instead of hanging in a
collective, and the run continues from its last checkpoint when every process is relaunched
with --resume (cua_jax/models/liveness.py).
"""

from __future__ import annotations

from absl import app

from cua_jax.models.liveness import guard_process
from cua_jax.models.sharding import initialize_distributed
from cua_jax.train.settings import ConfigError, mesh_settings
from experiments import main as experiment


def main(argv: list[str]) -> None:
    try:
        mesh = mesh_settings(experiment._CONFIG.value)
    except ConfigError as error:
        raise app.UsageError(str(error)) from error
    initialize_distributed(mesh)
    # A process that dies stops the others with an error naming it (cua_jax/models/liveness.py);
    # a normal end marks this one done, so the others no longer wait for its beats.
    with guard_process():
        experiment.main(argv)


if __name__ == "__main__":
    app.run(main)
