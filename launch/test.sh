#!/usr/bin/env bash
# The whole test suite, setup included: bash launch/test.sh [pytest args]
# ruff (lint, then the formatter's check; pyproject.toml) runs first: a finding stops the run.
# The layer contract (.importlinter) runs inside the suite, as tests/test_import_layers.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$CUA_JAX_ROOT"
"$CUA_JAX_VENV/bin/ruff" check --quiet .
"$CUA_JAX_VENV/bin/ruff" format --check --quiet .
printf '[lint] ruff check and ruff format --check: clean\n' >&2
exec "$CUA_JAX_PYTHON" -m pytest "$@"
