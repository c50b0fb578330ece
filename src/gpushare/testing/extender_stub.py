"""A scripted scheduler extender: an HTTP server on loopback that records every call.

The cluster tests point kube-scheduler's ``extenders`` entry at :attr:`ScriptedExtender.url_prefix`
and script the answers with plain functions of the decoded request body. Every request is kept
(verb, path, content type, raw JSON) so that tests can assert kube-scheduler's wire format and
save real request bodies as fixtures. Handlers run on the server's threads (kube-scheduler's
bind calls overlap filter calls), so they must be thread-safe.

Default answers: filter passes every candidate, prioritize scores 0, bind fails (a real bind must
create the ``pods/binding`` subresource, which only the test knows how to do).
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Handler = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class RecordedCall:
    """One request kube-scheduler made, and what the stub answered."""

    verb: str
    path: str
    method: str
    content_type: str
    body: Any
    status: int
    response: Any


def pass_all(args: dict[str, Any]) -> dict[str, Any]:
    """Filter answer: every candidate passes (cache mode or full nodes)."""
    return {
        "Nodes": args.get("Nodes"),
        "NodeNames": args.get("NodeNames"),
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def score_zero(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Prioritize answer: 0 for every candidate."""
    return [{"Host": name, "Score": 0} for name in args.get("NodeNames") or []]


def refuse_bind(args: dict[str, Any]) -> dict[str, Any]:
    """Bind answer: an error (the stub cannot bind without the test's API client)."""
    return {"Error": f"scripted extender has no binder for {args.get('PodName')}"}


class ScriptedExtender:
    """The stub server; use as a context manager. Handlers are keyed by verb."""

    def __init__(
        self,
        *,
        prefix: str = "/scheduler",
        on_filter: Handler = pass_all,
        on_prioritize: Handler = score_zero,
        on_bind: Handler = refuse_bind,
    ) -> None:
        self.prefix = "/" + prefix.strip("/")
        self.handlers: dict[str, Handler] = {
            "filter": on_filter,
            "prioritize": on_prioritize,
            "bind": on_bind,
        }
        self._calls: list[RecordedCall] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> ScriptedExtender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ScriptedExtender:
        stub = self

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's Go client expects

            def do_POST(self) -> None:
                stub._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # calls are recorded instead

        server = ThreadingHTTPServer(("127.0.0.1", 0), _RequestHandler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="scripted-extender", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def url_prefix(self) -> str:
        """The ``urlPrefix`` for kube-scheduler's configuration."""
        if self._server is None:
            raise RuntimeError("scripted extender not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.prefix}"

    # ---- records -----------------------------------------------------------------------

    def calls(self, verb: str | None = None) -> list[RecordedCall]:
        """Calls so far, oldest first, optionally only those of ``verb``."""
        with self._lock:
            return [c for c in self._calls if verb is None or c.verb == verb]

    @property
    def errors(self) -> list[str]:
        """Tracebacks of handler failures (each was answered with HTTP 500)."""
        with self._lock:
            return list(self._errors)

    # ---- serving -----------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path
        verb = path[len(self.prefix) + 1 :] if path.startswith(self.prefix + "/") else ""
        length = int(request.headers.get("Content-Length") or 0)
        raw = request.rfile.read(length)
        status, response = 200, None
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        handler = self.handlers.get(verb)
        if handler is None:
            status, response = 404, {"Error": f"unknown verb {verb!r}"}
        else:
            try:
                response = handler(body)
            except Exception:
                status, response = 500, {"Error": "handler failed"}
                with self._lock:
                    self._errors.append(f"{verb}: {traceback.format_exc()}")
        payload = json.dumps(response).encode()
        with self._lock:
            self._calls.append(
                RecordedCall(
                    verb=verb,
                    path=path,
                    method=request.command,
                    content_type=request.headers.get("Content-Type", ""),
                    body=body,
                    status=status,
                    response=response,
                )
            )
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)
