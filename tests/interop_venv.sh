#!/usr/bin/env bash
# Creates (or reuses) the Python venv of the interoperability tests
# (tests/it/interop.rs): Seldon MLServer + its scikit-learn runtime and
# tritonclient, exactly as pinned in examples/mlserver/requirements.txt,
# from PyPI. Prints the venv's python. Rebuilt whenever the requirements
# change; nothing else is cached. Takes about a minute when fresh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${PACPRIV_INTEROP_VENV:-$root/target/interop-venv}"
req="$root/examples/mlserver/requirements.txt"
stamp="$venv/.requirements"
die() { echo "interop venv: $*" >&2; exit 1; }
if ! cmp -s "$req" "$stamp" 2>/dev/null || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  echo "interop venv: installing $req into $venv" >&2
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  timeout "${PIP_TIMEOUT:-900}" "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2 \
    || die "pip install -r $req failed (PyPI must be reachable; the error is above)"
  cp "$req" "$stamp"
fi
echo "$venv/bin/python"
