#!/usr/bin/env bash
# Builds the pacpriv image on a machine without a container registry:
#
#   docker/build.sh [BINARY] [TAG]
#
# BINARY: a release build of this checkout (default target/release/pacpriv,
# built first with `cargo build --release --locked --bin pacpriv` if it is
# missing); TAG: the image's name (default pacpriv:local). The runtime base
# is built locally by docker/base.sh (debootstrap + docker import); the
# Dockerfile's `host-binary` target puts BINARY on it, so nothing is
# compiled twice and nothing is pulled. The classic builder is used because
# BuildKit needs the buildx plugin, which Debian bookworm does not package.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/target/release/pacpriv}"
TAG="${2:-pacpriv:local}"
BASE="${PACPRIV_BASE_IMAGE:-pacpriv-base:bookworm}"

if [[ ! -x "$BIN" ]]; then
    [[ "$BIN" == "$ROOT/target/release/pacpriv" ]] || { echo "docker/build.sh: $BIN is not an executable" >&2; exit 1; }
    (cd "$ROOT" && cargo build --release --locked --bin pacpriv)
fi
"$ROOT/docker/base.sh" "$BASE"

CONTEXT="$(mktemp -d "${TMPDIR:-/tmp}/pacpriv-image.XXXXXX")"
trap 'rm -rf "$CONTEXT"' EXIT
# Stripped: the image needs no debug symbols.
install -s -m 0755 "$BIN" "$CONTEXT/pacpriv"
DOCKER_BUILDKIT=0 docker build --quiet -f "$ROOT/docker/Dockerfile" --target host-binary \
    --build-arg "RUNTIME_BASE=$BASE" -t "$TAG" "$CONTEXT" >/dev/null
echo "docker/build.sh: built $TAG from $BIN on $BASE" >&2
