"""The share view library (``libgpushare-share.so``) against stub drivers: no GPU needed.

A program in a container that preloads the library sees its memory share of each GPU listed in
``GPUSHARE_SHARE_MIB`` wherever it looks (``dlsym``, ``cuGetProcAddress`` and its ``_v2``, NVML
and its ``_v2``), is refused allocations past it with ``GPUSHARE_SHARE_ENFORCE=1``, and counts
its use together with the container's other processes through ``GPUSHARE_SHARE_STATE``. Bad
input leaves the process as it was, with one line on stderr. The stubs and the reader are
``tests/native``; :mod:`gpushare.testing.native` builds and runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpushare.testing.native import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_PATHS,
    LIBRARY_PREFIX,
    MIB,
    AllocKind,
    AllocPlan,
    DeviceView,
    NativeTools,
    Reading,
    StubGpu,
    Via,
    build_share_library,
    build_tools,
    holding_reader,
    racing_readers,
    read_share,
    share_env,
    stub_env,
    stub_uuid,
)

CARD_A = StubGpu(stub_uuid(0xA), 16384)
CARD_B = StubGpu(stub_uuid(0xB), 8192)
A = CARD_A.uuid
B = CARD_B.uuid
KINDS: tuple[AllocKind, ...] = ("alloc", "pitch", "managed", "async", "pool", "create")
VIAS: tuple[Via, ...] = ("dlsym", "proc", "proc-ptsz")


@pytest.fixture(scope="session")
def tools(tmp_path_factory: pytest.TempPathFactory) -> NativeTools:
    return build_tools(tmp_path_factory.mktemp("share-view-tools"))


@pytest.fixture(scope="session")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_share_library(tmp_path_factory.mktemp("share-view-library"))


Seen = tuple[int, int]
"""(total MiB, free MiB) a device shows."""


def observed(view: DeviceView, *, nvml: bool = True) -> dict[str, dict[str, float]]:
    """Every path's reading of ``view`` in MiB, keyed by path (a failing case shows which)."""
    seen: dict[str, dict[str, float]] = {
        path: {"device_total": m.device_total / MIB, "total": m.total / MIB, "free": m.free / MIB}
        for path, m in view.cuda.items()
    }
    if nvml:
        for path, memory in (("nvml", view.nvml), ("nvml_v2", view.nvml_v2)):
            assert memory is not None, f"NVML has no device {view.uuid}"
            seen[path] = {"total": memory.total / MIB, "free": memory.free / MIB}
            seen[path]["used"] = memory.used / MIB
            if memory.reserved is not None:
                seen[path]["reserved"] = memory.reserved / MIB
    return seen


def expected(total_mib: int, free_mib: int, *, nvml: bool = True) -> dict[str, dict[str, float]]:
    """``observed`` of a device showing ``total_mib`` with ``free_mib`` free on every path
    (NVML: the rest used, nothing reserved)."""
    seen: dict[str, dict[str, float]] = {
        path: {"device_total": total_mib, "total": total_mib, "free": free_mib}
        for path in CUDA_PATHS
    }
    if nvml:
        used = total_mib - free_mib
        seen["nvml"] = {"total": total_mib, "free": free_mib, "used": used}
        seen["nvml_v2"] = {"total": total_mib, "free": free_mib, "used": used, "reserved": 0}
    return seen


def assert_silent(reading: Reading) -> None:
    assert reading.stderr == "", "the library writes nothing when all is well"


def assert_one_line(reading: Reading, naming: str | None = None) -> None:
    lines = reading.stderr.splitlines()
    assert len(lines) == 1, f"exactly one stderr line, got {lines}"
    assert lines[0].startswith(LIBRARY_PREFIX), lines
    if naming is not None:
        assert naming in lines[0], f"the line names {naming}: {lines[0]}"


