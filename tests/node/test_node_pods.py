"""Pods really start with their GPU: the real kube-scheduler with ``gpushare extender``, the
real kubelet and containerd, ``gpushare device-plugin --fake-gpus 2x16GiB:T4``. Every started
container's environment, read back through the API server (``kubectl logs`` of a container that
prints ``env``), names the GPU(s) the extender recorded on its pod; after every case the
extender's ledger equals the pods' annotations and no GPU is over capacity.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.kube.codec import GPU_MEM
from gpushare.kube.codec.pods import INIT_CONTAINER_REFUSAL
from gpushare.testing.controlplane import wait_for
from gpushare.testing.node.gpu import GpuStack, delete_pods, gpu_deployment, gpu_pod
from gpushare.testing.node.waits import (
    gpu_env_matches_annotations,
    is_running,
    phase,
    pod_until,
    running,
    wait_event,
)

pytestmark = pytest.mark.node

# name, containers (name -> gpu-mem GiB), gpushare.io/gpu-count, GPUs per container
ONE_POD_CASES: list[tuple[str, Mapping[str, int], Mapping[str, int] | None, Mapping[str, int]]] = [
    ("one container", {"main": 4}, None, {"main": 1}),
    ("two GPU containers", {"first": 4, "second": 6}, None, {"first": 1, "second": 1}),
    ("one container over two GPUs", {"main": 8}, {"main": 2}, {"main": 2}),
]


@pytest.mark.parametrize(
    ("containers", "gpu_count", "gpus_per_container"),
    [c[1:] for c in ONE_POD_CASES],
    ids=[c[0] for c in ONE_POD_CASES],
)
def test_a_pod_starts_with_the_gpus_the_extender_recorded(
    gpu_stack: GpuStack,
    kube: Client,
    namespace: str,
    *,
    containers: Mapping[str, int],
    gpu_count: Mapping[str, int] | None,
    gpus_per_container: Mapping[str, int],
) -> None:
    kube.create(gpu_pod(namespace, "p", containers, gpu_count=gpu_count))
    pod = running(kube, namespace, "p")
    seen = gpu_env_matches_annotations(kube, pod, gpu_stack.node.name)
    assert {c: len(set(g)) for c, g in seen.items()} == dict(gpus_per_container)
    gpu_stack.check_ledger(kube)


def test_four_equal_replicas_created_at_once_on_two_gpus_each_get_their_own_pods_gpu(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    """A Deployment of 4 × 8 GiB on 2 × 16 GiB: all four start (the GPUs end full), and each
    container's GPU is its own pod's annotation, whichever order kubelet admitted them in."""
    kube.create(gpu_deployment(namespace, "web", replicas=4, gpu_mem=8))

    def four_running() -> list[Pod] | None:
        pods = [p for p in kube.list(Pod, namespace=namespace) if is_running(p)]
        return pods if len(pods) == 4 else None

    pods = wait_for("4 replicas running", four_running, 120.0)
    per_gpu: dict[int, int] = {}
    for pod in pods:
        for gpus in gpu_env_matches_annotations(kube, pod, gpu_stack.node.name).values():
            for gpu in gpus:
                per_gpu[gpu] = per_gpu.get(gpu, 0) + 8
    assert per_gpu == {0: 16, 1: 16}
    gpu_stack.check_ledger(kube)


def test_an_init_container_asking_gpu_mem_is_refused_at_filter_with_the_reason(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    kube.create(gpu_pod(namespace, "init", {"main": 4}, init_containers={"warmup": 2}))
    message = wait_event(kube, namespace, "init", "FailedScheduling", "init container warmup")
    assert INIT_CONTAINER_REFUSAL in message
    pod = kube.get(Pod, "init", namespace=namespace)
    assert pod.spec is not None
    assert not pod.spec.nodeName
    gpu_stack.check_ledger(kube)


def test_a_deleted_pods_gpu_goes_to_the_pending_pod(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    kube.create(gpu_pod(namespace, "a", {"main": 16}))
    kube.create(gpu_pod(namespace, "b", {"main": 16}))
    freed = gpu_env_matches_annotations(kube, running(kube, namespace, "a"), gpu_stack.node.name)
    running(kube, namespace, "b")
    kube.create(gpu_pod(namespace, "c", {"main": 10}))
    wait_event(kube, namespace, "c", "FailedScheduling", "")
    assert phase(kube.get(Pod, "c", namespace=namespace)) == "Pending"
    gpu_stack.check_ledger(kube)
    delete_pods(kube, namespace, ["a"])
    started = gpu_env_matches_annotations(kube, running(kube, namespace, "c"), gpu_stack.node.name)
    assert started == freed
    gpu_stack.check_ledger(kube)


def test_a_pod_too_big_for_any_gpu_stays_pending_with_the_numbers_in_its_event(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    kube.create(gpu_pod(namespace, "huge", {"main": 20}))
    message = wait_event(kube, namespace, "huge", "FailedScheduling", "larger than any GPU")
    assert "requested 20" in message, message
    assert "16" in message, message
    pod = pod_until(kube, namespace, "huge", "still Pending", lambda p: phase(p) == "Pending")
    assert pod.spec is not None
    assert not pod.spec.nodeName
    limits = pod.spec.containers[0].resources.limits  # type: ignore[union-attr]
    assert limits is not None
    assert limits[GPU_MEM] == "20"
    gpu_stack.check_ledger(kube)
