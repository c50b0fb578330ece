"""What the DRA kubelet plugin prepares for a claim (``gpushare.dra.prepare``): the allocation read
and checked, and the CDI spec its containers get. Over real gRPC with claims kube-scheduler
allocated: tests/cluster/test_dra_allocation.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.plugin import cdi_spec_path
from gpushare.dra.prepare import (
    CDI_KIND,
    ClaimError,
    cdi_device_id,
    cdi_spec,
    prepared_claim,
)
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.dra import allocated_claim, result

GPUS = [
    PhysicalGpu(0, "GPU-a", 0, "Tesla-T4", 16384),
    PhysicalGpu(1, "GPU-b", 1, "Tesla-T4", 16384),
]


def prepare(claim: dict[str, Any], uid: str = "uid-1", unit: MemoryUnit = MemoryUnit.GIB) -> Any:
    return prepared_claim(claim, uid=uid, driver="gpu.gpushare.io", node="n1", gpus=GPUS, unit=unit)


@dataclass(frozen=True)
class Read:
    id: str
    results: list[dict[str, Any]]
    unit: MemoryUnit
    devices: list[tuple[int, int, int, str]]  # (GPU index, memory units, cores %, share ID)


READS = [
    Read("a share of one GPU: its memory in GiB", [result("gpu-1", memory="8Gi")],
         MemoryUnit.GIB, [(1, 8, 0, "share-1")]),
    Read("on a MiB node, the same share in MiB", [result("gpu-1", memory="8Gi")],
         MemoryUnit.MIB, [(1, 8192, 0, "share-1")]),
    Read("a compute share too", [result("gpu-0", memory="2Gi", cores="60")],
         MemoryUnit.GIB, [(0, 2, 60, "share-1")]),
    Read("no consumed memory recorded: the whole GPU", [result("gpu-0", memory=None)],
         MemoryUnit.GIB, [(0, 16, 0, "share-1")]),
    Read("another driver's device is not ours to prepare",
         [result("gpu-0", driver="other.example.com"), result("gpu-1", share_id=None)],
         MemoryUnit.GIB, [(1, 8, 0, "")]),
]  # fmt: skip


@pytest.mark.parametrize("case", READS, ids=[c.id for c in READS])
def test_a_claims_allocation_is_read_into_devices(case: Read) -> None:
    prepared = prepare(allocated_claim(case.results), unit=case.unit)
    assert [
        (d.gpu.index, d.memory_units, d.cores_percent, d.share_id) for d in prepared.devices
    ] == case.devices
    assert (prepared.namespace, prepared.name, prepared.uid) == ("ns", "c", "uid-1")


REFUSALS = [
    ("a claim made again under the same name", allocated_claim([result("gpu-0")], uid="uid-2"),
     "kubelet asked for 'uid-1'"),
    ("a claim not allocated", allocated_claim(None), "not allocated"),
    ("another node's pool", allocated_claim([result("gpu-0", pool="n2")]),
     "pool='n2': not this node's pool 'n1'"),
    ("a device the node lacks", allocated_claim([result("gpu-7")]),
     "device='gpu-7': no such GPU on node n1 (its devices: gpu-0, gpu-1)"),
    ("memory that is not a quantity", allocated_claim([result("gpu-0", memory="lots")]),
     "consumedCapacity.memory='lots'"),
    ("memory not in whole units of the node", allocated_claim([result("gpu-0", memory="1536Mi")]),
     "not a whole number of GiB"),
    ("cores above 100", allocated_claim([result("gpu-0", cores="150")]),
     "not a whole percentage 0-100"),
    ("a result that is not an object", allocated_claim(["gpu-0"]),  # type: ignore[list-item]
     "results[0]: not an object"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("claim", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_a_claim_that_cannot_be_prepared_is_refused_naming_the_value(
    claim: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClaimError) as refused:
        prepare(claim)
    assert message in str(refused.value)


def test_the_cdi_spec_gives_the_container_its_gpu_and_share_as_the_device_plugin_does() -> None:
    prepared = prepare(allocated_claim([result("gpu-1", memory="8Gi", cores="40")]))
    spec = cdi_spec(prepared, MemoryUnit.GIB)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", CDI_KIND)
    (device,) = spec["devices"]
    assert device["name"] == "uid-1"
    assert cdi_device_id("uid-1") == "gpushare.io/gpu=uid-1"
    assert device["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-b",
        "ALIYUN_COM_GPU_MEM_IDX=1",
        "ALIYUN_COM_GPU_MEM_POD=8",
        "ALIYUN_COM_GPU_MEM_CONTAINER=8",
        "ALIYUN_COM_GPU_MEM_DEV=16",
        "GPUSHARE_CORES_PERCENT=40",
    ]


def test_a_claim_without_our_devices_gets_an_empty_spec() -> None:
    prepared = prepare(allocated_claim([result("gpu-0", driver="other.example.com")]))
    assert prepared.devices == ()
    assert cdi_spec(prepared, MemoryUnit.GIB)["devices"] == []


@pytest.mark.parametrize(
    ("results", "limit", "percent"),
    [
        pytest.param([result("gpu-1", memory="4Gi")], "0=4096M", "25",
                     id="a memory share: its share of the GPU's threads, as the device plugin"),
        pytest.param([result("gpu-1", memory="4Gi", cores="60")], "0=4096M", "60",
                     id="a compute share: its percentage"),
        pytest.param([result("gpu-1", memory="2Gi"), result("gpu-0", memory="8Gi")],
                     "0=8192M,1=2048M", "50", id="two GPUs: by CUDA ordinal, the larger share"),
    ],
)  # fmt: skip
def test_with_mps_the_claim_gets_the_device_plugins_mps_limits(
    results: list[dict[str, Any]], limit: str, percent: str
) -> None:
    spec = cdi_spec(prepare(allocated_claim(results)), MemoryUnit.GIB, mps=True)
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
    without = cdi_spec(prepare(allocated_claim(results)), MemoryUnit.GIB)
    assert not [e for e in without["devices"][0]["containerEdits"]["env"] if "CUDA_MPS" in e]


@pytest.mark.parametrize("uid", ["../../etc/passwd", "a/b", "", "x" * 64, "-leading"])
def test_a_claim_uid_that_is_not_one_names_no_file(tmp_path: Path, uid: str) -> None:
    """kubelet's claim UID is input: it becomes a file name only when it is a UID."""
    with pytest.raises(ValueError, match="not a UID"):
        cdi_spec_path(tmp_path, uid)
    assert cdi_spec_path(tmp_path, "3f2c-9a").name == "gpushare.io-gpu_3f2c-9a.json"