@dataclass(frozen=True)
class ViewCase:
    """The library preloaded (or not) with ``env`` on ``gpus``: each UUID of ``seen`` shows
    (total, free) MiB on every path; only the CUDA paths when ``nvml`` is false."""

    env: Mapping[str, str]
    seen: Mapping[str, Seen]
    gpus: tuple[StubGpu, ...] = (CARD_A,)
    preload: bool = True
    others_used_mib: int | None = None
    nvml: bool = True


VIEW_CASES = [
    pytest.param(
        ViewCase(share_env({A: 4096}), {A: (16384, 16384)}, preload=False),
        id="without the library the stubs' whole card is seen",
    ),
    pytest.param(
        ViewCase(share_env({A: 4096}), {A: (4096, 4096)}),
        id="every path (dlsym, cuGetProcAddress, _v2, chained, NVML, NVML _v2) shows the share",
    ),
    pytest.param(
        ViewCase(
            share_env({A: 4096, B: 2048}),
            {A: (4096, 4096), B: (2048, 2048)},
            gpus=(CARD_A, CARD_B),
        ),
        id="two GPUs with different shares",
    ),
    pytest.param(
        ViewCase(
            share_env({B: 2048}),
            {A: (16384, 16384), B: (2048, 2048)},
            gpus=(CARD_A, CARD_B),
        ),
        id="a GPU not listed is untouched",
    ),
    pytest.param(
        ViewCase({}, {A: (16384, 16384)}),
        id="no variable: untouched (a whole-GPU pod)",
    ),
    pytest.param(
        ViewCase({"GPUSHARE_SHARE_MIB": ""}, {A: (16384, 16384)}),
        id="an empty variable: untouched",
    ),
    pytest.param(
        ViewCase(share_env({A: 4096}), {A: (4096, 4096)}, others_used_mib=8192),
        id="other tenants leaving room: the whole share is free, NVML's used is the container's",
    ),
    pytest.param(
        ViewCase(
            share_env({A: 4096}),
            {A: (4096, 2048)},
            others_used_mib=14336,
            nvml=False,
        ),
        id="other tenants leaving less than the share: free is what the card has",
    ),
]


@pytest.mark.parametrize("case", VIEW_CASES)
def test_view(case: ViewCase, tools: NativeTools, library: Path, tmp_path: Path) -> None:
    env = {
        **stub_env(case.gpus, others_used_mib=case.others_used_mib),
        **case.env,
        "GPUSHARE_SHARE_STATE": str(tmp_path / "usage"),
    }
    reading = read_share(tools, env, library=library if case.preload else None)
    assert [d.uuid for d in reading.devices] == [g.uuid for g in case.gpus]
    for uuid, (total, free) in case.seen.items():
        got = observed(reading.device(uuid), nvml=case.nvml)
        assert got == expected(total, free, nvml=case.nvml), uuid
    assert_silent(reading)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        pytest.param({"GPUSHARE_SHARE_MIB": "garbage"}, "GPUSHARE_SHARE_MIB", id="not uuid=MiB"),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": f"{A}=4GiB"}, "GPUSHARE_SHARE_MIB", id="MiB not a number"
        ),
        pytest.param({"GPUSHARE_SHARE_MIB": f"{A}="}, "GPUSHARE_SHARE_MIB", id="MiB missing"),
        pytest.param({"GPUSHARE_SHARE_MIB": f"{A}=-4096"}, "GPUSHARE_SHARE_MIB", id="negative MiB"),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": f"{A}=99999999999999999999999"},
            "GPUSHARE_SHARE_MIB",
            id="MiB past 64 bits",
        ),
        pytest.param({"GPUSHARE_SHARE_MIB": "=4096"}, "GPUSHARE_SHARE_MIB", id="UUID missing"),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": "GPU-5707ab00=4096"}, "GPUSHARE_SHARE_MIB", id="UUID cut short"
        ),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": f"{A}:4096"}, "GPUSHARE_SHARE_MIB", id="colon instead of ="
        ),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": f"{A}=4096,{B}=x"},
            "GPUSHARE_SHARE_MIB",
            id="second item malformed: the first is not applied either",
        ),
        pytest.param(
            {"GPUSHARE_SHARE_MIB": f"{A}=4096", "GPUSHARE_SHARE_ENFORCE": "yes"},
            "GPUSHARE_SHARE_ENFORCE",
            id="ENFORCE neither 0 nor 1",
        ),
    ],
)
def test_malformed_variable_leaves_the_process_unchanged(
    env: Mapping[str, str], variable: str, tools: NativeTools, library: Path, tmp_path: Path
) -> None:
    full = {
        **stub_env((CARD_A, CARD_B)),
        "GPUSHARE_SHARE_STATE": str(tmp_path / "usage"),
        **env,
    }
    reading = read_share(tools, full, library=library, alloc=AllocPlan(1024, max_count=20))
    assert observed(reading.device(A)) == expected(16384, 16384)
    assert observed(reading.device(B)) == expected(8192, 8192)
    assert reading.alloc is not None
    assert reading.alloc.rounds[0].count == 16, "nothing enforced: the card's 16 GiB"
    assert_one_line(reading, naming=variable)


