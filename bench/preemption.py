"""GPU-aware preemption against kube-scheduler's own, on the real control plane (docs/usage.md,
"Priorities and preemption").

Run: ``make bench-preemption`` (or ``.venv/bin/python bench/preemption.py [--nodes 100]
[--preemptors 200] [--seed 20261127] [--rounds 3] [--modes gpushare,kube-scheduler]``): every
mode ``--rounds`` times, alternating, each round in namespaces and nodes of its own, then the
median of each column with the load average. Needs the test control plane (``make
controlplane``).
``--cases`` replays the five preemption cases instead (``gpushare.testing.preemption.ISSUE_CASES``,
the table of docs/usage.md, "What kube-scheduler does without gpushare's preemption") under both
preemptions and prints which pods each evicted and where the high pod went.

Set-up, the same for both runs: ``--nodes`` kwok nodes of eight 16 GiB GPUs, every GPU full of
low-priority pods (PriorityClass 100) of mixed sizes (2, 4, 8, 12 or 16 GiB, seeded; created
bound, as the extender would have placed them, started one second apart per wave); then
``--preemptors`` high-priority pods (1000) of mixed sizes (4, 8, 12 or 16 GiB on one GPU, and
one in ten 8 GiB on two GPUs) arrive at 20 pods/s. An evicted pod goes at once (kwok), so the
time to bind is scheduling, not grace periods.

* **gpushare**: ``gpushare extender`` as shipped (preemption on), kube-scheduler with
  ``preemptVerb``;
* **kube-scheduler**: the same extender with ``--no-preemption`` and no ``preemptVerb``:
  kube-scheduler's DefaultPreemption on node totals, with today's (gpushare 0.1) extender.

Measured from the pods alone, after every preemptor is bound or ``--settle`` seconds passed:
evictions (low pods gone), evictions per bound preemptor, wasted evictions (a victim on whose
GPUs no preemptor is bound at the end), preemptors bound, time from creation to binding (p50,
p99, of the bound ones), GPUs over capacity (from every remaining pod's
allocation annotations), and the extender's mean ``preempt``/``filter`` handling time and call
counts; and, per bound preemptor, when each step happened (``Phases``: refused, hold written,
nominated, its victims gone, bound), from the same watch and one of the holds ConfigMaps; for
each wasted eviction of the gpushare run, the hold that named the victim and where its
preemptor bound. Binds are seen through a watch (no polling that would load the API server it
measures). Prints progress
and a table; ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from lightkube import Client
from lightkube.resources.core_v1 import ConfigMap, Pod

from gpushare.kube.codec import ALLOCATION
from gpushare.testing.controlplane import (
    PREEMPTION_CANDIDATE_NODES,
    Binaries,
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    gpushare_profile,
    unverified_context,
    wait_until,
)
from gpushare.testing.metrics import sample_sum
from gpushare.testing.preemption import ISSUE_CASES, Case, Seed, preemptor

SCHEDULER = "gpushare-bench-preempt"
LOG_LEVEL = ["warning"]  # --extender-log-level
GPU_GIB = 16
LOW_SIZES = (2, 4, 8, 12, 16)
HIGH_SIZES = (4, 8, 12, 16)


@dataclass
class Result:
    """One run's numbers (module doc)."""

    mode: str
    preemptors: int
    bound: int
    evictions: int
    wasted: int
    p50_s: float
    p99_s: float
    overcommitted: int
    preempt_ms: float
    filter_ms: float
    seconds: float
    load: float = 0.0
    """The 1-minute load average when the run ended."""
    phases: Phases | None = None
    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    cycles: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    """kube-scheduler's attempts and PostFilter runs, ``{what: (count, mean ms)}``."""
    wasted_why: list[str] = dataclasses.field(default_factory=list)
    """Per wasted eviction: the victim, its GPUs, the hold that named it (its preemptor, the
    GPUs held) and where that preemptor is bound at the end (``never``; ``no hold``: no hold
    seen naming the victim)."""

    @property
    def per_bound(self) -> float:
        return self.evictions / self.bound if self.bound else float("nan")


def fill(nodes: list[str], rng: random.Random) -> Iterator[Seed]:
    """Every GPU of ``nodes`` full of low-priority pods of ``LOW_SIZES``."""
    for node in nodes:
        for gpu in range(8):
            left, i = GPU_GIB, 0
            while left:
                size = rng.choice([s for s in LOW_SIZES if s <= left])
                yield Seed(f"{node}-g{gpu}-{i}", node, {gpu: size})
                left -= size
                i += 1


