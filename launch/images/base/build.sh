#!/usr/bin/env bash
# The base image: a minimal Debian bookworm root from debootstrap, imported into Docker.
#   bash launch/images/base/build.sh <image:tag>
# The mirror is the one in the machine's apt sources (deb.debian.org unless configured).
set -euo pipefail
TAG="$1"
SUITE=bookworm
SOURCES=/etc/apt/sources.list.d/debian.sources
MIRROR="$(awk '/^URIs:/ {print $2; exit}' "$SOURCES" 2>/dev/null || true)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$(mktemp -d /tmp/cua-jax-base.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "[base] debootstrap $SUITE from $MIRROR" >&2
debootstrap --variant=minbase --include=ca-certificates,python3-minimal,python3 \
  "$SUITE" "$ROOTFS" "$MIRROR" >&2
# As in Debian's official images: lean installs, no caches, no man pages.
cat > "$ROOTFS/etc/apt/apt.conf.d/90cua-jax" <<'CONF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
CONF
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/90cua-jax" <<'CONF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CONF
echo "deb $MIRROR $SUITE main" > "$ROOTFS/etc/apt/sources.list"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG" >/dev/null
echo "[base] imported $TAG" >&2
