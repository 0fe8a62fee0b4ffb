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
#
# The run is a coordinated one (config.train.coordinated, which a run of several processes
# needs): --config.train.coordinated=true goes right after the --config flag (or first, without
# one), so a later --config.train.coordinated=... of the caller's still wins. A process that dies
# stops the others within config.mesh.heartbeat_timeout_s (default 100) with an error naming it
# (exit status 75); relaunch every process with --resume (the same --workdir) to continue.
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
# ml_collections applies --config.x overrides in order, and only after --config itself.
coordinated=--config.train.coordinated=true
args=()
placed=0
while [[ $# -gt 0 ]]; do
  args+=("$1")
  if [[ $placed == 0 && ( "$1" == --config=* || ( "$1" == --config && $# -gt 1 ) ) ]]; then
    [[ "$1" == --config ]] && { shift; args+=("$1"); }
    args+=("$coordinated")
    placed=1
  fi
  shift
done
[[ $placed == 1 ]] || args=("$coordinated" ${args[@]+"${args[@]}"})
exec "$CUA_JAX_PYTHON" "${program[@]}" ${args[@]+"${args[@]}"} \
  --config.mesh.distributed=true \
  "--config.mesh.coordinator_address=$CUA_COORDINATOR_ADDRESS" \
  "--config.mesh.num_processes=$CUA_NUM_PROCESSES" \
  "--config.mesh.process_id=$CUA_PROCESS_ID"
