"""Making the lightkube ``AsyncClient`` that the cache, the binder and the event recorder take.

Other packages (the extender, the CLI) get their client here, so that only ``gpushare.kube``
imports lightkube (design.md, section 2). The client is the caller's to close
(``await client.close()``, or ``async with``).
"""

from __future__ import annotations

from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ConfigError

__all__ = ["FIELD_MANAGER", "AsyncClient", "ConfigError", "connect"]

FIELD_MANAGER = "gpushare"
"""The field manager recorded for gpushare's writes (``managedFields``)."""


def connect(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    timeout_s: float = 10.0,
    trust_env: bool = True,
) -> AsyncClient:
    """An ``AsyncClient`` for ``kubeconfig`` (and its ``context``, default: current), or, with
    no file, the pod's in-cluster service account, else ``$KUBECONFIG``, else
    ``~/.kube/config``. ``timeout_s`` bounds each request (seconds; watches are exempt from the
    read timeout). ``trust_env`` honours ``HTTPS_PROXY``/``NO_PROXY``-style variables.

    Raises lightkube's ``ConfigError`` (re-exported here) when no configuration is found.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    config = KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
    single = config.get(context_name=context)
    if single is None:  # lightkube raises ConfigError first; kept for the type checker
        raise ValueError(f"no context {context!r} in the Kubernetes configuration")
    return AsyncClient(
        single,
        timeout=httpx2.Timeout(timeout_s),
        field_manager=FIELD_MANAGER,
        trust_env=trust_env,
    )
