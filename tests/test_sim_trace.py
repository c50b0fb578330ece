"""The openb trace loader: the embedded and real traces load; every bad input is one TraceError
that names the file, the line, the column and the value."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.sim.trace import (
    EMBEDDED_WORKLOAD,
    NODE_FILE,
    Trace,
    TraceError,
    available_workloads,
    embedded_trace_dir,
    load_embedded_trace,
    load_nodes,
    load_pods,
    load_trace,
)

REPO = Path(__file__).resolve().parents[1]
REAL_TRACE_DIR = (REPO / ".." / "shared" / "traces" / "openb").resolve()
GENERATOR = REPO / "bench" / "make_embedded_trace.py"

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
POD_HEADER_FULL = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
GOOD_NODE = "n0,96000,393216,8,A8"
GOOD_POD = "p0,4000,8192,1,500"
POD_FILE = "openb_pod_list_case.csv"


def _kind(pod: PodRequest) -> str:
    container = pod.containers[0]
    if container.gpu_count == 0:
        return "cpu"
    if container.gpu_count == 1:
        return "share" if container.gpu_share < 1000 else "one"
    return "multi"


# --- loading good traces ---------------------------------------------------------------------


def test_embedded_trace_loads_with_the_expected_mix() -> None:
    trace = load_embedded_trace()
    assert trace.workload == EMBEDDED_WORKLOAD == "default"
    assert trace.node_path == embedded_trace_dir() / NODE_FILE
    assert len(trace.nodes) == 120
    assert len(trace.pods) == 820
    assert all(isinstance(node, Node) for node in trace.nodes)
    assert all(isinstance(pod, PodRequest) for pod in trace.pods)
    assert {gpu.capacity for node in trace.nodes for gpu in node.gpus} == {1000}
    assert {len(node.gpus) for node in trace.nodes} == {1, 2, 4, 8}
    assert trace.gpu_capacity_milli == 624_000
    assert 0.95 <= trace.gpu_request_milli / trace.gpu_capacity_milli <= 1.0
    kinds = [_kind(pod) for pod in trace.pods]
    assert (kinds.count("cpu"), kinds.count("share"), kinds.count("multi")) == (107, 312, 8)
    constrained = [pod for pod in trace.pods if pod.containers[0].allowed_models]
    assert 0.05 <= len(constrained) / (len(kinds) - kinds.count("cpu")) <= 0.15
    assert all("T4" in pod.containers[0].allowed_models for pod in constrained)


def test_embedded_csvs_are_what_the_generator_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for name in (NODE_FILE, "openb_pod_list_default.csv"):
        assert (tmp_path / name).read_bytes() == (embedded_trace_dir() / name).read_bytes(), name


@dataclass(frozen=True)
class RealCase:
    workload: str
    pods: int
    gpu_request_milli: int


@pytest.mark.parametrize(
    "case",
    [
        RealCase("default", 8_152, 6_086_800),
        RealCase("multigpu20", 8_324, 7_086_800),
    ],
    ids=["default", "multigpu20-five-columns"],
)
def test_real_openb_trace(case: RealCase) -> None:
    if not REAL_TRACE_DIR.is_dir():
        pytest.skip(f"the real openb trace is not present at {REAL_TRACE_DIR}")
    trace = load_trace(REAL_TRACE_DIR, case.workload)
    assert len(trace.nodes) == 1_213
    assert sum(len(node.gpus) for node in trace.nodes) == 6_212
    assert trace.gpu_capacity_milli == 6_212_000
    assert len(trace.pods) == case.pods
    assert trace.gpu_request_milli == case.gpu_request_milli
    kinds = [_kind(pod) for pod in trace.pods[:8_152]]
    assert (kinds.count("cpu"), kinds.count("share"), kinds.count("one")) == (1_088, 3_078, 3_911)
    assert trace.pods[0] == PodRequest(
        key="openb-pod-0000",
        containers=(ContainerRequest(name="main", gpu_share=1000, gpu_count=1),),
        cpu_milli=12_000,
        memory_mib=16_384,
    )
    assert not any(pod.containers[0].allowed_models for pod in trace.pods)
    assert {"default", "multigpu20"} <= set(available_workloads(REAL_TRACE_DIR))


# --- row shapes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRow:
    text: str
    expected: PodRequest


@pytest.mark.parametrize(
    "case",
    [
        PodRow(
            "c,2000,4096,0,0,,BE,Running,0,10,0",
            PodRequest("c", (ContainerRequest("main", 0, 0),), 2000, 4096),
        ),
        PodRow(
            "s,2000,4096,1,470,,LS,Running,0,10,0",
            PodRequest("s", (ContainerRequest("main", 470, 1),), 2000, 4096),
        ),
        PodRow(
            "w,2000,4096,8,1000,,LS,Pending,0,10,",
            PodRequest("w", (ContainerRequest("main", 1000, 8),), 2000, 4096),
        ),
        PodRow(
            "t,2000,4096,1,1000,V100M16|V100M32,LS,Running,0,10,0",
            PodRequest(
                "t",
                (ContainerRequest("main", 1000, 1, frozenset({"V100M16", "V100M32"})),),
                2000,
                4096,
            ),
        ),
        PodRow(
            'q,2000,4096,1,250,"T4|P100",LS,Running,0,10,0',
            PodRequest(
                "q", (ContainerRequest("main", 250, 1, frozenset({"T4", "P100"})),), 2000, 4096
            ),
        ),
    ],
    ids=["cpu-only", "sharing", "eight-gpus", "gpu-spec", "quoted-gpu-spec"],
)
def test_pod_row_becomes_request(tmp_path: Path, case: PodRow) -> None:
    path = tmp_path / POD_FILE
    path.write_text(f"{POD_HEADER_FULL}\n{case.text}\n")
    assert load_pods(path) == [case.expected]


def test_crlf_bom_and_blank_lines_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / POD_FILE
    path.write_bytes(f"\ufeff{POD_HEADER}\r\n{GOOD_POD}\r\n\r\np1,1,1,0,0\r\n".encode())
    assert [pod.key for pod in load_pods(path)] == ["p0", "p1"]


def test_cpu_only_node_may_have_no_model(tmp_path: Path) -> None:
    path = tmp_path / NODE_FILE
    path.write_text(f"{NODE_HEADER}\nc0,32000,65536,0,\n{GOOD_NODE}\n")
    nodes = load_nodes(path)
    assert nodes[0] == Node(name="c0", gpus=(), cpu_milli=32000, memory_mib=65536)
    assert [gpu.index for gpu in nodes[1].gpus] == list(range(8))
    assert {gpu.model for gpu in nodes[1].gpus} == {"A8"}


# --- bad input -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """``text`` written to ``file``; the error must point at ``line``/``column``/``value``."""

    file: str
    text: str
    line: int
    column: str | None
    value: str | None
    says: str


def _pods(*rows: str, header: str = POD_HEADER) -> str:
    return "\n".join((header, *rows)) + "\n"


def _nodes(*rows: str, header: str = NODE_HEADER) -> str:
    return "\n".join((header, *rows)) + "\n"


BAD_CASES = {
    # pods: ranges
    "pod-gpu-milli-above-1000": Bad(
        POD_FILE,
        _pods(GOOD_POD, "p1,1000,1024,1,1200"),
        3,
        "gpu_milli",
        "1200",
        "is out of range; accepted: an integer from 0 to 1000",
    ),
    "pod-negative-cpu": Bad(POD_FILE, _pods("p1,-1,1024,0,0"), 2, "cpu_milli", "-1", "range"),
    "pod-negative-memory": Bad(
        POD_FILE, _pods(GOOD_POD, "p1,1,-1024,0,0"), 3, "memory_mib", "-1024", "range"
    ),
    "pod-num-gpu-above-64": Bad(
        POD_FILE, _pods("p1,1,1,65,1000"), 2, "num_gpu", "65", "from 0 to 64"
    ),
    "pod-num-gpu-negative": Bad(POD_FILE, _pods("p1,1,1,-1,1000"), 2, "num_gpu", "-1", "range"),
    "pod-int64-overflow": Bad(
        POD_FILE,
        _pods("p1,99999999999999999999,1,0,0"),
        2,
        "cpu_milli",
        "99999999999999999999",
        "range",
    ),
    "pod-gpus-with-zero-milli": Bad(
        POD_FILE, _pods(GOOD_POD, "p1,1,1,2,0"), 3, "gpu_milli", "0", "while num_gpu is 2"
    ),
    "pod-share-on-multi-gpu": Bad(
        POD_FILE, _pods("p1,1,1,2,500"), 2, "gpu_milli", "500", "below 1000 while num_gpu is 2"
    ),
    "pod-milli-without-gpu": Bad(
        POD_FILE, _pods("p1,1,1,0,300"), 2, "gpu_milli", "300", "while num_gpu is 0"
    ),
    "pod-empty-model-in-spec": Bad(
        POD_FILE,
        _pods("p1,1,1,1,1000,T4||P100,LS,Running,0,1,0", header=POD_HEADER_FULL),
        2,
        "gpu_spec",
        "T4||P100",
        "empty model name",
    ),
    # pods: malformed rows
    "pod-cpu-not-integer": Bad(
        POD_FILE, _pods("p1,1.5,1,0,0"), 2, "cpu_milli", "1.5", "not an integer"
    ),
    "pod-num-gpu-not-integer": Bad(
        POD_FILE,
        _pods(GOOD_POD, GOOD_POD.replace("p0", "p1"), "p2,1,1,two,0"),
        4,
        "num_gpu",
        "two",
        "not an integer",
    ),
    "pod-too-few-fields": Bad(
        POD_FILE,
        _pods(GOOD_POD, "p1,1000,1024"),
        3,
        None,
        "p1,1000,1024",
        "missing num_gpu,gpu_milli",
    ),
    "pod-too-many-fields": Bad(
        POD_FILE, _pods("p1,1,1,0,0,x"), 2, None, "p1,1,1,0,0,x", "has 6 fields"
    ),
    "pod-duplicate-name": Bad(
        POD_FILE,
        _pods(GOOD_POD, "p1,1,1,0,0", GOOD_POD),
        4,
        "name",
        "p0",
        "repeats the name on line 2",
    ),
    "pod-empty-name": Bad(POD_FILE, _pods(",1,1,0,0"), 2, "name", "", "is empty"),
    "pod-blank-lines-keep-line-numbers": Bad(
        POD_FILE, f"{POD_HEADER}\n\n{GOOD_POD}\n\np1,1,1,0,5\n", 5, "gpu_milli", "5", "num_gpu is 0"
    ),
    "pod-quoted-bad-value": Bad(
        POD_FILE, _pods('"p1","1","1","1","2000"'), 2, "gpu_milli", "2000", "range"
    ),
    # pods: header and file
    "pod-missing-column": Bad(
        POD_FILE,
        _pods("p1,1,1,0", header="name,cpu_milli,memory_mib,num_gpu"),
        1,
        "gpu_milli",
        None,
        "missing",
    ),
    "pod-unknown-column": Bad(
        POD_FILE,
        _pods("p1,1,1,0,0,red", header=f"{POD_HEADER},colour"),
        1,
        "colour",
        "colour",
        "not a known column",
    ),
    "pod-duplicate-column": Bad(
        POD_FILE,
        _pods("p1,1,1,0,0,0", header=f"{POD_HEADER},num_gpu"),
        1,
        "num_gpu",
        "num_gpu",
        "twice",
    ),
    "pod-empty-file": Bad(POD_FILE, "", 1, None, None, "is empty"),
    "pod-header-only": Bad(POD_FILE, f"{POD_HEADER}\n", 2, None, None, "no pod rows"),
    # nodes
    "node-gpu-above-64": Bad(NODE_FILE, _nodes("n1,1,1,65,A8"), 2, "gpu", "65", "from 0 to 64"),
    "node-gpu-negative": Bad(NODE_FILE, _nodes(GOOD_NODE, "n1,1,1,-2,A8"), 3, "gpu", "-2", "range"),
    "node-gpus-without-model": Bad(
        NODE_FILE, _nodes("n1,1,1,2,"), 2, "model", "", "is empty while gpu is 2"
    ),
    "node-model-with-pipe": Bad(NODE_FILE, _nodes("n1,1,1,2,T4|P1"), 2, "model", "T4|P1", "'|'"),
    "node-negative-cpu": Bad(
        NODE_FILE, _nodes("n1,-96000,1,8,A8"), 2, "cpu_milli", "-96000", "range"
    ),
    "node-memory-not-integer": Bad(
        NODE_FILE, _nodes("n1,1,1GiB,8,A8"), 2, "memory_mib", "1GiB", "not an integer"
    ),
    "node-duplicate-name": Bad(
        NODE_FILE, _nodes(GOOD_NODE, GOOD_NODE), 3, "sn", "n0", "repeats the name on line 2"
    ),
    "node-malformed-row": Bad(NODE_FILE, _nodes("n1,1,1,8"), 2, None, "n1,1,1,8", "missing model"),
    "node-missing-column": Bad(
        NODE_FILE,
        _nodes("n1,1,1,8", header="sn,cpu_milli,memory_mib,gpu"),
        1,
        "model",
        None,
        "missing",
    ),
    "node-unknown-column": Bad(
        NODE_FILE,
        _nodes("n1,1,1,8,A8,x", header=f"{NODE_HEADER},rack"),
        1,
        "rack",
        "rack",
        "not a known",
    ),
    "node-empty-file": Bad(NODE_FILE, "\n\n", 1, None, None, "is empty"),
}


@pytest.mark.parametrize("case", list(BAD_CASES.values()), ids=list(BAD_CASES))
def test_bad_input_is_one_trace_error_at_its_position(tmp_path: Path, case: Bad) -> None:
    path = tmp_path / case.file
    path.write_text(case.text)
    loader = load_nodes if case.file == NODE_FILE else load_pods
    with pytest.raises(TraceError) as caught:
        loader(path)
    error = caught.value
    message = str(error)
    assert isinstance(error, ValueError)
    assert error.path == path
    assert message.startswith(f"{path}:{case.line}: "), message
    assert error.problems[0].line == case.line
    if case.column is not None:
        assert f"column {case.column}: " in message
        assert error.problems[0].column == case.column
    if case.value is not None:
        assert f"value {case.value!r} " in message
    assert case.says in message
    assert "accepted: " in message


def test_non_utf8_is_reported_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / POD_FILE
    path.write_bytes(f"{POD_HEADER}\n{GOOD_POD}\np\xff,1,1,0,0\n".encode("latin-1"))
    with pytest.raises(TraceError, match=rf"{POD_FILE}:3: has bytes that are not UTF-8") as caught:
        load_pods(path)
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)


def test_several_problems_listed_in_line_order_up_to_five(tmp_path: Path) -> None:
    path = tmp_path / POD_FILE
    rows = [f"p{i},1,1,0,{i + 1}" for i in range(7)]  # milli without GPU on every row
    rows.insert(3, "p9,-1,1,0,0")
    path.write_text(_pods(*rows))
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    error = caught.value
    assert error.total == 8
    assert [p.line for p in error.problems] == [2, 3, 4, 5, 6]
    assert error.problems[3].column == "cpu_milli"
    lines = str(error).splitlines()
    assert len(lines) == 6
    assert lines[-1] == f"... and 3 more problems in {path}"


def test_trace_error_survives_pickling(tmp_path: Path) -> None:
    path = tmp_path / POD_FILE
    path.write_text(_pods("p1,1,1,0,7"))
    with pytest.raises(TraceError) as caught:
        load_pods(path)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert str(copy) == str(caught.value)
    assert copy.problems == caught.value.problems


# --- files and directories -------------------------------------------------------------------


def _trace_dir(tmp_path: Path, *workloads: str, nodes: bool = True) -> Path:
    if nodes:
        (tmp_path / NODE_FILE).write_text(_nodes(GOOD_NODE))
    for workload in workloads:
        (tmp_path / f"openb_pod_list_{workload}.csv").write_text(_pods(GOOD_POD))
    return tmp_path


@dataclass(frozen=True)
class DirCase:
    workloads: tuple[str, ...]
    nodes: bool
    sub: str  # directory under tmp_path passed to load_trace
    workload: str
    says: tuple[str, ...]


@pytest.mark.parametrize(
    "case",
    [
        DirCase((), False, "absent", "default", ("absent: does not exist",)),
        DirCase(
            ("default", "gpushare40"),
            True,
            "",
            "gpushare41",
            (
                "has no workload 'gpushare41'",
                "openb_pod_list_gpushare41.csv",
                "default, gpushare40",
            ),
        ),
        DirCase((), True, "", "default", ("has no workload 'default'", "no pod lists")),
        DirCase(("default",), False, "", "default", (f"{NODE_FILE}: does not exist",)),
        DirCase(("default",), True, NODE_FILE, "default", ("is not a directory",)),
    ],
    ids=[
        "missing-directory",
        "unknown-workload",
        "no-workloads",
        "missing-node-file",
        "file-not-dir",
    ],
)
def test_bad_trace_directory(tmp_path: Path, case: DirCase) -> None:
    _trace_dir(tmp_path, *case.workloads, nodes=case.nodes)
    with pytest.raises(TraceError) as caught:
        load_trace(tmp_path / case.sub if case.sub else tmp_path, case.workload)
    for text in case.says:
        assert text in str(caught.value)


def test_missing_file_and_directory_as_file_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist") as caught:
        load_nodes(tmp_path / NODE_FILE)
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    with pytest.raises(TraceError, match="is a directory"):
        load_pods(tmp_path)


def test_load_trace_and_available_workloads(tmp_path: Path) -> None:
    _trace_dir(tmp_path, "gpushare40", "default")
    (tmp_path / "openb_pod_list_notes.txt").write_text("not a pod list")
    assert available_workloads(tmp_path) == ["default", "gpushare40"]
    trace = load_trace(tmp_path, "gpushare40")
    assert isinstance(trace, Trace)
    assert trace.pod_path == tmp_path / "openb_pod_list_gpushare40.csv"
    assert [pod.key for pod in trace.pods] == ["p0"]
    assert [node.name for node in trace.nodes] == ["n0"]
    assert trace.gpu_capacity_milli == 8000
    assert trace.gpu_request_milli == 500
