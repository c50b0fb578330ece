"""Texts for people that name items of a list the cluster handed over, bounded. Pure.

A refusal or a problem names a few items and counts the rest (``shown_names``), so that a list
of thousands (5,000 GPU UUIDs in one pod) never makes a message thousands of names long, and the
same pod gets the same short text on every node (kube-scheduler writes one line per distinct
reason into the pod's status).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NAMES_SHOWN", "shown_names"]

NAMES_SHOWN = 3
"""Items of a list that a message names before it counts the rest (``shown_names``)."""


def shown_names(names: Sequence[str], sep: str = ", ") -> str:
    """``a, b, c and 4,995 more``: the first ``NAMES_SHOWN`` of ``names`` (each at most 80
    characters) and how many are left out."""
    head = [n if len(n) <= 80 else n[:77] + "..." for n in names[:NAMES_SHOWN]]
    more = len(names) - len(head)
    return sep.join(head) + (f" and {more:,} more" if more > 0 else "")
