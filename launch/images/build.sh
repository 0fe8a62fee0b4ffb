#!/usr/bin/env bash
# Build the environment images that are missing (content-hash tags; see cua_jax/envs/images.py).
#   bash launch/images/build.sh            all images, the base first
#   bash launch/images/build.sh desktop    one image (and the base when missing)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bash "$ROOT/launch/dockerd.sh"
cd "$ROOT"
# Run as a file, not a module: the builder needs no package import (nor its dependencies).
exec python3 "$ROOT/cua_jax/envs/images.py" build "$@"
