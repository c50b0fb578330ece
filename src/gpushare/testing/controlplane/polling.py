"""Waiting in tests: the one poll loop of every test tier, sync and async.

A wait polls a probe with a short backoff (20 ms, growing by half to 250 ms) until the probe
answers, never a fixed sleep, and fails after ``timeout`` s with :class:`ControlPlaneError`
saying what it waited for, for how long, and (``detail``) the last state seen.

* :func:`wait_for` / :func:`wait_until`: a blocking probe (an API read, an HTTP health check, a
  file); ``processes``: programs checked before every poll, so that a crash fails at once with
  the crashed program's log instead of a timeout.
* :func:`async_wait_for` / :func:`async_wait_until`: the same inside an event loop, for a
  condition that tasks of the same loop make true. :func:`async_wait_for` awaits its probe (an
  async API read); :func:`async_wait_until` checks a plain condition (in-memory state).

A probe answers by returning something other than ``None`` (that is what the wait returns); a
condition by returning true. Either may raise to fail the wait at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from gpushare.testing.controlplane.errors import ControlPlaneError

if TYPE_CHECKING:
    from gpushare.testing.controlplane.processes import ManagedProcess

T = TypeVar("T")

FIRST_DELAY_S = 0.02
MAX_DELAY_S = 0.25


class _Poll:
    """One wait's deadline, backoff and failure message."""

    def __init__(
        self,
        what: str,
        timeout: float,
        processes: Sequence[ManagedProcess] = (),
        detail: Callable[[], object] | None = None,
    ) -> None:
        self.what = what
        self.timeout = timeout
        self.processes = processes
        self.detail = detail
        self.deadline = time.monotonic() + timeout
        self.delay = FIRST_DELAY_S

    def check_processes(self) -> None:
        for proc in self.processes:
            proc.check_running()

    def next_delay(self) -> float:
        """The sleep before the next poll; raises :meth:`timed_out` past the deadline."""
        if time.monotonic() >= self.deadline:
            raise self.timed_out()
        delay, self.delay = self.delay, min(self.delay * 1.5, MAX_DELAY_S)
        return delay

    def timed_out(self) -> ControlPlaneError:
        message = f"timed out after {self.timeout:g}s waiting for {self.what}"
        if self.detail is not None:
            message += f"; last seen: {self.detail()}"
        logs = "".join(f"\n--- {p.name} ---\n{p.log_tail(30)}" for p in self.processes)
        return ControlPlaneError(message + logs)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 30.0,
    *,
    processes: Sequence[ManagedProcess] = (),
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``probe`` until it returns something other than ``None``, and return that; fail
    with ``what`` (and ``detail()``, the last state seen) after ``timeout`` s. A probe that
    answers ``False`` or an empty collection is a bug in the probe (``x and y`` of an empty
    list is not ``None``: the wait would end at once): ``TypeError`` saying so.

    Every poll first checks that ``processes`` are still running, so a crash fails fast with
    the crashed program's log instead of a timeout.
    """
    poll = _Poll(what, timeout, processes, detail)
    while True:
        poll.check_processes()
        value = probe()
        if value is not None:
            return _checked(what, value)
        time.sleep(poll.next_delay())


def _checked(what: str, value: T) -> T:
    """``value``, a probe's answer that ends the wait for ``what``; ``TypeError`` for a falsy
    one that is not ``None`` (module doc of ``wait_for``)."""
    if value is False or (isinstance(value, (list, tuple, dict, set, frozenset)) and not value):
        raise TypeError(
            f"waiting for {what}: the probe answered {value!r}; a probe answers None to keep "
            "waiting (wait_until takes a condition)"
        )
    return value


def wait_until(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    *,
    processes: Sequence[ManagedProcess] = (),
    detail: Callable[[], object] | None = None,
) -> None:
    """:func:`wait_for` a condition that is simply true or false."""
    wait_for(
        what,
        lambda: True if condition() else None,
        timeout,
        processes=processes,
        detail=detail,
    )


async def async_wait_for(
    what: str,
    probe: Callable[[], Awaitable[T | None]],
    timeout: float = 30.0,
    *,
    detail: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_for` in an event loop: await ``probe`` until it returns something other
    than ``None``, and return that. A probe still in flight at the deadline is cancelled."""
    poll = _Poll(what, timeout, detail=detail)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            while True:
                value = await probe()
                if value is not None:
                    return _checked(what, value)
                await asyncio.sleep(poll.next_delay())
    except TimeoutError:
        if scope.expired():
            raise poll.timed_out() from None
        raise


async def async_wait_until(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    *,
    detail: Callable[[], object] | None = None,
) -> None:
    """:func:`async_wait_for` a plain condition that is simply true or false (state that other
    tasks of the loop change)."""

    async def holds() -> bool | None:
        return True if condition() else None

    await async_wait_for(what, holds, timeout, detail=detail)