def arrivals(count: int, rng: random.Random) -> list[tuple[str, int, int]]:
    """(name, GiB per GPU, GPUs) of each preemptor, in arrival order."""
    return [
        (f"high-{i:03d}", 8, 2) if i % 10 == 9 else (f"high-{i:03d}", rng.choice(HIGH_SIZES), 1)
        for i in range(count)
    ]


def calls(url: str, verb: str) -> int:
    """How many ``verb`` requests the extender answered (its ``/metrics``)."""
    name = "gpushare_extender_request_duration_seconds_count"
    return int(sample_sum(f"{url}/metrics", name, {"verb": verb}))


def _mean_ms(url: str, name: str, labels: dict[str, str]) -> float:
    count = sample_sum(f"{url}/metrics", f"{name}_count", labels)
    return 1000 * sample_sum(f"{url}/metrics", f"{name}_sum", labels) / count if count else 0.0


def mean_ms(url: str, verb: str) -> float:
    """The extender's mean handling time of ``verb``, ms (its ``/metrics``); 0 when none."""
    return _mean_ms(url, "gpushare_extender_request_duration_seconds", {"verb": verb})


@contextlib.contextmanager
def serving(plane: ControlPlane, mode: str, tag: str) -> Iterator[tuple[str, str | None, str]]:
    """The extender of ``mode`` and a kube-scheduler for ``SCHEDULER`` calling it, for the
    ``with`` body; yields the extender's URL, its holds ConfigMap (``None``: no preemption) and
    the kube-scheduler's URL."""
    preempting = mode == "gpushare"
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    holds = f"kube-system/gpushare-bench-holds-{tag}"
    argv = gpushare_argv(
        "extender", "--kubeconfig", str(plane.kubeconfig), "--host", "127.0.0.1",
        "--port", str(port), "--handshake-timeout", "0", "--log-level", LOG_LEVEL[0],
        *(("--preemption-holds", holds) if preempting else ("--no-preemption",)),
    )  # fmt: skip
    extender = ManagedProcess(f"extender-{tag}", argv, plane.root / f"bench-{tag}").start()
    try:
        wait_until("extender ready", lambda: _ok(f"{url}/readyz"), 120, processes=[extender])
        entry = gpushare_extender(f"{url}/gpushare-scheduler", preempt=preempting)
        name = f"kube-scheduler-{tag}"
        with plane.scheduler(
            name,
            profiles=[gpushare_profile(SCHEDULER, candidate_nodes=CANDIDATES[0])],
            extenders=[entry],
            podInitialBackoffSeconds=1,
            podMaxBackoffSeconds=10,
        ):
            yield url, holds if preempting else None, plane.scheduler_urls[name]
    finally:
        extender.stop()
        if LOG_LEVEL[0] != "warning":  # keep it: the control plane's directory goes at the end
            kept = Path("out/bench") / f"extender-{tag}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(extender.log_path.read_bytes())
            print(f"[{tag}] extender log: {kept}", flush=True)


CANDIDATES = [PREEMPTION_CANDIDATE_NODES]
"""``--candidate-nodes``: DefaultPreemption's ``minCandidateNodesAbsolute`` (the chart's)."""


def run(
    plane: ControlPlane, kube: Client, mode: str, args: argparse.Namespace, round_: int = 0
) -> Result:
    """One run (module doc) in its own namespace and nodes (round ``round_`` of ``mode``)."""
    rng = random.Random(args.seed)
    names = [f"{mode[:3]}{round_}-{i:03d}" for i in range(args.nodes)]
    layout = {n: [GPU_GIB] * 8 for n in names}
    tag = f"{mode}-{round_}"
    with Case(kube, f"bench-{tag}", layout, SCHEDULER, linger=False) as case:
        seeds = list(fill(names, rng))
        print(f"[{mode}] seeding {len(seeds)} low-priority pods on {len(names)} nodes", flush=True)
        started = time.monotonic()
        half = len(seeds) // 2
        case.seed_waves([seeds[:half], seeds[half:]])  # two start times
        print(f"[{mode}]   {time.monotonic() - started:.0f} s", flush=True)
        with serving(plane, mode, tag) as (url, holds, scheduler), plane.client() as watcher:
            return measure(
                case, mode, args, rng=rng, url=url, seeds={s.name: s for s in seeds},
                watcher=watcher, holds=holds, scheduler=scheduler,
            )  # fmt: skip


