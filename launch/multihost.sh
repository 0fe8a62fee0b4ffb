#!/usr/bin/env bash
# One process per host of a multi-host JAX run: bash launch/multihost.sh [--config=...] [--config.x.y=value ...]
#
# Under SLURM (srun --ntasks-per-node=1 bash launch/multihost.sh ...) the process id is
# SLURM_PROCID, the process count SLURM_NTASKS, and the coordinator the job's first node at port
# CUA_COORDINATOR_PORT (default 8476). Elsewhere set CUA_PROCESS_ID, CUA_NUM_PROCESSES and
# CUA_COORDINATOR_ADDRESS (host:port of process 0) on every host. The program is
# `python -m launch.multihost` (experiments.main after jax.distributed is joined) unless
# CUA_MULTIHOST_PROGRAM names another (a module as "-m name", or a script path); it gets the
# arguments plus --config.mesh.distributed/coordinator_address/num_processes/process_id.
set -euo pipefail
if [[ -n "${SLURM_PROCID:-}" && -z "${CUA_PROCESS_ID:-}" ]]; then
  CUA_PROCESS_ID=$SLURM_PROCID
  CUA_NUM_PROCESSES=${SLURM_NTASKS:?SLURM_NTASKS is not set}
  if [[ -z "${CUA_COORDINATOR_ADDRESS:-}" ]]; then
    first_node=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}" | head -n 1)
    CUA_COORDINATOR_ADDRESS="$first_node:${CUA_COORDINATOR_PORT:-8476}"
  fi
fi
: "${CUA_PROCESS_ID:?set CUA_PROCESS_ID (or run under SLURM)}"
: "${CUA_NUM_PROCESSES:?set CUA_NUM_PROCESSES (or run under SLURM)}"
: "${CUA_COORDINATOR_ADDRESS:?set CUA_COORDINATOR_ADDRESS=host:port (or run under SLURM)}"
if [[ -z "${CUA_JAX_PYTHON:-}" ]]; then
  source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
read -r -a program <<< "${CUA_MULTIHOST_PROGRAM:--m launch.multihost}"
exec "$CUA_JAX_PYTHON" "${program[@]}" "$@" \
  --config.mesh.distributed=true \
  "--config.mesh.coordinator_address=$CUA_COORDINATOR_ADDRESS" \
  "--config.mesh.num_processes=$CUA_NUM_PROCESSES" \
  "--config.mesh.process_id=$CUA_PROCESS_ID"
