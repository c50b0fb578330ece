"""Leader election on a real ``coordination.k8s.io/v1`` Lease (``gpushare.kube.lease``).

Two or three electors with service-account clients campaign on the real API server:

* one acquires, the others wait and see it as the holder;
* a holder that stops renewing (its task cancelled, nothing released: a SIGKILL) is replaced
  only after the others have *observed* the record unchanged for the lease duration;
* a holder that can no longer renew (its RBAC is revoked: every write answers 403) stops
  deciding — ``is_leader()`` false — before any other elector acquires;
* a clean release hands over within about a second;
* electors racing for a Lease that does not exist yet: exactly one wins (optimistic
  concurrency: ``create`` or ``replace`` with the ``resourceVersion`` read).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpushare.kube.client import connect
from gpushare.kube.lease import LeaderElector, LeaseConfig
from gpushare.testing.controlplane import ControlPlane, async_wait_until

pytestmark = pytest.mark.cluster

NAMESPACE = "kube-system"
LEASE_RULES = [
    PolicyRule(
        apiGroups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "create", "update"]
    )
]
TIMING: dict[str, Any] = {"lease_duration_s": 3.0, "renew_deadline_s": 2.0, "retry_period_s": 0.25}
WAIT_S = 15.0  # a wait on the electors, unless it says otherwise


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ({"lease_duration_s": 2.0, "renew_deadline_s": 2.0}, "lease_duration_s (2) must be >"),
        ({"renew_deadline_s": 1.0, "retry_period_s": 1.0}, "renew_deadline_s (1) must be >"),
        ({"retry_period_s": 0.0}, "retry_period_s must be > 0"),
    ],
    ids=["lease-not-longer-than-renew", "renew-not-longer-than-jittered-retry", "no-retry"],
)
def test_timing_rules_of_client_go_are_enforced(timing: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LeaseConfig("ns", "name", "me", **timing)


class Candidate:
    """One elector on its own service-account client, with a log of when it led."""

    def __init__(
        self, kubeconfig: Path, lease: str, identity: str, timing: dict[str, Any] | None = None
    ) -> None:
        self.client = connect(kubeconfig, trust_env=False)
        self.elector = LeaderElector(
            self.client, LeaseConfig(NAMESPACE, lease, identity, **(timing or TIMING))
        )
        self.started_leading: list[float] = []
        self.stopped_leading: list[float] = []
        self.started_wall: list[float] = []
        self.elector.on_change(self._changed)
        self.task: asyncio.Task[None] | None = None

    def _changed(self, leading: bool) -> None:
        (self.started_leading if leading else self.stopped_leading).append(time.monotonic())
        if leading:
            self.started_wall.append(time.time())

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def stop(self, *, release: bool) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        if release:
            await self.elector.release()


@contextlib.asynccontextmanager
async def candidates(
    kubeconfigs: list[Path], timing: dict[str, Any] | None = None
) -> AsyncIterator[list[Candidate]]:
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    group = [Candidate(k, lease, f"c{i}", timing) for i, k in enumerate(kubeconfigs)]
    try:
        yield group
    finally:
        for candidate in group:
            await candidate.stop(release=False)
            await candidate.client.close()


@pytest.fixture(scope="module")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.service_account_kubeconfig("gpushare-lease", NAMESPACE, LEASE_RULES)


def test_one_acquires_the_others_wait(kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with candidates([kubeconfig] * 3) as group:
            group[0].start()
            await async_wait_until("c0 leads", group[0].elector.is_leader, WAIT_S)
            for other in group[1:]:
                other.start()
            await asyncio.sleep(TIMING["lease_duration_s"] * 1.5)  # longer than a lease
            assert group[0].elector.is_leader()
            assert [c.elector.is_leader() for c in group[1:]] == [False, False]
            assert {c.elector.holder for c in group} == {"c0"}
            assert len(group[0].started_leading) == 1
            assert group[0].stopped_leading == []

    asyncio.run(scenario())


def test_a_dead_holder_is_replaced_after_the_observed_lease_expires(kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with candidates([kubeconfig] * 2) as (first, second):
            first.start()
            await async_wait_until("c0 leads", first.elector.is_leader, WAIT_S)
            second.start()
            await asyncio.sleep(1.0)  # c1 has observed c0's renewals
            await first.stop(release=False)  # SIGKILL: no release, no more renewals
            record = await first.client.get(Lease, first.elector.config.name, namespace=NAMESPACE)
            assert record.spec is not None
            assert record.spec.renewTime is not None
            last_renewal = record.spec.renewTime.timestamp()  # c0's last write, wall clock
            await async_wait_until("c1 leads", second.elector.is_leader, 60.0)
            took_over = second.started_wall[0]
            print(f"takeover {took_over - last_renewal:.2f}s after the last renewal")
            # c1 saw that renewal no earlier than it was written, and waits a whole lease from
            # then: no bound on how late (a loaded machine only delays it).
            assert took_over >= last_renewal + TIMING["lease_duration_s"]
            assert second.elector.holder == "c1"

    asyncio.run(scenario())


def test_a_holder_that_cannot_renew_stops_deciding_before_anyone_acquires(
    control_plane: ControlPlane,
) -> None:
    revocable = control_plane.service_account_kubeconfig(
        "gpushare-lease-revoked", NAMESPACE, LEASE_RULES
    )
    healthy = control_plane.service_account_kubeconfig("gpushare-lease", NAMESPACE, LEASE_RULES)

    async def scenario() -> None:
        async with candidates([revocable, healthy]) as (first, second):
            first.start()
            await async_wait_until("c0 leads", first.elector.is_leader, WAIT_S)
            seen: list[bool] = []  # c0's own verdict at the moment c1 acquires
            second.elector.on_change(
                lambda leading: seen.append(first.elector.is_leader()) if leading else None
            )
            second.start()
            await asyncio.sleep(0.5)
            with control_plane.client() as admin:  # every renew of c0 now answers 403
                admin.delete(
                    ClusterRoleBinding, f"gpushare-test:{NAMESPACE}:gpushare-lease-revoked"
                )
            await async_wait_until("c1 leads", second.elector.is_leader, 60.0)
            # c0's own clock had turned is_leader() false when c1 acquired (checked then, not
            # by comparing callback times, which a loaded loop delays)
            assert seen == [False]
            await async_wait_until(
                "c0 notices it lost the lease", lambda: bool(first.stopped_leading), WAIT_S
            )
            assert not first.elector.is_leader()

    asyncio.run(scenario())


def test_a_clean_release_hands_over_at_the_next_retry_not_at_expiry(kubeconfig: Path) -> None:
    """With a 120 s lease, a takeover within the 30 s waited for can only come from the
    release (no wall-clock bound; the takeover time is printed)."""
    slow = {"lease_duration_s": 120.0, "renew_deadline_s": 60.0, "retry_period_s": 0.25}

    async def scenario() -> None:
        async with candidates([kubeconfig] * 2, slow) as (first, second):
            first.start()
            await async_wait_until("c0 leads", first.elector.is_leader, WAIT_S)
            second.start()
            await async_wait_until(
                "c1 has seen the Lease", lambda: second.elector.observed is not None, WAIT_S
            )
            await first.stop(release=True)
            released = time.monotonic()
            await async_wait_until("c1 leads", second.elector.is_leader, 30.0)
            took_over = time.monotonic()
            print(f"takeover {took_over - released:.2f}s after the release")

    asyncio.run(scenario())


def test_racing_candidates_on_a_new_lease_elect_exactly_one(kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with candidates([kubeconfig] * 3) as group:
            results = await asyncio.gather(*(c.elector.try_acquire_or_renew() for c in group))
            assert sorted(results) == [False, False, True]
            winner = group[results.index(True)].elector.config.identity
            results = await asyncio.gather(*(c.elector.try_acquire_or_renew() for c in group))
            assert sorted(results) == [False, False, True]
            assert group[results.index(True)].elector.config.identity == winner

    asyncio.run(scenario())
