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
# CUA_JAX_PYTHON: the interpreter (default python3). CUA_JAX_GPU_CHECK_TIMEOUT: seconds before
# the run is stopped (default 480). Exit status: 0 all passed, 1 a check failed, 2 a package is
# missing (named in the output), 124 timed out.
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
status=0
timeout "${CUA_JAX_GPU_CHECK_TIMEOUT:-480}" "$python" -m experiments.gpu_check "$@" || status=$?
if [ "$status" -eq 124 ]; then
  echo "[gpu_check] stopped after ${CUA_JAX_GPU_CHECK_TIMEOUT:-480} s" >&2
fi
exit "$status"
