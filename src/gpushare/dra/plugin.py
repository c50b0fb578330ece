"""The DRA kubelet plugin: the ``v1.DRAPlugin`` gRPC service (grpc.aio) on the driver's socket and
the plugin-registration service kubelet discovers it by. docs/dra.md.

* **Registration** (``pluginregistration/v1``, served on
  ``/var/lib/kubelet/plugins_registry/<driver>-reg.sock``, which kubelet watches):
  ``GetInfo`` answers ``type: DRAPlugin``, the driver name, the DRA socket and
  ``supported_versions: [v1.DRAPlugin]``; ``NotifyRegistrationStatus`` records kubelet's verdict
  (``registered``) and logs a refusal.
* **NodePrepareResources**: for every claim kubelet names (namespace, name, UID), the claim is
  read from the API server (``ClaimSource``), checked and turned into devices
  (``gpushare.dra.prepare.prepared_claim``); the claim's CDI spec is written atomically as
  ``<cdi_dir>/gpushare.io-gpu_<claim UID>.json`` before the answer names its CDI device
  (``gpushare.io/gpu=<claim UID>``, on the first device of the claim: one CDI device carries the
  claim's whole environment), and with ``gpu_cdi`` each device also names its GPU's CDI device
  (``gpushare.dra.prepare.device_cdi_ids``: device node and driver). A claim that cannot be
  prepared gets its error in the answer, the others are prepared all the same; every claim of
  the request has an entry. Preparing a claim again (kubelet retries, and calls again after a
  restart) writes the same file.
* **NodeUnprepareResources**: removes the claim's CDI spec; a claim never prepared (or already
  unprepared) is fine. Nothing else is kept: the CDI files are the plugin's state, so a plugin
  restart finds every prepared claim as it left it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from grpc import aio

from gpushare.deviceplugin.cdi import GpuCdi
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.isolation import NodeIsolation
from gpushare.dra._proto.dra import api_pb2, api_pb2_grpc
from gpushare.dra._proto.registration import api_pb2 as reg_pb2
from gpushare.dra._proto.registration import api_pb2_grpc as reg_pb2_grpc
from gpushare.dra.prepare import ClaimError, cdi_spec, device_cdi_ids, prepared_claim
from gpushare.dra.slices import device_name
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.errors import KubeError

__all__ = [
    "DRA_VERSION",
    "ClaimSource",
    "DraPluginService",
    "PluginSockets",
    "RegistrationService",
    "cdi_spec_path",
    "serve",
]

log = logging.getLogger(__name__)

DRA_VERSION = "v1.DRAPlugin"
"""The gRPC service version advertised to kubelet."""

_Context = aio.ServicerContext[Any, Any]


class ClaimSource(Protocol):
    """Where ResourceClaims are read (the API server, ``gpushare.kube``)."""

    async def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim ``namespace/name`` as JSON; ``LookupError`` when there is none,
        ``KubeError`` when it cannot be read now."""
        ...


_UID = re.compile(r"[0-9a-zA-Z][0-9a-zA-Z-]{0,62}")
"""What a claim UID may be before it names a file: a Kubernetes UID (a UUID) and no more."""


def cdi_spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    """Where the CDI spec of claim ``claim_uid`` is written; ``ValueError`` for a UID that is
    not one (kubelet's request is input: it must not name a path)."""
    if not _UID.fullmatch(claim_uid):
        raise ValueError(f"claim uid {claim_uid[:80]!r}: not a UID (letters, digits, '-')")
    return cdi_dir / f"gpushare.io-gpu_{claim_uid}.json"


