"""One PyTorch client for ``test_gpu_share_view.py``: what a program in a shared container
sees of its GPU memory and how fast it computes, started with exactly the environment the
device plugin answered (the share-view library in ``LD_PRELOAD``, the MPS variables).

Runs with a Python that has PyTorch (the GPU machine's ``python3``); torch is imported only in
the modes that use the GPU, so ``--help`` and ``--dry-run`` work without it. Prints ONE JSON
line on stdout (the last line), also on failure (``"error"``: the traceback); exit 0 when the
mode ran (an expected out-of-memory is a result, not a failure), 1 otherwise.

Every mode reports ``pid``, ``library_loaded`` (``libgpushare-share`` is mapped into this
process), ``env`` (the variables that shape the view), ``uuid`` (the GPU of the share: the first
of ``GPUSHARE_SHARE_MIB``, else of ``CUDA_VISIBLE_DEVICES``) and, except ``--dry-run``,
``totals``: ``get_device_properties(0).total_memory`` and ``torch.cuda.mem_get_info()`` in MiB.
``nvidia_smi`` is ``nvidia-smi --query-gpu=uuid,memory.total,memory.used`` run as a child with
this process's environment, the row of ``uuid`` (MiB), or ``error`` with what it printed.

* ``--mode bench [--window-s S] [--start-at EPOCH] [--fallback-pool-mib M]``: vLLM-style
  sizing: one pool of ``int(0.9 × total)`` bytes (``total`` from ``mem_get_info``, as vLLM's
  ``gpu_memory_utilization`` takes it; ``pool_from_total``: ok or out_of_memory), else
  ``--fallback-pool-mib`` MiB; ``nvidia-smi`` while it is held; then a bf16 8192×8192×8192
  matmul loop (1 s of warm-up, then from ``--start-at`` when given, for S seconds):
  ``tflops`` (all iterations over the window), ``tflops_batches`` (median, min, max of
  batches of 10), ``ready_s`` (process start to ready), ``late_s`` (how late the window started
  after ``--start-at``), ``window`` (its start and end, epoch seconds).
* ``--mode limit --share-mib N``: one allocation of ``N × 1.02`` MiB (``past_share``: expected
  out_of_memory), then the largest multiple of 256 MiB that succeeds, descending from the
  largest at most ``N × 1.02`` (``largest_mib``; ``nvidia_smi_holding`` and ``totals_holding``
  while it is held).
* ``--dry-run``: no torch, no CUDA: the fields above that need neither (tests the output path).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

STARTED = time.time()
MIB = 1 << 20
N = 8192
FLOP_PER_MATMUL = 2 * N**3
BATCH = 10
WARMUP_S = 1.0
POOL_FRACTION = 0.9
PAST_SHARE = 1.02
STEP_MIB = 256
VIEW_VARIABLES = (
    "LD_PRELOAD",
    "GPUSHARE_SHARE_MIB",
    "GPUSHARE_SHARE_ENFORCE",
    "GPUSHARE_SHARE_STATE",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
)


def library_loaded() -> bool:
    """Whether ``libgpushare-share`` is mapped into this process (ld.so only warns when an
    ``LD_PRELOAD`` entry cannot be loaded)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libgpushare-share" in maps.read()
    except OSError:
        return False


def share_uuid() -> str:
    """The GPU of the share: the first of ``GPUSHARE_SHARE_MIB``, else of
    ``CUDA_VISIBLE_DEVICES`` (the runs without the library)."""
    listed = os.environ.get("GPUSHARE_SHARE_MIB", "").strip()
    if listed:
        return listed.split(",")[0].split("=")[0].strip()
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()


