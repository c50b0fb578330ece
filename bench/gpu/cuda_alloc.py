"""One CUDA client for the GPU checks in this directory: allocates device memory and
optionally times a compute-bound kernel, through the driver API alone (``libcuda.so.1`` via
``ctypes``, no other package).

``python bench/gpu/cuda_alloc.py --mib N [--spin-iters K] [--hold-s S]``: take the primary
context of device 0 (the first GPU of ``CUDA_VISIBLE_DEVICES``), ``cuMemAlloc`` N MiB; with
``--spin-iters``, load a hand-written PTX kernel (a dependent FMA chain of K steps per thread,
``BLOCKS`` × ``THREADS`` threads: the same work whatever the GPU) and time one launch; print one
JSON line::

    {"result": "ok" | "out_of_memory" | "error", "code": <CUresult>, "call": <last call>,
     "pid": ..., "mib": N, "free_mib": ..., "total_mib": ...,
     "device_sms": <multiprocessors of the GPU>, "context_sms": <multiprocessors this context
     may use (cuCtxGetExecAffinity), null where the driver does not say>,
     "kernel_ms": <wall time of the timed launch, milliseconds>}

then hold the memory for S seconds. Exit 0 when allocated, 3 on CUDA_ERROR_OUT_OF_MEMORY, 1 on
any other failure. Under MPS (``CUDA_MPS_PIPE_DIRECTORY``) the process is an MPS client:
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` bounds what it can allocate and
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` the multiprocessors its kernels run on (NVIDIA, "Multi-
Process Service", sections "Device Memory Limit" and "Active Thread Percentage").
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0
BLOCKS = 4096
THREADS = 256

# A dependent chain of ``iters`` FMAs per thread, the result stored (so it is not optimised
# away). Compute-bound: its time scales with the multiprocessors the context may use.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p;
    .reg .b32 %r<3>;
    .reg .f32 %f;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.f32 %f, 0f3F800000;
    mov.u32 %r2, 0;
LOOP:
    fma.rn.f32 %f, %f, 0f3F7FFFF0, 0f33D6BF95;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p, %r2, %r1;
    @%p bra LOOP;
    cvta.to.global.u64 %rd2, %rd1;
    st.global.f32 [%rd2], %f;
    ret;
}
\x00"""


class ExecAffinitySmCount(ctypes.Structure):
    """``CUexecAffinityParam`` with its ``smCount`` member (cuda.h)."""

    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--spin-iters", type=int, default=0)
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    report: dict[str, object] = {"pid": os.getpid(), "mib": args.mib}

    def done(result: str) -> None:
        report["result"] = result
        print(json.dumps(report), flush=True)

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        report.update(call="dlopen libcuda.so.1", detail=str(error))
        done("error")
        return 1

    def call(name: str, *params: object) -> int:
        code = int(getattr(cuda, name)(*params))
        report.update(call=name, code=code)
        return code

    device, context = ctypes.c_int(), ctypes.c_void_p()
    pointer, free, total = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_size_t()
    sms = ctypes.c_int()
    if (
        call("cuInit", 0) != CUDA_SUCCESS
        or call("cuDeviceGet", ctypes.byref(device), 0) != CUDA_SUCCESS
        or call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device) != CUDA_SUCCESS
        or call("cuCtxSetCurrent", context) != CUDA_SUCCESS
        or call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) != CUDA_SUCCESS
        or call(
            "cuDeviceGetAttribute",
            ctypes.byref(sms),
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            device,
        )
        != CUDA_SUCCESS
    ):
        done("error")
        return 1
    report.update(free_mib=free.value >> 20, total_mib=total.value >> 20, device_sms=sms.value)
    affinity = ExecAffinitySmCount()
    affinity_code = int(
        cuda.cuCtxGetExecAffinity(ctypes.byref(affinity), CU_EXEC_AFFINITY_TYPE_SM_COUNT)
    )
    report["context_sms"] = affinity.sm_count if affinity_code == CUDA_SUCCESS else None

    code = call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(args.mib << 20))
    if code not in (CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY):
        done("error")
        return 1
    allocated = code == CUDA_SUCCESS
    if args.spin_iters > 0 and not spin(cuda, call, report, args.spin_iters):
        done("error")
        return 1
    report.update(call="cuMemAlloc_v2", code=code)
    done("ok" if allocated else "out_of_memory")
    if allocated and args.hold_s > 0:
        time.sleep(args.hold_s)
    return 0 if allocated else 3


def spin(
    cuda: ctypes.CDLL, call: Callable[..., int], report: dict[str, object], iters: int
) -> bool:
    """Load ``SPIN_PTX`` and time one launch of ``iters`` (after a short warm-up launch);
    ``report["kernel_ms"]``. False on a driver error (``report`` names the call)."""
    module, function, out = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    cuda.cuLaunchKernel.argtypes = [
        ctypes.c_void_p,
        *[ctypes.c_uint] * 6,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    if (
        call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(SPIN_PTX)) != CUDA_SUCCESS
        or call("cuModuleGetFunction", ctypes.byref(function), module, b"spin") != CUDA_SUCCESS
        or call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(4)) != CUDA_SUCCESS
    ):
        return False

    def launch(count: int) -> bool:
        out_arg, iters_arg = ctypes.c_uint64(out.value), ctypes.c_uint32(count)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(out_arg), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(iters_arg), ctypes.c_void_p),
        )
        return (
            call("cuLaunchKernel", function, BLOCKS, 1, 1, THREADS, 1, 1, 0, None, params, None)
            == CUDA_SUCCESS
            and call("cuCtxSynchronize") == CUDA_SUCCESS
        )

    if not launch(1000):
        return False
    started = time.perf_counter()
    if not launch(iters):
        return False
    report["kernel_ms"] = round((time.perf_counter() - started) * 1000, 2)
    return True


if __name__ == "__main__":
    sys.exit(main())
