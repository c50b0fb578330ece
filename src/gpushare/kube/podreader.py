"""Read one pod from the API server now, not from a cache: for decisions that evict.

Preemption evicts on the word of its preemptor: the preemptor's existence, priority and
``preemptionPolicy`` must be the API server's, as it is at the moment of the eviction, never a
request body's nor a hold's (``gpushare.extender.preemption``). The extender's cache is the API
server's too, but a watch can lag (a pod created a moment ago); :meth:`PodReader.read` is the
fresh ``GET`` taken before acting.

:meth:`PodReader.read` returns the pod as the API server's JSON (a plain dict, as the cache keeps
pods), ``None`` when it is gone (404) or the name now belongs to another incarnation (another
UID), and raises :class:`~gpushare.kube.errors.ApiCallError` for anything else (the caller then
does not act). RBAC: ``pods`` ``get`` (:data:`RBAC_RULES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from gpushare.kube.codec import Json, pod_uid
from gpushare.kube.errors import CLIENT_ERRORS, Failure, api_call_error
from gpushare.kube.refs import PodRef

__all__ = ["RBAC_RULES", "PodReader"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
)
"""What :class:`PodReader` needs of its identity's RBAC."""


class PodReader:
    """Reads pods through ``client`` (owned by the caller)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def read(self, pod: PodRef) -> Json | None:
        """This incarnation of ``pod`` as the API server has it now (module doc)."""
        try:
            found = await self._client.get(Pod, pod.name, namespace=pod.namespace)
        except CLIENT_ERRORS as exc:
            error = api_call_error(f"GET pods {pod.namespace}/{pod.name}", exc)
            if error.failure is Failure.NOT_FOUND:
                return None
            raise error from exc
        obj: Json = found.to_dict()
        return obj if pod_uid(obj) == pod.uid else None
