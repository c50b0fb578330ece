"""Device plugin lifecycle with kubelet: serve, register, re-register after kubelet restarts.

`PluginRunner` runs one `DevicePluginService` for one resource (one socket per resource:
kubelet takes one resource per registration):

1. **Serve first** on `<socket_dir>/<socket_name>` (a stale socket is replaced), then **register**
   with `<socket_dir>/kubelet.sock` (docs/interfaces.md, Pitfalls: 15). Both run on one event loop;
   the Register call awaits, so the plugin's server answers kubelet's `GetDevicePluginOptions` and
   `ListAndWatch` while Register is in flight.
2. While kubelet is absent or refuses, retry with exponential backoff (`backoff_initial_s` doubling
   up to `backoff_max_s`); a failure is logged once per distinct error, not once per attempt.
3. **Kubelet restart** (docs/interfaces.md, "Lifecycle"): kubelet deletes every socket in its
   directory (ours included) and recreates `kubelet.sock`. The runner watches the directory with
   inotify (`watchfiles`) and, when its own socket is gone or `kubelet.sock` is a different file
   from the one it registered with, stops the old server, serves the *same* service again on a fresh
   socket (same device IDs, same health) and registers again. Other files (`DEPRECATION`,
   `kubelet_internal_checkpoint`, other plugins' sockets) are ignored. The check compares file
   identities (device, inode, ctime), so the runner's own re-creation of its socket does not look
   like a restart; a rescan every `rescan_s` catches events inotify could not deliver.
4. `stop()` is the clean shutdown: end the ListAndWatch streams, stop the server, remove the
   plugin's socket. kubelet's socket is never touched.

This module knows nothing of the Kubernetes API server; `on_registered` lets the caller act after
each successful registration (e.g. publish the node's GPU inventory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType

from watchfiles import Change, awatch

from gpushare.deviceplugin.registration import (
    DEVICE_PLUGIN_DIR,
    KUBELET_SOCKET_NAME,
    RegistrationError,
    register,
)
from gpushare.deviceplugin.server import DevicePluginService, PluginServer, serve
from gpushare.kube.codec import GPU_MEM

__all__ = ["DEFAULT_SOCKET_NAME", "PluginRunner"]

log = logging.getLogger(__name__)

DEFAULT_SOCKET_NAME = "aliyungpushare.sock"
"""The plugin's socket file name in kubelet's device-plugin directory (as Alibaba's plugin)."""

_FileId = tuple[int, int, int]
"""(st_dev, st_ino, st_ctime_ns): tells a re-created file from the one seen before."""


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s crashed", task.get_name(), exc_info=task.exception())


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it; a cancellation of the caller itself still propagates."""
    task.cancel()
    await asyncio.wait([task])  # raises only if the caller is cancelled while waiting


def _file_id(path: Path) -> _FileId | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginRunner:
    """Serves `service`, registers it with kubelet and keeps it registered until `stop()`.

    `socket_dir` is kubelet's device-plugin directory (default `/var/lib/kubelet/device-plugins`,
    `DevicePluginPath`); `socket_name` the plugin's socket file in it; `resource_name` the extended
    resource (default `aliyun.com/gpu-mem`). Times are seconds. `registrations` counts successful
    Register calls (await `wait_registered(n)`), `attempts` every Register tried; `last_error` is
    the latest failure, `None` once registered. `on_registered`, if given, is awaited after every
    successful registration; its exceptions are logged and do not stop the runner. A runner
    starts only once.
    """

    def __init__(
        self,
        service: DevicePluginService,
        *,
        socket_dir: Path = DEVICE_PLUGIN_DIR,
        socket_name: str = DEFAULT_SOCKET_NAME,
        kubelet_socket_name: str = KUBELET_SOCKET_NAME,
        resource_name: str = GPU_MEM,
        register_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        rescan_s: float = 5.0,
        on_registered: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        for name in (socket_name, kubelet_socket_name):
            if not name or os.path.basename(name) != name:
                raise ValueError(f"socket names are file names, got {name!r}")
        if socket_name == kubelet_socket_name:
            raise ValueError(f"the plugin socket cannot be kubelet's ({kubelet_socket_name!r})")
        self.service = service
        self.socket_dir = Path(os.path.abspath(socket_dir))
        self.socket_name = socket_name
        self.resource_name = resource_name
        self.kubelet_socket = self.socket_dir / kubelet_socket_name
        self.registrations = 0
        self.attempts = 0
        self.last_error: RegistrationError | None = None
        self._register_timeout_s = register_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._rescan_s = rescan_s
        self._on_registered = on_registered
        self._server: PluginServer | None = None
        self._own_id: _FileId | None = None
        self._registered_kubelet: _FileId | None = None
        self._registered = False
        self._failure_logged: tuple[object, str] | None = None
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._reserving: asyncio.Future[None] | None = None

    @property
    def socket_path(self) -> Path:
        """The plugin's socket: `<socket_dir>/<socket_name>`."""
        return self.socket_dir / self.socket_name

    @property
    def registered(self) -> bool:
        """True while the current server is registered with the current kubelet."""
        return self._registered

    async def start(self) -> None:
        """Serve now, then register and watch in the background; returns once serving.

        Raises `DeviceListTooLargeError` (before any socket is created) when the device list
        cannot fit one kubelet message, `FileNotFoundError` when `socket_dir` does not exist,
        `OSError` when the socket cannot be created, `RuntimeError` if already started.
        """
        if self._task is not None:
            raise RuntimeError("PluginRunner already started")
        self.service.check_size(self.service.gpus, self.service.unit)
        if not self.socket_dir.is_dir():
            raise FileNotFoundError(
                f"kubelet's device-plugin directory {self.socket_dir} does not exist "
                "(mount the host's /var/lib/kubelet/device-plugins into the plugin's pod)"
            )
        self._watcher = asyncio.create_task(self._watch(), name="device-plugin-watch")
        await asyncio.sleep(0)  # the inotify watch is set up before the first await
        try:
            await self._serve()
        except BaseException:
            self._stopping.set()
            await self._watcher
            raise
        self._task = asyncio.create_task(self._run(), name="device-plugin-register")
        self._task.add_done_callback(_log_crash)

    async def wait_registered(self, count: int = 1) -> None:
        """Return once `registrations >= count` (wrap in `asyncio.wait_for` to bound it)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.registrations >= count)

    async def serve_forever(self) -> None:
        """`start()`, then serve until cancelled or `stop()`; shuts down cleanly on the way out.

        Re-raises what ended the background task unexpectedly (a bug; it retries I/O errors).
        """
        await self.start()
        assert self._task is not None
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([self._task, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await self.stop()
        error = None if self._task.cancelled() else self._task.exception()
        if error is not None:
            raise error

    async def stop(self) -> None:
        """Clean shutdown: end streams, stop serving, remove the plugin's socket (idempotent)."""
        self._stopping.set()
        if self._task is not None:
            await _cancel_and_wait(self._task)
        if self._reserving is not None:
            with contextlib.suppress(Exception):
                await self._reserving
        if self._watcher is not None:
            try:
                async with asyncio.timeout(5.0):  # the stop event ends it within ~20 ms
                    await self._watcher
            except TimeoutError:
                await _cancel_and_wait(self._watcher)
        if self._server is not None:
            await self._server.stop()
            log.info("device plugin stopped; removed %s", self.socket_path)
        self._server = None
        self._registered = False

    async def __aenter__(self) -> PluginRunner:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _serve(self) -> None:
        """Replace the current server (if any) by a fresh one on `socket_path`."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        self._server = await serve(self.service, self.socket_dir, self.socket_name)
        self._own_id = _file_id(self.socket_path)
        self._registered = False

    def _restart_reason(self) -> str | None:
        """Why the server must be re-created, or None: our socket is gone, or `kubelet.sock` is a
        new file (kubelet restarted; docs/interfaces.md, "Lifecycle")."""
        if _file_id(self.socket_path) != self._own_id:
            return f"{self.socket_path} was removed or replaced"
        kubelet = _file_id(self.kubelet_socket)
        if self._registered and kubelet is not None and kubelet != self._registered_kubelet:
            return f"{self.kubelet_socket} was re-created (kubelet restarted)"
        return None

    async def _run(self) -> None:
        backoff = self._backoff[0]
        while not self._stopping.is_set():
            self._wake.clear()
            reason = self._restart_reason()
            if reason is not None:
                log.warning("%s: serving again on a fresh socket and re-registering", reason)
                self._reserving = asyncio.ensure_future(self._serve())
                try:
                    await asyncio.shield(self._reserving)
                except OSError as error:
                    log.error("cannot serve on %s: %s; retrying", self.socket_path, error)
                    await self._sleep_or_wake(backoff)
                    backoff = min(backoff * 2, self._backoff[1])
                    continue
            if self._registered:
                await self._sleep_or_wake(self._rescan_s)
            elif await self._register():
                backoff = self._backoff[0]
            else:
                await self._sleep_or_wake(backoff)
                backoff = min(backoff * 2, self._backoff[1])

    async def _register(self) -> bool:
        kubelet = _file_id(self.kubelet_socket)
        self.attempts += 1
        try:
            await register(
                self.kubelet_socket, self.socket_name, self.resource_name, self._register_timeout_s
            )
        except RegistrationError as error:
            self.last_error = error
            key = (error.code, error.details)
            if key != self._failure_logged:
                log.warning("%s; retrying with backoff", error)
                self._failure_logged = key
            else:
                log.debug("%s; retrying with backoff", error)
            return False
        self._registered_kubelet = kubelet if kubelet is not None else _file_id(self.kubelet_socket)
        self._registered = True
        self._failure_logged = None
        self.last_error = None
        async with self._changed:
            self.registrations += 1
            self._changed.notify_all()
        if self._on_registered is not None:
            try:
                await self._on_registered()
            except Exception:
                log.exception("on_registered hook failed (the plugin stays registered)")
        return True

    async def _sleep_or_wake(self, timeout_s: float) -> None:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel (gh-86296).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()

    async def _watch(self) -> None:
        """Wake the runner whenever its socket or kubelet's appears or disappears (inotify)."""
        names = {self.socket_name, self.kubelet_socket.name}

        def relevant(change: Change, path: str) -> bool:
            return os.path.basename(path) in names

        try:
            async for _ in awatch(
                self.socket_dir,
                watch_filter=relevant,
                stop_event=self._stopping,
                recursive=False,
                debounce=500,
                step=20,
            ):
                self._wake.set()
        except Exception as error:
            log.warning(
                "cannot watch %s for kubelet restarts (%s); checking every %.1f s instead",
                self.socket_dir,
                error,
                self._rescan_s,
            )
