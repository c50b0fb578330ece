"""Per-node outcome helpers shared by the extender's filter, prioritize and bind: the refusal
texts. The verdict itself (the fit under the handshake rule) is
``gpushare.core.handshake.handshake_verdict``; its kinds are ``gpushare.core.fit.FitStatus``.
"""

from __future__ import annotations

from gpushare.core.fit import FitResult
from gpushare.extender.state import ExtenderState
from gpushare.kube.codec import NodeInfo

NOT_SYNCED = "gpushare: the extender has not finished listing nodes and pods yet"
UNKNOWN_NODE = "gpushare: node unknown to the extender (not in its node cache)"
NOT_GPUSHARE = "gpushare: not a GPU-share node"


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
