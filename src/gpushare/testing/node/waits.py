"""Waiting on pods of the real node, and checking a started container's GPU environment
(what the real-node tests assert after each step)."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod

from gpushare.kube.codec import node_info, pod_allocation
from gpushare.testing.controlplane import wait_for
from gpushare.testing.node.gpu import container_env

WAIT_S = 90.0


def pod_until(
    kube: Client, namespace: str, name: str, what: str, predicate: Callable[[Pod], bool]
) -> Pod:
    def probe() -> Pod | None:
        pod = kube.get(Pod, name, namespace=namespace)
        return pod if predicate(pod) else None

    return wait_for(f"pod {namespace}/{name} {what}", probe, WAIT_S)


def is_running(pod: Pod) -> bool:
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    return bool(
        pod.status is not None
        and pod.status.phase == "Running"
        and statuses
        and all(s.ready for s in statuses)
    )


def running(kube: Client, namespace: str, name: str) -> Pod:
    return pod_until(kube, namespace, name, "Running and ready", is_running)


def phase(pod: Pod) -> str | None:
    return pod.status.phase if pod.status else None


def container_ids(pod: Pod) -> dict[str, str | None]:
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    return {s.name: s.containerID for s in statuses}


def event_messages(kube: Client, namespace: str, name: str, reason: str) -> list[str]:
    events = kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
    return [e.message or "" for e in events if e.reason == reason]


def wait_event(kube: Client, namespace: str, name: str, reason: str, text: str) -> str:
    def probe() -> str | None:
        found = [m for m in event_messages(kube, namespace, name, reason) if text in m]
        return found[0] if found else None

    return wait_for(f"event {reason} containing {text!r} on {name}", probe, WAIT_S)


def gpu_env_matches_annotations(kube: Client, pod: Pod, node_name: str) -> dict[str, list[int]]:
    """Every GPU container's env (``kubectl logs``) names exactly the GPUs the extender
    recorded on the pod, by index, UUID and amount. Returns container → GPU indices."""
    assert pod.metadata is not None
    assert pod.metadata.name
    assert pod.metadata.namespace
    allocation = pod_allocation(pod.to_dict())
    assert allocation is not None, f"{pod.metadata.name} has no allocation annotation"
    info = node_info(kube.get(Node, node_name).to_dict())
    seen: dict[str, list[int]] = {}
    for container in allocation.containers:
        env = container_env(kube, pod.metadata.name, pod.metadata.namespace, container.container)
        gpus = list(container.gpu_indices)
        where = f"{pod.metadata.name}/{container.container}"
        assert env.get("ALIYUN_COM_GPU_MEM_IDX") == ",".join(map(str, gpus)), (where, env)
        assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(info.uuids[g] for g in gpus), where
        assert env.get("ALIYUN_COM_GPU_MEM_CONTAINER") == str(container.gpu_share * len(gpus))
        seen[container.container] = gpus
    return seen
