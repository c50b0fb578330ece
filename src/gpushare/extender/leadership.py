"""Several extender replicas, one decider: the extender's side of leader election.

:class:`Leadership` sits between a :class:`gpushare.kube.lease.LeaderElector` and the HTTP
verbs. A replica *decides* (filter, prioritize, bind) only while

1. its elector holds the Lease (``is_leader()``: the last renew started less than
   ``renew_deadline_s`` ago, by this replica's own clock), **and**
2. it has rebuilt its ledger for this term: after acquiring, :meth:`Leadership.on_change`
   starts ``rebuild`` (the live extender relists nodes and pods from the API server, a list
   that starts *after* the Lease was taken) and only its completion opens the gate.

Otherwise it does not decide: a follower forwards each verb to the leader
(``gpushare.extender.forward``) or, with no leader to forward to, refuses it with a text that
names the Lease and its holder (:meth:`Leadership.refusal`). Followers stay ready (``/readyz``
follows their caches, not the Lease) and keep their caches warm by list+watch, so the rebuild
is one relist.

:class:`LeaderBinder` wraps the extender's binder: a bind starts only while the gate is open
and is abandoned (client side) at the elector's ``act_deadline`` — the start of its last renew
plus the lease duration, before which no other replica can acquire. Why that is enough
(and what it cannot cover) is in docs/install.md, "High availability".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from gpushare.extender.bindapi import Binder, Binding
from gpushare.kube.lease import LeaderElector
from gpushare.kube.watch import Backoff

log = logging.getLogger(__name__)

MIN_BIND_BUDGET_S = 0.5
"""A bind is not started with less time than this before the leader's ``act_deadline``."""

REBUILD_RETRY = Backoff(initial_s=0.5, max_s=5.0)
"""Delays between rebuild attempts within one term (a failed relist is retried while the
replica still leads, not given up for the rest of the term)."""


class Leadership:
    """The decide/refuse gate of one replica (module doc). ``rebuild`` is awaited after the
    Lease is acquired, again after ``retry`` delays while it fails, until it succeeds or the
    term ends; ``clock`` is the elector's monotonic clock."""

    def __init__(
        self,
        elector: LeaderElector,
        rebuild: Callable[[], Awaitable[None]],
        *,
        clock: Callable[[], float] = time.monotonic,
        retry: Backoff = REBUILD_RETRY,
    ) -> None:
        self.elector = elector
        self._rebuild = rebuild
        self._clock = clock
        self._retry = retry
        self._rng = random.Random()
        self._term = 0
        self._rebuilt_term = -1
        self._task: asyncio.Task[None] | None = None
        elector.on_change(self.on_change)

    def on_change(self, leading: bool) -> None:
        """The elector's listener: a new term starts a rebuild; a lost one closes the gate."""
        self._term += 1
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if leading:
            self._task = asyncio.get_running_loop().create_task(
                self._rebuild_term(self._term), name="gpushare-leader-rebuild"
            )

    async def _rebuild_term(self, term: int) -> None:
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._rebuild()
                break
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay_s = self._retry.delay_s(attempt, self._rng)
                log.warning(
                    "rebuilding the ledger after taking the Lease failed (attempt %d: %r); "
                    "retrying in %.1fs",
                    attempt,
                    error,
                    delay_s,
                )
            await asyncio.sleep(delay_s)
        if term == self._term:
            self._rebuilt_term = term
            log.info(
                "leading: ledger rebuilt from the API server in %.2fs", self._clock() - started
            )

    async def stop(self) -> None:
        """Cancel a rebuild in progress (shutdown)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def deciding(self) -> bool:
        """True while this replica may decide: it leads and its ledger is rebuilt."""
        return self._rebuilt_term == self._term and self.elector.is_leader()

    def refusal(self) -> str | None:
        """``None`` while :meth:`deciding`; else why this replica refuses to decide."""
        if self.deciding():
            return None
        config = self.elector.config
        where = f"Lease {config.namespace}/{config.name}"
        if self.elector.is_leader():
            return f"gpushare replica {config.identity} holds {where} but is still rebuilding"
        holder = self.elector.holder
        held = f"held by {holder}" if holder and holder != config.identity else "not held"
        return f"gpushare replica {config.identity} is not the leader ({where} {held}); retry"

    def bind_budget_s(self) -> float | None:
        """Seconds a bind started now may run before another replica could acquire (the
        elector's ``act_deadline``); ``None`` when not deciding."""
        if not self.deciding():
            return None
        deadline = self.elector.act_deadline
        return None if deadline is None else deadline - self._clock()


class LeaderBinder:
    """A ``Binder`` that binds only while ``leadership`` decides, bounded by its deadline.

    Answers like the wrapped binder; a refusal (not leading, or less than
    ``MIN_BIND_BUDGET_S`` left) is an error text — the pod is certainly not bound — and a bind
    still running at the deadline raises ``TimeoutError`` (outcome unknown: the assumed
    allocation stays until the watch shows the pod or it expires).
    """

    def __init__(self, inner: Binder, leadership: Leadership) -> None:
        self._inner = inner
        self._leadership = leadership

    async def bind(self, binding: Binding) -> str | None:
        """Bind through the wrapped binder if this replica may (class doc)."""
        refusal = self._leadership.refusal()
        if refusal is not None:
            return refusal
        budget = self._leadership.bind_budget_s()
        if budget is None or budget < MIN_BIND_BUDGET_S:
            return (
                f"gpushare replica {self._leadership.elector.config.identity} cannot renew its "
                "Lease in time; not binding"
            )
        try:
            async with asyncio.timeout(budget):
                return await self._inner.bind(binding)
        except TimeoutError as error:
            raise TimeoutError(
                f"bind {binding.namespace}/{binding.name} to {binding.node}: abandoned at the "
                f"end of this replica's Lease ({budget:.2f}s)"
            ) from error
