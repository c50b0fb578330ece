"""The plugin side of kubelet's `v1beta1.Registration/Register` call (docs/interfaces.md,
"Registration").

`register` dials kubelet's registration socket (`/var/lib/kubelet/device-plugins/kubelet.sock`)
and sends one `RegisterRequest`: version `"v1beta1"`, the plugin's socket **file name** as the
endpoint (kubelet joins it with its own device-plugin directory), the extended resource name and
the same `DevicePluginOptions` the plugin answers `GetDevicePluginOptions` with.

Kubelet 1.25+ dials the plugin back and calls `GetDevicePluginOptions` *inside* Register
(docs/interfaces.md, Pitfalls: 15), so the plugin must already be serving, on a loop that this
call does not block. Every failure is a `RegistrationError`; retrying is the caller's choice
(`gpushare.deviceplugin.lifecycle` retries with backoff).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc
from grpc import aio

from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.server import options

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_DIR",
    "KUBELET_SOCKET_NAME",
    "RegistrationError",
    "register",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
"""The only device plugin API version kubelet supports (docs/interfaces.md, "Names and
constants")."""
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""kubelet's device-plugin directory (`DevicePluginPath` of kubelet's `constants.go`)."""
KUBELET_SOCKET_NAME = "kubelet.sock"
"""kubelet's registration socket in `DEVICE_PLUGIN_DIR` (`KubeletSocket` of `constants.go`)."""


_UNREACHABLE = frozenset({None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class RegistrationError(Exception):
    """kubelet did not accept (or could not be asked for) the registration.

    Fields: `kubelet_socket` (the path dialled), `resource_name`, `code` (the gRPC status of the
    failed call, `None` when no call was made) and `details` (kubelet's message). kubelet reports
    every refusal as `UNKNOWN` with its own text, e.g. `the ResourceName "gpu" is invalid`, so the
    code does not tell a permanent refusal from a passing one; callers that retry retry all.
    """

    def __init__(
        self,
        kubelet_socket: Path,
        resource_name: str,
        code: grpc.StatusCode | None,
        details: str,
    ) -> None:
        self.kubelet_socket = kubelet_socket
        self.resource_name = resource_name
        self.code = code
        self.details = details
        status = code.name if code is not None else "not called"
        if code in _UNREACHABLE:
            fix = (
                f"is kubelet running? is {kubelet_socket.parent} mounted read-write into the "
                "plugin's pod?"
            )
        else:
            fix = (
                "kubelet answered but refused: check the resource name and that kubelet can "
                f"dial the plugin socket in {kubelet_socket.parent}"
            )
        super().__init__(
            f"cannot register {resource_name} with kubelet at {kubelet_socket}: "
            f"{status}: {details} ({fix})"
        )


def register_request(endpoint: str, resource_name: str) -> api_pb2.RegisterRequest:
    """The `RegisterRequest` for the plugin socket file `endpoint` (a name, not a path)."""
    return api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=options(),
    )


async def register(
    kubelet_socket: Path, endpoint: str, resource_name: str, timeout_s: float
) -> None:
    """Call `/v1beta1.Registration/Register` on `kubelet_socket`, waiting at most `timeout_s`.

    `endpoint` is the plugin's socket file name in the same directory as `kubelet_socket` (spec
    2.3: "file name only"); a path with a directory part is a programming error (`ValueError`).
    Raises `RegistrationError` when the socket is missing, kubelet does not answer in time, or
    kubelet refuses (unsupported version, invalid resource name, plugin socket not answering).
    """
    if os.path.basename(endpoint) != endpoint or not endpoint:
        raise ValueError(f"endpoint must be a socket file name, got {endpoint!r}")
    if not kubelet_socket.exists():
        raise RegistrationError(
            kubelet_socket, resource_name, None, f"{kubelet_socket} does not exist"
        )
    request = register_request(endpoint, resource_name)
    address = f"unix://{os.path.abspath(kubelet_socket)}"
    # A subchannel of its own, so that a refused dial of a dead kubelet's socket is not answered
    # again from gRPC's shared pool once the new kubelet listens (docs/interfaces.md, Pitfalls: 29).
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with aio.insecure_channel(address, options=options) as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout_s)
        except aio.AioRpcError as error:
            raise RegistrationError(
                kubelet_socket, resource_name, error.code(), error.details() or ""
            ) from error
    log.info("registered %s with kubelet at %s (endpoint %s)", resource_name, address, endpoint)
