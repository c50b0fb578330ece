"""What preemption reads from the cluster and writes to it: PodDisruptionBudgets and the holds
ConfigMap. Pure; no I/O.

**PodDisruptionBudgets** (``policy/v1``): :func:`disruption_budget` reads one into a
:class:`DisruptionBudget` (namespace, name, label selector, ``status.disruptionsAllowed``,
``status.disruptedPods``); :func:`budgets_of` names the budgets that select a pod, as
kube-scheduler's ``filterPodsWithPDBViolation`` counts them: same namespace, a non-empty
selector that matches the pod's labels, the pod not already among the budget's disrupted pods.

**Holds** (``gpushare.core.preemption.Hold``): the leading extender keeps them in one ConfigMap
(``--preemption-holds``, default ``kube-system/gpushare-preemption-holds``; RBAC lets only the
extender write it), one data key per preemptor UID, each value one JSON object::

    {"pod": "team-a/infer-0", "uid": "...", "node": "n1", "priority": 1000,
     "containers": [{"name": "main", "gpus": [0], "share": 16}],
     "victims": [{"pod": "team-b/nb-3", "uid": "..."}],
     "evictor": "gpushare", "created": 1795000000.0, "expires": 1795000090.0}

``containers`` as in the ``gpushare.io/allocation`` annotation (optional ``compute`` and
``whole``). Whatever the ConfigMap holds is input: :func:`holds_of` reads at most
``MAX_HOLDS`` entries of at most ``MAX_HOLD_BYTES`` each, refuses (and names) every entry that
is not exactly that shape, never echoes more than a few characters of a refused value, and
keeps the rest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core.affinity import Operator, Requirement
from gpushare.core.model import GPU_COMPUTE_MILLI, ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.kube.codec.common import CodecError, Json, is_int
from gpushare.kube.codec.fields import object_labels, object_name, object_namespace

__all__ = [
    "EVICTORS",
    "MAX_HOLDS",
    "MAX_HOLD_BYTES",
    "DisruptionBudget",
    "budgets_of",
    "disruption_budget",
    "hold_json",
    "holds_data",
    "holds_of",
]

MAX_HOLDS = 1024
"""Holds read from the ConfigMap at most (more are refused, the first kept by key order)."""
MAX_HOLD_BYTES = 16 * 1024
"""Bytes of one hold's JSON at most."""
MAX_VICTIMS = 256
MAX_CONTAINERS = 64
MAX_GPUS = 64
MAX_NAME_CHARS = 253 + 1 + 253  # namespace/name
EVICTORS = frozenset({"gpushare", "kube-scheduler"})
_SHOWN_CHARS = 60
HOLD_ACCEPTED = (
    'a JSON object {"pod", "uid", "node", "priority", "containers": [{"name", "gpus", '
    '"share"}], "victims": [{"pod", "uid"}], "evictor": "gpushare"|"kube-scheduler", '
    '"created", "expires"}'
)


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """One ``policy/v1`` PodDisruptionBudget as preemption counts it: ``key`` is
    ``namespace/name``; ``match_labels`` and ``match_expressions`` its selector (both empty: it
    selects nothing, as kube-scheduler reads it); ``allowed`` ``status.disruptionsAllowed``;
    ``disrupted`` the pod names in ``status.disruptedPods``."""

    key: str
    namespace: str
    match_labels: Mapping[str, str]
    match_expressions: tuple[tuple[str, str, frozenset[str]], ...]
    allowed: int
    disrupted: frozenset[str]

    def selects(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Whether this budget counts pod ``namespace/name`` with ``labels``."""
        if namespace != self.namespace or name in self.disrupted:
            return False
        if not self.match_labels and not self.match_expressions:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(
            _expression(labels, key, operator, values)
            for key, operator, values in self.match_expressions
        )


def _expression(labels: Mapping[str, str], key: str, operator: str, values: frozenset[str]) -> bool:
    """A label selector requirement (``disruption_budget`` admits In, NotIn, Exists and
    DoesNotExist) as node affinity evaluates it (``gpushare.core.affinity``)."""
    return Requirement(key, Operator(operator), tuple(values)).holds(labels)


_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def disruption_budget(obj: Json) -> DisruptionBudget:
    """A ``policy/v1`` PodDisruptionBudget read; ``CodecError`` when its selector cannot be
    read (the caller then counts the budget as selecting nothing, and says so)."""
    namespace, name = object_namespace(obj), object_name(obj)
    subject = f"PodDisruptionBudget {namespace}/{name}"
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    selector = spec.get("selector") if isinstance(spec, dict) else None
    labels: dict[str, str] = {}
    expressions: list[tuple[str, str, frozenset[str]]] = []
    if selector is not None:
        if not isinstance(selector, dict):
            raise CodecError(subject, "spec.selector", selector, "not an object", "a LabelSelector")
        raw_labels = selector.get("matchLabels") or {}
        if not isinstance(raw_labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw_labels.items()
        ):
            raise CodecError(
                subject, "spec.selector.matchLabels", raw_labels, "not a map of strings", "{k: v}"
            )
        labels = dict(raw_labels)
        for item in selector.get("matchExpressions") or []:
            if not isinstance(item, dict) or item.get("operator") not in _OPERATORS:
                raise CodecError(
                    subject, "spec.selector.matchExpressions", item, "not a requirement",
                    "{key, operator: In|NotIn|Exists|DoesNotExist, values}",
                )  # fmt: skip
            values = item.get("values") or []
            if not isinstance(item.get("key"), str) or not isinstance(values, list):
                raise CodecError(
                    subject, "spec.selector.matchExpressions", item, "no key or values",
                    "{key, operator, values: [...]}",
                )  # fmt: skip
            expressions.append(
                (item["key"], item["operator"], frozenset(v for v in values if isinstance(v, str)))
            )
    allowed = status.get("disruptionsAllowed", 0) if isinstance(status, dict) else 0
    disrupted = status.get("disruptedPods") if isinstance(status, dict) else None
    return DisruptionBudget(
        f"{namespace}/{name}",
        namespace,
        labels,
        tuple(expressions),
        allowed if is_int(allowed) else 0,
        frozenset(disrupted) if isinstance(disrupted, dict) else frozenset(),
    )


def budgets_of(pod: Json, budgets: Iterable[DisruptionBudget]) -> frozenset[str]:
    """The keys of the ``budgets`` that select ``pod`` (module doc)."""
    namespace, name, labels = object_namespace(pod), object_name(pod), object_labels(pod)
    return frozenset(b.key for b in budgets if b.selects(namespace, name, labels))


# -- holds -----------------------------------------------------------------------------------


def hold_json(hold: Hold) -> str:
    """One hold as the ConfigMap value (module doc)."""
    containers = []
    for c in hold.containers:
        item: dict[str, Any] = {
            "name": c.container,
            "gpus": list(c.gpu_indices),
            "share": c.gpu_share,
        }
        if c.compute_milli:
            item["compute"] = c.compute_milli
        if c.exclusive:
            item["whole"] = True
        containers.append(item)
    return json.dumps(
        {
            "pod": hold.pod,
            "uid": hold.uid,
            "node": hold.node,
            "priority": hold.priority,
            "containers": containers,
            "victims": [
                {"pod": p, "uid": u} for p, u in zip(hold.victims, hold.victim_uids, strict=True)
            ],
            "evictor": hold.evictor,
            "created": hold.created_s,
            "expires": hold.expires_s,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def holds_data(holds: Iterable[Hold]) -> dict[str, str]:
    """The ConfigMap's ``data``: one key per hold, the preemptor's UID (module doc)."""
    return {hold.uid: hold_json(hold) for hold in holds}


def holds_of(
    configmap: Json | None, known: dict[str, tuple[str, Hold]] | None = None
) -> tuple[list[Hold], list[str]]:
    """The holds in the ConfigMap (module doc) and one line per refused entry (key, problem,
    the start of the value). ``None`` or no ``data``: none. ``known`` (key -> (the value as
    read, its hold)), when given, saves reading again an entry whose value has not changed,
    and is updated to the entries read now: a replica that sees the ConfigMap after each of
    hundreds of writes reads only what each write changed."""
    if configmap is None:
        return [], []
    data = configmap.get("data")
    if data is None:
        return [], []
    subject = f"ConfigMap {object_namespace(configmap)}/{object_name(configmap)}"
    if not isinstance(data, dict):
        return [], [f"{subject}: data is not a map of strings"]
    holds: list[Hold] = []
    problems: list[str] = []
    for key in sorted(k for k in data if isinstance(k, str)):
        if len(holds) >= MAX_HOLDS:
            problems.append(f"{subject}: more than {MAX_HOLDS} holds; the rest are ignored")
            break
        raw = data[key]
        seen = known.get(key) if known is not None else None
        if seen is not None and seen[0] == raw:
            holds.append(seen[1])
            continue
        try:
            hold = _hold(key, raw)
        except CodecError as error:
            problems.append(str(error))
            continue
        holds.append(hold)
        if known is not None and isinstance(raw, str):
            known[key] = (raw, hold)
    if known is not None:
        for key in [k for k in known if k not in data]:
            del known[key]
    return holds, problems


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _refuse(key: str, value: object, problem: str) -> CodecError:
    return CodecError(f"hold {_shown(key)}", "value", _shown(value), problem, HOLD_ACCEPTED)


def _name(document: dict[str, Any], field: str, key: str, raw: str) -> str:
    value = document.get(field)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise _refuse(key, raw, f"{field} must be a non-empty string of at most {MAX_NAME_CHARS}")
    return value


def _seconds(document: dict[str, Any], field: str, key: str, raw: str) -> float:
    value = document.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse(key, raw, f"{field} must be a number of seconds since the Unix epoch")
    return float(value)


def _hold(key: str, raw: object) -> Hold:
    if not isinstance(raw, str) or len(raw) > MAX_HOLD_BYTES:
        raise _refuse(key, raw, f"not a string of at most {MAX_HOLD_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        raise _refuse(key, raw, "not JSON") from None
    if not isinstance(document, dict):
        raise _refuse(key, raw, "not a JSON object")
    pod, uid = _name(document, "pod", key, raw), _name(document, "uid", key, raw)
    node = _name(document, "node", key, raw)
    if uid != key:
        raise _refuse(key, raw, "its key is not the uid it names")
    priority = document.get("priority")
    if not is_int(priority) or abs(priority) > 2**31:
        raise _refuse(key, raw, "priority must be an int32")
    evictor = document.get("evictor")
    if evictor not in EVICTORS:
        raise _refuse(key, raw, f"evictor must be one of {sorted(EVICTORS)}")
    return Hold(
        pod=pod,
        uid=uid,
        node=node,
        priority=priority,
        containers=_containers(document.get("containers"), key, raw),
        victims=tuple(v[0] for v in _victims(document.get("victims"), key, raw)),
        victim_uids=tuple(v[1] for v in _victims(document.get("victims"), key, raw)),
        created_s=_seconds(document, "created", key, raw),
        expires_s=_seconds(document, "expires", key, raw),
        evictor=evictor,
    )


def _containers(items: object, key: str, raw: str) -> tuple[ContainerAllocation, ...]:
    if not isinstance(items, list) or not items or len(items) > MAX_CONTAINERS:
        raise _refuse(key, raw, f"containers must be a list of 1..{MAX_CONTAINERS}")
    containers = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _refuse(key, raw, "a container without a name")
        gpus, share = item.get("gpus"), item.get("share")
        compute, whole = item.get("compute", 0), item.get("whole", False)
        if (
            not isinstance(gpus, list)
            or not 0 < len(gpus) <= MAX_GPUS
            or not all(is_int(g) and 0 <= g < 2**16 for g in gpus)
            or len(set(gpus)) != len(gpus)
            or not is_int(share)
            or not 0 <= share < 2**40
            or not is_int(compute)
            or not 0 <= compute <= GPU_COMPUTE_MILLI
            or type(whole) is not bool
        ):
            raise _refuse(
                key, raw, f"container {_shown(item.get('name'))}: gpus, share, compute or whole"
            )
        containers.append(ContainerAllocation(item["name"], tuple(gpus), share, compute, whole))
    return tuple(containers)


def _victims(items: object, key: str, raw: str) -> list[tuple[str, str]]:
    if not isinstance(items, list) or len(items) > MAX_VICTIMS:
        raise _refuse(key, raw, f"victims must be a list of at most {MAX_VICTIMS}")
    victims = []
    for item in items:
        if not isinstance(item, dict):
            raise _refuse(key, raw, "a victim that is not an object")
        victims.append((_name(item, "pod", key, raw), _name(item, "uid", key, raw)))
    return victims
