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
# minute.
#
# The mirrors are the host's own: the first `deb` source of a release suite
# and of a `-security` suite in /etc/apt/sources.list and
# /etc/apt/sources.list.d (one-line and deb822 formats), so the image
# installs from wherever this machine does — a local or corporate mirror
# included — and no mirror host is written here. DEBIAN_MIRROR /
# DEBIAN_SECURITY_MIRROR override them (and are needed on a host that is
# not Debian); without a security mirror the image has none.
set -euo pipefail

TAG="${1:-pacpriv-base:bookworm}"

die() { echo "docker/base.sh: $*" >&2; exit 1; }

# "URI SUITE" for every `deb` source of the host.
host_sources() {
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    for f in "${files[@]}"; do
        [[ -r "$f" ]] || continue
        case "$f" in
        *.sources)
            # deb822: paragraphs of "Types:", "URIs:", "Suites:" fields.
            awk 'function flush() { if (deb) for (u in uris) for (s in suites) print uris[u], suites[s];
                                    deb = 0; delete uris; delete suites }
                 /^[[:space:]]*$/ { flush(); next }
                 tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
                 tolower($1) == "uris:" { for (i = 2; i <= NF; i++) uris[i] = $i }
                 tolower($1) == "suites:" { for (i = 2; i <= NF; i++) suites[i] = $i }
                 END { flush() }' "$f" ;;
        *)
            # One line per source: deb [options] URI SUITE COMPONENT…
            awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } print $i, $(i + 1) }' "$f" ;;
        esac
    done
}

if [[ -z "${REBUILD:-}" ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "docker/base.sh: $TAG exists (REBUILD=1 to make it again)" >&2
    exit 0
fi
SOURCES="$(host_sources)"
MIRROR="${DEBIAN_MIRROR:-$(awk '$2 !~ /-(security|updates|backports)$/ { print $1; exit }' <<<"$SOURCES")}"
SECURITY="${DEBIAN_SECURITY_MIRROR:-$(awk '$2 ~ /-security$/ { print $1; exit }' <<<"$SOURCES")}"
[[ -n "$MIRROR" ]] || die "no Debian mirror in this host's apt sources: set DEBIAN_MIRROR (and DEBIAN_SECURITY_MIRROR)"

command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
[[ "$(id -u)" -eq 0 ]] || die "debootstrap needs root (run as root or with sudo)"

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/pacpriv-base.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT

echo "docker/base.sh: debootstrap --variant=minbase bookworm from $MIRROR" >&2
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; die "debootstrap failed"; }
rm -f "$ROOTFS.log"

{
    echo "deb $MIRROR bookworm main"
    echo "deb $MIRROR bookworm-updates main"
    [[ -z "$SECURITY" ]] || echo "deb $SECURITY bookworm-security main"
} >"$ROOTFS/etc/apt/sources.list"
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
