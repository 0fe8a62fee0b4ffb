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
# Steps 3-4 are skipped with CUA_JAX_SETUP_NO_DOCKER=1. CUA_JAX_SETUP_IMAGES names the images
# step 4 builds (space-separated; unset: all but the on-demand ones; empty: none, and dockerd is
# left alone): launch/main.sh builds none, since the default experiment runs in the host's
# Chromium, and a run on desktops or code containers builds its image as it starts.
#
# Each step prints one line (launch/setup_steps.sh); what apt, pip, dockerd and the image builds
# print goes to $CUA_JAX_CACHE/logs/setup-<UTC time>-<pid>.log, whose path comes first. A failed
# step prints the log's last lines and its path, and exits with the failed command's status.
set -euo pipefail

CUA_JAX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUA_JAX_CACHE="${CUA_JAX_CACHE:-$HOME/.cache/cua_jax}"
mkdir -p "$CUA_JAX_CACHE"
source "$CUA_JAX_ROOT/launch/setup_steps.sh"
setup_log_start "$CUA_JAX_CACHE/logs"

# Two setups on one machine (a suite and a main job started together) take turns: the second
# waits for the first, then finds everything cached. The lock is released at the end of setup,
# not held by the job that sourced it.
exec 9>"$CUA_JAX_CACHE/setup.lock"  # fd 9: setup_run closes it for the programs it starts
if ! flock -n 9; then
  setup_step "waiting for another setup on this machine ($CUA_JAX_CACHE/setup.lock)"
  flock 9
  setup_done done
fi

# ---- 1. Debian packages -------------------------------------------------------------
_missing=()
_packages=0
while read -r pkg; do
  pkg="${pkg%%#*}"; pkg="$(echo "$pkg" | xargs)"
  [ -z "$pkg" ] && continue
  _packages=$((_packages + 1))
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || _missing+=("$pkg")
done < "$CUA_JAX_ROOT/launch/debian-packages.txt"
if [ "${#_missing[@]}" -gt 0 ]; then
  setup_step "installing Debian packages: ${_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  setup_run apt-get update -q
  setup_run apt-get install -y -q --no-install-recommends "${_missing[@]}"
  setup_done done
else
  setup_step "Debian packages"
  setup_done "all $_packages installed"
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
  setup_step "creating virtualenv $CUA_JAX_VENV (a few minutes, once)"
  setup_run rm -rf "$CUA_JAX_VENV"
  setup_run "$_python" -m venv "$CUA_JAX_VENV"
  setup_run "$CUA_JAX_VENV/bin/pip" install --progress-bar off --upgrade pip
  # The torch pin is installed first so that nothing later pulls another build.
  setup_run "$CUA_JAX_VENV/bin/pip" install --progress-bar off "${_reqs[@]/#/-r}"
  setup_run "$CUA_JAX_VENV/bin/pip" install --progress-bar off --no-deps -r "$_reqs_nodeps"
  if [ "$_platform" = cpu ]; then
    # PyPI's builds of these do not match torch 2.13+cpu and break `import transformers`
    # (pip skips, and succeeds on, those not installed).
    setup_run "$CUA_JAX_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
  fi
  setup_run "$CUA_JAX_VENV/bin/python" -c "import jax, flax, optax, transformers, ray, playwright, docker, openpyxl, docx, pptx, pypdf, desktop_env"
  touch "$CUA_JAX_VENV/.complete"
  setup_done done
else
  setup_step "virtualenv $CUA_JAX_VENV"
  setup_done cached
fi
CUA_JAX_PYTHON="$CUA_JAX_VENV/bin/python"
export CUA_JAX_ROOT CUA_JAX_CACHE CUA_JAX_VENV CUA_JAX_PYTHON
export PYTHONPATH="$CUA_JAX_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$CUA_JAX_VENV/bin:$PATH"

