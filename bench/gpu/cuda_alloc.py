"""One CUDA client that allocates device memory through the driver API (``libcuda.so.1`` via
``ctypes``, no other package), for the GPU checks in this directory (issue 16).

``python bench/gpu/cuda_alloc.py --mib N [--hold-s S]``: create a context on device 0 (the first
GPU of ``CUDA_VISIBLE_DEVICES``), ``cuMemAlloc`` N MiB, print one JSON line ``{"result": "ok" |
"out_of_memory" | "error", "code": <CUresult>, "call": ..., "pid": ..., "free_mib": ...,
"total_mib": ...}``, then hold the memory for S seconds. Exit 0 when allocated, 3 on
CUDA_ERROR_OUT_OF_MEMORY, 1 on any other failure. Under MPS (``CUDA_MPS_PIPE_DIRECTORY``) the
process is an MPS client and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` bounds what it can allocate.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    report: dict[str, object] = {"pid": os.getpid(), "mib": args.mib}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        report.update(result="error", call="dlopen libcuda.so.1", detail=str(error))
        print(json.dumps(report), flush=True)
        return 1

    def call(name: str, *params: object) -> int:
        code = int(getattr(cuda, name)(*params))
        report.update(call=name, code=code)
        return code

    device, context = ctypes.c_int(), ctypes.c_void_p()
    pointer, free, total = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_size_t()
    if (
        call("cuInit", 0) != CUDA_SUCCESS
        or call("cuDeviceGet", ctypes.byref(device), 0) != CUDA_SUCCESS
        or call("cuCtxCreate_v2", ctypes.byref(context), 0, device) != CUDA_SUCCESS
        or call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) != CUDA_SUCCESS
    ):
        report["result"] = "error"
        print(json.dumps(report), flush=True)
        return 1
    report.update(free_mib=free.value >> 20, total_mib=total.value >> 20)
    code = call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(args.mib << 20))
    if code == CUDA_SUCCESS:
        report["result"] = "ok"
    elif code == CUDA_ERROR_OUT_OF_MEMORY:
        report["result"] = "out_of_memory"
    else:
        report["result"] = "error"
    print(json.dumps(report), flush=True)
    if code == CUDA_SUCCESS and args.hold_s > 0:
        time.sleep(args.hold_s)
    return {CUDA_SUCCESS: 0, CUDA_ERROR_OUT_OF_MEMORY: 3}.get(code, 1)


if __name__ == "__main__":
    sys.exit(main())
