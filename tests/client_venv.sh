#!/usr/bin/env bash
# Creates (or reuses) the venv the Python client's tests run in
# (tests/it/client.rs): `pip install ./clients/python` exactly as a user
# would, plus the pinned stub generator. Prints the venv's python. Rebuilt
# whenever the package changes; nothing else is cached.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${PACPRIV_CLIENT_VENV:-$root/target/client-venv}"
stamp="$venv/.package"
die() { echo "client venv: $*" >&2; exit 1; }
want="$(cd "$root/clients/python" && find pyproject.toml src -type f -not -path '*/__pycache__/*' -not -path '*.egg-info*' | sort | xargs sha256sum | sha256sum)"
if [ "$want" != "$(cat "$stamp" 2>/dev/null)" ] || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  echo "client venv: pip install ./clients/python into $venv" >&2
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  timeout "${PIP_TIMEOUT:-900}" "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "$root/clients/python" grpcio-tools==1.85.1 >&2 || die "pip install failed (PyPI must be reachable; the error is above)"
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