@dataclass(frozen=True)
class AllocCase:
    """``plan`` (two rounds) under ``shares``: each round's count and stopping CUresult, and
    the (total, free) MiB every CUDA path shows with the round's allocations held."""

    plan: AllocPlan
    enforce: bool | None
    counts: int
    stopped_by: int
    seen_held: Seen
    shares: Mapping[str, int] = field(default_factory=lambda: {A: 4096})
    preload: bool = True
    others_used_mib: int | None = None


def _enforced(kind: AllocKind, via: Via) -> object:
    return pytest.param(
        AllocCase(
            AllocPlan(1024, kind=kind, via=via, max_count=16, rounds=2),
            enforce=True,
            counts=4,
            stopped_by=CUDA_ERROR_OUT_OF_MEMORY,
            seen_held=(4096, 0),
        ),
        id=f"enforced, {kind} via {via}: the fourth GiB fills the 4 GiB share, the fifth is "
        "refused, frees give it back",
    )


ALLOC_CASES = [
    *(_enforced(kind, via) for via in VIAS for kind in KINDS),
    pytest.param(
        AllocCase(AllocPlan(1500, rounds=2), True, 2, CUDA_ERROR_OUT_OF_MEMORY, (4096, 1096)),
        id="enforced: 3000 MiB of 4096 held, the next 1500 would pass the share",
    ),
    pytest.param(
        AllocCase(AllocPlan(1024, max_count=6, rounds=2), None, 6, 0, (4096, 0)),
        id="view only: allocations pass the share, free shows 0 (not wrapped around)",
    ),
    pytest.param(
        AllocCase(AllocPlan(1024, max_count=6, rounds=2), False, 6, 0, (4096, 0)),
        id="ENFORCE=0 is view only",
    ),
    pytest.param(
        AllocCase(AllocPlan(1024, device=1, max_count=6, rounds=2), True, 6, 0, (8192, 2048)),
        id="enforced: a GPU not listed is not limited",
    ),
    pytest.param(
        AllocCase(
            AllocPlan(1024, rounds=2),
            True,
            2,
            CUDA_ERROR_OUT_OF_MEMORY,
            (4096, 0),
            others_used_mib=14336,
        ),
        id="enforced: other tenants fill the card first, the card refuses",
    ),
    pytest.param(
        AllocCase(
            AllocPlan(1024, rounds=2),
            True,
            16,
            CUDA_ERROR_OUT_OF_MEMORY,
            (16384, 0),
            preload=False,
        ),
        id="without the library the stub card refuses past its 16 GiB",
    ),
]


@pytest.mark.parametrize("case", ALLOC_CASES)
def test_allocation(case: AllocCase, tools: NativeTools, library: Path, tmp_path: Path) -> None:
    env = {
        **stub_env((CARD_A, CARD_B), others_used_mib=case.others_used_mib),
        **share_env(case.shares, enforce=case.enforce, state=tmp_path / "usage"),
    }
    reading = read_share(tools, env, library=library if case.preload else None, alloc=case.plan)
    assert reading.alloc is not None
    for number, round_ in enumerate(reading.alloc.rounds):
        got = (round_.count, round_.stopped_by, round_.freed)
        assert got == (case.counts, case.stopped_by, case.counts), f"round {number}"
        total, free = case.seen_held
        assert observed(round_.view, nvml=False) == expected(total, free, nvml=False)
    assert_silent(reading)


