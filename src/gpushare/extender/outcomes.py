"""Per-node outcome helpers shared by the extender's filter, prioritize and bind: the refusal
texts, and the filter error of a pod the handshake rule holds. The verdict itself (the fit
under the handshake rule) is ``gpushare.core.handshake.handshake_verdict``; its kinds are
``gpushare.core.fit.FitStatus``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from gpushare.core.fit import FitResult, FitStatus
from gpushare.core.preemption import Hold
from gpushare.extender.state import ExtenderState
from gpushare.kube.codec import NodeInfo

NOT_SYNCED = "gpushare: the extender has not finished listing nodes and pods yet"
UNKNOWN_NODE = "gpushare: node unknown to the extender (not in its node cache)"
NOT_GPUSHARE = "gpushare: not a GPU-share node"
HELD = "gpushare: held by the handshake rule, retrying with backoff"


def not_gpushare(info: NodeInfo) -> str:
    """``gpushare: not a GPU-share node (<why>)`` for a node that takes no GPU-memory pods."""
    return f"{NOT_GPUSHARE} ({info.refusal})"


def describe_fit(result: FitResult, info: NodeInfo) -> str:
    """``<reason>; <numbers>[; unit <unit>]`` for a rejected fit (``FitResult.describe``)."""
    unit = f"; unit {info.unit}" if info.unit else ""
    return f"{result.describe()}{unit}"


class Verdict(NamedTuple):
    """The filter's verdict on one node: ``status``, the ``reason`` text (``""`` when it fits)
    and whether the device-plugin handshake rule is what refused it (``held``,
    ``Reason.HANDSHAKE``)."""

    status: FitStatus
    reason: str = ""
    held: bool = False


def outcome_of(error: str) -> str:
    """The ``outcome`` label of a verb's answer whose ``Error`` is ``error``: ``ok`` (none),
    ``held`` (``held_error``: a normal wait, kept out of the error rate) or ``error``."""
    if not error:
        return "ok"
    return "held" if error.startswith(HELD) else "error"


def skipped_note(state: ExtenderState, node: str) -> str:
    """``; counted too, not in the ledger: <SkippedPod.describe>, ...`` for the skipped pods on
    ``node`` (``""`` when none): a refusal caused by them says so, with their numbers."""
    skipped = state.reservations.skipped(node)
    if not skipped:
        return ""
    return "; counted too, not in the ledger: " + " | ".join(s.describe() for s in skipped)


def hold_note(holds: Sequence[Hold], key: str, priority: int, now_s: float) -> str:
    """``; held for preemptor ns/p (priority 1000, waiting for its victims): GPU 0 16`` for
    the ``holds`` that keep GPUs from pod ``key`` of ``priority`` at ``now_s`` (``""`` when
    none): a refusal caused by them says so (at most ``HELD_SHOWN`` named)."""
    binding = [h for h in holds if h.binds(key, priority, now_s)]
    if not binding:
        return ""
    shown = " | ".join(
        f"{h.pod} (priority {h.priority}): "
        + ", ".join(f"GPU {','.join(map(str, c.gpu_indices))} {c.gpu_share}" for c in h.containers)
        for h in binding[:HELD_SHOWN]
    )
    more = f" | and {len(binding) - HELD_SHOWN} more" if len(binding) > HELD_SHOWN else ""
    return f"; held for preemptors waiting for their victims: {shown}{more}"


def held_error(passed: Sequence[str], held: Mapping[str, str]) -> str:
    """The filter's ``Error`` for a pod the handshake rule holds: ``""`` unless no node passed
    and the rule refused it on at least one node (``held``: node → reason).

    An extender error makes kube-scheduler retry the pod with backoff (its scheduling queue
    requeues a pod that failed with an error, not one rejected by plugins or extenders, which
    waits for a cluster event); the text names the held nodes, so the pod's FailedScheduling
    event still says why. Source: kube-scheduler ``findNodesThatPassExtenders`` and
    ``PriorityQueue.determineSchedulingHintForInFlightPod`` (v1.37).
    """
    if passed or not held:
        return ""
    return f"{HELD}: {node_reasons(held)}"


def node_reasons(reasons: Mapping[str, str]) -> str:
    """``n1: <why>; n2: <why>; n3: <why>; and 997 more nodes``: the first ``HELD_SHOWN``
    nodes' reasons (node → reason) and how many are left out."""
    shown = "; ".join(f"{name}: {why}" for name, why in list(reasons.items())[:HELD_SHOWN])
    more = len(reasons) - HELD_SHOWN
    return shown + (f"; and {more} more nodes" if more > 0 else "")


HELD_SHOWN = 3
"""How many nodes ``node_reasons`` names before it counts the rest."""
