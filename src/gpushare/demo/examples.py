"""The examples the demo applies (``examples/*.yaml`` of the repository) and what became of them.

:func:`apply_examples` creates the objects of each file in :data:`ORDER` through the demo's
kubeconfig and waits (:func:`wait_settled`) until its pods are bound or have kube-scheduler's
``FailedScheduling`` event before the next file, so where each lands does not depend on how
kube-scheduler interleaves them (an object that exists already is left as it is: ``up`` can run
twice). :func:`outcome` says where each pod went and why the others wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightkube import Client
from lightkube.codecs import load_all_yaml
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event, Pod

from gpushare.kube.codec import CodecError, pod_allocation
from gpushare.testing.controlplane import REPO_ROOT

__all__ = [
    "DIALECT_EXAMPLES",
    "EXAMPLES",
    "Placed",
    "apply_examples",
    "files_of",
    "outcome",
    "wait_settled",
]

EXAMPLES = REPO_ROOT / "examples"
ORDER = (
    "binpack.yaml",
    "tf-notebook.yaml",
    "gpu-manager.yaml",
    "hami.yaml",
    "whole-gpu.yaml",
    "never-fits.yaml",
)
DIALECT_EXAMPLES = ("gpu-manager.yaml", "hami.yaml")
"""The examples written in gpu-manager's and HAMi's request dialects: applied only when the demo
serves the dialects (``up --dialects``), as the chart does only with ``devicePlugin.dialects``
and ``scheduler.dialectResources`` set (docs/compute.md, "What an operator configures")."""
NAMESPACES = ("default", "notebooks")


@dataclass(frozen=True)
class Placed:
    """One example pod: where it runs (``node`` and the GPUs of its annotations) or why it
    waits (``reason``: kube-scheduler's last FailedScheduling message)."""

    namespace: str
    name: str
    node: str | None
    gpus: str
    reason: str


def apply_examples(
    kube: Client, files: Sequence[str] = ORDER, *, settle_s: float = 120.0
) -> tuple[list[str], bool]:
    """Create the objects of ``files`` (names in :data:`EXAMPLES`), one file at a time, each
    file's pods placed or refused before the next file (so placements do not depend on how
    kube-scheduler interleaves the files); the ``kind/name`` of each object created, and
    whether every file's pods settled within ``settle_s``."""
    created: list[str] = []
    settled = True
    expected = 0
    for name in files:
        created += _apply_file(kube, name)
        expected += pod_count(name)
        settled = wait_settled(kube, expected, settle_s) and settled
    return created, settled


def _apply_file(kube: Client, name: str) -> list[str]:
    """Create the objects of example file ``name``; an object that exists is left alone."""
    created: list[str] = []
    for obj in load_all_yaml((EXAMPLES / name).read_text()):
        try:
            kube.create(obj)
        except ApiError as error:
            if error.status.code != 409:  # AlreadyExists: a second `up`
                raise
            continue
        meta = obj.metadata
        created.append(f"{obj.kind}/{meta.name if meta else '?'}")
    return created


def _pods(kube: Client) -> list[Pod]:
    return [pod for ns in NAMESPACES for pod in kube.list(Pod, namespace=ns)]


def _failed(kube: Client, pod: Pod) -> str:
    assert pod.metadata is not None
    name = pod.metadata.name or ""
    found = kube.list(Event, namespace=pod.metadata.namespace, fields={"involvedObject.name": name})
    events = [e for e in found if e.reason == "FailedScheduling"]
    return (events[-1].message or "") if events else ""


def wait_settled(kube: Client, expected_pods: int, timeout_s: float = 120.0) -> bool:
    """Wait until ``expected_pods`` pods exist and each is bound or refused; whether they did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = _pods(kube)
        settled = [p for p in pods if (p.spec is not None and p.spec.nodeName) or _failed(kube, p)]
        if len(pods) >= expected_pods and len(settled) == len(pods):
            return True
        time.sleep(1.0)
    return False


def outcome(kube: Client) -> list[Placed]:
    """Every example pod: where it went, or why it waits."""
    placed: list[Placed] = []
    for pod in sorted(_pods(kube), key=lambda p: (p.metadata.namespace, p.metadata.name)):  # type: ignore[union-attr]
        assert pod.metadata is not None
        assert pod.spec is not None
        node = pod.spec.nodeName or None
        placed.append(
            Placed(
                pod.metadata.namespace or "",
                pod.metadata.name or "",
                node,
                _gpus(pod),
                "" if node else _failed(kube, pod),
            )
        )
    return placed


def _gpus(pod: Pod) -> str:
    """The GPU indices the pod's allocation annotation records (``""`` when none)."""
    try:
        allocation = pod_allocation(pod.to_dict())
    except CodecError:
        return ""
    if allocation is None:
        return ""
    indices = sorted({i for c in allocation.containers for i in c.gpu_indices})
    return ",".join(map(str, indices))


def pod_count(name: str) -> int:
    """How many pods example file ``name`` makes (a Deployment's replicas count)."""
    count = 0
    for obj in load_all_yaml((EXAMPLES / name).read_text()):
        if obj.kind == "Pod":
            count += 1
        elif obj.kind == "Deployment":
            count += obj.spec.replicas or 1
    return count


def describe(placed: Sequence[Placed]) -> str:
    """A table of :func:`outcome` for people."""
    width = max((len(f"{p.namespace}/{p.name}") for p in placed), default=10)
    lines = []
    for p in placed:
        name = f"{p.namespace}/{p.name}".ljust(width)
        if p.node:
            gpus = f"GPUs {p.gpus}" if "," in p.gpus else f"GPU {p.gpus or '?'}"
            lines.append(f"  {name}  on {p.node}, {gpus}")
        else:
            lines.append(f"  {name}  Pending: {p.reason or 'not yet considered'}")
    return "\n".join(lines)


def files_of(directory: Path = EXAMPLES, *, dialects: bool = True) -> list[str]:
    """The example files the demo applies, in order; without ``dialects`` the
    :data:`DIALECT_EXAMPLES` are left out."""
    left_out = () if dialects else DIALECT_EXAMPLES
    return [name for name in ORDER if name not in left_out and (directory / name).is_file()]
