"""Extender filter and prioritize latency over loopback HTTP (docs/design.md, "Budgets").

Run: ``.venv/bin/python bench/extender.py [--nodes 1000] [--pods 20000] [--requests 300]
[--rounds 5]`` (``make bench-extender``; ``make bench-scale``: 5,000 nodes, 50,000 pods).

Set-up: ``--nodes`` GPU-share nodes × 8 GPUs of 16 GiB, ``--pods`` bound GPU pods already in
the ledger (observed as the watch would deliver them), and a pending 4 GiB pod. Each request
carries all node names (``nodeCacheCapable: true``). Two servers run the same HTTP stack
(uvicorn + starlette) on loopback, in a child process of their own (so that the client here
never competes with them for the interpreter lock): gpushare's extender, and a canned server
that answers every request with the extender's own answer, precomputed (the floor: HTTP, JSON
and the request size, no decisions). ``--window N`` sends N names a request instead, each window
starting where the last stopped, as kube-scheduler does (``percentageOfNodesToScore``: 500 of
5,000 nodes), so consecutive requests name different nodes. One persistent connection per
server and round sends ``--requests`` requests one after another; each round measures gpushare
then the canned server, verb by verb, so both see the same machine. Reports the first (cold)
request, the medians over the rounds of p50 and p99, each round's p99 and its ratio, and the
ratio of the median p99s.
Budget (docs/design.md, "Budgets"): p99 ≤ 2× the floor.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
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


def timed(
    port: int, path: str, bodies: list[bytes], count: int
) -> tuple[float, list[float], bytes]:
    """(first request s, the next ``count`` in s, last response body) on one connection, the
    request bodies taken from ``bodies`` in turn."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Content-Type": "application/json"}
    times: list[float] = []
    reply = b""
    for i in range(count + 1):
        started = time.perf_counter()
        connection.request("POST", path, bodies[i % len(bodies)], headers)
        response = connection.getresponse()
        reply = response.read()
        times.append(time.perf_counter() - started)
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {reply[:200]!r}")
    connection.close()
    return times[0], times[1:], reply


def request_bodies(names: list[str], window: int) -> list[bytes]:
    """The filter/prioritize bodies for a pending 4 GiB pod: one naming all ``names`` when
    ``window`` is 0, else windows of ``window`` names starting where the last stopped, once
    round the nodes."""
    pending = pod_json("pending", 4, namespace="bench")
    if window <= 0:
        return [json.dumps({"Pod": pending, "Nodes": None, "NodeNames": names}).encode()]
    ring = names * 2
    starts = range(0, len(names), window)
    return [
        json.dumps({"Pod": pending, "Nodes": None, "NodeNames": ring[s : s + window]}).encode()
        for s in starts
    ]


def serve_both(state_args: tuple[int, int, str, int], ports: Connection) -> None:
    """In a child process: build the state, serve gpushare's extender and the canned floor (its
    answers taken from the extender's own), send both ports and the request bodies, then
    wait."""
    nodes, pods, policy, window = state_args
    started = time.perf_counter()
    state, names = populated_state(nodes, pods, gpus_per_node=GPUS_PER_NODE, gpu_gib=GPU_GIB)
    built_s = time.perf_counter() - started
    bodies = request_bodies(names, window)
    _, port = serve(create_app(state, policy=policy, expire_interval_s=None))
    firsts, replies = {}, {}
    for verb in VERBS:  # the first (cold) request of each verb, and the answers for the floor
        firsts[verb], _, replies[verb] = timed(port, f"{PREFIX}/{verb}", bodies, 0)
    _, canned_port = serve(canned_app(replies["filter"], replies["prioritize"]))
    ports.send((port, canned_port, bodies, built_s, firsts))
    ports.recv()  # until the parent is done


VERBS = ("filter", "prioritize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=300, help="per verb, server and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--policy", default="binpack")
    parser.add_argument(
        "--window", type=int, default=0, help="names a request (0: all), rotating (module doc)"
    )
    args = parser.parse_args()

    parent, child = multiprocessing.get_context("fork").Pipe()
    servers = multiprocessing.get_context("fork").Process(
        target=serve_both,
        args=((args.nodes, args.pods, args.policy, args.window), child),
        daemon=True,
    )
    servers.start()
    port, canned_port, bodies, built_s, firsts = parent.recv()
    names_each = f"windows of {args.window} names" if args.window > 0 else "every name"
    print(
        f"{args.nodes} nodes × {GPUS_PER_NODE} GPUs, {args.pods} pods in the ledger "
        f"(built in {built_s:.1f} s); policy {args.policy}; {names_each}, request body"
        f" {len(bodies[0]) / 1024:.0f} KiB; {args.rounds} rounds of {args.requests} requests"
        " per verb and server, one connection, gpushare and canned alternating"
    )
    p99s: dict[tuple[str, str], list[float]] = {}
    p50s: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for verb in VERBS:
            for server, server_port in (("gpushare", port), ("canned", canned_port)):
                _, times, _ = timed(server_port, f"{PREFIX}/{verb}", bodies, args.requests)
                p50, p99 = np.percentile(np.array(times) * 1000, [50, 99])
                p50s.setdefault((verb, server), []).append(float(p50))
                p99s.setdefault((verb, server), []).append(float(p99))
    parent.send("done")
    servers.join(10)
    for verb in VERBS:
        ours, floor = p99s[(verb, "gpushare")], p99s[(verb, "canned")]
        ratios = [a / b for a, b in zip(ours, floor, strict=True)]
        p99, f99 = statistics.median(ours), statistics.median(floor)
        p50, f50 = (
            statistics.median(p50s[(verb, "gpushare")]),
            statistics.median(p50s[(verb, "canned")]),
        )
        print(
            f"  {verb:10s} gpushare p50 {p50:6.2f} ms p99 {p99:6.2f} ms"
            f" (first {firsts[verb] * 1000:.1f} ms) | canned p50 {f50:6.2f} ms p99 {f99:6.2f} ms"
            f" | p99 ratio {p99 / f99:.2f} (budget 2.0: {'met' if p99 <= 2 * f99 else 'NOT met'})"
            f"; median ratio {p50 / f50:.2f}"
        )
        print(
            f"  {'':10s} per round p99 gpushare {', '.join(f'{x:.2f}' for x in ours)} ms;"
            f" canned {', '.join(f'{x:.2f}' for x in floor)} ms;"
            f" ratios {', '.join(f'{x:.2f}' for x in ratios)}"
        )


if __name__ == "__main__":
    main()
