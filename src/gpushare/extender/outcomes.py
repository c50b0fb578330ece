"""Per-node outcome helpers shared by the extender's filter, prioritize and bind: the refusal
texts, the verdict kinds, a node's state without the pod's own allocation, a pod's shape key,
and a fit under the handshake rule.
"""

from __future__ import annotations

from dataclasses import replace

from gpushare.core.fit import FitResult, FitStatus, Reason
from gpushare.core.handshake import PendingPod, Pin, PinStatus, forced_fit, pin, waiting
from gpushare.core.model import Allocation, NodeState, PodRequest
from gpushare.extender.state import ExtenderState
from gpushare.kube.codec import NodeInfo

NOT_SYNCED = "gpushare: the extender has not finished listing nodes and pods yet"
UNKNOWN_NODE = "gpushare: node unknown to the extender (not in its node cache)"
NOT_GPUSHARE = "gpushare: not a GPU-share node"
_PASS, _FAIL, _NEVER = 0, 1, 2


def not_gpushare(info: NodeInfo) -> str:
    """``gpushare: not a GPU-share node (<why>)`` for a node that takes no GPU-memory pods."""
    return f"{NOT_GPUSHARE} ({info.refusal})"


def describe_fit(result: FitResult, info: NodeInfo) -> str:
    """``<reason>; <numbers>[; unit <unit>]`` for a rejected fit (``FitResult.describe``)."""
    unit = f"; unit {info.unit}" if info.unit else ""
    return f"{result.describe()}{unit}"


def skipped_note(state: ExtenderState, node: str) -> str:
    """``; counted too, not in the ledger: <SkippedPod.describe>, ...`` for the skipped pods on
    ``node`` (``""`` when none): a refusal caused by them says so, with their numbers."""
    skipped = state.skipped(node)
    if not skipped:
        return ""
    return "; counted too, not in the ledger: " + " | ".join(s.describe() for s in skipped)


def _without(state: NodeState, own: Allocation | None) -> NodeState:
    """``state`` minus ``own`` when ``own`` is on that node (a pod never blocks itself)."""
    if own is None or own.node != state.node.name:
        return state
    used = list(state.gpu_used)
    position = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
    for index, amount in own.per_gpu().items():
        if index in position:
            used[position[index]] -= amount
    return NodeState(node=state.node, gpu_used=tuple(used))


def _shape(pod: PodRequest) -> tuple[object, ...]:
    """What a fit or a policy value depends on: the pod's shape and its container names (the
    reasons name the container)."""
    return (pod.shape, tuple(c.name for c in pod.containers))


def pinned_fit(
    state: NodeState, pod: PodRequest, result: FitResult, pending: tuple[PendingPod, ...]
) -> FitResult:
    """``result`` (``check_fit`` of ``pod`` on ``state``) under the handshake rule
    (``gpushare.core.handshake.pin``) for the node's ``pending`` pods (``apply_pin``)."""
    if not pending or result.status is FitStatus.CAN_NEVER_FIT:
        return result
    return apply_pin(state, pod, result, pin(pod, pending))


def apply_pin(state: NodeState, pod: PodRequest, result: FitResult, rule: Pin) -> FitResult:
    """``result`` under ``rule``: a pod that must wait does not fit now; a pod pinned to an
    equal pending pod's GPUs fits only there (``FitResult.assignment`` says where)."""
    if result.status is FitStatus.CAN_NEVER_FIT or rule.status is PinStatus.FREE:
        return result
    if rule.status is PinStatus.WAIT:
        return waiting(state, pod)
    forced = forced_fit(state, pod, rule.assignment)
    return forced if forced.fits else replace(forced, reason=Reason.HANDSHAKE)