@dataclass
class CaseResult:
    """One preemption case under one preemption: the pods evicted and where the high pod went."""

    case: str
    mode: str
    evicted: list[str]
    bound: str | None


def replay_cases(plane: ControlPlane, kube: Client, wait_s: float) -> list[CaseResult]:
    """The five preemption cases (``ISSUE_CASES``) under both preemptions: evicted pods go at
    once; the high pod gets ``wait_s`` seconds to bind (and 3 more for evictions still
    coming)."""
    results = []
    for mode in ("kube-scheduler", "gpushare"):
        for scenario in ISSUE_CASES:
            tag = f"{mode[:3]}-case{scenario.name.replace(chr(39), 'p')}"
            nodes = {f"{tag}-{n}": gpus for n, gpus in scenario.nodes.items()}
            waves = [
                tuple(dataclasses.replace(s, node=f"{tag}-{s.node}") for s in wave)
                for wave in scenario.waves
            ]
            with Case(kube, tag, nodes, SCHEDULER, linger=False) as case:
                case.seed_waves(waves)
                seeded = set(case.pods())
                with serving(plane, mode, tag):
                    case.submit(preemptor("high", scenario.ask))
                    deadline = time.monotonic() + wait_s
                    while time.monotonic() < deadline and case.placement("high") is None:
                        time.sleep(0.25)
                    time.sleep(3)
                    placed = case.placement("high")
                evicted = sorted(seeded - set(case.pods()))
                bound = None if placed is None else f"{placed[0]} GPU {placed[1]}"
                results.append(CaseResult(scenario.name, mode, evicted, bound))
                what = f"evicted {evicted}, bound: {bound}"
                print(f"[case {scenario.name}, {mode}] {what}", flush=True)
    return results


def _ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class BoundWatch:
    """What happens to each pod of the namespace, from a watch in a thread of its own (its own
    client: a sync client is not shared across threads; a broken watch catches up from a list
    and starts again from now), in monotonic seconds: when each of
    ``names`` is first seen refused (``PodScheduled`` false), nominated
    (``status.nominatedNodeName``) and bound; when every other pod is first seen going
    (``deletionTimestamp`` or deleted). With ``holds`` (``namespace/name`` of the extender's
    holds ConfigMap), when a hold for each of ``names`` is first seen. Use as a context
    manager."""

    def __init__(
        self, kube: Client, namespace: str, names: set[str], holds: str | None = None
    ) -> None:
        self._kube, self._namespace, self._names = kube, namespace, names
        self.bound_at: dict[str, float] = {}
        self.refused_at: dict[str, float] = {}
        self.nominated_at: dict[str, float] = {}
        self.gone_at: dict[str, float] = {}
        self.held_at: dict[str, float] = {}
        self.held_for: dict[str, tuple[str, str, list[int]]] = {}
        """A victim's name -> (the preemptor of the last hold seen naming it, that hold's node,
        its GPUs)."""
        self._holds = holds
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        if holds is not None:
            self._threads.append(threading.Thread(target=self._run_holds, daemon=True))

    def __enter__(self) -> BoundWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _seen(self, kind: str, pod: Pod) -> None:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        if meta is None or meta.name is None:
            return
        now, name = time.monotonic(), str(meta.name)
        if name not in self._names:
            if kind == "DELETED" or meta.deletionTimestamp is not None:
                self.gone_at.setdefault(name, now)
            return
        if spec is not None and spec.nodeName:
            self.bound_at.setdefault(name, now)
        if status is not None and status.nominatedNodeName:
            self.nominated_at.setdefault(name, now)
        for condition in (status.conditions if status is not None else None) or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                self.refused_at.setdefault(name, now)

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                # A watch from no version starts with every pod of the namespace (23,321 at
                # 1,000 nodes): the server's timeout must let it finish, or the version kept is
                # one from the middle of that unordered start.
                for kind, pod in self._kube.watch(
                    Pod, namespace=self._namespace, resource_version=version, server_timeout=120
                ):
                    if pod.metadata is not None:
                        version = pod.metadata.resourceVersion
                    self._seen(kind, pod)
                    if self._stop.is_set():
                        return
            except Exception:  # the watch broke (e.g. its version expired): catch up, go on
                version = None
                with contextlib.suppress(Exception):
                    for pod in self._kube.list(Pod, namespace=self._namespace):
                        self._seen("MODIFIED", pod)

    def _run_holds(self) -> None:
        assert self._holds is not None
        namespace, _, name = self._holds.partition("/")
        with Client(self._kube.config) as client:
            while not self._stop.is_set():
                try:
                    for _, configmap in client.watch(
                        ConfigMap, namespace=namespace, server_timeout=5
                    ):  # every shard: NAME, NAME-1, ... (gpushare.kube.holds)
                        shard = configmap.metadata.name if configmap.metadata else ""
                        suffix = (shard or "").removeprefix(name)
                        if suffix and not (suffix[0] == "-" and suffix[1:].isdigit()):
                            continue
                        now = time.monotonic()
                        for raw in (configmap.data or {}).values():
                            hold = json.loads(raw)
                            held = str(hold.get("pod", "")).rpartition("/")[2]
                            self.held_at.setdefault(held, now)
                            gpus = sorted(
                                {i for c in hold.get("containers", []) for i in c["gpus"]}
                            )
                            for victim in hold.get("victims", []):
                                evicted = str(victim.get("pod", "")).rpartition("/")[2]
                                self.held_for[evicted] = (held, str(hold.get("node", "")), gpus)
                        if self._stop.is_set():
                            return
                except Exception:  # as above
                    continue


