"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Several extender replicas run; one decides. :class:`LeaderElector` is a small port of client-go's
``tools/leaderelection`` (``LeaderElector.tryAcquireOrRenew``, the ``LeaseLock``) on lightkube:

* **Expiry by observation, never by comparing clocks.** A candidate remembers the Lease's
  ``resourceVersion`` and *its own* monotonic time when that version was first seen. It takes
  the Lease over only when the record has not changed for ``lease_duration_s`` of its own
  time (``renewTime`` is written for humans and other tools, never read).
* **Optimistic concurrency.** Every write is a ``replace`` carrying the ``resourceVersion``
  that was read; of two candidates writing the same version, the API server accepts one and
  answers 409 to the other. A missing Lease is ``create``\\ d (409 if another won).
* **Timing.** Candidates and the leader try every ``retry_period_s``. The leader's authority
  ends ``renew_deadline_s`` after the *start* of its last successful renew (client-go counts
  from the answer; counting from the request is the conservative side): :meth:`is_leader` turns
  false at that instant even if no loop has noticed, so a leader that cannot reach the API
  server stops deciding before any candidate may take over (``renew_deadline_s <
  lease_duration_s``). :attr:`LeaderElector.act_deadline` (start of the last renew +
  ``lease_duration_s``) is the latest moment an action of this leader may land; a bind must
  be bounded by it (docs/install.md, "High availability").
* **Release.** :meth:`release` (clean shutdown) writes an empty ``holderIdentity`` and a
  1-second ``leaseDurationSeconds``, as client-go's ``ReleaseOnCancel``, so a successor takes
  over after one second instead of a whole lease.

A lost leadership sends the elector back to candidate (client-go's callers usually exit; the
extender keeps its warm caches and rebuilds when it leads again). Listeners
(:meth:`LeaderElector.on_change`) are called synchronously on the event loop with ``True``
when this replica starts leading and ``False`` when it stops.

RBAC: ``leases`` in ``coordination.k8s.io``: ``get``, ``create``, ``update`` (the named Lease).
Source: client-go ``tools/leaderelection/leaderelection.go`` and ``resourcelock/leaselock.go``
(Kubernetes v1.31); the defaults here are shorter than client-go's 15/10/2 s so that failover
fits in 15 s (docs/install.md).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lightkube import AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpushare.kube.errors import CLIENT_ERRORS, classify

__all__ = ["LeaderElector", "LeaseConfig", "LeaseRecord"]

