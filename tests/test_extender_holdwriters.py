"""Who else may write the preemption holds (``gpushare.extender.holdwriters``): the gauge and
the log over a scripted sequence of answers (the real access reviews:
``tests/cluster/test_extender_preemption_trust.py``)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from gpushare.extender.holdwriters import HoldWriterCheck
from gpushare.kube.errors import ApiCallError, Failure

GRANT = "group system:serviceaccounts:kube-system may patch"


class Answers:
    def __init__(self, *answers: list[str] | Exception) -> None:
        self.answers = list(answers)

    async def __call__(self) -> list[str]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_gauge_and_the_log_follow_the_answers(caplog: pytest.LogCaptureFixture) -> None:
    refused = ApiCallError("POST subjectaccessreviews", Failure.FORBIDDEN, "no", status_code=403)
    answers = Answers(refused, refused, [], [GRANT], [GRANT], [])
    registry = CollectorRegistry()
    check = HoldWriterCheck(answers, "ConfigMap kube-system/holds", registry)

    def gauge() -> float | None:
        return registry.get_sample_value("gpushare_extender_holds_foreign_writers")

    seen = []
    with caplog.at_level(logging.INFO, logger="gpushare.extender.holdwriters"):
        for _ in range(6):
            asyncio.run(check.check())
            seen.append((gauge(), len(caplog.records)))
    assert seen == [
        (-1.0, 1),  # cannot ask: said once ...
        (-1.0, 1),  # ... not again while it lasts
        (0.0, 1),  # nobody else
        (1.0, 2),  # a grant: a warning naming it
        (1.0, 2),  # the same grant: said once
        (0.0, 3),  # gone: said
    ]
    warning = caplog.records[1]
    assert warning.levelno == logging.WARNING
    assert GRANT in warning.getMessage()
    assert caplog.records[2].levelno == logging.INFO
