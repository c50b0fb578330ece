"""The device plugin's handshake record for kwok nodes, which run no device plugin.

On a real node kubelet calls the device plugin's Allocate once per GPU container when it
starts a pod, and the plugin records each answer on the pod (``gpushare.io/assigned-containers``,
then ``ALIYUN_COM_GPU_MEM_ASSIGNED: "true"``: docs/deviceplugin.md, "The handshake";
``gpushare.kube.codec.handshake``). kwok "starts" the pods of its fake nodes without any of
that, so their GPU pods would stay *starting* (bound, GPUs chosen, not yet started by the
device plugin) for ever in ``kubectl inspect gpushare``, the GPU map and
``gpushare_gpu_memory_pending_bytes``.

:func:`handshake_records` says, purely, which pods of the given nodes a device plugin would
have recorded as started and with which annotations (every GPU container answered, as after
kubelet's last Allocate of the pod: kwok admits each pod as a whole and knows which pod it
admits, so no matching by units is needed). :class:`KwokDevicePlugin` writes them: a thread
that lists the pods every ``interval_s`` seconds and patches the annotations of those not yet
recorded. The demo (``gpushare.demo.cluster``) runs it on its kwok GPU nodes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpushare.kube.codec import CodecError, pod_deleting, pod_finished
from gpushare.kube.codec.handshake import handshake_annotations, pending_pod

__all__ = ["HandshakeRecord", "KwokDevicePlugin", "handshake_records"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HandshakeRecord:
    """Pod ``namespace/name`` is to carry ``annotations`` (the device plugin's record)."""

    namespace: str
    name: str
    annotations: Mapping[str, str]


def handshake_records(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[str]
) -> list[HandshakeRecord]:
    """The records a device plugin on each of ``nodes`` would have written by now on ``pods``
    (pod JSON): one per pod bound to one of them with an allocation recorded and not every GPU
    container answered (``gpushare.kube.codec.handshake.pending_pod``), all its containers
    answered. Pods being deleted or finished, on other nodes, or whose annotations cannot be
    read (the extender and ``kubectl inspect gpushare`` report those) get none. Pure."""
    wanted = set(nodes)
    records: list[HandshakeRecord] = []
    for raw in pods:
        pod = dict(raw)
        spec = pod.get("spec") or {}
        if spec.get("nodeName") not in wanted or pod_deleting(pod) or pod_finished(pod):
            continue
        try:
            pending = pending_pod(pod)
        except CodecError as error:
            log.warning("left unstarted: %s", error)
            continue
        if pending is None:
            continue
        namespace, name = pending.key.split("/", 1)
        annotations = handshake_annotations(pending, len(pending.steps))
        records.append(HandshakeRecord(namespace, name, annotations))
    return records


class KwokDevicePlugin:
    """Records, as the device plugin would, that the GPU pods bound to ``nodes`` have started
    (:func:`handshake_records`), every ``interval_s`` seconds through ``kube`` (RBAC: ``pods``
    ``list`` and ``patch``), in a daemon thread from ``start`` (or ``with``) until ``stop``. A
    failed list or patch is logged and tried again at the next round."""

    def __init__(self, kube: Client, nodes: Iterable[str], *, interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._kube = kube
        self._nodes = tuple(nodes)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwok-device-plugin", daemon=True)
        self.recorded = 0
        """Pods recorded as started so far."""

    def start(self) -> KwokDevicePlugin:
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for its round to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> KwokDevicePlugin:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def record_once(self) -> int:
        """One round: list the pods, patch the records due; how many pods were recorded."""
        pods = [pod.to_dict() for pod in self._kube.list(Pod, namespace="*")]
        done = 0
        for record in handshake_records(pods, self._nodes):
            patch = {"metadata": {"annotations": dict(record.annotations)}}
            try:
                self._kube.patch(
                    Pod, record.name, patch, namespace=record.namespace,
                    patch_type=PatchType.MERGE,
                )  # fmt: skip
            except ApiError as error:
                log.warning("recording pod %s/%s as started: %s", record.namespace,
                            record.name, error)  # fmt: skip
                continue
            done += 1
        self.recorded += done
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.record_once()
            except (ApiError, httpx2.HTTPError) as error:  # the API server away: next round
                log.warning("listing the kwok nodes' pods: %s", error)
            self._stop.wait(self._interval_s)