@dataclass
class Phases:
    """Medians (and p99) over the bound preemptors, seconds, of each step from creation to
    binding (module doc): ``refused`` (created → first seen unschedulable), ``held`` (→ the
    extender's hold written), ``nominated`` (→ kube-scheduler's nomination), ``victims_gone``
    (→ the last low pod on its GPUs going), ``bound`` (victims gone → bound)."""

    refused: tuple[float, float]
    held: tuple[float, float]
    nominated: tuple[float, float]
    victims_gone: tuple[float, float]
    bound_after_victims: tuple[float, float]
    held_count: int
    nominated_count: int


def phases(
    watch: BoundWatch,
    created: dict[str, float],
    placements: dict[str, tuple[str, set[int]]],
    seeds: dict[str, Seed],
) -> Phases:
    """The per-step times of ``watch`` (see :class:`Phases`); a preemptor's victims are the
    low pods gone from the GPUs it was bound to."""
    since: dict[str, list[float]] = {k: [] for k in ("refused", "held", "nominated", "gone")}
    after: list[float] = []
    for name, bound in watch.bound_at.items():
        start = created[name]
        for key, seen in (("refused", watch.refused_at), ("held", watch.held_at),
                          ("nominated", watch.nominated_at)):  # fmt: skip
            if name in seen:
                since[key].append(seen[name] - start)
        node, gpus = placements.get(name, ("", set()))
        gone = [
            watch.gone_at[s.name]
            for s in seeds.values()
            if s.node == node
            and set(s.gpus) & gpus
            and s.name in watch.gone_at
            and watch.gone_at[s.name] <= bound
        ]
        if gone:
            since["gone"].append(max(gone) - start)
            after.append(bound - max(gone))

    def q(values: list[float]) -> tuple[float, float]:
        return (_quantile(sorted(values), 0.5), _quantile(sorted(values), 0.99))

    return Phases(
        q(since["refused"]), q(since["held"]), q(since["nominated"]), q(since["gone"]), q(after),
        len(since["held"]), len(since["nominated"]),
    )  # fmt: skip


