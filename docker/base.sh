#!/usr/bin/env bash
# Builds a Debian bookworm base image without a registry:
#
#   docker/base.sh [TAG]        (default: pacpriv-base:bookworm)
#
# debootstrap --variant=minbase from a Debian mirror into a temporary
# directory, with bookworm-updates and bookworm-security in its apt
# sources, then `docker import`. The image is what `debian:bookworm-slim`
# would be on a machine with a registry (docker/build.sh passes it as the
# Dockerfile's RUNTIME_BASE). An existing TAG is kept unless REBUILD=1.
# Needs root (debootstrap) and Debian's `debootstrap` package; about a
# minute. DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR override the mirrors.
set -euo pipefail

TAG="${1:-pacpriv-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

die() { echo "docker/base.sh: $*" >&2; exit 1; }

if [[ -z "${REBUILD:-}" ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "docker/base.sh: $TAG exists (REBUILD=1 to make it again)" >&2
    exit 0
fi
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
[[ "$(id -u)" -eq 0 ]] || die "debootstrap needs root (run as root or with sudo)"

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/pacpriv-base.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT

echo "docker/base.sh: debootstrap --variant=minbase bookworm from $MIRROR" >&2
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; die "debootstrap failed"; }
rm -f "$ROOTFS.log"

cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $SECURITY bookworm-security main
SOURCES
# What the official slim images do: no package lists or downloaded .debs
# in the image, no documentation from packages installed later.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
SLIM

tar --numeric-owner -C "$ROOTFS" -c . \
    | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --message "debootstrap --variant=minbase bookworm $MIRROR" \
        - "$TAG" >/dev/null
echo "docker/base.sh: built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))" >&2
