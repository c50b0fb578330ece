"""Pods: what a pod asks (``pod_request``), what it got (``pod_allocation``, Alibaba's
annotations), and the annotations that record an allocation (``allocation_annotations``).
Formats and the multi-GPU syntax: the package docstring. Pure; no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

import msgspec

from gpushare.core.ask import ContainerAsk, PodAsk
from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    Allocation,
    ContainerAllocation,
    Node,
)
from gpushare.kube.codec.common import (
    ALIYUN_ASSIGNED,
    ALIYUN_ASSUME_TIME,
    ALIYUN_DEV,
    ALIYUN_IDX,
    ALIYUN_POD,
    ALLOCATION,
    EXCLUSIVE_ANNOTATION,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPU_MODELS_ANNOTATION,
    CodecError,
    Json,
    MemoryUnit,
    annotations_of,
    decimal,
    mapping,
    parse_json,
    pod_key,
    shown,
    whole_quantity,
)
from gpushare.kube.codec.dialects import (
    DIALECT_NAMES,
    HAMI_SELECTION,
    Dialect,
    GpuAsk,
    MemoryBasis,
    container_ask,
)

# -- pod requests ----------------------------------------------------------------------------


def _per_container(
    annotations: Json,
    key: str,
    subject: str,
    names: list[str],
    *,
    parse: Callable[[object], Any],
    accepted: str,
) -> dict[str, Any]:
    """A per-container annotation: one plain value for every GPU container, or a JSON object
    keyed by container name. ``parse(raw)`` returns the value or ``None`` when invalid."""
    raw = annotations.get(key)
    if raw is None:
        return {}
    document = parse_json(raw, subject, key, accepted) if raw.lstrip().startswith("{") else None
    if document is None:
        value = parse(raw)
        if value is None:
            raise CodecError(subject, f"annotation {key}", raw, "invalid value", accepted)
        return dict.fromkeys(names, value)
    result: dict[str, Any] = {}
    for name, item in document.items():
        value = parse(item)
        if name not in names or value is None:
            problem = "no such GPU container" if name not in names else "invalid value"
            problem = f"{shown(name)}: {problem}"
            raise CodecError(subject, f"annotation {key}", raw, problem, accepted)
        result[name] = value
    return result


def _count(raw: object) -> int | None:
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 4:
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw <= 1024:
        return raw
    return None


def _flag(raw: object) -> bool | None:
    if isinstance(raw, bool):
        return raw
    return {"true": True, "false": False}.get(raw) if isinstance(raw, str) else None


_INIT_ORDER = (GPU_MEM, GPU_COUNT, *sorted(DIALECT_NAMES))
"""The GPU resources an init container may not ask, in the order they are read."""
_INIT_REFUSED = frozenset(_INIT_ORDER)


def _asks_none_of(resources: object, names: frozenset[str]) -> bool:
    """Whether ``resources`` (a container's, as decoded JSON) plainly names none of ``names``
    in its limits or requests; anything not plain is read the long way, for its error."""
    if type(resources) is not dict:
        return resources is None
    return all(
        part is None or (type(part) is dict and names.isdisjoint(part))
        for part in (resources.get("limits"), resources.get("requests"))
    )


def _dialect_ask(container: Json, where: str, total: int | None) -> GpuAsk | None:
    """The container's ask in a dialect other than plain ``aliyun.com/gpu-mem``
    (``gpushare.kube.codec.dialects``), or ``None`` when it names none of their resources."""
    resources = container.get("resources")
    if _asks_none_of(resources, DIALECT_NAMES):  # the common case, checked without copies
        return None
    resources = mapping(resources, where, "resources")
    names: set[str] = set()
    for part in ("limits", "requests"):
        given = resources.get(part)
        if given:
            names.update(name for name in given if name in DIALECT_NAMES)
    if not names:
        return None
    ordered = tuple(sorted(names))
    asked = {
        name: value
        for name, value in zip(ordered, _gpu_resources(container, where, ordered), strict=True)
        if value is not None
    }
    if total is not None:
        asked[GPU_MEM] = total
    return container_ask(asked, where)


def _models(raw: object) -> frozenset[str] | None:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(m, str) and m.strip() for m in items):
        return None
    return frozenset(m.strip() for m in items)


def _resource(container: Json, subject: str, name: str) -> int | None:
    return _gpu_resources(container, subject, (name,))[0]


def _gpu_resources(
    container: Json, subject: str, names: tuple[str, ...] = (GPU_MEM, GPU_COUNT)
) -> list[int | None]:
    """Each of ``names`` in the container's ``resources``: the limit, else the request (equal
    when both are set), ``None`` when neither. The objects are read once for all names; errors
    come in the order of reading one name after the other."""
    resources = mapping(container.get("resources"), subject, "resources")
    limits = mapping(resources.get("limits"), subject, "resources.limits")
    requests: Json | None = None
    found: list[int | None] = []
    for name in names:
        limit = request = None
        if name in limits:
            limit = whole_quantity(limits[name], subject, f"resources.limits.{name}")
        if requests is None:
            requests = mapping(resources.get("requests"), subject, "resources.requests")
        if name in requests:
            request = whole_quantity(requests[name], subject, f"resources.requests.{name}")
        if limit is not None and request is not None and limit != request:
            values = {"limits": limit, "requests": request}
            raise CodecError(subject, name, values, "limit and request differ", "equal values")
        found.append(limit if limit is not None else request)
    return found


INIT_CONTAINER_REFUSAL = (
    "init containers get no GPU share (kubelet would run them on a GPU the extender never "
    "placed); ask in spec.containers"
)


def _refuse_init_containers(spec: Json, subject: str) -> None:
    """``CodecError`` when an init container asks ``aliyun.com/gpu-mem`` or ``-count``.

    Alibaba's extender ignores init containers; a real kubelet still calls Allocate for them
    (init devices are reused by the app containers), so the device plugin would match that
    call to the wrong container or none. Refused up front, at filter, with this reason.
    """
    raw = spec.get("initContainers") or []
    if not isinstance(raw, list):
        raise CodecError(subject, "spec.initContainers", raw, "not a list", "a list")
    for i, item in enumerate(raw):
        container = mapping(item, subject, f"spec.initContainers[{i}]")
        if _asks_none_of(container.get("resources"), _INIT_REFUSED):
            continue  # the common init container (istio-init, a copier): nothing to read
        where = f"{subject} init container {container.get('name')}"
        for name in _INIT_ORDER:
            asked = _resource(container, where, name)
            if asked:
                raise CodecError(
                    where, f"resources.limits.{name}", asked, INIT_CONTAINER_REFUSAL,
                    f"no {name} in spec.initContainers",
                )  # fmt: skip


def pod_request(pod: Json) -> PodAsk:
    """What ``pod`` asks as written (package doc), a ``PodAsk`` that
    ``gpushare.core.resolve.resolve`` turns into one node's ``PodRequest``: its
    ``spec.containers``, in order; init containers are
    not placed, and one that asks a GPU is refused (``CodecError`` with
    :data:`INIT_CONTAINER_REFUSAL`). CPU and memory are left 0 (kube-scheduler's job).
    ``CodecError`` on garbage."""
    key = pod_key(pod)
    subject = f"pod {key}"
    spec = mapping(pod.get("spec"), subject, "spec")
    return request_of(key, spec, annotations_of(pod, subject))


def request_of(key: str, spec: Json, annotations: Json) -> PodAsk:
    """``pod_request`` of the pod ``key`` whose ``spec`` and ``metadata.annotations`` (values
    checked to be strings) the caller has read. ``CodecError`` on garbage."""
    subject = f"pod {key}"
    raw_containers = spec.get("containers")
    if not isinstance(raw_containers, list) or not raw_containers:
        raise CodecError(subject, "spec.containers", raw_containers, "missing", "a list")
    asked: list[tuple[str, int, int | None, GpuAsk | None]] = []
    dialects: list[str] = []
    for i, raw in enumerate(raw_containers):
        container = raw if type(raw) is dict else mapping(raw, subject, f"spec.containers[{i}]")
        name = container.get("name")
        if not isinstance(name, str) or not name:
            raise CodecError(subject, f"spec.containers[{i}].name", name, "missing", "a name")
        where = f"{subject} container {name}"
        total, count = _gpu_resources(container, where)
        if count is not None and not total:
            raise CodecError(where, GPU_COUNT, count, f"without {GPU_MEM}", f"with {GPU_MEM}")
        ask = _dialect_ask(container, where, total)
        if ask is not None:
            dialects.append(name)
        asked.append((name, total or 0, count, ask))
    if spec.get("initContainers"):  # absent or empty: nothing to refuse
        _refuse_init_containers(spec, subject)
    if dialects:
        _refuse_mixed(subject, asked)
    selection: tuple[tuple[str, ...], ...] = ()
    if (
        annotations
        and any(key in annotations for key in HAMI_SELECTION)
        and any(total or ask is not None for _, total, _, ask in asked)
    ):  # a CPU pod's annotations are not its own to read
        selection = tuple(_named_list(annotations, key, subject) for key in HAMI_SELECTION)
    counts: dict[str, int] = {}
    models: dict[str, frozenset[str]] = {}
    exclusive: dict[str, bool] = {}
    if (
        GPU_COUNT_ANNOTATION in annotations
        or GPU_MODELS_ANNOTATION in annotations
        or EXCLUSIVE_ANNOTATION in annotations
    ):
        gpu_names = [name for name, total, _, _ in asked if total]
        counts = _per_container(
            annotations, GPU_COUNT_ANNOTATION, subject, gpu_names,
            parse=_count, accepted='"2" or {"<container>": 2}, 1..1024',
        )  # fmt: skip
        exclusive = _per_container(
            annotations, EXCLUSIVE_ANNOTATION, subject, gpu_names,
            parse=_flag, accepted='"true" or {"<container>": true}',
        )  # fmt: skip
        models = _per_container(
            annotations, GPU_MODELS_ANNOTATION, subject, gpu_names + dialects,
            parse=_models, accepted='"A100,V100" or {"<container>": ["A100"]}',
        )  # fmt: skip
    containers = []
    for name, total, limit_count, ask in asked:
        if ask is not None and ask.dialect is not Dialect.ALIBABA:
            containers.append(_dialect_container(name, ask, models.get(name, _ANY)))
            continue
        count = counts.get(name, limit_count or 1)
        if limit_count and limit_count != count:
            raise CodecError(
                f"{subject} container {name}", GPU_COUNT, limit_count,
                f"differs from annotation {GPU_COUNT_ANNOTATION} ({count})", "equal GPU counts",
            )  # fmt: skip
        if total % count:
            raise CodecError(
                f"{subject} container {name}", GPU_MEM, total,
                f"not divisible by the GPU count {count}", "the total over all its GPUs",
            )  # fmt: skip
        allowed = models.get(name, _ANY)
        if not total:
            containers.append(ContainerAsk(name, 0, 0, allowed))
        elif exclusive.get(name):  # kubelet still passes the gpu-mem the spec names
            containers.append(
                ContainerAsk(name, 0, count, allowed, exclusive=True, kubelet_units=total)
            )
        else:  # with aliyun.com/gpu-core.percentage, Alibaba's cloud: a compute share
            compute_milli = ask.compute_milli if ask is not None else 0
            containers.append(ContainerAsk(name, total // count, count, allowed, compute_milli))
    if selection:
        use_types, avoid_types, use_uuids, avoid_uuids = selection
        containers = [
            replace(
                c, gpu_types=use_types, excluded_gpu_types=avoid_types, gpu_uuids=use_uuids,
                excluded_gpu_uuids=avoid_uuids,
            )
            if c.gpu_count
            else c
            for c in containers
        ]  # fmt: skip
    return PodAsk(key, tuple(containers))


def _named_list(annotations: Json, key: str, subject: str) -> tuple[str, ...]:
    """The names of HAMi's annotation ``key`` (comma-separated, blanks dropped), ``()`` when
    absent; ``CodecError`` for one naming nothing."""
    raw = annotations.get(key)
    if raw is None:
        return ()
    names = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not names:
        raise CodecError(
            subject, f"annotation {key}", raw, "names no GPU type or UUID",
            'comma-separated GPU types ("A100,V100") or UUIDs ("GPU-8a1e...,GPU-03f2...")',
        )  # fmt: skip
    return names


def _dialect_container(name: str, ask: GpuAsk, allowed: frozenset[str]) -> ContainerAsk:
    """The ``ContainerAsk`` of a gpu-manager or HAMi ask: whole GPUs, or memory in MiB or
    percent (``memory_basis``, resolved per node by ``gpushare.core.resolve``), with the
    dialect's Allocate resource and the units kubelet passes there."""
    if ask.exclusive:
        return ContainerAsk(
            name, 0, ask.gpu_count, allowed, exclusive=True,
            allocate_resource=ask.allocate_resource, kubelet_units=ask.kubelet_units,
        )  # fmt: skip
    basis = "" if ask.memory_basis is MemoryBasis.NODE_UNITS else str(ask.memory_basis)
    return ContainerAsk(
        name, ask.memory, ask.gpu_count, allowed, ask.compute_milli, memory_basis=basis,
        allocate_resource=ask.allocate_resource, kubelet_units=ask.kubelet_units,
    )  # fmt: skip


def _refuse_mixed(subject: str, asked: list[tuple[str, int, int | None, GpuAsk | None]]) -> None:
    """``CodecError`` for a pod whose GPU containers write two dialects: each system's device
    plugin tells the containers of a pod apart in its own way, and none of them knows the
    other's (docs/compute.md, "Mixed pods")."""
    used = {
        name: (ask.dialect if ask is not None else Dialect.ALIBABA)
        for name, total, _, ask in asked
        if total or ask is not None
    }
    if len(set(used.values())) > 1:
        raise CodecError(
            subject, "spec.containers", {n: str(d) for n, d in used.items()},
            "GPU containers in two dialects", "one dialect per pod (all containers in one "
            "system's resources)",
        )  # fmt: skip


_ANY: frozenset[str] = frozenset()
"""Allowed GPU models of a container that names none: any model."""


# -- allocations -----------------------------------------------------------------------------

_ALLOCATION_ACCEPTED = (
    '{"node": "<name>", "containers": [{"name": "<container>", "gpus": [0], "share": 8}]}'
    ', each container optionally with "compute": 1..1000 and "whole": true'
)

_Got = tuple[int | None, int, int, bool]
"""What a container got or asks, as compared: (share per GPU, ``None`` where the request
cannot say it without the node; GPU count; compute_milli per GPU; whole GPUs)."""


class _RecordedContainer(msgspec.Struct, frozen=True):
    """One container of ``gpushare.io/allocation`` (``allocation_annotations`` writes it).
    ``compute`` (absent: 0) and ``whole`` (absent: false): records written before them read
    as before. Integers are JSON integers (not ``true``, not ``1.0``)."""

    name: str
    gpus: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=1)]
    share: Annotated[int, msgspec.Meta(gt=0)]
    compute: Annotated[int, msgspec.Meta(ge=0, le=GPU_COMPUTE_MILLI)] = 0
    whole: bool = False


