"""Bind a pod to a node after recording the allocation on it (design.md, "Source of truth").

:meth:`Binder.bind` does, for one :class:`~gpushare.kube.refs.PodRef` and node:

1. **Read** the pod (``GET``). It must still be the same incarnation (UID), not being deleted,
   and not bound yet; otherwise nothing is written.
2. **Annotate**: a JSON merge patch of ``metadata.annotations`` carrying the resourceVersion
   just read, so the API server applies it only to the pod as checked in step 1 (409
   otherwise; the binder then re-reads and tries again, ``attempts`` times in all).
3. **Bind**: ``POST pods/{name}/binding`` (kubernetes-interfaces.md 4.1) with the UID and the
   resourceVersion returned by the patch as preconditions, so the node is set only on the pod
   that carries *these* annotations: a concurrent bind of the same pod that annotated it in
   between makes this one fail rather than bind the pod under someone else's annotations.
   Success is HTTP 201 with a ``Status`` body; lightkube 1.0.1's ``PodBinding`` would decode
   that ``Status`` as a ``Binding`` and raise after a successful bind, so the binding goes
   through a dict-typed subresource (:class:`_BindingRequest`) that accepts any reply.

Every failure is a :class:`~gpushare.kube.errors.BindError`: ``failure`` says what to do
(``CONFLICT``: temporary, the pod changed; ``ALREADY_BOUND``: permanent, ``bound_node`` says
where, so a caller can treat a retried bind to the same node as done; ``NOT_FOUND``: the pod is
gone, recreated or being deleted; ``FORBIDDEN``: RBAC; ``SERVER``/``UNREACHABLE``/``THROTTLED``:
temporary). A failed bind may leave the annotations on the still unbound pod; they mean
nothing until ``spec.nodeName`` is set, and the next bind overwrites them.

RBAC: ``pods`` ``get`` and ``patch``, ``pods/binding`` ``create``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core import resource as lightkube_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpushare.kube.errors import CLIENT_ERRORS, BindError, BindStage, Failure, classify
from gpushare.kube.refs import PodRef

__all__ = ["BindResult", "Binder"]


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
    """A successful bind: ``pod`` is bound to ``node`` and carries ``annotations``;
    ``resource_version`` is the pod's after the annotation patch."""

    pod: PodRef
    node: str
    annotations: Mapping[str, str]
    resource_version: str


class Binder:
    """Annotates and binds pods through ``client`` (owned by the caller).

    ``attempts`` (>= 1) is how many times a bind re-reads and retries after the pod changed
    under it (a 409 on the patch or the binding) before giving up with ``CONFLICT``.
    """

    def __init__(self, client: AsyncClient, *, attempts: int = 3) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self._client = client
        self._attempts = attempts

    async def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> BindResult:
        """Record ``annotations`` on ``pod``, then bind it to ``node``; raises ``BindError``."""
        if not node:
            raise ValueError(f"bind {pod.key}: empty node name")
        wanted = dict(annotations)
        conflict: BindError | None = None
        for _ in range(self._attempts):
            current = await self._read(pod, node)
            rv = await self._annotate(pod, node, wanted, current)
            if rv is None:
                continue  # changed between read and patch: read again
            try:
                await self._post_binding(pod, node, rv)
            except BindError as exc:
                if exc.failure is not Failure.CONFLICT:
                    raise
                conflict = exc  # re-read: already bound, recreated, or merely changed
                continue
            return BindResult(pod=pod, node=node, annotations=wanted, resource_version=rv)
        if conflict is not None:
            raise conflict
        raise BindError(
            pod.key,
            node,
            BindStage.ANNOTATE,
            Failure.CONFLICT,
            f"the pod changed during each of {self._attempts} attempts",
            status_code=409,
        )

    async def _read(self, pod: PodRef, node: str) -> dict[str, Any]:
        """The pod as a dict, checked to be this incarnation, alive and unbound."""
        try:
            obj = await self._client.get(Pod, pod.name, namespace=pod.namespace)
        except CLIENT_ERRORS as exc:
            raise self._error(pod, node, BindStage.READ, exc) from exc
        current = obj.to_dict()
        meta = current.get("metadata") or {}
        bound = (current.get("spec") or {}).get("nodeName")
        if meta.get("uid") != pod.uid:
            detail = f"pod was recreated: UID is {meta.get('uid')}, not {pod.uid}"
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
        if meta.get("deletionTimestamp"):
            detail = f"pod is being deleted (since {meta['deletionTimestamp']})"
            raise BindError(pod.key, node, BindStage.READ, Failure.NOT_FOUND, detail)
        return current

    async def _annotate(
        self, pod: PodRef, node: str, annotations: dict[str, str], current: dict[str, Any]
    ) -> str | None:
        """Merge-patch the annotations; the new resourceVersion, or ``None`` on a 409."""
        rv = current["metadata"].get("resourceVersion")
        patch = {"metadata": {"resourceVersion": rv, "annotations": annotations}}
        try:
            patched = await self._client.patch(
                Pod, pod.name, patch, namespace=pod.namespace, patch_type=PatchType.MERGE
            )
        except CLIENT_ERRORS as exc:
            error = self._error(pod, node, BindStage.ANNOTATE, exc)
            if error.failure is Failure.CONFLICT:
                return None
            raise error from exc
        meta = patched.metadata
        new_rv = meta.resourceVersion if meta is not None else None
        if not new_rv:
            detail = "the patched pod came back without a resourceVersion"
            raise BindError(pod.key, node, BindStage.ANNOTATE, Failure.SERVER, detail)
        return new_rv

    async def _post_binding(self, pod: PodRef, node: str, resource_version: str) -> None:
        binding = _BindingRequest(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "uid": pod.uid,
                    "resourceVersion": resource_version,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
        )
        try:
            reply = await self._client.create(binding, pod.name, namespace=pod.namespace)
        except CLIENT_ERRORS as exc:
            raise self._error(pod, node, BindStage.BIND, exc) from exc
        # 2xx is success (kubernetes-interfaces.md 4.1: check the code, not the body); a
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
