#!/bin/sh
# Headless Chromium with DevTools on the container's loopback, bridged to a Unix socket.
# The container exits when either process does, so a crashed browser is a dead container.
# The switches are the host's (cua_jax.envs.miniwob.CHROMIUM_ARGS), so deployments compare alike.
set -eu
SOCKET="${CDP_SOCKET:-/run/cua/cdp.sock}"
rm -f "$SOCKET"
/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
  --disable-background-networking --disable-component-update --disable-sync --no-first-run \
  --disable-background-timer-throttling --disable-renderer-backgrounding \
  --disable-backgrounding-occluded-windows --disable-gpu-vsync --disable-frame-rate-limit \
  --user-data-dir=/tmp/chromium-profile \
  --remote-debugging-address=127.0.0.1 --remote-debugging-port=9222 about:blank &
BROWSER=$!
socat "UNIX-LISTEN:$SOCKET,fork,mode=666" TCP:127.0.0.1:9222 &
BRIDGE=$!
trap 'kill $BROWSER $BRIDGE 2>/dev/null' TERM INT
while kill -0 $BROWSER 2>/dev/null && kill -0 $BRIDGE 2>/dev/null; do sleep 0.5; done
kill $BROWSER $BRIDGE 2>/dev/null || true
exit 1
