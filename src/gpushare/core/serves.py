"""Which kinds of GPU request a node serves: shared GPUs, whole GPUs, or both (docs/node-config.md).

An operator sets it per node (``gpushare.kube.codec.nodeconfig``, docs/node-config.md); the
device plugin publishes it in the node's inventory and the extender refuses, with
:func:`serves_refusal`, a pod whose kind the node does not serve. A pod asks **whole GPUs** when
a GPU container is ``exclusive`` (``ContainerRequest.exclusive``) and a **share** when a GPU
container is not; a pod with both kinds needs a node that serves ``both``. Pure; no I/O.
"""

from __future__ import annotations

import enum

from gpushare.core.ask import PodAsk
from gpushare.core.model import PodRequest

__all__ = ["Serves", "serves_refusal"]


class Serves(enum.StrEnum):
    """What a node serves: ``shared`` (shares of a GPU only), ``whole`` (whole GPUs only) or
    ``both`` (the default, and what a node that says nothing serves)."""

    SHARED = "shared"
    WHOLE = "whole"
    BOTH = "both"


def serves_refusal(serves: Serves, pod: PodRequest | PodAsk) -> str:
    """Why a node serving ``serves`` refuses ``pod`` (a request or an ask, ``""`` when it does
    not): a pod asking
    whole GPUs on a ``shared`` node, or a share of a GPU on a ``whole`` node."""
    if serves is Serves.BOTH:
        return ""
    containers = pod.gpu_containers
    if serves is Serves.SHARED and any(c.exclusive for c in containers):
        whole = ", ".join(c.name for c in containers if c.exclusive)
        return (
            f"the node serves shared GPUs only (node config serves={serves}); container(s) "
            f"{whole} ask whole GPUs"
        )
    if serves is Serves.WHOLE and any(not c.exclusive for c in containers):
        shared = ", ".join(c.name for c in containers if not c.exclusive)
        return (
            f"the node serves whole GPUs only (node config serves={serves}); container(s) "
            f"{shared} ask a share of a GPU"
        )
    return ""
