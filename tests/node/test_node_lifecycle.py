"""Node lifecycle as an operator lives it, on the real node: kubelet restarts, device-plugin
restarts, and a reboot (every container gone, containerd's runtime state gone, kubelet started
again) with the plugin up first and with kubelet up first. After every step: no GPU over
capacity, and the extender's ledger equals the annotations of the pods that still hold GPUs.

Observed behaviour that the tests pin (kubelet v1.37.1, containerd 1.6):

* kubelet restart: containers keep running, Allocate is not called again, the plugin registers
  again (kubelet's new ``kubelet.sock``).
* plugin restart: containers keep running; the new plugin's devices are back on the Node; new
  pods start.
* reboot, plugin registered first: pods are re-admitted and recreated from kubelet's device
  checkpoint without a new Allocate; their env still names their GPUs.
* reboot, kubelet first: kubelet fails each GPU pod's admission (``UnexpectedAdmissionError``,
  phase Failed). gpushare releases a Failed pod's GPUs in its ledger at once; a pod owned by a
  controller is replaced, scheduled and started once the plugin is back; a bare pod stays
  Failed (``docs/troubleshooting.md``).
"""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.testing.controlplane import wait_for
from gpushare.testing.node.gpu import GpuStack, gpu_deployment, gpu_pod
from gpushare.testing.node.waits import (
    container_ids,
    gpu_env_matches_annotations,
    is_running,
    phase,
    pod_until,
    running,
)

pytestmark = pytest.mark.node


def start_pair(gpu_stack: GpuStack, kube: Client, namespace: str) -> dict[str, Pod]:
    """A bare pod (4 GiB) and a one-replica Deployment (8 GiB), both running."""
    kube.create(gpu_pod(namespace, "bare", {"main": 4}))
    kube.create(gpu_deployment(namespace, "owned", replicas=1, gpu_mem=8))
    pods = {"bare": running(kube, namespace, "bare")}
    pods["owned"] = running(kube, namespace, owned_pod_name(kube, namespace))
    for pod in pods.values():
        gpu_env_matches_annotations(kube, pod, gpu_stack.node.name)
    gpu_stack.check_ledger(kube)
    return pods


def owned_pod_name(kube: Client, namespace: str, *, exclude: str = "") -> str:
    def probe() -> str | None:
        for pod in kube.list(Pod, namespace=namespace, labels={"app": "owned"}):
            name = pod.metadata.name if pod.metadata else None
            if name and name != exclude and phase(pod) not in {"Failed", "Succeeded"}:
                return name
        return None

    return wait_for("the Deployment's live pod", probe, 120.0)


