#!/usr/bin/env bash
# The real-GPU checks (docs/testing.md, "Which tier proves what") on a machine with an NVIDIA
# GPU, as root, where the project's virtual environment is not built:
# `bash bench/gpu/run.sh [pytest args]`. With a `.whl/` folder of the runtime's wheels (cp312,
# made with `pip download`; docs/usage.md, "Enforced shares (MPS)") they are installed into
# /tmp/site first; else the current python must have them (`.venv`).
# Writes the log to $OUT/gpu-checks.log when $OUT is set. test_gpu_share_view.py (the
# share-view library under PyTorch: `bash bench/gpu/run.sh -k share_view`, with build/native/
# carried) also writes $OUT/share-view.json and share-view.md; its probe runs with the
# machine's python3 (GPUSHARE_PROBE_PYTHON), which must have PyTorch.
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
if [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:src
else
  export PYTHONPATH=src
fi
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  found=$(find / -xdev -name nvidia-cuda-mps-control -type f 2>/dev/null | head -1)
  [ -n "$found" ] && export PATH="$PATH:$(dirname "$found")"
fi
log=${OUT:-/tmp}/gpu-checks.log
{
  date -u
  nvidia-smi --query-gpu=name,uuid,memory.total,driver_version,compute_mode --format=csv
  echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo missing)"
  "$python" --version
  "$python" -m pytest bench/gpu -v -s -p no:cacheprovider -W default "$@"
  status=$?
  nvidia-smi --query-gpu=compute_mode --format=csv
  exit $status
} 2>&1 | tee "$log"
