"""A clock for tests: an injectable monotonic clock (seconds) that moves only when the test
moves it (``clock.now_s += 5``). Components that take ``clock: Callable[[], float]`` (the
ledger, the event rate, the health watch, leader election) get one of these instead of
``time.monotonic``."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Returns ``now_s`` when called (seconds; 1000.0 unless given)."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s
