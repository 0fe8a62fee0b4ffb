#!/usr/bin/env bash
# Accelerator smoke check (experiments/gpu_check.py): parity of our Qwen3 / Qwen3-VL with
# transformers, sharding over all visible devices, one bfloat16 learner step with remat; then a
# table of check, result and seconds.
#
# Uses the Python and JAX already installed (CUDA on a GPU machine): it creates no virtualenv
# and reaches no package index. Wheels in launch/wheels/ are installed first (pip --no-index,
# into a directory on PYTHONPATH, never over the interpreter's own packages), but only those
# whose distribution is not installed yet: the place for pure-Python packages the machine lacks.
#
#   bash launch/gpu_check.sh [--small] [--checks parity_qwen3,sharding] [--json out.json]
#   JAX_PLATFORMS=cpu CUA_JAX_PYTHON=/path/to/venv/python bash launch/gpu_check.sh   # on a CPU
#
# Multi-host on one machine, instead of the checks above:
#
#   bash launch/gpu_check.sh --two-processes [STEPS]
#
# two processes of one coordinated training run (launch/multihost.sh, jax.distributed through
# 127.0.0.1), each with half of this machine's GPUs (CUDA_VISIBLE_DEVICES; with JAX_PLATFORMS=cpu,
# 4 host devices each), on a data 2 x fsdp (half the GPUs) mesh, take STEPS (default 3) on-policy
# updates of experiments/configs/tiny.py with the tiny text Qwen3 on MiniWoB++ capsules, each
# process collecting its share of every step's groups. It passes when both processes exit 0 and
# process 0's metrics.jsonl holds every step. Needs an even count of 2 or more GPUs (exit status 3
# otherwise) and a machine set up for MiniWoB++ (launch/setup.sh: Chromium, the playwright and
# miniwob packages, the tokenizer in the Hugging Face cache); each process's log is shown when it
# fails.
#
# CUA_JAX_PYTHON: the interpreter (default python3). CUA_JAX_GPU_CHECK_TIMEOUT: seconds before
# the run is stopped (default 480). Exit status: 0 all passed, 1 a check failed, 2 a package is
# missing (named in the output), 3 too few GPUs for --two-processes, 124 timed out.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${CUA_JAX_PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "[gpu_check] no Python interpreter '$python' (set CUA_JAX_PYTHON)" >&2
  exit 2
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
wheels="$here/wheels"
if compgen -G "$wheels/*.whl" >/dev/null; then
  site="${CUA_JAX_GPU_CHECK_SITE:-${TMPDIR:-/tmp}/cua_jax_gpu_check_site}"
  export PYTHONPATH="$site:$PYTHONPATH"
  # The wheels whose distribution the interpreter (or an earlier run's $site) does not have.
  mapfile -t needed < <("$python" - "$wheels" <<'EOF'
import importlib.metadata, pathlib, sys
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    try:
        importlib.metadata.distribution(wheel.name.split("-")[0])
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
EOF
  )
  if [ "${#needed[@]}" -gt 0 ]; then
    echo "[gpu_check] installing into $site: ${needed[*]##*/}" >&2
    "$python" -m pip install --quiet --no-index --no-deps --target "$site" "${needed[@]}" \
      || { echo "[gpu_check] pip could not install the wheels in $wheels" >&2; exit 2; }
  fi
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$root"

