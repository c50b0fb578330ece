"""Making the lightkube ``AsyncClient`` that the cache, the binder and the event recorder take.

Other packages (the extender, the CLI) get their client here, so that only ``gpushare.kube``
imports lightkube (the ``only-kube-talks-to-the-api-server`` contract, docs/architecture.md).
The client is the caller's to close (``await client.close()``, or ``async with``).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import DEFAULT_KUBECONFIG, SERVICE_ACCOUNT
from lightkube.core.exceptions import ConfigError

from gpushare.kube.kubeconfig import (
    KubeconfigError,
    check_files,
    load_kubeconfig,
    select_context,
)
from gpushare.kube.transport import closing_transport

__all__ = ["FIELD_MANAGER", "AsyncClient", "ConfigError", "KubeconfigError", "connect"]

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
    read timeout). ``trust_env`` honours ``HTTPS_PROXY``/``NO_PROXY``-style variables. Its
    transport closes a connection whose TLS handshake a cancellation interrupted
    (``gpushare.kube.transport``).

    Raises lightkube's ``ConfigError`` (re-exported here) when no configuration is found, and
    its subclass ``KubeconfigError`` (one line: ``kubeconfig <path>: <problem>``) when the file
    is missing, unreadable, not a kubeconfig, or has no such context or its context names no
    user, or a file it points at (certificate, key, CA, token file) is missing: then the
    entry, its key and the path are named (``gpushare.kube.kubeconfig.check_files``).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    config = _config(kubeconfig)
    single = select_context(config, context)
    where = config.fname or "(in-cluster)"
    if single.user is None:  # lightkube would stop at an assertion
        raise KubeconfigError(where, f"context {single.context_name!r} names no user")
    check_files(single)
    try:
        verify = verify_cluster(single.cluster, single.user, single.abs_file, trust_env=trust_env)
        return AsyncClient(
            single,
            timeout=httpx2.Timeout(timeout_s),
            field_manager=FIELD_MANAGER,
            trust_env=trust_env,
            transport=closing_transport(verify, trust_env=trust_env),
        )
    except (OSError, ValueError, TypeError, ConfigError) as error:  # certificates, server URL
        raise KubeconfigError(where, f"{type(error).__name__}: {error}") from error


def _config(kubeconfig: Path | None) -> KubeConfig:
    """The explicit file, else lightkube's order (``KubeConfig.from_env``): the in-cluster
    service account, ``$KUBECONFIG``, ``~/.kube/config``; files read by ``load_kubeconfig``."""
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig)
    try:
        return KubeConfig.from_service_account(service_account=SERVICE_ACCOUNT)
    except ConfigError:
        pass
    path = Path(os.environ.get("KUBECONFIG", DEFAULT_KUBECONFIG)).expanduser()
    if not path.exists():
        raise ConfigError(f"Configuration file {path} not found")
    return load_kubeconfig(path)
