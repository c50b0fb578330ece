"""The extender's decide/refuse gate (``gpushare.extender.leadership``) over a real
``LeaderElector`` on the real API server, with the elector's clock in the test's hand.

Table of situations, each with what filter/bind may do: before the Lease is held (refuse, name
the holder); held but the ledger not yet rebuilt (refuse); rebuilt (decide; binds bounded by the
Lease: start of the last renew + lease duration); past the renew deadline without a renew
(refuse, before anyone else may acquire); too little time left for a bind (refuse without
calling the API); a bind still running at the end of the Lease (abandoned: ``TimeoutError``,
outcome unknown).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from lightkube.models.rbac_v1 import PolicyRule

from gpushare.extender.bindapi import Binding
from gpushare.extender.leadership import LeaderBinder, Leadership
from gpushare.kube.client import connect
from gpushare.kube.lease import LeaderElector, LeaseConfig
from gpushare.testing.clock import ManualClock
from gpushare.testing.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

RULES = [
    PolicyRule(
        apiGroups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "create", "update"]
    )
]
BINDING = Binding("ns", "pod", "uid-1", "node-a", {})


class RecordingBinder:
    """The wrapped binder: records calls, answers after ``delay_s``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[Binding] = []
        self.delay_s = delay_s

    async def bind(self, binding: Binding) -> str | None:
        self.calls.append(binding)
        await asyncio.sleep(self.delay_s)
        return None


@pytest.fixture(scope="module")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.service_account_kubeconfig("gpushare-leadership", "kube-system", RULES)


async def rebuilt_immediately() -> None:
    return None


def test_the_gate_through_a_term(kubeconfig: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        client = connect(kubeconfig, trust_env=False)
        config = LeaseConfig("kube-system", f"gate-{uuid.uuid4().hex[:6]}", "me", 8.0, 6.0, 1.0)
        elector = LeaderElector(client, config, clock=clock)
        rebuild = asyncio.Event()

        async def slow_rebuild() -> None:
            await rebuild.wait()

        leadership = Leadership(elector, slow_rebuild, clock=clock)
        inner = RecordingBinder()
        binder = LeaderBinder(inner, leadership)
        try:
            # not holding the Lease yet
            text = leadership.refusal()
            assert text is not None
            assert "me is not the leader" in text
            assert await binder.bind(BINDING) == text
            # acquired; the rebuild has not finished
            assert await elector.try_acquire_or_renew()
            leadership.on_change(True)
            assert "still rebuilding" in (leadership.refusal() or "")
            assert await binder.bind(BINDING) is not None
            assert inner.calls == []
            # rebuilt: decides; a bind may run until the start of the renew + 8 s
            rebuild.set()
            await asyncio.sleep(0.05)
            assert leadership.deciding()
            assert leadership.refusal() is None
            assert leadership.bind_budget_s() == pytest.approx(8.0)
            assert await binder.bind(BINDING) is None
            assert inner.calls == [BINDING]
            # 5.8 s later: 2.2 s of Lease left, still deciding
            clock.now_s += 5.8
            assert leadership.bind_budget_s() == pytest.approx(2.2)
            # past the renew deadline without a renew: refuses by the clock alone
            clock.now_s += 0.3
            assert not leadership.deciding()
            assert await binder.bind(BINDING) is not None
            assert len(inner.calls) == 1
            # renewed: decides again in the same term (no new rebuild needed)
            assert await elector.try_acquire_or_renew()
            assert leadership.deciding()
        finally:
            await leadership.stop()
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("elapsed_s", "delay_s", "expect"),
    [
        (7.6, 0.0, "refused: 0.4 s left is under the minimum"),
        (7.0, 5.0, "abandoned: TimeoutError at the end of the Lease"),
        (1.0, 0.0, "bound"),
    ],
    ids=["too-little-time-left", "bind-outlives-the-lease", "plenty-of-time"],
)
def test_binds_are_bounded_by_the_lease(
    kubeconfig: Path, elapsed_s: float, delay_s: float, expect: str
) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        client = connect(kubeconfig, trust_env=False)
        config = LeaseConfig("kube-system", f"bound-{uuid.uuid4().hex[:6]}", "me", 8.0, 7.8, 1.0)
        elector = LeaderElector(client, config, clock=clock)
        leadership = Leadership(elector, rebuilt_immediately, clock=clock)
        inner = RecordingBinder(delay_s)
        binder = LeaderBinder(inner, leadership)
        try:
            assert await elector.try_acquire_or_renew()
            leadership.on_change(True)
            await asyncio.sleep(0.05)
            clock.now_s += elapsed_s
            if expect.startswith("refused"):
                assert "cannot renew its Lease in time" in (await binder.bind(BINDING) or "")
                assert inner.calls == []
            elif expect.startswith("abandoned"):
                with pytest.raises(TimeoutError, match="abandoned at the end"):
                    await binder.bind(BINDING)
            else:
                assert await binder.bind(BINDING) is None
        finally:
            await leadership.stop()
            await client.close()

    asyncio.run(scenario())