# --two-processes: two processes of a coordinated run, half the GPUs each (see the header).
two_processes() {
  local steps="$1" timeout_s="${CUA_JAX_GPU_CHECK_TIMEOUT:-480}" devices=() half=4 total rows missing
  if [ "${JAX_PLATFORMS:-}" != cpu ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
      IFS=, read -r -a devices <<< "$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
      mapfile -t devices < <(nvidia-smi --query-gpu=index --format=csv,noheader)
    fi
    if [ "${#devices[@]}" -lt 2 ] || [ $(( ${#devices[@]} % 2 )) -ne 0 ]; then
      echo "[gpu_check] two_processes: needs an even count of 2 or more GPUs, this machine shows ${#devices[@]}" >&2
      return 3
    fi
    half=$(( ${#devices[@]} / 2 ))
  fi
  missing="$("$python" - <<'EOF'
import importlib.util, os
missing = [name for name in ("playwright", "miniwob") if importlib.util.find_spec(name) is None]
if not missing:
    from cua_jax.envs.miniwob.page import CHROMIUM_EXECUTABLE
    if not os.access(CHROMIUM_EXECUTABLE, os.X_OK):
        missing.append(f"Chromium at {CHROMIUM_EXECUTABLE}")
print(", ".join(missing))
EOF
  )"
  if [ -n "$missing" ]; then
    echo "[gpu_check] two_processes: missing $missing (launch/setup.sh installs them)" >&2
    return 2
  fi
  # The mesh's data x fsdp (every device) must divide learner.rows: the smallest multiple of 4.
  total=$(( 2 * half ))
  rows=$total
  while [ $(( rows % 4 )) -ne 0 ]; do rows=$(( rows + total )); done
  local workdir port start pids=() statuses=() p logged=0
  workdir="$(mktemp -d "${TMPDIR:-/tmp}/cua_jax_two_processes.XXXXXX")"
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  echo "[gpu_check] two_processes: 2 processes x $half devices ($([ "${JAX_PLATFORMS:-}" = cpu ] && echo CPU || echo GPU)), $steps updates, in $workdir" >&2
  start=$SECONDS
  for p in 0 1; do
    (
      if [ "${JAX_PLATFORMS:-}" = cpu ]; then
        export XLA_FLAGS="--xla_force_host_platform_device_count=$half"
      else
        CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${devices[*]:$(( p * half )):$half}")"
        export CUDA_VISIBLE_DEVICES
      fi
      export CUA_PROCESS_ID=$p CUA_NUM_PROCESSES=2 CUA_COORDINATOR_ADDRESS="127.0.0.1:$port" CUA_JAX_PYTHON="$python"
      exec timeout "$timeout_s" bash "$here/multihost.sh" --config=experiments/configs/tiny.py \
        --config.model.name=tiny_qwen3 --config.env.observation=text --config.env.include_dom_text=true \
        --config.rollout.seed_per_turn=true --config.rollout.max_context_tokens=2048 \
        --config.rollout.prompt_style=compact --config.mesh.data=2 --config.mesh.fsdp="$half" \
        --config.mesh.tensor=1 --config.learner.rows="$rows" --config.train.num_steps="$steps" \
        --config.mesh.heartbeat_timeout_s=30 --workdir="$workdir/run"
    ) > "$workdir/process_$p.log" 2>&1 &
    pids+=($!)
  done
  for p in 0 1; do
    statuses[p]=0
    wait "${pids[p]}" || statuses[p]=$?
  done
  if [ -f "$workdir/run/metrics.jsonl" ]; then
    logged=$(grep -c '"learner/loss"' "$workdir/run/metrics.jsonl" || true)
  fi
  if [ "${statuses[0]}" -eq 0 ] && [ "${statuses[1]}" -eq 0 ] && [ "$logged" -eq "$steps" ]; then
    echo "[gpu_check] two_processes: PASS in $(( SECONDS - start )) s: both processes took $steps coordinated updates" >&2
    return 0
  fi
  for p in 0 1; do
    echo "[gpu_check] two_processes: process $p exited ${statuses[p]}; the end of $workdir/process_$p.log:" >&2
    tail -n 25 "$workdir/process_$p.log" >&2
  done
  echo "[gpu_check] two_processes: FAIL after $(( SECONDS - start )) s ($logged of $steps updates logged)" >&2
  if [ "${statuses[0]}" -eq 124 ] || [ "${statuses[1]}" -eq 124 ]; then
    return 124
  fi
  return 1
}

if [ "${1:-}" = --two-processes ]; then
  status=0
  two_processes "${2:-3}" || status=$?
  exit "$status"
fi

status=0
timeout "${CUA_JAX_GPU_CHECK_TIMEOUT:-480}" "$python" -m experiments.gpu_check "$@" || status=$?
if [ "$status" -eq 124 ]; then
  echo "[gpu_check] stopped after ${CUA_JAX_GPU_CHECK_TIMEOUT:-480} s" >&2
fi
exit "$status"
