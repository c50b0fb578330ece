"""What every codec module shares: resource and annotation names, ``CodecError`` and the bounded
echo of values in messages (``shown``; lists of names: ``gpushare.core.text.shown_names``),
Kubernetes quantities, and typed accessors for plain JSON dicts. Pure; no I/O."""

from __future__ import annotations

import enum
import json
import re
import reprlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, TypeGuard

import msgspec

GPU_MEM = "aliyun.com/gpu-mem"
GPU_COUNT = "aliyun.com/gpu-count"
GPUSHARE_LABEL = "gpushare"
INVENTORY = "gpushare.io/gpu-inventory"
ALLOCATION = "gpushare.io/allocation"
GPU_COUNT_ANNOTATION = "gpushare.io/gpu-count"
GPU_MODELS_ANNOTATION = "gpushare.io/gpu-models"
EXCLUSIVE_ANNOTATION = "gpushare.io/exclusive"
PLACEMENT = "gpushare.io/placement"
"""Why the extender bound the pod where it did (``gpushare.core.explain.placement_message``:
its GPUs, the policy, the best nodes' scores; at most 1 KiB), written with the Binding; read by
``kubectl inspect gpushare --pod``. For people: nothing decides on it."""
# Alibaba gpushare's annotation keys (``pkg/utils/const.go`` of gpushare-scheduler-extender).
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ALIYUN_POD = "ALIYUN_COM_GPU_MEM_POD"
ALIYUN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
ALIYUN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ALIYUN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ALIYUN_KEYS = (ALIYUN_IDX, ALIYUN_POD, ALIYUN_DEV, ALIYUN_ASSIGNED, ALIYUN_ASSUME_TIME)


class MemoryUnit(enum.StrEnum):
    """The unit of ``aliyun.com/gpu-mem`` on a node (docs/design.md, "Units"): the device plugin
    advertises one device per unit per GPU, and the inventory annotation, the allocation
    annotations and the ledger count whole units. The project's only memory-unit vocabulary:
    ``MemoryUnit("GiB")`` reads one (``ValueError`` for anything else); members are strings
    (``"GiB"``, ``"MiB"``) wherever JSON is written."""

    GIB = "GiB"
    MIB = "MiB"

    @property
    def mib(self) -> int:
        """Size of one unit in MiB (1024 for GiB, 1 for MiB)."""
        return 1024 if self is MemoryUnit.GIB else 1


Json = Mapping[str, Any]
"""A Kubernetes object as decoded JSON."""


_ECHO = reprlib.Repr()
_ECHO.maxlevel = 3
_ECHO.maxstring = 80
_ECHO.maxother = 80
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxset = _ECHO.maxdict = _ECHO.maxfrozenset = 4
ECHO_CHARS = 120
"""Characters of a value that an error message echoes at most (``shown``)."""


def shown(value: object) -> str:
    """``value`` as an error message echoes it: a ``repr`` bounded in depth, items and length
    (``reprlib``; never the whole of a value the cluster handed over, which may be a YAML alias
    expanded a billion times or a list of thousands), at most ``ECHO_CHARS`` characters."""
    text = _ECHO.repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


class CodecError(ValueError):
    """A Kubernetes object ``subject`` (``pod ns/name``, ``node n``) whose ``key`` holds a
    ``value`` gpushare cannot read; ``accepted`` says what would be read. The message echoes
    ``value`` bounded (``shown``)."""

    def __init__(self, subject: str, key: str, value: object, problem: str, accepted: str) -> None:
        super().__init__(f"{subject}: {key}={shown(value)}: {problem}; accepted: {accepted}")
        self.subject, self.key, self.value, self.accepted = subject, key, value, accepted


