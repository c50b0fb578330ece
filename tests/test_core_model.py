"""The unit-free model: validation at construction, free amounts, adding an allocation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.model import (
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.testing.core import gpu_node


def node(
    *capacities: int,
    healthy: tuple[bool, ...] | None = None,
    cpu_milli: int | None = None,
    memory_mib: int | None = None,
) -> Node:
    return gpu_node(
        capacities, name="n", model="A100", healthy=healthy, cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )  # fmt: skip


INVALID: list[tuple[str, Callable[[], object], str]] = [
    ("gpu capacity zero", lambda: Gpu(0, "A100", 0), "capacity must be > 0"),
    ("gpu capacity negative", lambda: Gpu(0, "A100", -1), "capacity must be > 0"),
    ("gpu index negative", lambda: Gpu(-1, "A100", 10), "index must be >= 0"),
    (
        "duplicate gpu indices",
        lambda: Node("n", (Gpu(0, "A100", 10), Gpu(0, "A100", 10))),
        "duplicate GPU indices",
    ),
    (
        "gpus out of index order",
        lambda: Node("n", (Gpu(1, "A100", 10), Gpu(0, "A100", 10))),
        "index order",
    ),
    ("share without count", lambda: ContainerRequest("c", 5, 0), "asks memory, compute or"),
    ("count without share", lambda: ContainerRequest("c", 0, 1), "asks memory, compute or"),
    (
        "compute without count",
        lambda: ContainerRequest("c", 0, 0, compute_milli=300),
        "asks memory, compute or",
    ),
    (
        "compute above one GPU",
        lambda: ContainerRequest("c", 4, 1, compute_milli=1001),
        "compute_milli must be 0..1000",
    ),
    (
        "negative compute",
        lambda: ContainerRequest("c", 4, 1, compute_milli=-1),
        "compute_milli must be 0..1000",
    ),
    (
        "whole GPUs with a memory share",
        lambda: ContainerRequest("c", 4, 1, exclusive=True),
        "exclusive container asks whole GPUs only",
    ),
    (
        "whole GPUs without a count",
        lambda: ContainerRequest("c", 0, 0, exclusive=True),
        "exclusive container asks whole GPUs only",
    ),
    (
        "compute usage for the wrong number of GPUs",
        lambda: NodeState(Node("n", (Gpu(0, "T4", 16),)), (0,), gpu_compute_used=(0, 0)),
        "usage entries",
    ),
    ("negative share", lambda: ContainerRequest("c", -1, 1), "must be >= 0"),
    ("negative count", lambda: ContainerRequest("c", 1, -1), "must be >= 0"),
    (
        "usage entries do not match gpus",
        lambda: NodeState(node(10, 10), (0,)),
        "1 usage entries for 2 GPUs",
    ),
]


@pytest.mark.parametrize(
    ("build", "message"), [(b, m) for _, b, m in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_model_is_rejected_at_construction(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build()


VALID: list[tuple[str, Callable[[], object]]] = [
    ("cpu-only container", lambda: ContainerRequest("c", 0, 0)),
    (
        "compute-only container (openb, Tencent share without memory is refused by its codec)",
        lambda: ContainerRequest("c", 0, 1, compute_milli=300),
    ),
    ("memory and compute", lambda: ContainerRequest("c", 4, 1, compute_milli=1000)),
    ("two whole GPUs", lambda: ContainerRequest("c", 0, 2, exclusive=True)),
    ("node without gpus", lambda: Node("n", ())),
    ("gpu indices with gaps", lambda: Node("n", (Gpu(0, "A100", 1), Gpu(3, "A100", 1)))),
]


@pytest.mark.parametrize("build", [b for _, b in VALID], ids=[i for i, _ in VALID])
def test_valid_model_is_accepted(build: Callable[[], object]) -> None:
    build()


def test_node_gpu_looks_up_by_device_index_not_position() -> None:
    n = Node("n", (Gpu(0, "A100", 1), Gpu(3, "V100", 2)))
    assert n.gpu(3).model == "V100"
    with pytest.raises(KeyError, match="no GPU 1"):
        n.gpu(1)


GPU_FREE = [
    ("empty node is all free", node(16, 16), (0, 0), (16, 16)),
    ("used subtracts per gpu", node(16, 8), (4, 8), (12, 0)),
    ("unhealthy gpu has nothing free", node(16, 16, healthy=(True, False)), (0, 0), (16, 0)),
    ("unhealthy gpu in use has nothing free", node(16, 16, healthy=(False, True)), (4, 4), (0, 12)),
]


SECOND_DIMENSION = [
    # (id, state, memory free, compute free, unused GPUs)
    ("nothing used: all compute free, every GPU unused",
     NodeState(node(16, 16), (0, 0)), (16, 16), (1000, 1000), (True, True)),
    ("compute used on one GPU: it is no longer unused",
     NodeState(node(16, 16), (0, 0), gpu_compute_used=(300, 0)), (16, 16), (700, 1000),
     (False, True)),
    ("a GPU held whole has nothing free in either dimension",
     NodeState(node(16, 16), (16, 0), gpu_compute_used=(1000, 0), gpu_whole=(True, False)),
     (0, 16), (0, 1000), (False, True)),
    ("an unhealthy GPU has no compute free either",
     NodeState(node(16, 16, healthy=(False, True)), (0, 0)), (0, 16), (0, 1000), (False, True)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "free", "compute_free", "unused"),
    [case[1:] for case in SECOND_DIMENSION],
    ids=[case[0] for case in SECOND_DIMENSION],
)
def test_compute_free_and_whole_gpus(
    state: NodeState,
    free: tuple[int, ...],
    compute_free: tuple[int, ...],
    unused: tuple[bool, ...],
) -> None:
    assert state.gpu_free == free
    assert state.gpu_compute_free == compute_free
    assert tuple(state.is_unused(p) for p in range(len(free))) == unused


def test_with_and_without_an_allocation_move_both_dimensions_and_whole_gpus() -> None:
    empty = NodeState.empty(node(16, 16))
    allocation = Allocation(
        "ns/p",
        "n",
        (
            ContainerAllocation("a", (0,), 4, compute_milli=250),
            ContainerAllocation("b", (1,), 16, compute_milli=1000, exclusive=True),
        ),
    )
    held = empty.with_allocation(allocation)
    assert (held.gpu_used, held.gpu_compute_used, held.gpu_whole) == (
        (4, 16), (250, 1000), (False, True),
    )  # fmt: skip
    assert held.without(allocation) == empty


@pytest.mark.parametrize(
    ("n", "used", "free"),
    [(n, u, f) for _, n, u, f in GPU_FREE],
    ids=[i for i, *_ in GPU_FREE],
)
def test_gpu_free(n: Node, used: tuple[int, ...], free: tuple[int, ...]) -> None:
    assert NodeState(n, used).gpu_free == free


@pytest.mark.parametrize(
    ("n", "cpu_free", "memory_free"),
    [(node(16), None, None), (node(16, cpu_milli=4000, memory_mib=8192), 3000, 4096)],
    ids=["unconstrained node reports None", "constrained node reports the difference"],
)
def test_cpu_and_memory_free(n: Node, cpu_free: int | None, memory_free: int | None) -> None:
    state = NodeState(n, (0,), cpu_used_milli=1000, memory_used_mib=4096)
    assert state.cpu_free_milli == cpu_free
    assert state.memory_free_mib == memory_free


def test_with_allocation_adds_per_gpu_by_device_index() -> None:
    n = Node("n", (Gpu(0, "A100", 16), Gpu(2, "A100", 16)))
    allocation = Allocation(
        pod="ns/p",
        node="n",
        containers=(
            ContainerAllocation("a", (2,), 4),
            ContainerAllocation("b", (0, 2), 3),
        ),
        cpu_milli=500,
        memory_mib=256,
    )
    before = NodeState.empty(n)
    after = before.with_allocation(allocation, tag="train")
    assert after.gpu_used == (3, 7)
    assert after.gpu_free == (13, 9)
    assert (after.cpu_used_milli, after.memory_used_mib) == (500, 256)
    assert dict(after.workload_tags) == {"train": 1}
    assert after.tags_key == (("train", 1),)
    assert before.gpu_used == (0, 0), "with_allocation must not change the original"


def test_with_allocation_counts_tags() -> None:
    state = NodeState.empty(node(16))
    allocation = Allocation("ns/p", "n", (ContainerAllocation("a", (0,), 1),))
    twice = state.with_allocation(allocation, "t").with_allocation(allocation, "t")
    assert dict(twice.workload_tags) == {"t": 2}
    assert twice.with_allocation(allocation).tags_key == (("t", 2),)


def test_pod_request_totals_and_shape() -> None:
    pod = PodRequest(
        key="ns/p",
        containers=(
            ContainerRequest("gpu2", 4, 2),
            ContainerRequest("cpu", 0, 0),
            ContainerRequest("gpu1", 3),
        ),
    )
    assert pod.gpu_total == 11
    assert [c.name for c in pod.gpu_containers] == ["gpu2", "gpu1"]
    renamed = PodRequest(key="ns/q", containers=pod.containers)
    assert renamed.shape == pod.shape


@given(
    capacities=st.lists(st.integers(1, 64), min_size=1, max_size=6),
    data=st.data(),
)
def test_with_allocation_sums_like_per_gpu(capacities: list[int], data: st.DataObject) -> None:
    n = node(*capacities)
    containers = data.draw(
        st.lists(
            st.builds(
                ContainerAllocation,
                container=st.text(min_size=1, max_size=3),
                gpu_indices=st.lists(
                    st.integers(0, len(capacities) - 1), unique=True, max_size=len(capacities)
                ).map(tuple),
                gpu_share=st.integers(0, 64),
            ),
            max_size=4,
        )
    )
    allocation = Allocation("ns/p", "n", tuple(containers))
    after = NodeState.empty(n).with_allocation(allocation)
    per_gpu = allocation.per_gpu()
    assert after.gpu_used == tuple(per_gpu.get(i, 0) for i in range(len(capacities)))


def test_without_removes_the_pods_own_allocation_on_its_node_only() -> None:
    state = NodeState(node(16, 16), (10, 4), cpu_used_milli=500)
    own = Allocation(
        "ns/p", "n", (ContainerAllocation("c0", (0, 1), 4),), cpu_milli=200, memory_mib=0
    )
    assert state.without(own) == NodeState(node(16, 16), (6, 0), cpu_used_milli=300)
    assert state.without(None) is state
    assert state.without(Allocation("ns/p", "elsewhere", own.containers)) is state
