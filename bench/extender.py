"""Extender filter and prioritize latency over loopback HTTP (design.md §6, issue 4 item 8).

Run: ``.venv/bin/python bench/extender.py [--nodes 1000] [--pods 20000] [--requests 300]``.

Set-up: ``--nodes`` GPU-share nodes × 8 GPUs of 16 GiB, ``--pods`` bound GPU pods already in
the ledger (observed as the watch would deliver them), and a pending 4 GiB pod. Each request
carries all node names (``nodeCacheCapable: true``). Two servers run the same HTTP stack
(uvicorn + starlette) on loopback: gpushare's extender, and a canned server that answers every
request with a precomputed body (the floor: HTTP, JSON and the request size, no decisions).
One persistent connection sends requests one after another. Reports the first (cold) request,
then p50/p99 over ``--requests`` and the ratio to the canned floor. Budget: p99 ≤ 2× the floor.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpushare.extender.app import create_app
from gpushare.testing.extender import pod_json, populated_state

PREFIX = "/gpushare-scheduler"
GPUS_PER_NODE = 8
GPU_GIB = 16


def canned_app(filter_body: bytes, prioritize_body: bytes) -> Starlette:
    """Same stack, fixed answers."""

    def answer(body: bytes) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            await request.body()
            return Response(body, media_type="application/json")

        return endpoint

    return Starlette(
        routes=[
            Route(f"{PREFIX}/filter", answer(filter_body), methods=["POST"]),
            Route(f"{PREFIX}/prioritize", answer(prioritize_body), methods=["POST"]),
        ]
    )


def serve(app: Starlette) -> tuple[uvicorn.Server, int]:
    """Start ``app`` on a free loopback port in a thread; return the server and its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    return server, port


def timed(port: int, path: str, body: bytes, count: int) -> tuple[float, list[float], bytes]:
    """(first request s, the next ``count`` in s, last response body) on one connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Content-Type": "application/json"}
    times: list[float] = []
    reply = b""
    for _ in range(count + 1):
        started = time.perf_counter()
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        reply = response.read()
        times.append(time.perf_counter() - started)
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {reply[:200]!r}")
    connection.close()
    return times[0], times[1:], reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--policy", default="binpack")
    args = parser.parse_args()

    started = time.perf_counter()
    state, names = populated_state(
        args.nodes, args.pods, gpus_per_node=GPUS_PER_NODE, gpu_gib=GPU_GIB
    )
    print(
        f"{args.nodes} nodes × {GPUS_PER_NODE} GPUs, {args.pods} pods in the ledger "
        f"(built in {time.perf_counter() - started:.1f} s); policy {args.policy}"
    )
    pending = pod_json("pending", 4, namespace="bench")
    body = json.dumps({"Pod": pending, "Nodes": None, "NodeNames": names}).encode()

    server, port = serve(create_app(state, policy=args.policy, expire_interval_s=None))
    results: dict[str, tuple[float, list[float]]] = {}
    replies: dict[str, bytes] = {}
    for verb in ("filter", "prioritize"):
        first, times, reply = timed(port, f"{PREFIX}/{verb}", body, args.requests)
        results[verb] = (first, times)
        replies[verb] = reply
    server.should_exit = True

    canned, canned_port = serve(canned_app(replies["filter"], replies["prioritize"]))
    floors: dict[str, list[float]] = {}
    for verb in ("filter", "prioritize"):
        _, floors[verb], _ = timed(canned_port, f"{PREFIX}/{verb}", body, args.requests)
    canned.should_exit = True

    print(f"request body {len(body) / 1024:.0f} KiB; {args.requests} requests each, one connection")
    for verb in ("filter", "prioritize"):
        first, times = results[verb]
        ms = np.array(times) * 1000
        floor = np.array(floors[verb]) * 1000
        p50, p99 = np.percentile(ms, [50, 99])
        f50, f99 = np.percentile(floor, [50, 99])
        median_ratio = statistics.median(times) / statistics.median(floors[verb])
        print(
            f"  {verb:10s} gpushare p50 {p50:6.2f} ms p99 {p99:6.2f} ms"
            f" (first {first * 1000:.1f} ms) | canned p50 {f50:6.2f} ms p99 {f99:6.2f} ms"
            f" | p99 ratio {p99 / f99:.2f} (budget 2.0); median ratio {median_ratio:.2f}"
        )


if __name__ == "__main__":
    main()