def _write_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """``document`` as JSON at ``path``, replaced in one rename (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".gpushare-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle, indent=1)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class DraPluginService(api_pb2_grpc.DRAPluginServicer):
    """``NodePrepareResources`` and ``NodeUnprepareResources`` of driver ``driver`` on node
    ``node`` (module doc): the node's ``gpus`` (called on every request: health and inventory
    stay current), memory counted in ``unit``, claims read from ``claims``, CDI specs in
    ``cdi_dir``, with the CUDA MPS limits when ``mps`` and the share's edits with
    ``isolation`` (``gpushare.dra.prepare.cdi_spec``); ``gpu_cdi`` the CDI devices of the
    node's GPUs (``gpushare.deviceplugin.cdi``; ``None``: none)."""

    def __init__(
        self,
        *,
        driver: str,
        node: str,
        gpus: Callable[[], Sequence[PhysicalGpu]],
        unit: MemoryUnit,
        claims: ClaimSource,
        cdi_dir: Path,
        mps: bool = False,
        isolation: NodeIsolation | None = None,
        gpu_cdi: GpuCdi | None = None,
    ) -> None:
        self.driver = driver
        self.gpu_cdi = gpu_cdi
        self.mps = mps
        self.isolation = isolation
        self.node = node
        self.gpus = gpus
        self.unit = unit
        self.claims = claims
        self.cdi_dir = cdi_dir

    async def _prepare(self, claim: api_pb2.Claim) -> api_pb2.NodePrepareResourceResponse:
        where = f"claim {claim.namespace}/{claim.name}"
        try:
            document = await self.claims.claim(claim.namespace, claim.name)
        except LookupError:
            return api_pb2.NodePrepareResourceResponse(error=f"{where} not found")
        except KubeError as error:  # the API server away: kubelet asks again
            log.warning("reading %s: %s", where, error)
            return api_pb2.NodePrepareResourceResponse(error=f"reading {where}: {error}")
        try:
            path = cdi_spec_path(self.cdi_dir, claim.uid)
        except ValueError as error:
            return api_pb2.NodePrepareResourceResponse(error=str(error))
        try:
            prepared = prepared_claim(
                document, uid=claim.uid, driver=self.driver, node=self.node,
                gpus=self.gpus(), unit=self.unit,
            )  # fmt: skip
            spec = cdi_spec(prepared, self.unit, mps=self.mps, isolation=self.isolation)
            cdi_ids = device_cdi_ids(prepared, self.gpu_cdi)
            _write_atomically(path, spec)
        except (ClaimError, OSError) as error:
            log.warning("preparing %s: %s", where, error)
            return api_pb2.NodePrepareResourceResponse(error=str(error))
        devices = []
        for device, ids in zip(prepared.devices, cdi_ids, strict=True):
            answer = api_pb2.Device(
                request_names=[device.request],
                pool_name=self.node,
                device_name=device_name(device.gpu.index),
                cdi_device_ids=ids,
            )
            if device.share_id:
                answer.share_id = device.share_id
            devices.append(answer)
        log.info(
            "prepared claim %s/%s (%s): %s", claim.namespace, claim.name, claim.uid,
            ", ".join(
                f"GPU {d.gpu.index} {d.memory_units} {self.unit}"
                + (f" {d.cores_percent}% cores" if d.cores_percent else "")
                for d in prepared.devices
            ) or "no device of this driver",
        )  # fmt: skip
        return api_pb2.NodePrepareResourceResponse(devices=devices)

    async def NodePrepareResources(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.NodePrepareResourcesRequest, context: _Context
    ) -> api_pb2.NodePrepareResourcesResponse:
        """Prepare every claim of ``request`` (module doc)."""
        del context
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(await self._prepare(claim))
        return response

    async def NodeUnprepareResources(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: _Context
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        """Remove every claim's CDI spec (module doc)."""
        del context
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = api_pb2.NodeUnprepareResourceResponse()
            try:
                cdi_spec_path(self.cdi_dir, claim.uid).unlink(missing_ok=True)
                log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, claim.uid)
            except ValueError as error:
                entry.error = str(error)
            except OSError as error:
                entry.error = f"removing the CDI spec of claim {claim.uid}: {error}"
            response.claims[claim.uid].CopyFrom(entry)
        return response


class RegistrationService(reg_pb2_grpc.RegistrationServicer):
    """The plugin-registration service of driver ``driver`` whose DRA socket is ``endpoint``
    (module doc); ``registered`` and ``error`` hold kubelet's last verdict."""

    def __init__(self, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = False
        self.error = ""

    async def GetInfo(  # noqa: N802 (gRPC method name)
        self, request: reg_pb2.InfoRequest, context: _Context
    ) -> reg_pb2.PluginInfo:
        """``type: DRAPlugin``, the driver, its DRA socket and ``v1.DRAPlugin``."""
        del request, context
        return reg_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=[DRA_VERSION],
        )

    async def NotifyRegistrationStatus(  # noqa: N802 (gRPC method name)
        self, request: reg_pb2.RegistrationStatus, context: _Context
    ) -> reg_pb2.RegistrationStatusResponse:
        """Record kubelet's verdict; a refusal is logged with kubelet's reason."""
        del context
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s (%s)", self.driver, self.endpoint)
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, request.error)
        return reg_pb2.RegistrationStatusResponse()


class PluginSockets:
    """The two running grpc.aio servers of a DRA driver: the plugin on ``dra_socket`` and the
    ``registration`` service on ``registration_socket``; ``stop`` ends both and removes the
    sockets."""

    def __init__(
        self,
        servers: Sequence[aio.Server],
        dra_socket: Path,
        registration_socket: Path,
        registration: RegistrationService,
    ) -> None:
        self._servers = list(servers)
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self.registration = registration

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving (in-flight calls get ``grace_s``) and remove both sockets; the
        registration socket first, so kubelet deregisters the driver."""
        for server in reversed(self._servers):
            await server.stop(grace_s)
        self.registration_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)


async def _listen(socket: Path) -> aio.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)  # a stale socket of an earlier run
    server = aio.server()
    address = f"unix://{os.path.abspath(socket)}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    return server


async def serve(
    service: DraPluginService, dra_socket: Path, registration_socket: Path
) -> PluginSockets:
    """Serve ``service`` on ``dra_socket`` and its registration on ``registration_socket``
    (stale sockets removed); the registration starts last, when the plugin already answers."""
    plugin = await _listen(dra_socket)
    api_pb2_grpc.add_DRAPluginServicer_to_server(service, plugin)
    await plugin.start()
    registration = await _listen(registration_socket)
    registrar = RegistrationService(service.driver, dra_socket)
    reg_pb2_grpc.add_RegistrationServicer_to_server(registrar, registration)
    await registration.start()
    log.info("DRA driver %s serving on %s (registration %s)", service.driver, dra_socket,
             registration_socket)  # fmt: skip
    return PluginSockets([plugin, registration], dra_socket, registration_socket, registrar)