class _Recorded(msgspec.Struct, frozen=True):
    """``gpushare.io/allocation``: the node and the containers (other keys, ``unit``, are
    not read here)."""

    node: str
    containers: list[_RecordedContainer]


_RECORDED = msgspec.json.Decoder(_Recorded)

_FIELD_RULES = {
    "node": "node must be a node name",
    "containers": "containers must be a list of objects",
    "name": "name must be a string",
    "gpus": "gpus must be a non-empty list of indices",
    "share": "share must be an integer > 0",
    "compute": f"compute must be 0..{GPU_COMPUTE_MILLI}, whole a boolean",
    "whole": f"compute must be 0..{GPU_COMPUTE_MILLI}, whole a boolean",
}
"""What each field of the record must be, as a refusal says it."""

_AT = re.compile(r"\$(?:\.containers\[(\d+)\])?(?:\.(\w+))?(?:\[\d+\])?")
"""msgspec's place of an error: ``$``, ``$.node``, ``$.containers[1].gpus[0]``."""
_MISSING = re.compile(r"Object missing required field `(\w+)`")


def _our_allocation(
    raw: str, subject: str
) -> tuple[str, tuple[ContainerAllocation, ...], dict[str, _Got], set[int], int]:
    """``gpushare.io/allocation`` read (``_Recorded``): the node, the containers, and for the
    checks against the request: what each container got (``_Got``) by name, the GPU indices
    used, the total."""
    try:
        document = _RECORDED.decode(raw)
    except msgspec.ValidationError as error:
        raise _bad_allocation(raw, subject, _refusal(raw, str(error))) from None
    except (ValueError, RecursionError):  # msgspec.DecodeError; a str with a lone surrogate
        raise _bad_allocation(raw, subject, "not JSON") from None
    containers = []
    got: dict[str, _Got] = {}
    indices: set[int] = set()
    total = 0
    for item in document.containers:
        name, gpus, share = item.name, item.gpus, item.share
        if len(gpus) > 1 and len(set(gpus)) != len(gpus):
            raise _bad_allocation(raw, subject, f"container {shown(name)}: repeated GPU")
        containers.append(ContainerAllocation(name, tuple(gpus), share, item.compute, item.whole))
        got[name] = (share, len(gpus), item.compute, item.whole)
        indices.update(gpus)
        total += share * len(gpus)
    return document.node, tuple(containers), got, indices, total


