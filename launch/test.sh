#!/usr/bin/env bash
# The whole test suite, setup included: bash launch/test.sh [pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$CUA_JAX_ROOT"
exec "$CUA_JAX_PYTHON" -m pytest "$@"
