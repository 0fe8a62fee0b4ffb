#!/usr/bin/env bash
# The main job, setup included: bash launch/main.sh [--workdir=DIR] [--resume] [--config.x.y=value ...]
# Without --workdir each run gets its own directory, runs/default/<UTC time>, so the command
# can be run again; continue a killed run with --workdir=<its directory> --resume.
set -euo pipefail
# The default experiment's tasks run in the host's Chromium: no environment image to build
# (a run configured onto desktops or code containers builds its image as it starts).
export CUA_JAX_SETUP_IMAGES="${CUA_JAX_SETUP_IMAGES-}"
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$CUA_JAX_ROOT"
args=("$@")
case " ${args[*]-} " in
  *" --workdir="* | *" --workdir "*) ;;
  *) args+=("--workdir=runs/default/$(date -u +%Y%m%d-%H%M%S)") ;;
esac
exec "$CUA_JAX_PYTHON" -m experiments.main --config=experiments/configs/default.py "${args[@]}"
