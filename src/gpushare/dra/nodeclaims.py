"""The ResourceClaims allocated to the pods bound to one node, for the DRA driver's device order
(``gpushare.dra.usage``): a list+watch of the node's pods that have claims
(``gpushare.kube.nodepods.NodePods``, field selector ``spec.nodeName``: the driver watches its
own node's pods, as kubelet does), each claim read once when a pod names it (``ClaimSource``)
and kept while some pod on the node names it. kube-scheduler writes a claim's allocation before
it binds the pod, so a bound pod's claims are allocated.

RBAC: ``pods`` ``list`` and ``watch``; ``resourceclaims`` ``get``
(``gpushare.testing.rbac.DRA_DRIVER_RULES``, the chart's ``dra-driver.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from gpushare.dra.plugin import ClaimSource
from gpushare.kube.codec import pod_finished
from gpushare.kube.codec.dra import pod_claim_names
from gpushare.kube.errors import KubeError
from gpushare.kube.nodepods import NodePods
from gpushare.kube.watch import Change

__all__ = ["NodeClaims", "claim_names", "has_claims"]


def has_claims(pod: Pod) -> bool:
    """Whether ``pod`` names a ResourceClaim (directly or from a template)."""
    return bool(pod.spec is not None and pod.spec.resourceClaims)


def claim_names(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    """``(namespace, name)`` of the claims a pod (JSON) uses: those its spec names and those
    the resourceclaim controller made from its templates (``status.resourceClaimStatuses``);
    none for a finished pod (its claims are being released)."""
    if pod_finished(pod):
        return set()
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    return {(namespace, name) for name in pod_claim_names(pod) if name is not None}


class NodeClaims:
    """The claims of the pods bound to ``node`` (module doc); ``on_change`` is called whenever
    the node's pods change."""

    def __init__(
        self,
        client: AsyncClient,
        node: str,
        claims: ClaimSource,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._notify = on_change
        self._source = claims
        self._pods = NodePods(client, node, keep=has_claims, on_change=self._on_change)
        self._known: dict[tuple[str, str], Mapping[str, Any]] = {}

    def _on_change(self, _change: Change) -> None:
        self._notify()

    def start(self) -> None:
        """List and watch the node's pods in a background task."""
        self._pods.start()

    async def stop(self) -> None:
        """Stop watching."""
        await self._pods.stop()

    async def allocated(self) -> tuple[list[Mapping[str, Any]], list[str]]:
        """The allocated claims of the node's pods, as JSON, and one message per claim that
        could not be read now (left out until the next call)."""
        wanted: set[tuple[str, str]] = set()
        for pod in self._pods.pods():
            wanted |= claim_names(pod)
        for key in self._known.keys() - wanted:
            del self._known[key]
        errors: list[str] = []
        for namespace, name in sorted(wanted - self._known.keys()):
            try:
                claim = await self._source.claim(namespace, name)
            except LookupError:
                continue  # deleted meanwhile
            except KubeError as error:
                errors.append(f"claim {namespace}/{name}: {error}")
                continue
            if (claim.get("status") or {}).get("allocation"):
                self._known[(namespace, name)] = claim
        return [self._known[key] for key in sorted(wanted) if key in self._known], errors
