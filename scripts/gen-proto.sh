#!/usr/bin/env bash
# Regenerate the device plugin v1beta1 gRPC stubs (and their .pyi type stubs) from
# proto/deviceplugin/v1beta1/api.proto into src/gpushare/deviceplugin/_proto/.
# Needs the test extra installed (grpcio-tools, mypy-protobuf): `make test` once, then re-run this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
BIN="$(dirname "$PY")"
OUT=src/gpushare/deviceplugin/_proto
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PATH="$BIN:$PATH" "$PY" -m grpc_tools.protoc -I proto \
  --python_out="$TMP" --grpc_python_out="$TMP" \
  --mypy_out="$TMP" --mypy_grpc_out="$TMP" \
  deviceplugin/v1beta1/api.proto
mkdir -p "$OUT"
for f in api_pb2.py api_pb2.pyi api_pb2_grpc.py api_pb2_grpc.pyi; do
  # Absolute proto-path imports become package-relative ones.
  sed -e 's/^from deviceplugin\.v1beta1 import api_pb2/from . import api_pb2/' \
      -e 's/^import deviceplugin\.v1beta1\.api_pb2$/from . import api_pb2/' \
      "$TMP/deviceplugin/v1beta1/$f" > "$OUT/$f"
done
cat > "$OUT/__init__.py" <<'PYEOF'
"""Generated device plugin v1beta1 stubs (scripts/gen-proto.sh); do not edit by hand."""
PYEOF
echo "generated: $(ls "$OUT")"
