#!/bin/sh
# The osworld image's entrypoint. Runs as root only to prepare what root must, then runs
# the in-environment server as `user` (HOME=/home/user) inside a D-Bus session bus, which
# the accessibility bus (at-spi2-core), dconf and gnome-terminal are activated on.
# Arguments (e.g. `--screen 1280x800` from the pool) go to the server.
set -eu
USER_NAME=user
USER_ID="$(id -u "$USER_NAME")"
as_user() { setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --init-groups "$@"; }
# /run/cua holds the server's socket. The pool bind-mounts a host folder there, usually
# root's with mode 0755: let the user write it, keeping its owner (who removes it later).
mkdir -p /run/cua
if ! as_user test -w /run/cua; then chmod a+rwx /run/cua; fi
# The container's host name resolves (sudo looks it up), as on a machine with a name.
HOST_NAME="$(cat /proc/sys/kernel/hostname)"
if ! grep -qw -- "$HOST_NAME" /etc/hosts; then echo "127.0.1.1 $HOST_NAME" >> /etc/hosts || true; fi
# The user's runtime folder, as a login would make it (dconf and GLib keep sockets there).
mkdir -p "/run/user/$USER_ID"
chown "$USER_NAME:$USER_NAME" "/run/user/$USER_ID"
chmod 700 "/run/user/$USER_ID"
exec setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --init-groups \
  env HOME=/home/user USER="$USER_NAME" LOGNAME="$USER_NAME" SHELL=/bin/bash \
      XDG_RUNTIME_DIR="/run/user/$USER_ID" \
  dbus-run-session -- \
  python3 -m cua_jax.envs.server --socket /run/cua/env.sock --start-display --home /home/user \
    --window-manager "cua-osworld-session -use_titlebar no -use_cursor yes" "$@"
