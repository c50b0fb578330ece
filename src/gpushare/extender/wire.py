"""The scheduler-extender wire types (``k8s.io/kube-scheduler/extender/v1``), as msgspec structs.

Source: ``k8s.io/kube-scheduler/extender/v1/types.go`` (docs/interfaces.md, "Types"). The
top-level keys are the Go field names in PascalCase (``Pod``, ``NodeNames``,
``FailedAndUnresolvableNodes``, ``PodUID``, ``NodeNameToMetaVictims``...); nested Kubernetes
objects (the Pod, the Nodes) stay plain JSON dicts, read by ``gpushare.kube.codec``.
No field is omitted on encoding: ``None`` is written as ``null``, as Go does. ``decode`` turns any
malformed body into ``RequestError`` (the HTTP layer answers 400 with its text): JSON syntax,
a shape mismatch, a string that is not UTF-8, nesting deeper than the decoder's recursion limit.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

MIN_PRIORITY = 0
MAX_PRIORITY = 10
"""``MinExtenderPriority`` / ``MaxExtenderPriority``: the range of ``HostPriority.score``."""


class NodeList(msgspec.Struct):
    """A core/v1 NodeList: ``{"metadata": {...}, "items": [<Node>, ...]}``; nodes stay dicts."""

    items: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None


class ExtenderArgs(msgspec.Struct, rename="pascal"):
    """Body of ``filter`` and ``prioritize``: the pod and the candidates, as ``NodeNames``
    (``nodeCacheCapable: true``) or full ``Nodes`` (``false``); the other one is ``null``."""

    pod: dict[str, Any]
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct, rename="pascal"):
    """Answer of ``filter``: the passing nodes (in the field the request used), the nodes that
    do not fit now (``FailedNodes``) and those that never will (``FailedAndUnresolvableNodes``),
    each with a reason; a non-empty ``Error`` fails the whole call."""

    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] | None = None
    failed_and_unresolvable_nodes: dict[str, str] | None = None
    error: str = ""


class HostPriority(msgspec.Struct, rename="pascal"):
    """One entry of the ``prioritize`` answer (a JSON array of these); ``Score`` is an integer
    in ``MIN_PRIORITY..MAX_PRIORITY``."""

    host: str
    score: int


class ExtenderBindingArgs(msgspec.Struct, rename="pascal"):
    """Body of ``bind``: the pod (by name, namespace and UID) and the node chosen for it."""

    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(name="PodUID")
    node: str = msgspec.field(name="Node")


class ExtenderBindingResult(msgspec.Struct, rename="pascal"):
    """Answer of ``bind``: empty ``Error`` on success."""

    error: str = ""


class MetaPod(msgspec.Struct):
    """A victim named by UID alone (``MetaPod``; the Go field name is ``UID``)."""

    uid: str = msgspec.field(name="UID")


class MetaVictims(msgspec.Struct, rename="pascal"):
    """The victims on one node by UID, and how many PodDisruptionBudgets evicting them would
    break (``MetaVictims``)."""

    pods: list[MetaPod] | None = None
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class Victims(msgspec.Struct, rename="pascal"):
    """The victims on one node as whole pods (``Victims``: sent when ``nodeCacheCapable`` is
    false)."""

    pods: list[dict[str, Any]] | None = None
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(msgspec.Struct, rename="pascal"):
    """Body of ``preempt``: the preemptor and kube-scheduler's candidate nodes with the victims
    its own dry run chose, by UID (``NodeNameToMetaVictims``, ``nodeCacheCapable: true``) or as
    pods (``NodeNameToVictims``). From Kubernetes 1.38 a candidate may come with no victims (a
    node whose totals fit but whose devices may not)."""

    pod: dict[str, Any]
    node_name_to_victims: dict[str, Victims | None] | None = None
    node_name_to_meta_victims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(msgspec.Struct, rename="pascal"):
    """Answer of ``preempt``: the candidates kept, each with the victims to evict there (a
    node left out is dropped; kube-scheduler 1.37 refuses a node with an empty list)."""

    node_name_to_meta_victims: dict[str, MetaVictims] = msgspec.field(default_factory=dict)


class RequestError(ValueError):
    """A request body that is not valid JSON or not of the expected shape."""


T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def decode(body: bytes, kind: type[T], verb: str) -> T:
    """``body`` as ``kind``; ``RequestError`` naming ``verb`` and the problem otherwise."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as error:
        raise RequestError(f"invalid {verb} request: {error}") from None
    except msgspec.DecodeError as error:
        raise RequestError(f"invalid {verb} request: malformed JSON: {error}") from None
    except UnicodeDecodeError as error:  # msgspec decodes strings lazily, after the syntax
        raise RequestError(
            f"invalid {verb} request: a string is not valid UTF-8 "
            f"(byte {error.object[error.start : error.start + 1]!r} at offset {error.start} of "
            f"the string): JSON text must be UTF-8 (RFC 8259 section 8.1)"
        ) from None
    except RecursionError:
        raise RequestError(
            f"invalid {verb} request: JSON nested too deep for the decoder (a Kubernetes Pod "
            "nests about 10 levels)"
        ) from None


def encode(value: object) -> bytes:
    """JSON bytes of a wire value (structs, lists of structs, plain JSON)."""
    return _encoder.encode(value)