# ---- 2a. the web application's virtualenv ------------------------------------------------
# The `webapp` kind's application (Trac) runs in its own process, from its own virtualenv
# (requirements-webapp.txt), cached by the file's hash like the framework's.
_webapp_hash="$( { cat "$CUA_JAX_ROOT/requirements-webapp.txt"; "$_python" --version; } | sha256sum | cut -c1-16)"
CUA_JAX_WEBAPP_VENV="$CUA_JAX_CACHE/webapp-venv-$_webapp_hash"
if [ ! -f "$CUA_JAX_WEBAPP_VENV/.complete" ]; then
  setup_step "creating the web application's virtualenv $CUA_JAX_WEBAPP_VENV"
  setup_run rm -rf "$CUA_JAX_WEBAPP_VENV"
  setup_run "$_python" -m venv "$CUA_JAX_WEBAPP_VENV"
  setup_run "$CUA_JAX_WEBAPP_VENV/bin/pip" install --progress-bar off -r "$CUA_JAX_ROOT/requirements-webapp.txt"
  setup_run "$CUA_JAX_WEBAPP_VENV/bin/python" -c "import trac.web.standalone"
  touch "$CUA_JAX_WEBAPP_VENV/.complete"
  setup_done done
else
  setup_step "web application virtualenv $CUA_JAX_WEBAPP_VENV"
  setup_done cached
fi
export CUA_JAX_WEBAPP_PYTHON="$CUA_JAX_WEBAPP_VENV/bin/python"

# ---- 2b. matplotlib's font cache ------------------------------------------------------
# Built here once rather than by a run's first plot (minutes on a machine with many fonts).
# The stamp names the cache file this venv's matplotlib wrote; checking it costs no import.
_mpl_dir="${MPLCONFIGDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/matplotlib}"
_mpl_stamp="$CUA_JAX_VENV/.mpl-fontlist"
if [ ! -f "$_mpl_stamp" ] || [ "$(dirname "$(cat "$_mpl_stamp")")" != "$_mpl_dir" ] || [ ! -f "$(cat "$_mpl_stamp")" ]; then
  setup_step "building matplotlib's font cache in $_mpl_dir"
  setup_run "$CUA_JAX_PYTHON" -c "
import os, sys, matplotlib, matplotlib.font_manager as fm
with open(sys.argv[1], 'w') as stamp:
    print(os.path.join(matplotlib.get_cachedir(), f'fontlist-v{fm.FontManager.__version__}.json'), file=stamp)" \
    "$_mpl_stamp.tmp"
  setup_run mv "$_mpl_stamp.tmp" "$_mpl_stamp"
  setup_done done
else
  setup_step "matplotlib's font cache"
  setup_done cached
fi

# ---- 2c. XLA's compilation cache ------------------------------------------------------
# Compiled programs that runs and the test suite keep (cua_jax/compilation.py); emptied once it
# passes 4 GiB (JAX's own size bound slows every write).
_xla_cache="$CUA_JAX_CACHE/xla"
_xla_mib=0
if [ -d "$_xla_cache" ]; then _xla_mib="$(du -sm "$_xla_cache" | cut -f1)"; fi
if [ "$_xla_mib" -gt 4096 ]; then
  setup_step "emptying XLA's compilation cache $_xla_cache ($_xla_mib MiB, over 4 GiB)"
  setup_run rm -rf "$_xla_cache"
  setup_done done
else
  setup_step "XLA's compilation cache"
  setup_done "$_xla_mib MiB"
fi

# ---- 3-4. dockerd and environment images ------------------------------------------------
if [ "${CUA_JAX_SETUP_NO_DOCKER:-0}" != 1 ] && [ "${CUA_JAX_SETUP_IMAGES-all}" != "" ]; then
  setup_step dockerd
  setup_run bash "$CUA_JAX_ROOT/launch/dockerd.sh"
  # dockerd.sh says so when it starts a daemon.
  case "$(setup_step_output)" in
    *"starting dockerd"*) setup_done started ;;
    *) setup_done running ;;
  esac
  if [ -x "$CUA_JAX_ROOT/launch/images/build.sh" ]; then
    setup_step "environment images"
    if [ "${CUA_JAX_SETUP_IMAGES-all}" = all ]; then
      setup_run bash "$CUA_JAX_ROOT/launch/images/build.sh"
    else
      # shellcheck disable=SC2086  # a list of names
      setup_run bash "$CUA_JAX_ROOT/launch/images/build.sh" $CUA_JAX_SETUP_IMAGES
    fi
    # The builder logs "[images] built cua-jax/<name>:<hash> in <n>s" for each image it built.
    _built="$(setup_step_output | sed -n 's|^\[images\] built cua-jax/\([^:]*\):.*|\1|p' | paste -sd ' ')"
    if [ -n "$_built" ]; then setup_done "built $_built"; else setup_done "all present"; fi
  fi
fi
flock -u 9
exec 9>&-
printf '[setup] ready: python=%s platform=%s\n' "$CUA_JAX_PYTHON" "$_platform" >&2
