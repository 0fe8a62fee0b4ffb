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
# The test files run on CUA_JAX_TEST_WORKERS processes (pytest-xdist; default: the cores, at most
# 4), a file's tests together in one of them (their module fixtures are built once). Most tests
# keep one core busy (compiling, or waiting on a browser or a container), so on two cores two
# workers take about half the time of one. `-n 0` after the command runs one process.
workers="${CUA_JAX_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
exec "$CUA_JAX_PYTHON" -m pytest -n "$workers" --dist loadfile "$@"