def test_kubelet_restart_keeps_pods_running_without_a_second_allocate(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    pods = start_pair(gpu_stack, kube, namespace)
    allocations, registrations = gpu_stack.allocate_calls(), gpu_stack.registrations()
    gpu_stack.node.restart_kubelet()
    wait_for(
        "the plugin registered again",
        lambda: gpu_stack.registrations() > registrations or None,
        60.0,
    )
    gpu_stack.wait_capacity()
    for name, before in pods.items():
        assert before.metadata is not None
        after = running(kube, namespace, str(before.metadata.name))
        assert container_ids(after) == container_ids(before), name
        gpu_env_matches_annotations(kube, after, gpu_stack.node.name)
    assert gpu_stack.allocate_calls() == allocations
    gpu_stack.check_ledger(kube)


def test_device_plugin_restart_keeps_pods_running_and_new_pods_start(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    pods = start_pair(gpu_stack, kube, namespace)
    gpu_stack.stop_plugin()
    gpu_stack.start_plugin()
    for name, before in pods.items():
        assert before.metadata is not None
        after = running(kube, namespace, str(before.metadata.name))
        assert container_ids(after) == container_ids(before), name
    gpu_stack.check_ledger(kube)
    kube.create(gpu_pod(namespace, "later", {"main": 2}))
    gpu_env_matches_annotations(kube, running(kube, namespace, "later"), gpu_stack.node.name)
    assert gpu_stack.allocate_calls() == 1  # the new process's one Allocate
    gpu_stack.check_ledger(kube)


def test_reboot_with_the_plugin_up_first_recreates_pods_on_their_gpus(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    pods = start_pair(gpu_stack, kube, namespace)
    allocations = gpu_stack.allocate_calls()
    assert gpu_stack.node.power_cut() >= 4  # two sandboxes, two containers
    gpu_stack.check_ledger(kube)
    gpu_stack.node.start_kubelet()  # the plugin process never stopped: it registers at once
    gpu_stack.wait_capacity()
    for before in pods.values():
        assert before.metadata is not None
        old = container_ids(before)
        after = pod_until(
            kube,
            namespace,
            str(before.metadata.name),
            "recreated and running",
            lambda p, old=old: is_running(p) and container_ids(p) != old,  # type: ignore[misc]
        )
        gpu_env_matches_annotations(kube, after, gpu_stack.node.name)
    assert gpu_stack.allocate_calls() == allocations  # kubelet's checkpoint, no new Allocate
    gpu_stack.check_ledger(kube)


def test_reboot_with_kubelet_up_first_fails_gpu_pods_and_the_owned_one_is_replaced(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    pods = start_pair(gpu_stack, kube, namespace)
    assert pods["owned"].metadata is not None
    first_owned = str(pods["owned"].metadata.name)
    gpu_stack.node.power_cut()
    gpu_stack.stop_plugin()
    gpu_stack.node.start_kubelet()
    for name in ("bare", first_owned):
        failed = pod_until(kube, namespace, name, "Failed", lambda p: phase(p) == "Failed")
        assert failed.status is not None
        assert failed.status.reason == "UnexpectedAdmissionError", failed.status
    # The failed pods' GPUs are free in the ledger at once (the plugin is still down).
    held = gpu_stack.check_ledger(kube)
    assert f"{namespace}/bare" not in held
    assert f"{namespace}/{first_owned}" not in held
    gpu_stack.start_plugin()
    replacement = running(kube, namespace, owned_pod_name(kube, namespace, exclude=first_owned))
    gpu_env_matches_annotations(kube, replacement, gpu_stack.node.name)
    assert phase(kube.get(Pod, "bare", namespace=namespace)) == "Failed"
    gpu_stack.check_ledger(kube)


def test_after_a_power_cut_containerd_answers_cri_before_kubelet_is_started(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    """containerd serves its socket before its CRI plugin has recovered the sandboxes it knows;
    kubelet started in between exits at once ("server is not initialized yet"). The harness
    says containerd is up only once CRI answers (``gpushare.testing.node.containerd``). Thirty
    pods' sandboxes make the recovery long enough to show the window."""
    kube.create(gpu_deployment(namespace, "idle", replicas=30, gpu_mem=0))

    def all_running() -> bool | None:
        pods = kube.list(Pod, namespace=namespace, labels={"app": "idle"})
        return sum(is_running(p) for p in pods) == 30 or None

    wait_for("30 pods running", all_running, 300.0)
    gpu_stack.node.power_cut()
    assert gpu_stack.node.containerd.serves_cri()
    gpu_stack.node.start_kubelet()
    wait_for("30 pods running again", all_running, 300.0)
    gpu_stack.wait_capacity()


def test_a_node_a_failed_test_left_stopped_is_started_again_for_the_next_test(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    """A test that fails between a power cut and kubelet's start leaves the session's node
    without kubelet; the next test's ``kube`` fixture starts it again (``RealNode.revive``)
    rather than every later test failing too."""
    gpu_stack.node.stop_kubelet()
    gpu_stack.node.containerd.stop()
    assert gpu_stack.node.revive() == ["containerd", "kubelet"]
    assert gpu_stack.node.revive() == []
    gpu_stack.wait_capacity()
    kube.create(gpu_pod(namespace, "after", {"main": 2}))
    gpu_env_matches_annotations(kube, running(kube, namespace, "after"), gpu_stack.node.name)
