#!/usr/bin/env bash
# Regenerate the gRPC stubs (and their .pyi type stubs) of the kubelet APIs gpushare serves, from
# proto/ into the package next to their users:
#   proto/deviceplugin/v1beta1/api.proto      -> src/gpushare/deviceplugin/_proto/
#   proto/dra/v1/api.proto                    -> src/gpushare/dra/_proto/dra/
#   proto/pluginregistration/v1/api.proto     -> src/gpushare/dra/_proto/registration/
# Needs the test extra installed (grpcio-tools, mypy-protobuf): `make test` once, then re-run this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
BIN="$(dirname "$PY")"

# generate PROTO OUT: the stubs of proto/PROTO in OUT, with package-relative imports.
generate() {
  local proto="$1" out="$2" dir tmp
  dir="$(dirname "$proto")"
  tmp="$(mktemp -d)"
  PATH="$BIN:$PATH" "$PY" -m grpc_tools.protoc -I proto \
    --python_out="$tmp" --grpc_python_out="$tmp" \
    --mypy_out="$tmp" --mypy_grpc_out="$tmp" \
    "$proto"
  mkdir -p "$out"
  local module="${dir//\//.}"
  for f in api_pb2.py api_pb2.pyi api_pb2_grpc.py api_pb2_grpc.pyi; do
    # Absolute proto-path imports become package-relative ones.
    sed -e "s/^from ${module} import api_pb2/from . import api_pb2/" \
        -e "s/^import ${module}\\.api_pb2\$/from . import api_pb2/" \
        "$tmp/$dir/$f" > "$out/$f"
  done
  printf '"""Generated %s stubs (scripts/gen-proto.sh); do not edit by hand."""\n' "$proto" \
    > "$out/__init__.py"
  rm -rf "$tmp"
  echo "generated in $out: $(ls "$out" | tr '\n' ' ')"
}

generate deviceplugin/v1beta1/api.proto src/gpushare/deviceplugin/_proto
generate dra/v1/api.proto src/gpushare/dra/_proto/dra
generate pluginregistration/v1/api.proto src/gpushare/dra/_proto/registration
printf '"""Generated DRA and plugin-registration stubs (scripts/gen-proto.sh)."""\n' \
  > src/gpushare/dra/_proto/__init__.py
