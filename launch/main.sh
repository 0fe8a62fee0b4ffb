#!/usr/bin/env bash
# The main job, setup included: bash launch/main.sh [--config.x.y=value ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$CUA_JAX_ROOT"
exec "$CUA_JAX_PYTHON" -m experiments.main --config=experiments/configs/default.py "$@"