@dataclass(frozen=True)
class SharingCase:
    """A first process holds 3 GiB of a 4 GiB share (state file ``usage``) while a second,
    with the same state file or another, reads ``free_mib`` and allocates ``count`` GiB; then
    the first frees and exits, or is killed holding them: a third sees the whole share."""

    same_state: bool
    free_mib: int
    count: int
    killed: bool = False


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            SharingCase(True, 1024, 1), id="one state file: the second process sees the first's use"
        ),
        pytest.param(SharingCase(False, 4096, 4), id="two state files: each process counts alone"),
        pytest.param(
            SharingCase(True, 1024, 1, killed=True),
            id="a process killed holding memory no longer counts",
        ),
    ],
)
def test_processes_of_a_container_count_together(
    case: SharingCase, tools: NativeTools, library: Path, tmp_path: Path
) -> None:
    def env(state: str) -> dict[str, str]:
        shares = share_env({A: 4096}, enforce=True, state=tmp_path / state)
        return {**stub_env((CARD_A,)), **shares}

    second = "usage" if case.same_state else "other-usage"
    plan = AllocPlan(1024, max_count=3)
    with holding_reader(tools, env("usage"), library=library, alloc=plan) as first:
        assert first.reading.alloc is not None
        assert first.reading.alloc.rounds[0].count == 3
        reading = read_share(tools, env(second), library=library, alloc=AllocPlan(1024))
        assert observed(reading.device(A)) == expected(4096, case.free_mib)
        assert reading.alloc is not None
        assert reading.alloc.rounds[0].count == case.count
        assert_silent(first.reading)
        assert_silent(reading)
        if case.killed:
            first.kill()
    after = read_share(tools, env(second), library=library)
    assert observed(after.device(A)) == expected(4096, 4096), "the first's use is gone"


@pytest.mark.parametrize(
    "processes", [pytest.param(2, id="two processes"), pytest.param(4, id="four processes")]
)
def test_processes_racing_to_the_share_never_pass_it_together(
    processes: int, tools: NativeTools, library: Path, tmp_path: Path
) -> None:
    env = {**stub_env((CARD_A,)), **share_env({A: 4096}, enforce=True, state=tmp_path / "usage")}
    plan = AllocPlan(1, max_count=8192)
    readings = racing_readers(tools, env, library=library, alloc=plan, processes=processes)
    rounds = [r.alloc.rounds[0] for r in readings if r.alloc is not None]
    assert [r.stopped_by for r in rounds] == [CUDA_ERROR_OUT_OF_MEMORY] * processes
    counts = [r.count for r in rounds]
    assert sum(counts) <= 4096, f"{counts} MiB held together on a 4096 MiB share"
    # A refusal may come from another process's allocation in flight (counted, then taken
    # back): each process loses at most one MiB that way.
    assert sum(counts) >= 4096 - processes, counts
    for reading in readings:
        assert_silent(reading)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("under a regular file", id="a state path under a regular file"),
        pytest.param("a directory", id="a state path that is a directory"),
    ],
)
def test_unwritable_state_path_still_shows_and_enforces_the_share(
    kind: str, tools: NativeTools, library: Path, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "usage" if kind == "under a regular file" else tmp_path
    env = {**stub_env((CARD_A,)), **share_env({A: 4096}, enforce=True, state=state)}
    reading = read_share(tools, env, library=library, alloc=AllocPlan(1024, max_count=16))
    assert observed(reading.device(A)) == expected(4096, 4096)
    assert reading.alloc is not None
    assert reading.alloc.rounds[0].count == 4, "counted in the process alone"
    assert_one_line(reading, naming="GPUSHARE_SHARE_STATE")
