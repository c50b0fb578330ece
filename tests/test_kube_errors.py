"""``gpushare.kube.errors``: each client-library error maps to one ``Failure`` with a retry hint."""

from __future__ import annotations

import httpx2
import msgspec
import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status, StatusDetails

from gpushare.kube.errors import (
    ApiCallError,
    BindError,
    BindStage,
    Failure,
    api_call_error,
    classify,
    is_client_error,
)

REQUEST = httpx2.Request("GET", "https://127.0.0.1:6443/api/v1/pods")


def api_error(code: int, reason: str = "", retry_after: int | None = None) -> ApiError:
    details = StatusDetails(retryAfterSeconds=retry_after) if retry_after is not None else None
    return ApiError(status=Status(code=code, reason=reason, message="msg", details=details))


def status_error(code: int, headers: dict[str, str] | None = None) -> httpx2.HTTPStatusError:
    response = httpx2.Response(code, headers=headers, request=REQUEST)
    return httpx2.HTTPStatusError("refused", request=REQUEST, response=response)


CASES = [
    ("409 conflict", api_error(409, "Conflict"), Failure.CONFLICT, 409, None, True),
    ("404 not found", api_error(404, "NotFound"), Failure.NOT_FOUND, 404, None, False),
    ("401 unauthorized", api_error(401), Failure.FORBIDDEN, 401, None, False),
    ("403 forbidden", api_error(403, "Forbidden"), Failure.FORBIDDEN, 403, None, False),
    ("400 bad request", api_error(400), Failure.INVALID, 400, None, False),
    ("422 invalid", api_error(422, "Invalid"), Failure.INVALID, 422, None, False),
    ("410 expired event", api_error(410, "Expired"), Failure.EXPIRED, 410, None, True),
    ("429 with retry", api_error(429, "TooManyRequests", 3), Failure.THROTTLED, 429, 3.0, True),
    ("500 internal", api_error(500), Failure.SERVER, 500, None, True),
    ("503 unavailable", api_error(503), Failure.SERVER, 503, None, True),
    ("watch refused with 410", status_error(410), Failure.EXPIRED, 410, None, True),
    (
        "429 with Retry-After header",
        status_error(429, {"Retry-After": "2"}),
        Failure.THROTTLED,
        429,
        2.0,
        True,
    ),
    (
        "garbage Retry-After header",
        status_error(503, {"Retry-After": "soon"}),
        Failure.SERVER,
        503,
        None,
        True,
    ),
    ("connect error", httpx2.ConnectError("refused"), Failure.UNREACHABLE, None, None, True),
    ("read timeout", httpx2.ReadTimeout("slow"), Failure.UNREACHABLE, None, None, True),
    ("peer closed", httpx2.RemoteProtocolError("eof"), Failure.UNREACHABLE, None, None, True),
    ("bad reply", msgspec.ValidationError("no"), Failure.SERVER, None, None, True),
]


@pytest.mark.parametrize(
    ("exc", "failure", "code", "retry_after_s", "temporary"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_classify(
    exc: Exception, failure: Failure, code: int | None, retry_after_s: float | None, temporary: bool
) -> None:
    assert is_client_error(exc)
    got_failure, got_code, got_retry, detail = classify(exc)
    assert (got_failure, got_code, got_retry) == (failure, code, retry_after_s)
    assert failure.temporary is temporary
    assert detail


def test_api_error_detail_carries_the_servers_reason_and_message() -> None:
    error = api_call_error("PATCH pods ml/p", api_error(409, "Conflict"))
    assert isinstance(error, ApiCallError)
    assert (error.failure, error.status_code, error.temporary) == (Failure.CONFLICT, 409, True)
    assert str(error) == "PATCH pods ml/p: conflict (HTTP 409): Conflict: msg"


def test_no_reply_is_said_so() -> None:
    error = api_call_error("GET nodes", httpx2.ConnectError("refused"))
    assert str(error) == "GET nodes: unreachable (no reply): ConnectError: refused"


def test_other_exceptions_are_not_classified() -> None:
    assert not is_client_error(ValueError("x"))
    with pytest.raises(TypeError, match="not a client library error"):
        classify(ValueError("x"))


@pytest.mark.parametrize(
    ("failure", "hint"),
    [(Failure.CONFLICT, "temporary, retry"), (Failure.ALREADY_BOUND, "permanent")],
    ids=["temporary", "permanent"],
)
def test_bind_error_message_names_pod_node_stage_and_hint(failure: Failure, hint: str) -> None:
    error = BindError("ml/p", "n3", BindStage.BIND, failure, "details", bound_node="n1")
    assert str(error) == f"bind ml/p to n3: create binding: {failure.value} ({hint}): details"
    assert error.temporary is failure.temporary
    assert error.bound_node == "n1"