# -- quantities ------------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"([+-]?)(\d+(?:\.\d*)?|\.\d+)([eE][+-]?\d{1,2}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?"
)
_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000)} | {
    s: Fraction(1000**i) for i, s in enumerate(("", "k", "M", "G", "T", "P", "E"))
}
_SUFFIX |= {
    s: Fraction(1024 ** (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
}
QUANTITY_ACCEPTED = "a whole Kubernetes quantity >= 0, e.g. 8, 1k, 2Ki, 1e3"


def parse_quantity(text: object) -> Fraction:
    """A Kubernetes quantity (``"100m"``, ``"1Gi"``, ``"1e3"``, a JSON integer) as an exact
    number. Raises ``ValueError`` for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        return Fraction(text)
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("not a quantity string")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError("not a quantity")
    sign, number, suffix = match.groups()
    value = Fraction(number)
    if suffix and suffix[0] in "eE" and len(suffix) > 1:
        value *= Fraction(10) ** int(suffix[1:])
    else:
        value *= _SUFFIX[suffix or ""]
    return -value if sign == "-" else value


def whole_quantity(text: object, subject: str, key: str) -> int:
    """``parse_quantity`` that must give a whole number >= 0; ``CodecError`` otherwise."""
    if type(text) is str and text.isascii() and text.isdigit() and len(text) <= 64:
        return int(text)  # the common case, without the exact-number detour
    try:
        value = parse_quantity(text)
    except ValueError as error:
        raise CodecError(subject, key, text, str(error), QUANTITY_ACCEPTED) from None
    if value < 0 or value.denominator != 1:
        raise CodecError(subject, key, text, "not a whole number >= 0", QUANTITY_ACCEPTED)
    return int(value)


# -- typed accessors -------------------------------------------------------------------


def mapping(value: object, subject: str, key: str) -> Json:
    """``value`` as an object (``None`` reads as empty); ``CodecError`` for anything else."""
    if type(value) is dict:
        return value  # the common case, before the slower abstract-class check
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CodecError(subject, key, value, "not an object", "a JSON object")
    return value


def annotations_of(obj: Json, subject: str) -> Json:
    """``metadata.annotations`` of ``obj``, every value checked to be a string."""
    meta = mapping(obj.get("metadata"), subject, "metadata")
    annotations = mapping(meta.get("annotations"), subject, "metadata.annotations")
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise CodecError(subject, f"annotation {key}", value, "not a string", "strings")
    return annotations


def decimal(value: str, subject: str, key: str, *, positive: bool = False) -> int:
    """Annotation ``key``'s value as Go's ``strconv`` decimal (ASCII digits, at most 20)."""
    if not (value.isascii() and value.isdigit() and len(value) <= 20) or (
        positive and int(value) == 0
    ):
        accepted = "a decimal integer " + ("> 0" if positive else ">= 0")
        raise CodecError(subject, f"annotation {key}", value, "not a decimal integer", accepted)
    return int(value)


def parse_json(value: str, subject: str, key: str, accepted: str) -> Any:
    """Annotation ``key``'s value as JSON; ``CodecError`` naming ``accepted`` otherwise.

    Decoded by msgspec (about 5x faster than ``json``), which gives the same value for every
    text both accept; what msgspec refuses goes to ``json.loads``, the reference, which
    also reads ``NaN``, ``Infinity``, numbers beyond a float's range and lone surrogates."""
    try:
        return msgspec.json.decode(value)
    except (msgspec.DecodeError, ValueError, RecursionError):
        pass
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        raise CodecError(subject, f"annotation {key}", value, "not JSON", accepted) from None


def is_int(value: object) -> TypeGuard[int]:
    """An integer that is not a bool (JSON ``true`` is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def pod_key(pod: Json) -> str:
    """``namespace/name`` (namespace ``default`` when absent); ``CodecError`` without a name."""
    meta = mapping(mapping(pod, "pod", "(the pod)").get("metadata"), "pod", "metadata")
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        raise CodecError("pod", "metadata.name", name, "missing or not a string", "a pod name")
    return f"{namespace}/{name}"
