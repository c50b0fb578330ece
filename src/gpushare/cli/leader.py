"""``--leader-elect`` and its companions: kube-scheduler's flag names, gpushare's defaults.

The names follow kube-scheduler's (``--leader-elect``, ``--leader-elect-lease-duration``,
``--leader-elect-renew-deadline``, ``--leader-elect-retry-period``,
``--leader-elect-resource-namespace``, ``--leader-elect-resource-name``); durations are seconds.
The defaults (8 s / 6 s / 1 s) keep failover within 15 s (docs/install.md, "High
availability"). The identity is ``$POD_NAME`` (else the host name), the pod IP
(``$POD_IP``) when known, and a random suffix, as client-go's ``hostname_uuid``: a restarted
process never mistakes its predecessor's Lease for its own.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpushare.kube.lease import LeaseConfig

__all__ = ["DEFAULT_LEASE_NAME", "default_identity", "leader_election_options", "lease_config"]

R = TypeVar("R")
DEFAULT_LEASE_NAME = "gpushare-extender"


def default_identity() -> str:
    """``<pod name or host name>[_<pod IP>]_<8 hex digits>``."""
    parts = [os.environ.get("POD_NAME") or socket.gethostname()]
    if os.environ.get("POD_IP"):
        parts.append(os.environ["POD_IP"])
    parts.append(uuid.uuid4().hex[:8])
    return "_".join(parts)


_OPTION_PARAMS = (
    "leader_elect",
    "lease_duration_s",
    "renew_deadline_s",
    "retry_period_s",
    "lease_namespace",
    "lease_name",
    "lease_identity",
)


def leader_election_options(command: Callable[..., R]) -> Callable[..., R]:
    """The ``--leader-elect*`` options (module doc), handed to ``command`` as one keyword
    argument, ``leader_election``: the ``LeaseConfig`` of :func:`lease_config` (``None``
    without ``--leader-elect``)."""

    @functools.wraps(command)
    def with_lease(*args: object, **kwargs: Any) -> R:
        values = {name: kwargs.pop(name) for name in _OPTION_PARAMS}
        return command(*args, leader_election=lease_config(**values), **kwargs)

    seconds = click.FloatRange(min=0, min_open=True)
    options = [
        click.option(
            "--leader-elect/--no-leader-elect",
            default=False,
            show_default=True,
            help="Run as one of several replicas: only the holder of a coordination.k8s.io "
            "Lease decides; the others stay warm and forward requests to it.",
        ),
        click.option(
            "--leader-elect-lease-duration",
            "lease_duration_s",
            type=seconds,
            default=8.0,
            show_default=True,
            help="Seconds a candidate waits, after the Lease last changed, before taking it.",
        ),
        click.option(
            "--leader-elect-renew-deadline",
            "renew_deadline_s",
            type=seconds,
            default=6.0,
            show_default=True,
            help="Seconds the leader keeps deciding after its last successful renew started.",
        ),
        click.option(
            "--leader-elect-retry-period",
            "retry_period_s",
            type=seconds,
            default=1.0,
            show_default=True,
            help="Seconds between attempts to acquire or renew.",
        ),
        click.option(
            "--leader-elect-resource-namespace",
            "lease_namespace",
            default=None,
            help="Namespace of the Lease (default: $POD_NAMESPACE, else kube-system).",
        ),
        click.option(
            "--leader-elect-resource-name",
            "lease_name",
            default=DEFAULT_LEASE_NAME,
            show_default=True,
            help="Name of the Lease.",
        ),
        click.option(
            "--leader-elect-identity",
            "lease_identity",
            default=None,
            help="holderIdentity to write (default: pod name, pod IP and a random suffix).",
        ),
    ]
    decorated: Callable[..., R] = with_lease
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def lease_config(
    *,
    leader_elect: bool,
    lease_duration_s: float,
    renew_deadline_s: float,
    retry_period_s: float,
    lease_namespace: str | None,
    lease_name: str,
    lease_identity: str | None,
) -> LeaseConfig | None:
    """The ``LeaseConfig`` of these options (``None`` without ``--leader-elect``);
    ``click.UsageError`` naming every broken timing rule."""
    if not leader_elect:
        return None
    try:
        return LeaseConfig(
            namespace=lease_namespace or os.environ.get("POD_NAMESPACE") or "kube-system",
            name=lease_name,
            identity=lease_identity or default_identity(),
            lease_duration_s=lease_duration_s,
            renew_deadline_s=renew_deadline_s,
            retry_period_s=retry_period_s,
        )
    except ValueError as error:
        raise click.UsageError(f"--leader-elect-*: {error}") from error