def _refusal(raw: str, message: str) -> str:
    """The problem a refusal names for msgspec's ``ValidationError`` ``message`` on ``raw``:
    the field (``no node``; ``container main: gpus must be ...``) and the rule it breaks."""
    text, _, at = message.partition(" - at `")
    match = _AT.fullmatch(at.rstrip("`") or "$")
    index, field = match.groups() if match else (None, None)
    missing = _MISSING.fullmatch(text)
    if index is None:
        return f"no {missing[1]}" if missing else _FIELD_RULES.get(field or "", "not an object")
    where = f"container {_container_name(raw, int(index))}"
    if missing:
        return f"{where}: no {missing[1]}"
    return f"{where}: {_FIELD_RULES.get(field or '', 'not an object')}"


def _container_name(raw: str, index: int) -> str:
    """How a refusal names container ``index`` of the record ``raw``: its name when it has a
    string one, else its place (``#1``, counted from 0)."""
    try:
        name = msgspec.json.decode(raw)["containers"][index]["name"]
    except (ValueError, LookupError, TypeError, RecursionError):
        name = None
    return shown(name) if isinstance(name, str) else f"#{index}"


def _bad_allocation(raw: str, subject: str, problem: str) -> CodecError:
    return CodecError(subject, f"annotation {ALLOCATION}", raw, problem, _ALLOCATION_ACCEPTED)


