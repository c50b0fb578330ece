"""The one poll loop of the test tiers (``gpushare.testing.controlplane.polling``): what a wait
returns, and what its failure says."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gpushare.testing.controlplane import (
    ControlPlaneError,
    ManagedProcess,
    async_wait_for,
    async_wait_until,
    wait_for,
    wait_until,
)


def test_wait_for_returns_the_probes_first_answer() -> None:
    answers = iter([None, None, "ready"])
    assert wait_for("the third answer", lambda: next(answers), 5) == "ready"


@pytest.mark.parametrize(
    "answer", [False, [], (), {}], ids=["false", "empty list", "empty tuple", "empty dict"]
)
def test_a_falsy_answer_other_than_none_is_a_bug_in_the_probe(answer: object) -> None:
    """``ready and leader()`` of an empty ``ready`` list is ``[]``, not ``None``: it must not
    end the wait as if it were an answer (the preemption fixture's wait ended at once)."""
    with pytest.raises(TypeError, match="a probe answers None to keep waiting"):
        wait_for("a ready replica", lambda: answer, 5)


def test_a_timeout_says_what_was_waited_for_how_long_and_the_last_state_seen() -> None:
    with pytest.raises(ControlPlaneError) as raised:
        wait_until("the moon", lambda: False, 0.05, detail=lambda: "still the sun")
    assert str(raised.value) == (
        "timed out after 0.05s waiting for the moon; last seen: still the sun"
    )


def test_a_process_that_exits_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('out of cheese'); raise SystemExit(3)"]
    proc = ManagedProcess("crasher", argv, tmp_path).start()
    try:
        with pytest.raises(ControlPlaneError, match=r"(?s)crasher exited with status 3.*cheese"):
            wait_until("nothing", lambda: False, 60, processes=[proc])
    finally:
        proc.stop()


def test_async_wait_for_awaits_the_probe_until_it_answers() -> None:
    answers = iter([None, 7])

    async def probe() -> int | None:
        await asyncio.sleep(0)
        return next(answers)

    assert asyncio.run(async_wait_for("the second answer", probe, 5)) == 7


def test_async_wait_until_sees_what_other_tasks_of_the_loop_change() -> None:
    done: list[bool] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, done.append, True)
        await async_wait_until("the callback", lambda: bool(done), 5)

    asyncio.run(scenario())


def test_an_async_probe_still_in_flight_at_the_deadline_is_cancelled_and_named() -> None:
    async def hangs() -> None:
        await asyncio.sleep(60)

    with pytest.raises(ControlPlaneError, match=r"^timed out after 0.05s waiting for a hang$"):
        asyncio.run(async_wait_for("a hang", hangs, 0.05))


def test_a_probes_own_timeout_error_is_not_taken_for_the_waits() -> None:
    async def fails() -> None:
        raise TimeoutError("the probe's own")

    with pytest.raises(TimeoutError, match="the probe's own"):
        asyncio.run(async_wait_for("anything", fails, 5))
