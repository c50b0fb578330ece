"""Bind a pod to a node, recording the allocation on it in the same call (docs/design.md,
"Source of truth").

:meth:`PodBinder.bind` creates ``pods/{name}/binding`` (docs/interfaces.md, "Binding") with the
allocation annotations in the Binding's ``metadata.annotations`` and the pod's UID as a
precondition. The API server sets ``spec.nodeName`` and merges the annotations **atomically**:
a pod is never bound without its allocation, and of concurrent binds of one pod exactly one
wins and the pod carries that one's annotations. One API call per bind.

A 409 (already bound, recreated under another UID, being deleted) is explained by reading the
pod once: ``ALREADY_BOUND`` with ``bound_node`` (so a caller can treat a retried bind to the
same node as done), ``NOT_FOUND`` (recreated, deleted or being deleted); a pod still unbound
and the same is bound again, ``attempts`` times in all. Success is HTTP 201 with a ``Status``
body; lightkube 1.0.1's ``PodBinding`` would decode that ``Status`` as a ``Binding`` and raise
after a successful bind, so the binding goes through a dict-typed subresource
(:class:`_BindingRequest`) that accepts any reply.

Every failure is a :class:`~gpushare.kube.errors.BindError`: ``failure`` says what to do
(``CONFLICT``: temporary; ``ALREADY_BOUND``: permanent, ``bound_node`` says where;
``NOT_FOUND``: the pod is gone, recreated or being deleted; ``FORBIDDEN``: RBAC;
``SERVER``/``UNREACHABLE``/``THROTTLED``: temporary).

RBAC: ``pods/binding`` ``create``; ``pods`` ``get`` (explaining a conflict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core import resource as lightkube_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpushare.kube.codec import pod_deletion_timestamp, pod_node_name, pod_uid
from gpushare.kube.errors import CLIENT_ERRORS, BindError, BindStage, Failure, classify
from gpushare.kube.refs import PodRef

__all__ = ["RBAC_RULES", "BindResult", "PodBinder"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
)
"""What :class:`PodBinder` needs of its identity's RBAC (module doc)."""


class _BindingRequest(dict[str, Any], lightkube_resource.NamespacedSubResource):
    """``pods/{name}/binding`` as a plain dict: encodes a ``Binding``, decodes any reply.

    lightkube sends the dict as the body and reads ``metadata.namespace``, ``apiVersion`` and
    ``kind`` from attributes; the reply (a ``Status``) is decoded back into this class.
    """

    _api_info = lightkube_resource.ApiInfo(
        resource=lightkube_resource.ResourceDef("", "v1", "Binding"),
        parent=lightkube_resource.ResourceDef("", "v1", "Pod"),
        plural="pods",
        verbs=["post"],
        action="binding",
    )

    def __init__(self, body: Mapping[str, Any]) -> None:
        super().__init__(body)
        meta = body.get("metadata") or {}
        self.apiVersion = str(body.get("apiVersion") or "v1")
        self.kind = str(body.get("kind") or "Binding")
        self.metadata = ObjectMeta(name=meta.get("name"), namespace=meta.get("namespace"))


@dataclass(frozen=True, slots=True)
class BindResult:
    """A successful bind: ``pod`` is bound to ``node`` and carries ``annotations``."""

    pod: PodRef
    node: str
    annotations: Mapping[str, str]


class PodBinder:
    """Binds pods, with their annotations, through ``client`` (owned by the caller).

    ``attempts`` (>= 1) is how many times a bind is tried when a 409 leaves the pod unbound and
    unchanged in identity, before giving up with ``CONFLICT``.
    """

    def __init__(self, client: AsyncClient, *, attempts: int = 3) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self._client = client
        self._attempts = attempts

    async def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> BindResult:
        """Bind ``pod`` to ``node`` and merge ``annotations`` into it, atomically; raises
        ``BindError``."""
        if not node:
            raise ValueError(f"bind {pod.key}: empty node name")
        wanted = dict(annotations)
        conflict: BindError | None = None
        for _ in range(self._attempts):
            try:
                await self._post_binding(pod, node, wanted)
            except BindError as exc:
                if exc.failure is not Failure.CONFLICT:
                    raise
                conflict = exc
                await self._read(pod, node)  # raises when bound, recreated or being deleted
                continue
            return BindResult(pod=pod, node=node, annotations=wanted)
        assert conflict is not None
        raise conflict

    async def _read(self, pod: PodRef, node: str) -> dict[str, Any]:
        """The pod as a dict, checked to be this incarnation, alive and unbound."""
        try:
            obj = await self._client.get(Pod, pod.name, namespace=pod.namespace)
        except CLIENT_ERRORS as exc:
            raise self._error(pod, node, BindStage.READ, exc) from exc
        current = obj.to_dict()
        uid, bound = pod_uid(current), pod_node_name(current)
        if uid != pod.uid:
            detail = f"pod was recreated: UID is {uid or None}, not {pod.uid}"
            raise BindError(pod.key, node, BindStage.READ, Failure.NOT_FOUND, detail)
        if bound:
            raise BindError(
                pod.key,
                node,
                BindStage.READ,
                Failure.ALREADY_BOUND,
                f"pod is already bound to node {bound}",
                bound_node=bound,
                observed_pod=current,
            )
        if deleted_at := pod_deletion_timestamp(current):
            detail = f"pod is being deleted (since {deleted_at})"
            raise BindError(pod.key, node, BindStage.READ, Failure.NOT_FOUND, detail)
        return current

    async def _post_binding(self, pod: PodRef, node: str, annotations: dict[str, str]) -> None:
        binding = _BindingRequest(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "uid": pod.uid,
                    "annotations": annotations,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
        )
        try:
            reply = await self._client.create(binding, pod.name, namespace=pod.namespace)
        except CLIENT_ERRORS as exc:
            raise self._error(pod, node, BindStage.BIND, exc) from exc
        # 2xx is success (the API server answers 201 with a Status: check the code); a
        # Status reply that says otherwise is still worth refusing.
        if reply.get("kind") == "Status" and reply.get("status") not in (None, "Success"):
            detail = f"binding answered {reply.get('status')}: {reply.get('message')}"
            raise BindError(pod.key, node, BindStage.BIND, Failure.SERVER, detail)

    @staticmethod
    def _error(pod: PodRef, node: str, stage: BindStage, exc: Exception) -> BindError:
        failure, code, retry, detail = classify(exc)
        return BindError(
            pod.key, node, stage, failure, detail, status_code=code, retry_after_s=retry
        )
