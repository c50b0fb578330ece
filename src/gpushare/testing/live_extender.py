"""The live extender in a thread of the test process, on a loopback port, with clean shutdown.

:class:`ExtenderThread` runs :class:`gpushare.extender.live.LiveExtender` — the same code as
``gpushare extender --kubeconfig`` — on its own event loop in a daemon thread, serving on a
socket it binds to ``127.0.0.1:0`` before starting (so the port is known and free). Entering
waits until ``/healthz`` answers (not until synced: tests poll ``/readyz`` themselves); leaving
asks the server to stop, joins the thread and re-raises whatever the thread died of. The tests
talk to it over HTTP only (:meth:`ExtenderThread.get`), never touching its state across threads.
With ``options.tls_cert``/``tls_key`` it serves HTTPS and :attr:`ExtenderThread.url` is
``https://``; :meth:`ExtenderThread.get` then skips verifying the certificate (loopback; the
tests that care verify through kube-scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from gpushare.extender.live import LiveExtender, LiveOptions
from gpushare.kube.client import AsyncClient, connect
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import (
    ControlPlane,
    ControlPlaneError,
    gpushare_extender,
    unverified_context,
    wait_for,
    wait_until,
)
from gpushare.testing.nodes import FakeGpu, create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import EXTENDER_RULES


class ExtenderThread:
    """``LiveExtender`` over ``kubeconfig`` in a thread (module doc); a context manager.

    ``options`` ``host``/``port`` are ignored: the thread binds its own loopback socket, on
    ``port`` when given (a restarted extender reached at the URL kube-scheduler already has),
    else on a free one.
    """

    def __init__(
        self,
        kubeconfig: Path,
        options: LiveOptions | None = None,
        *,
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 15.0,
        port: int = 0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.options = options or LiveOptions()
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extender: LiveExtender | None = None
        self.error: BaseException | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._client: AsyncClient | None = None
        self.requested_port = port
        self.port = port

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> ExtenderThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ExtenderThread:
        """Bind the socket, start the thread, wait until ``/healthz`` answers."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.requested_port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._client = connect(self.kubeconfig, trust_env=False)
        # The port it really serves on: a leader publishes it on its Lease for followers.
        self.extender = LiveExtender(
            self._client, dataclasses.replace(self.options, port=self.port)
        )
        self._thread = threading.Thread(target=self._main, name="gpushare-extender", daemon=True)
        self._thread.start()
        thread = self._thread

        def healthy() -> bool:
            if self.get("/healthz")[0] == 200:
                return True
            if not thread.is_alive():
                raise ControlPlaneError("the extender thread ended during start-up")
            return False

        try:
            wait_until("the extender to answer /healthz", healthy, self.startup_timeout_s)
        except ControlPlaneError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server, join the thread, re-raise the thread's error if it had one."""
        thread, self._thread = self._thread, None
        if self.extender is not None:
            self.extender.request_stop()
        if thread is not None:
            thread.join(self.stop_timeout_s)
            if thread.is_alive():
                raise ControlPlaneError(f"the extender did not stop within {self.stop_timeout_s}s")
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        error, self.error = self.error, None
        if error is not None:
            raise ControlPlaneError(f"the extender thread failed: {error!r}") from error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # handed to the test thread by stop()
            self.error = error

    async def _serve(self) -> None:
        assert self._socket is not None
        assert self.extender is not None
        assert self._client is not None
        try:
            await self.extender.run(sockets=[self._socket])
        finally:
            await self._client.close()

    # ---- HTTP ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, or ``https://`` with TLS options."""
        scheme = "https" if self.options.tls_cert is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def url_prefix(self) -> str:
        """The ``urlPrefix`` for kube-scheduler's extender configuration."""
        return self.url + "/" + self.options.prefix.strip("/")

    def get(self, path: str) -> tuple[int, Any]:
        """``GET path`` on the extender (:func:`http_get`)."""
        if self.options.tls_cert is None:
            return http_get(self.url + path)
        return http_get(self.url + path, context=unverified_context())


def http_get(
    url: str, timeout_s: float = 5.0, *, context: ssl.SSLContext | None = None
) -> tuple[int, Any]:
    """``GET url`` without any proxy: (HTTP status, decoded JSON body; ``None`` for an error
    body that is not JSON), or (0, None) when nothing answers. ``context``: for ``https://``
    URLs."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # loopback
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        with error:
            try:
                return error.code, json.loads(error.read() or b"null")
            except ValueError:  # uvicorn's own answers (503 past the connection cap) are text
                return error.code, None
    except OSError:
        return 0, None


@contextlib.contextmanager
def extender_with_scheduler(
    control_plane: ControlPlane,
    kubeconfig: Path,
    options: LiveOptions,
    scheduler_name: str,
    *,
    dialects: bool = False,
) -> Iterator[ExtenderThread]:
    """The live extender on ``kubeconfig`` (ready: caches synced) and a kube-scheduler of its
    own (profile ``scheduler_name``) that calls it as the chart wires it
    (``gpushare_extender``; ``dialects``: also for the gpu-manager and HAMi resources); both
    stopped after the ``with`` body."""
    with ExtenderThread(kubeconfig, options) as extender:
        wait_for("extender /readyz 200", lambda: extender.get("/readyz")[0] == 200 or None)
        with control_plane.scheduler(
            f"kube-scheduler-{scheduler_name}",
            profiles=[{"schedulerName": scheduler_name}],
            extenders=[gpushare_extender(extender.url_prefix, dialects=dialects)],
        ):
            yield extender


@contextlib.contextmanager
def t4_cluster_with_extender(
    control_plane: ControlPlane,
    nodes: tuple[str, str],
    namespace: str,
    account: str,
    scheduler_name: str,
) -> Iterator[tuple[Client, ExtenderThread]]:
    """A small GPU-share cluster on ``control_plane`` to look at: ``nodes`` (two 16 GiB Tesla
    T4 GPUs each; GPU 1 of the second unhealthy), namespace ``namespace``, and the live
    extender (binpack) on service account ``account`` (kube-system, the chart's extender
    rules) with its own kube-scheduler (``extender_with_scheduler``). Yields an API client
    and the extender; the nodes and namespace are deleted after."""
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        sick = [FakeGpu(0, 16, "Tesla T4"), FakeGpu(1, 16, "Tesla T4", healthy=False)]
        create_nodes(
            kube, [gpu_node(nodes[0], [16, 16], model="Tesla T4"), gpu_node(nodes[1], sick)]
        )
        stack.callback(delete_nodes, kube, list(nodes))
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        stack.callback(delete_namespace, kube, namespace)
        kubeconfig = control_plane.service_account_kubeconfig(
            account, "kube-system", [*EXTENDER_RULES]
        )
        options = LiveOptions(policy="binpack", backoff=Backoff(initial_s=0.05, max_s=0.5))
        extender = stack.enter_context(
            extender_with_scheduler(control_plane, kubeconfig, options, scheduler_name)
        )
        yield kube, extender