_LOG = logging.getLogger(__name__)
JITTER_FACTOR = 1.2
"""client-go's ``JitterFactor``: ``renew_deadline_s`` must exceed ``retry_period_s`` × this."""


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Which Lease, who we are, and the timing (seconds).

    ``identity`` is written to ``holderIdentity`` (the extender uses ``$POD_NAME``, the pod IP
    and a random suffix); ``holder_annotations`` are merged into the Lease's annotations with
    every write of this holder (the extender publishes its address there, for followers that
    forward to it). Rules (client-go's ``NewLeaderElector``):
    ``lease_duration_s > renew_deadline_s > retry_period_s × 1.2``, all > 0. ``ValueError``
    lists every broken rule.
    """

    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 8.0
    renew_deadline_s: float = 6.0
    retry_period_s: float = 1.0
    holder_annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        for what, value in (("namespace", self.namespace), ("name", self.name)):
            if not value:
                problems.append(f"the Lease {what} is empty")
        if not self.identity:
            problems.append("the identity is empty")
        if self.retry_period_s <= 0:
            problems.append(f"retry_period_s must be > 0, got {self.retry_period_s:g}")
        if self.renew_deadline_s <= self.retry_period_s * JITTER_FACTOR:
            problems.append(
                f"renew_deadline_s ({self.renew_deadline_s:g}) must be > retry_period_s × "
                f"{JITTER_FACTOR} ({self.retry_period_s * JITTER_FACTOR:g})"
            )
        if self.lease_duration_s <= self.renew_deadline_s:
            problems.append(
                f"lease_duration_s ({self.lease_duration_s:g}) must be > renew_deadline_s "
                f"({self.renew_deadline_s:g})"
            )
        if problems:
            raise ValueError("leader election: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the Lease said when last read: holder ('' when released or never held),
    ``resource_version``, ``lease_duration_s`` (``leaseDurationSeconds``) and the Lease's
    ``annotations``."""

    holder: str
    resource_version: str
    lease_duration_s: float
    annotations: Mapping[str, str] = field(default_factory=dict)


def _written_duration_s(config: LeaseConfig) -> int:
    """``leaseDurationSeconds`` as written (whole seconds, rounded down: others wait that)."""
    return max(1, math.floor(config.lease_duration_s))


def _now_micro() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    """Campaigns for ``config``'s Lease on ``client`` (module doc). Run :meth:`run` as a task;
    ``clock`` is monotonic seconds (tests may inject one)."""

    def __init__(
        self,
        client: AsyncClient,
        config: LeaseConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._client = client
        self._clock = clock
        self._listeners: list[Callable[[bool], None]] = []
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # start of the last successful write of ours
        self._leading = False  # what the listeners were last told
        self._held_at_stop = False  # led when run() was cancelled

    # ---- reading ---------------------------------------------------------------------

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(True)`` when this replica starts leading, ``(False)`` when it stops
        (synchronously, on the elector's event loop; it must not block)."""
        self._listeners.append(listener)

    def is_leader(self) -> bool:
        """True while the last successful renew started less than ``renew_deadline_s`` ago.
        Checked at every decision; turns false by the clock alone."""
        renewed = self._renewed_at
        return renewed is not None and self._clock() < renewed + self.config.renew_deadline_s

    @property
    def act_deadline(self) -> float | None:
        """The monotonic time (``clock``) by which every action of this leader must have
        landed: no other replica can acquire before it. ``None`` when not leading."""
        if not self.is_leader():
            return None
        assert self._renewed_at is not None
        return self._renewed_at + _written_duration_s(self.config)

    @property
    def holder(self) -> str:
        """The ``holderIdentity`` last read or written ('' if none or unknown)."""
        return self._observed.holder if self._observed is not None else ""

    @property
    def observed(self) -> LeaseRecord | None:
        """The Lease as last read or written (``None`` before the first round)."""
        return self._observed

    # ---- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Campaign and renew every ``retry_period_s`` until cancelled; on cancellation the
        listeners hear ``False`` (if they heard ``True``). Call :meth:`release` afterwards
        for a fast hand-over."""
        try:
            while True:
                started = self._clock()
                await self.try_acquire_or_renew()
                self._announce()
                pause = self.config.retry_period_s - (self._clock() - started)
                await asyncio.sleep(max(0.0, pause))
        finally:
            self._held_at_stop = self.is_leader()  # release() may still hand it over
            self._renewed_at = None
            self._announce()

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease; create, take over or renew it when allowed. True when
        this replica holds it afterwards. API errors are logged and count as a failed round."""
        config = self.config
        started = self._clock()
        try:
            lease = await self._client.get(Lease, config.name, namespace=config.namespace)
        except CLIENT_ERRORS as error:
            _, code, _, detail = classify(error)
            if code != 404:
                _LOG.warning("reading Lease %s: %s", self._where(), detail)
                return False
            return await self._write(None, started)
        record = self._record(lease)
        if self._observed is None or record.resource_version != self._observed.resource_version:
            self._observed, self._observed_at = record, started
        mine = record.holder == config.identity
        if record.holder and not mine:
            expires = self._observed_at + record.lease_duration_s
            if started < expires:
                return False  # someone else holds a lease we have not seen expire
        return await self._write(lease, started)

    async def release(self) -> bool:
        """Give the Lease up if this replica holds it (clean shutdown): empty holder, 1-second
        duration. True when released; errors are logged."""
        was_leader = self.is_leader() or self._held_at_stop
        self._held_at_stop = False
        self._renewed_at = None
        self._announce()
        if not was_leader or self._observed is None:
            return False
        config = self.config
        try:
            lease = await self._client.get(Lease, config.name, namespace=config.namespace)
            spec = lease.spec or LeaseSpec()
            if spec.holderIdentity != config.identity:
                return False
            now = _now_micro()
            lease.spec = LeaseSpec(
                holderIdentity="",
                leaseDurationSeconds=1,
                acquireTime=now,
                renewTime=now,
                leaseTransitions=spec.leaseTransitions,
            )
            await self._client.replace(lease)
        except CLIENT_ERRORS as error:
            _LOG.warning("releasing Lease %s: %s", self._where(), classify(error)[3])
            return False
        _LOG.info("released Lease %s", self._where())
        return True

    # ---- helpers ---------------------------------------------------------------------

    async def _write(self, lease: Lease | None, started: float) -> bool:
        config = self.config
        now = _now_micro()
        duration = _written_duration_s(config)
        try:
            if lease is None:
                lease = Lease(
                    metadata=ObjectMeta(
                        name=config.name,
                        namespace=config.namespace,
                        annotations=dict(config.holder_annotations) or None,
                    ),
                    spec=LeaseSpec(
                        holderIdentity=config.identity,
                        leaseDurationSeconds=duration,
                        acquireTime=now,
                        renewTime=now,
                        leaseTransitions=0,
                    ),
                )
                written = await self._client.create(lease)
            else:
                old = lease.spec or LeaseSpec()
                renewing = old.holderIdentity == config.identity and self._renewed_at is not None
                transitions = old.leaseTransitions or 0
                lease.spec = LeaseSpec(
                    holderIdentity=config.identity,
                    leaseDurationSeconds=duration,
                    acquireTime=old.acquireTime if renewing else now,
                    renewTime=now,
                    leaseTransitions=transitions if renewing else transitions + 1,
                )
                if config.holder_annotations:
                    meta = lease.metadata or ObjectMeta()
                    meta.annotations = {**(meta.annotations or {}), **config.holder_annotations}
                    lease.metadata = meta
                written = await self._client.replace(lease)  # carries the resourceVersion read
        except CLIENT_ERRORS as error:
            _, code, _, detail = classify(error)
            log = _LOG.info if code == 409 else _LOG.warning
            log("writing Lease %s: %s", self._where(), detail)
            return False
        self._observed, self._observed_at = self._record(written), started
        self._renewed_at = started
        return True

    def _announce(self) -> None:
        leading = self.is_leader()
        if leading == self._leading:
            return
        self._leading = leading
        _LOG.info(
            "%s %s Lease %s",
            self.config.identity,
            "now holds" if leading else "no longer holds",
            self._where(),
        )
        for listener in self._listeners:
            try:
                listener(leading)
            except Exception:
                _LOG.exception("leadership listener %r failed", listener)

    def _where(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    @staticmethod
    def _record(lease: Lease) -> LeaseRecord:
        spec = lease.spec or LeaseSpec()
        meta = lease.metadata or ObjectMeta()
        return LeaseRecord(
            holder=spec.holderIdentity or "",
            resource_version=meta.resourceVersion or "",
            lease_duration_s=float(spec.leaseDurationSeconds or 0),
            annotations=dict(meta.annotations or {}),
        )
