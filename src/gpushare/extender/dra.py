"""Scoring nodes for pods whose GPUs come from DRA claims (docs/dra.md, "Placement"): the
extender's ``dra/prioritize`` verb.

kube-scheduler's allocator chooses the GPU within a node (first fit in the slice's order, which
gpushare's driver keeps as best fit) but scores nodes for claim pods with its own plugins, which
spread. ``DraScorer`` answers prioritize for a pod with claims of gpushare's DeviceClass as the
extender answers it for an ``aliyun.com/gpu-mem`` pod: each candidate node's state from its
slice and the claims allocated on it (``gpushare.kube.dracache``, ``gpushare.kube.codec.dra``),
the pod's request from its claims, ``check_fit``, the policy's node half and its tie-break,
mapped to 0–10 (``gpushare.extender.scoring``). Nodes without gpushare's slice, or that the pod
does not fit, score 0; a pod without such claims gets an empty answer, which changes nothing.
Memory only (``gpushare.kube.codec.dra``).

kube-scheduler asks once its own informer has the pod's claims; the extender's watch of claims
can be behind it (docs/interfaces.md, Pitfalls: 30). A pod whose claims the cache does not
know yet is answered once they arrive (``DraCache.wait_for_claims``), at most ``claim_wait_s``
(default 1 s, within the 5 s ``httpTimeout`` of the extender entry); after that it gets an empty
answer and a warning in the log (kube-scheduler's own plugins then choose the node). While the
extender's watch of claims is failing it does not wait (``DraCache.claims_failing``).

kube-scheduler calls an extender for a pod only when the pod names one of the extender's
``managedResources``, or for every pod when it lists none: this verb is a second extender entry
without ``managedResources``, ``prioritizeVerb`` only (the chart's ``draDriver.scoreNodes``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpushare.core.fit import FitStatus, check_fit
from gpushare.core.model import NodeState, PodRequest
from gpushare.core.policies import Policy, tie_break_of
from gpushare.core.text import shown_names
from gpushare.extender.scoring import policy_value, to_priorities
from gpushare.extender.wire import ExtenderArgs, HostPriority
from gpushare.kube.codec.common import MemoryUnit
from gpushare.kube.codec.dra import (
    DEVICE_CLASS,
    claim_asks,
    claim_pod_request,
    node_state,
    pod_claim_names,
)
from gpushare.kube.dracache import DraCache

__all__ = ["CLAIM_WAIT_S", "DraScorer", "candidate_names"]

CLAIM_WAIT_S = 1.0
"""How long a prioritize call waits for claims the cache does not know yet (seconds)."""

log = logging.getLogger(__name__)


def candidate_names(args: ExtenderArgs) -> list[str]:
    """The candidate nodes' names of a prioritize request, in order, each once (``NodeNames``,
    or the names of ``Nodes.items``)."""
    if args.node_names is not None:
        return list(dict.fromkeys(args.node_names))
    items = (args.nodes.items if args.nodes is not None else None) or []
    names = (str((item.get("metadata") or {}).get("name") or "") for item in items)
    return list(dict.fromkeys(name for name in names if name))


class DraScorer:
    """``dra/prioritize`` over ``cache`` with ``policy`` for claims of ``device_class``
    (module doc)."""

    def __init__(
        self,
        cache: DraCache,
        policy: Policy,
        device_class: str = DEVICE_CLASS,
        *,
        claim_wait_s: float = CLAIM_WAIT_S,
    ) -> None:
        self.cache = cache
        self.policy = policy
        self.device_class = device_class
        self.claim_wait_s = claim_wait_s
        self._tie_break = tie_break_of(policy)
        self._states: dict[str, tuple[int, NodeState]] = {}

    def state(self, node: str) -> NodeState | None:
        """Node ``node``'s state, kept while its version is the same; ``None`` without a slice
        of gpushare's driver."""
        version = self.cache.version(node)
        kept = self._states.get(node)
        if kept is not None and kept[0] == version:
            return kept[1]
        found = self.cache.slices.get(node)
        if found is None:
            return None
        gpus, unit = found
        claims = self.cache.on_node.get(node, {}).values()
        state, errors = node_state(gpus, unit, claims, driver=self.cache.driver)
        for error in errors:
            log.warning("claim left out of node %s's state: %s", node, error)
        self._states[node] = (version, state)
        return state

    async def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> list[HostPriority]:
        """Scores 0–10 for ``names`` (module doc); ``[]`` for a pod without claims of the
        DeviceClass, or whose claims the cache has not listed or watched within
        ``claim_wait_s`` (at once while its watch of claims is failing)."""
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return []
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        key = f"{namespace}/{meta.get('name', '')}"
        wanted = [(namespace, name) for name in pod_claim_names(pod) if name is not None]
        failing = self.cache.claims_failing  # then not waited for
        if not await self.cache.wait_for_claims(wanted, self.claim_wait_s):
            missing = [f"{ns}/{n}" for ns, n in wanted if (ns, n) not in self.cache.claims]
            after = "at once" if failing else f"after {self.claim_wait_s:g} s"
            if failing:
                why = (
                    f"its claims {shown_names(missing)} are not in the extender's cache and its "
                    "watch of ResourceClaims is failing (see the 'ResourceClaim list+watch' "
                    "warnings)"
                )
            elif not self.cache.synced:
                why = "ResourceSlices and ResourceClaims are not listed yet"
            else:
                why = (
                    f"its claims {shown_names(missing)} are not in the extender's cache (the "
                    "watch of ResourceClaims lags, or they are deleted)"
                )
            log.warning("pod %s not scored %s: %s", key, after, why)
            return []
        asks = claim_asks(pod, self.cache.claims, self.device_class)
        if not asks:
            return []
        values: dict[str, float] = {}
        requests: dict[MemoryUnit, PodRequest] = {}
        for name in names:
            state = self.state(name)
            if state is None:
                continue
            unit = self.cache.slices[name][1]
            request = requests.get(unit)
            if request is None:
                request = requests[unit] = claim_pod_request(key, asks, unit)
            if check_fit(state, request).status is FitStatus.FITS:
                values[name] = policy_value(self.policy, state, request, tie_break=self._tie_break)
        scores = to_priorities(values, names)
        return [HostPriority(name, scores[name]) for name in names]
