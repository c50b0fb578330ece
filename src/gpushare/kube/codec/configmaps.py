"""ConfigMaps gpushare reads: Alibaba's ``kube-system/unhealthy-gpu-<node>`` (GPUs an operator
marked unhealthy by hand). Pure; no I/O.

Format (Alibaba's ``gpushare-scheduler-extender``, ``pkg/cache/nodeinfo.go``,
``getUnhealthyGPUs``): ConfigMap ``unhealthy-gpu-<node name>`` in ``kube-system``, key ``gpus``
in ``data``: GPU indices separated by commas, e.g. ``"0,2"``. No ``gpus`` key, or an empty
value, marks none. Where Alibaba's code logs a value it cannot parse and then marks GPU 0
(``strconv.Atoi`` gives 0 with its error), gpushare refuses the whole value with a
``CodecError`` naming it, so that a typo never takes a healthy GPU out of service.
"""

from __future__ import annotations

from gpushare.kube.codec.common import CodecError, Json, mapping

UNHEALTHY_NAMESPACE = "kube-system"
UNHEALTHY_PREFIX = "unhealthy-gpu-"
UNHEALTHY_KEY = "gpus"
UNHEALTHY_ACCEPTED = 'GPU indices separated by commas, e.g. "0,2" (empty: none)'


def unhealthy_configmap_name(node: str) -> str:
    """``unhealthy-gpu-<node>``: the ConfigMap (in ``kube-system``) for node ``node``."""
    return f"{UNHEALTHY_PREFIX}{node}"


def marked_unhealthy(configmap: Json, gpu_indices: frozenset[int]) -> frozenset[int]:
    """The GPU indices ``configmap`` marks unhealthy (module doc), each one of the node's
    ``gpu_indices``. ``CodecError`` naming the ConfigMap, the key and the value for anything
    else: a part that is not a decimal index, or an index the node does not have."""
    meta = mapping(configmap.get("metadata"), "configmap", "metadata")
    subject = f"configmap {meta.get('namespace') or UNHEALTHY_NAMESPACE}/{meta.get('name')}"
    raw = mapping(configmap.get("data"), subject, "data").get(UNHEALTHY_KEY)
    if raw is None:
        return frozenset()
    if not isinstance(raw, str):
        raise CodecError(subject, f"data.{UNHEALTHY_KEY}", raw, "not a string", UNHEALTHY_ACCEPTED)
    parts = [part.strip() for part in raw.split(",")] if raw.strip() else []
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise CodecError(
            subject, f"data.{UNHEALTHY_KEY}", raw, "not GPU indices", UNHEALTHY_ACCEPTED
        )
    marked = frozenset(int(part) for part in parts)
    missing = sorted(marked - gpu_indices)
    if missing:
        have = ", ".join(map(str, sorted(gpu_indices))) or "none"
        raise CodecError(
            subject, f"data.{UNHEALTHY_KEY}", raw,
            f"names GPU {', '.join(map(str, missing))}; the node has GPUs {have}",
            UNHEALTHY_ACCEPTED,
        )  # fmt: skip
    return marked
