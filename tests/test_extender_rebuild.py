"""A new leader's ledger rebuild (``gpushare.extender.leadership.Leadership``): it is retried
with backoff while it fails, for as long as the term lasts; the gate opens once it succeeds.
The whole term on a real API server is ``tests/cluster/test_extender_leadership.py``."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from gpushare.extender.leadership import Leadership
from gpushare.kube.client import AsyncClient
from gpushare.kube.lease import LeaderElector, LeaseConfig
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import async_wait_until


def test_a_failed_rebuild_is_retried_within_the_term_until_it_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relist that fails right after the Lease is taken (the API server briefly away) must
    not leave the leader holding the Lease without deciding for the rest of its term."""
    config = LeaseConfig("kube-system", "gpushare-extender", "me", 8.0, 6.0, 1.0)
    elector = LeaderElector(cast(AsyncClient, object()), config)  # never campaigns here
    monkeypatch.setattr(elector, "is_leader", lambda: True)
    attempts: list[int] = []

    async def flaky_rebuild() -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ConnectionError("API server unreachable")

    async def term() -> bool:
        leadership = Leadership(
            elector, flaky_rebuild, retry=Backoff(initial_s=0.01, max_s=0.01, jitter=0)
        )
        leadership.on_change(True)
        try:
            await async_wait_until("a decision after 3 rebuilds", leadership.deciding, 2.0)
        finally:
            await leadership.stop()
        return leadership.deciding()

    assert asyncio.run(term())
    assert attempts == [1, 2, 3]
