#!/usr/bin/env bash
# Start dockerd when no daemon answers; wait until it does. Idempotent.
set -euo pipefail
CACHE="${CUA_JAX_CACHE:-$HOME/.cache/cua_jax}"
mkdir -p "$CACHE"
if docker info >/dev/null 2>&1; then exit 0; fi
DOCKERD="$(command -v dockerd || echo /usr/sbin/dockerd)"
echo "[setup] starting dockerd (log: $CACHE/dockerd.log)" >&2  # launch/setup.sh's summary reads this
setsid "$DOCKERD" >"$CACHE/dockerd.log" 2>&1 < /dev/null &
for _ in $(seq 1 120); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "[setup] dockerd did not come up; last log lines:" >&2
tail -20 "$CACHE/dockerd.log" >&2
exit 1