def pod_allocation(pod: Json) -> Allocation | None:
    """The allocation recorded on ``pod`` (module doc), or ``None`` when it records none or
    when only Alibaba's annotations are set and the pod is not bound (they name no node).

    The node is ``spec.nodeName`` when bound, else the one in ``gpushare.io/allocation``. The
    record is checked against what the pod asks. Raises ``CodecError`` on garbage.
    """
    key = pod_key(pod)
    subject = f"pod {key}"
    annotations = annotations_of(pod, subject)
    spec = mapping(pod.get("spec"), subject, "spec")
    bound = spec.get("nodeName") or None
    if bound is not None and not isinstance(bound, str):
        raise CodecError(subject, "spec.nodeName", bound, "not a string", "a node name")
    if ALLOCATION not in annotations and ALIYUN_IDX not in annotations:
        return None
    return allocation_of(key, annotations, bound, pod_request(pod), alibaba_annotations(pod))


def allocation_of(
    key: str,
    annotations: Json,
    bound: str | None,
    request: PodAsk,
    alibaba: AlibabaAnnotations,
) -> Allocation | None:
    """``pod_allocation`` of the pod ``key`` from what the caller has read: its
    ``metadata.annotations`` (values checked to be strings), the node it is ``bound`` to
    (``spec.nodeName``, checked to be a string; ``None``: not bound), its ``request`` and its
    ``alibaba`` annotations. ``CodecError`` on garbage."""
    if ALLOCATION not in annotations and ALIYUN_IDX not in annotations:
        return None
    subject = f"pod {key}"
    asked: dict[str, ContainerAsk] = {}
    wanted: dict[str, _Got] = {}
    for c in request.gpu_containers:
        asked[c.name], wanted[c.name] = c, _wanted(c)
    if not asked:
        raise CodecError(subject, GPU_MEM, None, "records a GPU but asks none", "a GPU pod")
    index, pod_total = alibaba.index, alibaba.pod_total
    if ALLOCATION in annotations:
        node, containers, got, indices, total = _our_allocation(annotations[ALLOCATION], subject)
        if bound is not None and node != bound:
            raise CodecError(
                subject, f"annotation {ALLOCATION}", node, f"pod is bound to {bound}", bound
            )
        for name, (_, count, compute, whole) in got.items():
            if name in wanted and wanted[name][0] is None:
                got[name] = (None, count, compute, whole)  # the share is the node's to say
        if got != wanted:
            plain = not request.per_node and not request.two_dimensional
            shown: dict[str, tuple[object, ...]] = (
                {n: g[:2] for n, g in got.items()} if plain else dict(got)
            )
            accepted = (
                f"(share, count) per GPU container: { {n: w[:2] for n, w in wanted.items()} }"
                if plain
                else f"(share, count, compute, whole) per GPU container: {wanted}"
            )
            raise CodecError(
                subject, f"annotation {ALLOCATION}", shown, "does not match the pod's request",
                accepted,
            )  # fmt: skip
        if index is not None and indices != {index}:
            raise CodecError(subject, ALIYUN_IDX, index, f"{ALLOCATION} uses GPUs {indices}", "")
    else:
        if bound is None:
            return None
        node = bound
        if any(c.gpu_count != 1 for c in asked.values()) or index is None:
            raise CodecError(
                subject, ALIYUN_IDX, index, "pod asks several GPUs", f"annotation {ALLOCATION}"
            )
        if request.per_node or any(c.exclusive for c in asked.values()):
            raise CodecError(
                subject, ALIYUN_IDX, index, "pod asks whole GPUs, memory in MiB or percent, "
                "or GPUs by type or UUID",
                f"annotation {ALLOCATION}",
            )  # fmt: skip
        containers = tuple(
            ContainerAllocation(c.name, (index,), c.gpu_share, c.compute_milli)
            for c in asked.values()
        )
        total = sum(c.gpu_share for c in containers)
    if pod_total is not None and pod_total != total:
        raise CodecError(subject, ALIYUN_POD, pod_total, f"the pod asks {total}", str(total))
    return Allocation(key, node, containers)


