"""The extender's replicas as the API server knows them: the pod IPs a leader URL may name
(``gpushare.extender.forward``, check 2).

:class:`PeerPods` lists the pods of one namespace that carry a label selector (the chart's:
the extender Deployment's selector labels), keeps the IPs of those not being deleted
(``status.podIP`` and ``status.podIPs``) and answers :meth:`PeerPods.known` from them; an
address it does not know makes it list again, at most once every ``min_interval_s``, so a
leader that just started is found and a forged address costs at most one list a second.
RBAC: ``pods`` ``list`` in the namespace (the extender has it cluster-wide).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from lightkube import AsyncClient
from lightkube.core.client import LabelValue
from lightkube.resources.core_v1 import Pod

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error

__all__ = ["PeerPods", "parse_selector"]


def parse_selector(text: str) -> dict[str, str]:
    """``a=b,c=d`` → ``{"a": "b", "c": "d"}``; ``ValueError`` naming the bad part."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key or "=" in value:
            raise ValueError(f"{part!r} is not label=value (e.g. app.kubernetes.io/name=gpushare)")
        labels[key] = value
    return labels


class PeerPods:
    """The replicas of namespace ``namespace`` selected by ``selector`` (module doc)."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        selector: Mapping[str, str],
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not selector:
            raise ValueError("the peer selector must name at least one label")
        self._client = client
        self.namespace = namespace
        self.selector = dict(selector)
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._addresses: frozenset[str] = frozenset()
        self._listed_at: float | None = None

    def describe(self) -> str:
        """``namespace kube-system, labels app.kubernetes.io/component=extender``."""
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))
        return f"pods of namespace {self.namespace} with labels {labels}"

    async def known(self, address: str) -> bool:
        """Whether ``address`` is a replica's pod IP (listing again when it is not known and
        the last list is older than ``min_interval_s``). Raises ``ApiCallError``."""
        if address in self._addresses:
            return True
        now = self._clock()
        if self._listed_at is not None and now - self._listed_at < self._min_interval_s:
            return False
        self._listed_at = now
        addresses: set[str] = set()
        try:
            labels: dict[str, LabelValue] = dict(self.selector)
            async for pod in self._client.list(Pod, namespace=self.namespace, labels=labels):
                meta, status = pod.metadata, pod.status
                if meta is None or meta.deletionTimestamp is not None or status is None:
                    continue
                if status.podIP:
                    addresses.add(status.podIP)
                addresses.update(ip.ip for ip in status.podIPs or () if ip.ip)
        except CLIENT_ERRORS as error:
            raise api_call_error(f"LIST pods in {self.namespace}", error) from error
        self._addresses = frozenset(addresses)
        return address in self._addresses