def measure(
    case: Case,
    mode: str,
    args: argparse.Namespace,
    *,
    rng: random.Random,
    url: str,
    seeds: dict[str, Seed],
    watcher: Client,
    holds: str | None = None,
    scheduler: str | None = None,
) -> Result:
    """Send the preemptors, wait, judge (module doc)."""
    created: dict[str, float] = {}
    wanted = arrivals(args.preemptors, rng)
    with BoundWatch(watcher, case.name, {name for name, _, _ in wanted}, holds) as watch:
        start = time.monotonic()
        gap_s = 1.0 / args.arrivals_per_s if args.arrivals_per_s > 0 else 0.0
        for name, gib, gpus in wanted:
            case.submit(preemptor(name, gib, gpus=gpus))
            created[name] = time.monotonic()
            time.sleep(gap_s)
        deadline = time.monotonic() + args.settle
        ticks = 0
        while len(watch.bound_at) < len(wanted) and time.monotonic() < deadline:
            time.sleep(1)
            ticks += 1
            if ticks % 10 == 0:
                took = time.monotonic() - start
                print(f"[{mode}]   {len(watch.bound_at)}/{len(wanted)} bound after {took:.0f} s")
        sys.stdout.flush()
        bound_at = dict(watch.bound_at)
    elapsed = time.monotonic() - start
    pods = case.pods()
    evicted = [s for name, s in seeds.items() if name not in pods]
    where: dict[str, set[int]] = {}
    placements: dict[str, tuple[str, set[int]]] = {}
    for name in bound_at:
        placed = case.placement(name)
        if placed is not None:
            where.setdefault(placed[0], set()).update(placed[1])
            placements[name] = (placed[0], set(placed[1]))
    wasted = [s for s in evicted if not where.get(s.node, set()) & set(s.gpus)]
    wasted_why = [_why_wasted(s, watch.held_for, placements) for s in wasted]
    waits = sorted(bound_at[n] - created[n] for n in bound_at)
    means = {verb: mean_ms(url, verb) for verb in ("preempt", "filter")}
    steps = {
        step: _mean_ms(url, "gpushare_extender_preemption_step_seconds", {"step": step})
        for step in ("weigh", "record")
    }
    answered = {verb: calls(url, verb) for verb in ("preempt", "filter", "bind")}
    over = len(case.overcommitted())
    cycles = scheduling_cycles(scheduler) if scheduler is not None else {}
    cycles.update({f"preempt {k}": (0, v) for k, v in steps.items() if v})
    _check_records(pods)
    return Result(
        mode, len(wanted), len(bound_at), len(evicted), len(wasted),
        _quantile(waits, 0.5), _quantile(waits, 0.99), over,
        means.get("preempt", 0.0), means.get("filter", 0.0), elapsed,
        os.getloadavg()[0], phases(watch, created, placements, seeds), answered, cycles,
        wasted_why,
    )  # fmt: skip


def _why_wasted(
    seed: Seed,
    held_for: dict[str, tuple[str, str, list[int]]],
    placements: dict[str, tuple[str, set[int]]],
) -> str:
    """One line on a wasted eviction (``Result.wasted_why``)."""
    victim = f"{seed.name} ({seed.node} GPUs {sorted(seed.gpus)})"
    found = held_for.get(seed.name)
    if found is None:
        return f"{victim}: no hold seen naming it"
    preemptor, node, gpus = found
    placed = placements.get(preemptor)
    end = f"{placed[0]} GPUs {sorted(placed[1])}" if placed is not None else "never"
    return f"{victim}: held for {preemptor} on {node} GPUs {gpus}; it bound on {end}"


def scheduling_cycles(scheduler: str) -> dict[str, tuple[int, float]]:
    """kube-scheduler's scheduling attempts by result (``scheduled``, ``unschedulable``,
    ``error``) and its PostFilter (preemption) runs: ``{what: (count, mean ms)}``, from its
    ``/metrics`` (``scheduler_scheduling_attempt_duration_seconds``,
    ``scheduler_framework_extension_point_duration_seconds``)."""
    context = unverified_context()
    out: dict[str, tuple[int, float]] = {}
    series = [
        ("scheduler_scheduling_attempt_duration_seconds", {"result": result}, result)
        for result in ("scheduled", "unschedulable", "error")
    ] + [
        ("scheduler_framework_extension_point_duration_seconds",
         {"extension_point": point, "profile": SCHEDULER}, point)
        for point in ("Filter", "PostFilter")
    ]  # fmt: skip
    for name, labels, what in series:
        count = sample_sum(f"{scheduler}/metrics", f"{name}_count", labels, context=context)
        total = sample_sum(f"{scheduler}/metrics", f"{name}_sum", labels, context=context)
        out[what] = (int(count), 1000 * total / count if count else 0.0)
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _pair(values: tuple[float, float]) -> str:
    return f"{values[0]:.1f}/{values[1]:.1f}"