def _wanted(c: ContainerAsk) -> _Got:
    """What container ``c`` must have got (``_Got``): a whole GPU is recorded at its capacity
    and all its compute; memory in MiB or percent at what it resolved to on the node."""
    if c.exclusive:
        return (None, c.gpu_count, GPU_COMPUTE_MILLI, True)
    return (None if c.memory_basis else c.gpu_share, c.gpu_count, c.compute_milli, False)


@dataclass(frozen=True, slots=True)
class AlibabaAnnotations:
    """Alibaba's five annotations on a pod, read (``None``: absent). ``device_memory`` is
    ``ALIYUN_COM_GPU_MEM_DEV``; ``assume_time_ns`` nanoseconds since the Unix epoch."""

    index: int | None = None
    pod_total: int | None = None
    device_memory: int | None = None
    assigned: bool | None = None
    assume_time_ns: int | None = None


def alibaba_annotations(pod: Json) -> AlibabaAnnotations:
    """Read and check Alibaba's annotations on ``pod`` (formats: module doc)."""
    key = pod_key(pod)
    return alibaba_of(key, annotations_of(pod, f"pod {key}"))


def alibaba_of(key: str, annotations: Json) -> AlibabaAnnotations:
    """``alibaba_annotations`` of the pod ``key`` whose ``metadata.annotations`` (values
    checked to be strings) the caller has read. ``CodecError`` on garbage."""
    subject = f"pod {key}"
    flag = annotations.get(ALIYUN_ASSIGNED)
    if flag not in (None, "true", "false"):
        raise CodecError(
            subject, f"annotation {ALIYUN_ASSIGNED}", flag, "not a flag", '"true" or "false"'
        )
    numbers: list[int | None] = []
    for name, positive in _ALIBABA_NUMBERS:
        raw = annotations.get(name)
        numbers.append(None if raw is None else decimal(raw, subject, name, positive=positive))
    index, pod_total, device_memory, assume_time_ns = numbers
    return AlibabaAnnotations(
        index, pod_total, device_memory, None if flag is None else flag == "true", assume_time_ns
    )


