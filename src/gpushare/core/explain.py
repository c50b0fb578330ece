"""Why a pod went where it went: the extender's own scores, as one bounded line. Pure.

kube-scheduler asks the extender to score the nodes a pod fits (``prioritize``: integers 0–10,
``gpushare.extender.scoring``) and then binds the pod to the node its weighted total ranks
first. :class:`Placement` keeps that answer as it was sent (the policy, each node's score, how
many nodes passed the filter), and :func:`placement_message` writes it after what the bind
chose: the best ``MAX_NODES_SHOWN`` nodes with their scores, the rest counted (``and N
more``), the chosen node's score when it is not among them (kube-scheduler's own plugins
outweighed gpushare's), all within ``MESSAGE_MAX_BYTES`` (an Event's message is cut by the
API server past 1 KiB; the same text is the pod's ``gpushare.io/placement`` annotation). No
second scoring pass: the numbers are the ones kube-scheduler got.

Example (``bound`` is the bind's own text)::

    gpushare: pod ns/p bound to node n3: container main on GPU 0 (8 GiB each); policy binpack;
    scores 0-10 of the 7 node(s) it fits: n3 10, n1 7, n2 7, n4 3, n5 0 and 2 more
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "MAX_NODES_SHOWN",
    "MESSAGE_MAX_BYTES",
    "Placement",
    "bounded",
    "placement_message",
    "placement_text",
]

MAX_NODES_SHOWN = 5
"""Nodes named with their score; the others are counted."""
MESSAGE_MAX_BYTES = 1024
"""The most a placement message takes, in UTF-8 bytes: the API server truncates an Event's
``message`` past 1 KiB (``k8s.io/kubernetes/pkg/apis/core/validation``, ``ValidateEvent``:
``noteLengthLimit``)."""
_NAME_CHARS = 63
"""A node name longer than this is shortened in the message (DNS names go up to 253)."""
_ELLIPSIS = "..."


@dataclass(frozen=True, slots=True)
class Placement:
    """What the extender answered for one pod before its bind: ``policy`` (its registry
    name), ``scores`` the 0–10 integers ``prioritize`` returned for the nodes the pod fits,
    best first (ties by name), and ``passed`` how many nodes the filter passed (kube-scheduler
    asks no scores when only one does; 0: unknown)."""

    policy: str
    scores: tuple[tuple[str, int], ...] = ()
    passed: int = 0

    @classmethod
    def of(cls, policy: str, scores: Mapping[str, int], passed: int = 0) -> Placement:
        """A placement from ``scores`` (node → 0–10) in any order."""
        ranked = tuple(sorted(scores.items(), key=lambda item: (-item[1], item[0])))
        return cls(policy, ranked, passed)


def _name(node: str) -> str:
    return node if len(node) <= _NAME_CHARS else node[: _NAME_CHARS - len(_ELLIPSIS)] + _ELLIPSIS


def placement_text(placement: Placement, node: str, *, shown: int = MAX_NODES_SHOWN) -> str:
    """``policy binpack; scores 0-10 of the 7 node(s) it fits: n3 10, n1 7 and 5 more``:
    at most ``shown`` nodes with their scores, then the chosen ``node``'s when it is not among
    them. Without scores: how many nodes passed the filter (a lone one is not scored)."""
    policy = f"policy {placement.policy}"
    scores = placement.scores
    if not scores:
        if placement.passed == 1:
            return f"{policy}; the only node that passed the filter (not scored)"
        return f"{policy}; not scored"
    top = scores[: max(shown, 0)]
    more = len(scores) - len(top)
    listed = ", ".join(f"{_name(name)} {score}" for name, score in top)
    if more:
        listed = f"{listed} and {more} more" if listed else f"{more} not named"
    text = f"{policy}; scores 0-10 of the {len(scores)} node(s) it fits: {listed}"
    chosen = dict(scores).get(node)
    if chosen is not None and all(name != node for name, _ in top):
        text += f"; chosen {_name(node)} {chosen} (kube-scheduler's own scores outweighed)"
    return text


def bounded(text: str, max_bytes: int = MESSAGE_MAX_BYTES) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8 (at a character boundary, ending ``...`` when
    cut)."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    room = max(max_bytes - len(_ELLIPSIS), 0)
    return raw[:room].decode(errors="ignore") + _ELLIPSIS[: max_bytes - room]


def placement_message(
    bound: str,
    placement: Placement | None,
    node: str,
    *,
    shown: int = MAX_NODES_SHOWN,
    max_bytes: int = MESSAGE_MAX_BYTES,
) -> str:
    """``bound`` (what the bind chose: node, containers, GPUs), then ``; `` and
    ``placement_text`` (nothing more when ``placement`` is ``None``), in at most ``max_bytes``
    of UTF-8: fewer nodes are named (and more counted) until it fits, and only a text still too
    long is cut (``bounded``)."""
    if placement is None:
        return bounded(bound, max_bytes)
    for count in range(max(shown, 0), -1, -1):
        text = f"{bound}; {placement_text(placement, node, shown=count)}"
        if len(text.encode()) <= max_bytes:
            return text
    return bounded(text, max_bytes)