def _check_records(pods: dict[str, Pod]) -> None:
    """Every bound pod carries an allocation record (else ``overcommitted`` would miss it)."""
    for name, pod in pods.items():
        if pod.spec is not None and pod.spec.nodeName and pod.metadata is not None:
            assert ALLOCATION in (pod.metadata.annotations or {}), f"{name}: no allocation"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--preemptors", type=int, default=200)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--settle", type=float, default=180.0, help="seconds to wait for binds")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument(
        "--extender-log-level", default="warning", help="the extenders' --log-level (logs: "
        "the control plane's temporary directory)",
    )  # fmt: skip
    parser.add_argument(
        "--arrivals-per-s",
        type=float,
        default=20.0,
        help="preemptors created per second (0: one burst, as fast as the API server takes them)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every mode (medians when more than one)"
    )
    parser.add_argument(
        "--modes",
        default="gpushare,kube-scheduler",
        help="the runs, in order: gpushare (the extender's preemption), kube-scheduler (its own "
        "on node totals); comma-separated",
    )
    parser.add_argument(
        "--candidate-nodes",
        type=int,
        default=PREEMPTION_CANDIDATE_NODES,
        help="DefaultPreemption's minCandidateNodesAbsolute (percentage 0), the chart's "
        "scheduler.preemptionCandidateNodes; 0: kube-scheduler's defaults (10 %%, at least 100)",
    )
    parser.add_argument(
        "--cases",
        action="store_true",
        help="replay the five preemption cases under both preemptions instead (a table)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the control plane stops too
    LOG_LEVEL[0] = args.extender_log_level
    CANDIDATES[0] = args.candidate_nodes
    print(f"load averages at start: {os.getloadavg()}", flush=True)
    results = []
    with ControlPlane(Binaries.locate()) as plane, plane.client() as kube:
        if args.cases:
            replayed = replay_cases(plane, kube, wait_s=20.0)
            print("| case | kube-scheduler: evicted, bound | gpushare: evicted, bound |")
            print("|---|---|---|")
            for name in dict.fromkeys(r.case for r in replayed):
                cells = [
                    f"{len(r.evicted)} ({', '.join(r.evicted) or '-'}), {r.bound or 'never'}"
                    for mode in ("kube-scheduler", "gpushare")
                    for r in replayed
                    if r.case == name and r.mode == mode
                ]
                print(f"| {name} | {cells[0]} | {cells[1]} |")
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps([asdict(r) for r in replayed], indent=2))
            return 0
        for round_ in range(args.rounds):
            for mode in args.modes.split(","):
                results.append(run(plane, kube, mode, args, round_))
    print(f"load averages at end: {os.getloadavg()}")
    header = (
        f"{'run':<15}{'bound':>10}{'evictions':>10}{'per bound':>10}{'wasted':>8}"
        f"{'p50 s':>8}{'p99 s':>8}{'over':>6}{'preempt ms':>12}{'filter ms':>11}{'load':>6}"
    )
    print(header)
    for r in results:
        print(
            f"{r.mode:<15}{f'{r.bound}/{r.preemptors}':>10}{r.evictions:>10}{r.per_bound:>10.2f}"
            f"{r.wasted:>8}{r.p50_s:>8.1f}{r.p99_s:>8.1f}{r.overcommitted:>6}"
            f"{r.preempt_ms:>12.1f}{r.filter_ms:>11.1f}{r.load:>6.1f}"
        )
    for mode in args.modes.split(","):
        mine = [r for r in results if r.mode == mode]
        if len(mine) > 1:
            m = statistics.median
            print(
                f"{'median ' + mode[:8]:<15}{'':>10}{m(r.evictions for r in mine):>10.0f}"
                f"{m(r.per_bound for r in mine):>10.2f}{m(r.wasted for r in mine):>8.0f}"
                f"{m(r.p50_s for r in mine):>8.1f}{m(r.p99_s for r in mine):>8.1f}"
                f"{max(r.overcommitted for r in mine):>6}{m(r.preempt_ms for r in mine):>12.1f}"
                f"{m(r.filter_ms for r in mine):>11.1f}{m(r.load for r in mine):>6.1f}"
            )
    print("per-step times of the bound preemptors, s from creation (p50 / p99):")
    for r in results:
        if r.phases is None:
            continue
        f = r.phases
        print(
            f"  {r.mode:<15} refused {_pair(f.refused)}  held {_pair(f.held)} ({f.held_count})"
            f"  nominated {_pair(f.nominated)} ({f.nominated_count})  victims gone "
            f"{_pair(f.victims_gone)}  then bound after {_pair(f.bound_after_victims)}"
        )
        print(f"  {r.mode:<15} extender calls: {r.calls}")
        cycles = ", ".join(f"{k} {n} x {ms:.1f} ms" for k, (n, ms) in r.cycles.items())
        print(f"  {r.mode:<15} kube-scheduler: {cycles}")
        if r.mode == "gpushare":
            for line in r.wasted_why:
                print(f"  {r.mode:<15} wasted: {line}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    ours = [r for r in results if r.mode == "gpushare"]
    kept = all(r.wasted == 0 and r.bound == r.preemptors and not r.overcommitted for r in ours)
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