_ALIBABA_NUMBERS = ((ALIYUN_IDX, False), (ALIYUN_POD, False), (ALIYUN_DEV, True),
                    (ALIYUN_ASSUME_TIME, False))  # fmt: skip
"""Alibaba's numeric annotations in the order they are read, and whether they must be > 0."""


def bound_copy(pod: Json, node: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    """``pod`` as the API server will show it once bound to ``node`` with ``annotations``
    merged (what a successful ``pods/binding`` call changes), without touching ``pod``: the
    copy the extender keeps until its watch brings the API server's."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return {**pod, "metadata": meta, "spec": {**(pod.get("spec") or {}), "nodeName": node}}


def allocation_annotations(
    allocation: Allocation, node: Node, *, now_ns: int, unit: MemoryUnit | None = None
) -> dict[str, str]:
    """The annotations recording ``allocation`` on ``node`` (module doc); ``now_ns`` is the
    assume time in nanoseconds since the Unix epoch; ``unit`` the node's memory unit when known.
    Empty for an allocation without GPU containers. ``KeyError`` if ``node`` lacks a GPU used."""
    if not allocation.containers:
        return {}
    document: dict[str, object] = {"node": allocation.node}
    if unit is not None:
        document["unit"] = unit
    containers: list[dict[str, object]] = []
    for c in allocation.containers:
        item: dict[str, object] = {"name": c.container, "gpus": list(c.gpu_indices)}
        item["share"] = c.gpu_share
        if c.compute_milli:
            item["compute"] = c.compute_milli
        if c.exclusive:
            item["whole"] = True
        containers.append(item)
    document["containers"] = containers
    per_gpu = allocation.per_gpu()
    result = {
        ALLOCATION: json.dumps(document, separators=(",", ":")),
        ALIYUN_POD: str(sum(per_gpu.values())),
        ALIYUN_ASSIGNED: "false",
        ALIYUN_ASSUME_TIME: str(now_ns),
    }
    if len(per_gpu) == 1:
        (index,) = per_gpu
        result[ALIYUN_IDX] = str(index)
        result[ALIYUN_DEV] = str(node.gpu(index).capacity)
    return result
