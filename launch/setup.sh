#!/usr/bin/env bash
# Idempotent setup for cua_jax. Source it (`source launch/setup.sh`) or run it.
#
#   1. Debian packages from launch/debian-packages.txt (installed only when missing).
#   2. A virtualenv outside the checkout, cached by a hash of the requirement files,
#      so a second run (or a fresh clone on the same machine) installs nothing; matplotlib's
#      font cache, built once with it (not by the first plot of a run).
#   3. dockerd, started when it is not running.
#   4. Environment images (launch/images/build.sh), built when their content hash is new.
#
# Exports CUA_JAX_VENV, CUA_JAX_PYTHON, CUA_JAX_ROOT and puts the checkout on PYTHONPATH.
# Steps 3-4 are skipped with CUA_JAX_SETUP_NO_DOCKER=1.
set -euo pipefail

CUA_JAX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUA_JAX_CACHE="${CUA_JAX_CACHE:-$HOME/.cache/cua_jax}"
mkdir -p "$CUA_JAX_CACHE"

_log() { printf '[setup] %s\n' "$*" >&2; }

# ---- 1. Debian packages -------------------------------------------------------------
_missing=()
while read -r pkg; do
  pkg="${pkg%%#*}"; pkg="$(echo "$pkg" | xargs)"
  [ -z "$pkg" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || _missing+=("$pkg")
done < "$CUA_JAX_ROOT/launch/debian-packages.txt"
if [ "${#_missing[@]}" -gt 0 ]; then
  _log "installing Debian packages: ${_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${_missing[@]}" >/dev/null
fi

# ---- 2. Cached virtualenv -------------------------------------------------------------
if [ -n "${CUA_JAX_PLATFORM:-}" ]; then
  _platform="$CUA_JAX_PLATFORM"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  _platform=gpu
else
  _platform=cpu
fi
_reqs=("$CUA_JAX_ROOT/requirements.txt" "$CUA_JAX_ROOT/requirements-$_platform.txt")
_reqs_nodeps="$CUA_JAX_ROOT/requirements-nodeps.txt"
_python="${CUA_JAX_BASE_PYTHON:-python3}"
_hash="$( { cat "${_reqs[@]}" "$_reqs_nodeps"; "$_python" --version; echo "$_platform uninstall:torchvision,torchaudio,torchcodec"; } | sha256sum | cut -c1-16)"
CUA_JAX_VENV="$CUA_JAX_CACHE/venv-$_platform-$_hash"
if [ ! -f "$CUA_JAX_VENV/.complete" ]; then
  _log "creating virtualenv $CUA_JAX_VENV (this takes a few minutes once)"
  rm -rf "$CUA_JAX_VENV"
  "$_python" -m venv "$CUA_JAX_VENV"
  "$CUA_JAX_VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  # The torch pin is installed first so that nothing later pulls another build.
  "$CUA_JAX_VENV/bin/pip" install -q --progress-bar off "${_reqs[@]/#/-r}" 2>&1 | grep -v "is ignored" || true
  "$CUA_JAX_VENV/bin/pip" install -q --progress-bar off --no-deps -r "$_reqs_nodeps" 2>&1 | grep -v "is ignored" || true
  if [ "$_platform" = cpu ]; then
    # PyPI's builds of these do not match torch 2.13+cpu and break `import transformers`.
    "$CUA_JAX_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  "$CUA_JAX_VENV/bin/python" -c "import jax, flax, optax, transformers, ray, playwright, docker, openpyxl, docx, pptx, pypdf, desktop_env" \
    || { _log "virtualenv check failed"; exit 1; }
  touch "$CUA_JAX_VENV/.complete"
fi
CUA_JAX_PYTHON="$CUA_JAX_VENV/bin/python"
export CUA_JAX_ROOT CUA_JAX_CACHE CUA_JAX_VENV CUA_JAX_PYTHON
export PYTHONPATH="$CUA_JAX_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$CUA_JAX_VENV/bin:$PATH"

# ---- 2b. matplotlib's font cache ------------------------------------------------------
# Built here once rather than by a run's first plot (minutes on a machine with many fonts).
# The stamp names the cache file this venv's matplotlib wrote; checking it costs no import.
_mpl_dir="${MPLCONFIGDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/matplotlib}"
_mpl_stamp="$CUA_JAX_VENV/.mpl-fontlist"
if [ ! -f "$_mpl_stamp" ] || [ "$(dirname "$(cat "$_mpl_stamp")")" != "$_mpl_dir" ] || [ ! -f "$(cat "$_mpl_stamp")" ]; then
  _log "building matplotlib's font cache in $_mpl_dir"
  "$CUA_JAX_PYTHON" -c "
import os, matplotlib, matplotlib.font_manager as fm
print(os.path.join(matplotlib.get_cachedir(), f'fontlist-v{fm.FontManager.__version__}.json'))" > "$_mpl_stamp.tmp" \
    && mv "$_mpl_stamp.tmp" "$_mpl_stamp"
fi

# ---- 2c. XLA's compilation cache ------------------------------------------------------
# Compiled programs that runs and the test suite keep (cua_jax/compilation.py); emptied once it
# passes 4 GiB (JAX's own size bound slows every write).
_xla_cache="$CUA_JAX_CACHE/xla"
if [ -d "$_xla_cache" ] && [ "$(du -sm "$_xla_cache" | cut -f1)" -gt 4096 ]; then
  _log "emptying XLA's compilation cache $_xla_cache (over 4 GiB)"
  rm -rf "$_xla_cache"
fi

# ---- 3-4. dockerd and environment images ------------------------------------------------
if [ "${CUA_JAX_SETUP_NO_DOCKER:-0}" != 1 ]; then
  bash "$CUA_JAX_ROOT/launch/dockerd.sh"
  if [ -x "$CUA_JAX_ROOT/launch/images/build.sh" ]; then
    bash "$CUA_JAX_ROOT/launch/images/build.sh"
  fi
fi
_log "ready: python=$CUA_JAX_PYTHON platform=$_platform"