def nvidia_smi(uuid: str) -> dict[str, Any]:
    """``nvidia-smi``'s memory.total and memory.used (MiB) of ``uuid``, run with this
    process's environment (NVML lists every GPU; the row of ``uuid`` is taken)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return {"error": f"nvidia-smi is not on PATH ({os.environ.get('PATH', '')})"}
    command = [binary, "--query-gpu=uuid,memory.total,memory.used", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"{' '.join(command)}: {error!r}"}
    seen: dict[str, Any] = {"exit": done.returncode, "stderr": done.stderr[-1000:]}
    for line in done.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 3 and cells[0] == uuid:
            try:
                return {**seen, "uuid": uuid, "total_mib": int(cells[1]), "used_mib": int(cells[2])}
            except ValueError:
                break
    return {**seen, "error": f"no numeric row for {uuid!r}", "stdout": done.stdout[-2000:]}


def totals(torch: Any) -> dict[str, Any]:
    """What PyTorch reports of device 0, MiB."""
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    return {
        "name": props.name,
        "multi_processor_count": props.multi_processor_count,
        "total_memory_mib": props.total_memory / MIB,
        "mem_get_info_free_mib": free / MIB,
        "mem_get_info_total_mib": total / MIB,
    }


def allocate(torch: Any, nbytes: int) -> tuple[Any, str, str]:
    """``(block or None, "ok" | "out_of_memory" | "error", message)`` for one allocation of
    ``nbytes`` (``torch.empty`` of uint8 on the GPU)."""
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda"), "ok", ""
    except torch.cuda.OutOfMemoryError as error:
        return None, "out_of_memory", str(error)[:400]
    except RuntimeError as error:
        return None, "error", str(error)[:600]


def release(torch: Any) -> None:
    """Give the caching allocator's blocks back to the driver (the next try starts clean)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def bench(torch: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """``--mode bench`` (module doc)."""
    report["totals"] = totals(torch)
    pool_bytes = int(POOL_FRACTION * report["totals"]["mem_get_info_total_mib"] * MIB)
    pool, result, message = allocate(torch, pool_bytes)
    report["pool_from_total"] = {"mib": pool_bytes / MIB, "result": result, "message": message}
    if pool is None and args.fallback_pool_mib:
        pool_bytes = args.fallback_pool_mib * MIB
        pool, result, message = allocate(torch, pool_bytes)
        report["pool_fallback"] = {"mib": args.fallback_pool_mib, "result": result}
    if pool is None:
        raise RuntimeError(f"no pool could be allocated: {result}: {message}")
    report["pool_mib"] = pool_bytes / MIB
    report["nvidia_smi"] = nvidia_smi(report["uuid"])
    a = torch.randn(N, N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, N, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(N, N, dtype=torch.bfloat16, device="cuda")
    warm_until = time.monotonic() + WARMUP_S
    while time.monotonic() < warm_until:
        for _ in range(BATCH):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
    report["ready_s"] = time.time() - STARTED
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
        report["late_s"] = max(0.0, time.time() - args.start_at)
    batches: list[float] = []
    iterations = 0
    begin_wall = time.time()
    begin = time.perf_counter()
    end = begin + args.window_s
    now = begin
    while now < end:
        before = now
        for _ in range(BATCH):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        now = time.perf_counter()
        iterations += BATCH
        batches.append(BATCH * FLOP_PER_MATMUL / (now - before) / 1e12)
    elapsed = now - begin
    report["window"] = {"start": begin_wall, "end": begin_wall + elapsed}
    report["iterations"] = iterations
    report["elapsed_s"] = elapsed
    report["tflops"] = iterations * FLOP_PER_MATMUL / elapsed / 1e12
    report["tflops_batches"] = {
        "median": statistics.median(batches),
        "min": min(batches),
        "max": max(batches),
    }
    del pool


def limit(torch: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """``--mode limit`` (module doc)."""
    share = args.share_mib
    if not share:
        raise ValueError("--mode limit needs --share-mib")
    report["totals"] = totals(torch)
    report["nvidia_smi"] = nvidia_smi(report["uuid"])
    past_mib = int(share * PAST_SHARE)
    block, result, message = allocate(torch, past_mib * MIB)
    report["past_share"] = {"mib": past_mib, "result": result, "message": message}
    del block
    release(torch)
    tried: list[tuple[int, str]] = []
    mib = past_mib // STEP_MIB * STEP_MIB
    while mib >= share // 2:
        block, result, message = allocate(torch, mib * MIB)
        tried.append((mib, result))
        if block is not None:
            report["largest_mib"] = mib
            report["totals_holding"] = totals(torch)
            report["nvidia_smi_holding"] = nvidia_smi(report["uuid"])
            del block
            release(torch)
            break
        if result != "out_of_memory":
            report["largest_error"] = message
            break
        release(torch)
        mib -= STEP_MIB
    else:
        report["largest_mib"] = None
    report["tried"] = tried


def main() -> int:
    parser = argparse.ArgumentParser(
        description="What a PyTorch process sees of its GPU share; one JSON line (module doc)."
    )
    parser.add_argument("--mode", choices=("bench", "limit"), default="bench")
    parser.add_argument("--window-s", type=float, default=10.0, help="matmul window (bench)")
    parser.add_argument(
        "--start-at", type=float, default=0.0, help="epoch seconds to start the window (bench)"
    )
    parser.add_argument(
        "--fallback-pool-mib", type=int, default=0, help="pool when 0.9 x total fails (bench)"
    )
    parser.add_argument("--share-mib", type=int, default=0, help="the share (limit)")
    parser.add_argument("--label", default="", help="echoed in the report")
    parser.add_argument("--dry-run", action="store_true", help="no torch, no CUDA")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "mode": args.mode,
        "label": args.label,
        "pid": os.getpid(),
        "library_loaded": library_loaded(),
        "uuid": share_uuid(),
        "env": {name: os.environ[name] for name in VIEW_VARIABLES if name in os.environ},
    }
    status = 0
    try:
        if args.dry_run:
            report["dry_run"] = True
            report["nvidia_smi"] = nvidia_smi(report["uuid"])
        else:
            torch: Any = importlib.import_module("torch")
            report["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
            (bench if args.mode == "bench" else limit)(torch, args, report)
    except Exception:
        report["error"] = traceback.format_exc()[-3000:]
        status = 1
    print(json.dumps(report, sort_keys=True), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
