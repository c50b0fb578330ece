"""Errors of ``gpushare.kube``: one tree, the library error chained as the cause, retry in the type.

Every failure to talk to the API server surfaces as a :class:`KubeError`; the lightkube, httpx2
or msgspec exception that caused it is its ``__cause__``. What a caller should do is in
``error.failure`` (a :class:`Failure`) and its ``temporary`` flag, never in the message text::

    KubeError            any failure talking to kube-apiserver
    ├── ApiCallError     one API call (GET, PATCH, POST, LIST, WATCH) failed; ``what`` names it
    └── BindError        a bind (read, annotate, bind) failed; pod, node, stage, bound_node

``temporary`` is true when the same call may succeed later without anyone changing anything
(conflicts after a re-read, throttling, server errors, unreachable server, expired watches);
permanent failures (not found, forbidden, invalid, already bound) need a different request or a
fix elsewhere (RBAC, the pod). ``retry_after_s`` is the server's ``Retry-After`` hint, if any.
"""

from __future__ import annotations

import enum
from typing import Any

import httpx2
import msgspec
from lightkube.core.exceptions import ApiError

__all__ = [
    "CLIENT_ERRORS",
    "ApiCallError",
    "BindError",
    "BindStage",
    "Failure",
    "KubeError",
    "api_call_error",
    "classify",
    "is_client_error",
]


class Failure(enum.StrEnum):
    """Why a call failed. The value is a fixed text; details live in the error's fields."""

    CONFLICT = "conflict"
    """409 or a failed precondition: the object changed meanwhile; re-read, then retry."""
    ALREADY_BOUND = "already bound"
    """The pod already has ``spec.nodeName`` (bind only); ``BindError.bound_node`` says where."""
    NOT_FOUND = "not found"
    """404, or the pod was recreated under another UID, or it is being deleted."""
    FORBIDDEN = "forbidden"
    """401/403: the credentials or their RBAC rules do not allow the call."""
    INVALID = "invalid"
    """400, 422 or another 4xx: the request itself is wrong."""
    EXPIRED = "expired"
    """410 Gone on a list or watch: the resourceVersion is too old; relist."""
    THROTTLED = "throttled"
    """429: too many requests; retry after ``retry_after_s``."""
    SERVER = "server error"
    """5xx, or a reply that could not be read."""
    UNREACHABLE = "unreachable"
    """No reply: connection refused or reset, timeout, TLS failure."""

    @property
    def temporary(self) -> bool:
        """Whether retrying later (after a re-read for ``CONFLICT``) may succeed."""
        return self in _TEMPORARY


_TEMPORARY = frozenset(
    {Failure.CONFLICT, Failure.EXPIRED, Failure.THROTTLED, Failure.SERVER, Failure.UNREACHABLE}
)


class KubeError(Exception):
    """A failure talking to the API server.

    ``failure`` classifies it; ``status_code`` is the HTTP status when there was a reply
    (``None`` otherwise); ``retry_after_s`` is the server's retry hint in seconds, if any.
    """

    def __init__(
        self,
        message: str,
        failure: Failure,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.failure = failure
        self.status_code = status_code
        self.retry_after_s = retry_after_s

    @property
    def temporary(self) -> bool:
        """Whether the same call may succeed later (see :attr:`Failure.temporary`)."""
        return self.failure.temporary

    def __str__(self) -> str:
        return self.message


class ApiCallError(KubeError):
    """One API call failed. ``what`` names it, e.g. ``"GET pods ml/train-0"``."""

    def __init__(
        self,
        what: str,
        failure: Failure,
        detail: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        code = f"HTTP {status_code}" if status_code is not None else "no reply"
        super().__init__(
            f"{what}: {failure.value} ({code}): {detail}",
            failure,
            status_code=status_code,
            retry_after_s=retry_after_s,
        )
        self.what = what
        self.detail = detail


class BindStage(enum.StrEnum):
    """The step of a bind that failed."""

    READ = "read pod"
    ANNOTATE = "annotate pod"
    BIND = "create binding"


class BindError(KubeError):
    """Binding ``pod`` (``namespace/name``) to ``node`` failed at ``stage``.

    ``bound_node`` is the node the pod was found bound to (``ALREADY_BOUND``), else ``None``;
    ``observed_pod`` is the pod as last read (a plain dict), when it was read at all.
    """

    def __init__(
        self,
        pod: str,
        node: str,
        stage: BindStage,
        failure: Failure,
        detail: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        bound_node: str | None = None,
        observed_pod: dict[str, Any] | None = None,
    ) -> None:
        retry = "temporary, retry" if failure.temporary else "permanent"
        super().__init__(
            f"bind {pod} to {node}: {stage.value}: {failure.value} ({retry}): {detail}",
            failure,
            status_code=status_code,
            retry_after_s=retry_after_s,
        )
        self.pod = pod
        self.node = node
        self.stage = stage
        self.detail = detail
        self.bound_node = bound_node
        self.observed_pod = observed_pod


CLIENT_ERRORS: tuple[type[Exception], ...] = (httpx2.HTTPError, msgspec.MsgspecError)
"""The client-library exceptions :func:`classify` understands (``except CLIENT_ERRORS``)."""


def is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`CLIENT_ERRORS`."""
    return isinstance(exc, CLIENT_ERRORS)


def _failure_for_status(code: int) -> Failure:
    if code == 409:
        return Failure.CONFLICT
    if code == 404:
        return Failure.NOT_FOUND
    if code in (401, 403):
        return Failure.FORBIDDEN
    if code == 410:
        return Failure.EXPIRED
    if code == 429:
        return Failure.THROTTLED
    if code >= 500:
        return Failure.SERVER
    return Failure.INVALID


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def classify(exc: BaseException) -> tuple[Failure, int | None, float | None, str]:
    """``(failure, HTTP status or None, retry-after seconds or None, detail text)`` for a
    lightkube/httpx2/msgspec error (see :func:`is_client_error`).

    A lightkube ``ApiError`` carries the server's ``Status`` (also for a watch ``ERROR``
    event, which has no HTTP response); a bare ``httpx2.HTTPStatusError`` (a watch request
    refused before streaming) only the HTTP status.
    """
    if isinstance(exc, ApiError):
        status = exc.status
        code = status.code if status is not None and status.code else None
        if code is None and exc.response is not None:
            code = exc.response.status_code
        details = status.details if status is not None else None
        retry = details.retryAfterSeconds if details is not None else None
        reason = status.reason if status is not None and status.reason else ""
        message = status.message if status is not None and status.message else str(exc)
        detail = f"{reason}: {message}" if reason else message
        failure = _failure_for_status(code) if code is not None else Failure.SERVER
        return failure, code, float(retry) if retry else None, detail
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        retry_header = exc.response.headers.get("Retry-After")
        return _failure_for_status(code), code, _retry_after(retry_header), f"HTTP {code}"
    if isinstance(exc, httpx2.TransportError):
        return Failure.UNREACHABLE, None, None, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx2.HTTPError | msgspec.MsgspecError):
        return Failure.SERVER, None, None, f"unreadable reply: {type(exc).__name__}: {exc}"
    raise TypeError(f"not a client library error: {exc!r}")


def api_call_error(what: str, exc: BaseException) -> ApiCallError:
    """The :class:`ApiCallError` for a failed call ``what``; raise it ``from exc``."""
    failure, code, retry, detail = classify(exc)
    return ApiCallError(what, failure, detail, status_code=code, retry_after_s=retry)
