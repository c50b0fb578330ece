"""The request dialects of gpu-manager, its fork, HAMi and Alibaba's cloud, read into one
``GpuAsk`` (``gpushare.kube.codec.dialects``), and each system's own refusals. Cases are named
after the rule they show; the sources are in the module docstring."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpushare.kube.codec import CodecError
from gpushare.kube.codec.dialects import (
    Dialect,
    GpuAsk,
    MemoryBasis,
    container_ask,
    vcuda_core_limit,
)

T, F, H, A = Dialect.TENCENT, Dialect.TENCENT_FORK, Dialect.HAMI, Dialect.ALIBABA
MIB, PERCENT, UNITS = MemoryBasis.MIB, MemoryBasis.PERCENT, MemoryBasis.NODE_UNITS


@dataclass(frozen=True)
class Read:
    id: str
    asked: dict[str, int]
    ask: GpuAsk | None


READS = [
    # gpu-manager's two README pods (tkestack/gpu-manager README.md, "Pod template example").
    Read("gpu-manager README pod 1: vcuda-core 50 and 30 blocks of 256 MiB (7,680 MiB)",
         {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 30},
         GpuAsk(T, 1, 7680, MIB, 500, kubelet_units=50)),
    Read("gpu-manager README pod 2: vcuda-core 200 is two whole GPUs, memory 60 ignored",
         {"tencent.com/vcuda-core": 200, "tencent.com/vcuda-memory": 60},
         GpuAsk(T, 2, 0, MIB, exclusive=True, kubelet_units=200)),
    Read("vcuda-core 100 is one whole GPU",
         {"tencent.com/vcuda-core": 100},
         GpuAsk(T, 1, 0, MIB, exclusive=True, kubelet_units=100)),
    Read("the fork's nvidia.com/vcuda-memory counts MiB",
         {"nvidia.com/vcuda-core": 25, "nvidia.com/vcuda-memory": 4096},
         GpuAsk(F, 1, 4096, MIB, 250, kubelet_units=25)),
    Read("HAMi: two GPUs, 3,000 MiB and 30 % of each",
         {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
         GpuAsk(H, 2, 3000, MIB, 300, kubelet_units=2)),
    Read("HAMi: no memory asked is the whole memory (defaultMem 0 = 100 %)",
         {"nvidia.com/gpu": 1}, GpuAsk(H, 1, 100, PERCENT, kubelet_units=1)),
    Read("HAMi: memory as a percentage of each GPU",
         {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25},
         GpuAsk(H, 1, 25, PERCENT, kubelet_units=1)),
    Read("HAMi: MiB and percentage both: the MiB, read first",
         {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpumem-percentage": 50},
         GpuAsk(H, 1, 2000, MIB, kubelet_units=1)),
    Read("HAMi: gpucores 100 is the whole GPU, exclusively",
         {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100},
         GpuAsk(H, 1, 0, MIB, exclusive=True, kubelet_units=1)),
    Read("HAMi: gpumem without nvidia.com/gpu asks one GPU (defaultGPUNum 1), and kubelet "
         "passes no nvidia.com/gpu", {"nvidia.com/gpumem": 1024}, GpuAsk(H, 1, 1024, MIB)),
    Read("HAMi: nvidia.com/gpu 0 alone asks nothing", {"nvidia.com/gpu": 0}, None),
    Read("Alibaba's cloud: compute percentage next to gpu-mem",
         {"aliyun.com/gpu-mem": 8, "aliyun.com/gpu-core.percentage": 40},
         GpuAsk(A, 1, 8, UNITS, 400, kubelet_units=8)),
    Read("plain gpu-mem is pod_request's, not a dialect here", {"aliyun.com/gpu-mem": 8}, None),
    Read("no GPU resource at all", {"cpu": 1}, None),
    Read("vcuda-core 0 and no memory asks nothing", {"tencent.com/vcuda-core": 0}, None),
]  # fmt: skip


@pytest.mark.parametrize("case", READS, ids=[c.id for c in READS])
def test_a_dialect_is_read_as_its_system_reads_it(case: Read) -> None:
    assert container_ask(case.asked, "pod ns/p container main") == case.ask


@dataclass(frozen=True)
class Refusal:
    id: str
    asked: dict[str, int]
    message: str


REFUSALS = [
    Refusal("vcuda-core 150: above 100 only multiples of 100",
            {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 4},
            "tencent.com/vcuda-core=150: above 100 only multiples of 100 (whole GPUs)"),
    Refusal("a share without memory is not permitted in share mode",
            {"tencent.com/vcuda-core": 50},
            "tencent.com/vcuda-core=50: a share (below 100) needs tencent.com/vcuda-memory > 0"),
    Refusal("memory without cores: gpu-manager allocates by vcuda-core",
            {"tencent.com/vcuda-memory": 8},
            "tencent.com/vcuda-memory=8: without tencent.com/vcuda-core"),
    Refusal("HAMi gpucores above 100",
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150},
            "nvidia.com/gpucores=150: above 100 %; accepted: 0-100 (% of each GPU)"),
    Refusal("HAMi memory percentage above 100",
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 120},
            "nvidia.com/gpumem-percentage=120: above 100 %"),
    Refusal("HAMi zero GPUs with memory",
            {"nvidia.com/gpu": 0, "nvidia.com/gpumem": 100},
            "nvidia.com/gpu=0: 0 GPUs with GPU memory or cores asked"),
    Refusal("Alibaba compute percentage without gpu-mem",
            {"aliyun.com/gpu-core.percentage": 30},
            "aliyun.com/gpu-core.percentage=30: without aliyun.com/gpu-mem"),
    Refusal("Alibaba compute percentage above 100",
            {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 101},
            "aliyun.com/gpu-core.percentage=101: not 1-100"),
    Refusal("two dialects in one container",
            {"aliyun.com/gpu-mem": 4, "tencent.com/vcuda-core": 50},
            "mixes Alibaba gpushare and Tencent gpu-manager resources; "
            "accepted: one dialect per container"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_a_request_its_own_system_refuses_is_refused_with_its_rule(case: Refusal) -> None:
    with pytest.raises(CodecError) as error:
        container_ask(case.asked, "pod ns/p container main")
    assert str(error.value).startswith("pod ns/p container main: ")
    assert case.message in str(error.value)


@pytest.mark.parametrize(
    ("annotations", "limit"),
    [({}, None), ({"tencent.com/vcuda-core-limit": "60"}, 60),
     ({"tencent.com/vcuda-core-limit": "250"}, 100)],
    ids=["absent: a hard cap at vcuda-core", "a soft cap", "above 100 counts as 100"],
)  # fmt: skip
def test_vcuda_core_limit(annotations: dict[str, str], limit: int | None) -> None:
    assert vcuda_core_limit(annotations, "pod ns/p") == limit


@pytest.mark.parametrize("raw", ["0", "-5", "half", "5.5"])
def test_a_vcuda_core_limit_that_is_not_a_whole_number_is_refused(raw: str) -> None:
    with pytest.raises(CodecError, match="not a whole number > 0"):
        vcuda_core_limit({"tencent.com/vcuda-core-limit": raw}, "pod ns/p")
