#!/usr/bin/env bash
# Regenerates the committed stubs in src/pacpriv/v1 from the repository's
# proto with the pinned generator. Usage: clients/python/generate.sh [PYTHON]
# (a Python with grpcio-tools==1.85.1; default python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"${1:-python3}" -m grpc_tools.protoc -I "$here/../../proto" --python_out="$here/src" \
    --grpc_python_out="$here/src" --pyi_out="$here/src" pacpriv/v1/privatizer.proto
