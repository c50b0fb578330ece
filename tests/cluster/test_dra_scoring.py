"""The extender scoring nodes for DRA claim pods (``gpushare extender --dra-scoring``,
``dra/prioritize``; docs/dra.md, "Placement") on the real API server and kube-scheduler v1.37.1
with kwok nodes carrying gpushare's slices; and its answer when its watch of claims lags
kube-scheduler's (docs/interfaces.md, Pitfalls: 30; found by a soak)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceSlice

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import device_class, resource_slice
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.dra import DraScorer
from gpushare.extender.scoring import extender_policy
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import DEVICE_CLASS, DRIVER, MEMORY
from gpushare.kube.dracache import DraCache
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    async_wait_until,
    free_ports,
    gpushare_argv,
    gpushare_dra_extender,
    http_ok,
    wait_for,
    wait_until,
)
from gpushare.testing.faults import FaultyTransport
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import DRA_SCORING_RULES, EXTENDER_RULES

pytestmark = pytest.mark.cluster

SCHEDULER = "gpushare-dra-scored"


def claim_body(namespace: str, name: str, memory: str) -> dict[str, Any]:
    """A ResourceClaim of ``memory`` of one GPU of gpushare's DeviceClass."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DEVICE_CLASS, "capacity": {"requests": {MEMORY: memory}}}}]}},
    }  # fmt: skip


def claim_pod(kube: Client, namespace: str, name: str, memory: str, pin: str = "") -> None:
    """A claim of ``memory`` of one GPU and a pod of one CPU using it, for the scheduler whose
    nodes gpushare's extender scores, or with ``pin``, for the default one and that node."""
    kube.create(from_dict(claim_body(namespace, name, memory)))
    kube.create(from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": "default-scheduler" if pin else SCHEDULER,
            "containers": [{"name": "main", "image": "registry.invalid/none:0",
                            "resources": {"claims": [{"name": "gpu"}],
                                          "requests": {"cpu": "1"}}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "nodeSelector": {"gpushare.io/test": SCHEDULER} | (
                {"gpushare.io/node": pin} if pin else {}),
        },
    }))  # fmt: skip


def bound_to(kube: Client, namespace: str, name: str) -> str | None:
    pod = kube.get(Pod, name, namespace=namespace)
    return (pod.spec.nodeName or None) if pod.spec is not None else None


def test_claim_pods_go_where_gpushares_policy_scores_them_not_where_the_plugins_spread_them(
    kube: Client, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Two nodes of two 16 GiB GPUs; ``full`` already holds 12 GiB of GPU 0 and 24 of its 32
    CPUs are in use, so kube-scheduler's own scoring (least allocated) prefers ``empty``. With
    the extender scoring claim pods (``bestfit``), 4 GiB goes to ``full`` (GPU 0's last 4),
    16 GiB too (GPU 1), and only 8 GiB, which ``full`` no longer fits, goes to ``empty``."""
    full, empty = "dra-scored-full", "dra-scored-empty"
    namespace = f"dra-{uuid.uuid4().hex[:6]}"
    kubeconfig = control_plane.service_account_kubeconfig(
        "gpushare-extender-dra", "kube-system", [*EXTENDER_RULES, *DRA_SCORING_RULES]
    )
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    argv = gpushare_argv(
        "extender", "--kubeconfig", str(kubeconfig), "--port", str(port), "--policy", "bestfit",
        "--dra-scoring",
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        labels = {"gpushare.io/test": SCHEDULER}
        create_nodes(kube, [plain_node(n, labels=labels | {"gpushare.io/node": n})
                            for n in (full, empty)])  # fmt: skip
        stack.callback(delete_nodes, kube, [full, empty])
        gpus = [PhysicalGpu(i, f"GPU-{uuid.uuid4()}", i, "Tesla-T4", 16384) for i in range(2)]
        for node in (full, empty):
            body = resource_slice(node, gpus, unit=MemoryUnit.GIB, generation=1)
            kube.create(from_dict(body))
            stack.callback(kube.delete, ResourceSlice, body["metadata"]["name"])
        with contextlib.suppress(ApiError):  # 409: made by an earlier test
            kube.create(from_dict(device_class(DEVICE_CLASS)))
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}}))  # fmt: skip
        stack.callback(delete_namespace, kube, namespace)
        # what is already on "full": a claim pod of 12 GiB (GPU 0) and CPU in use
        claim_pod(kube, namespace, "held", "12Gi", pin=full)
        wait_for("held bound", partial(bound_to, kube, namespace, "held"), 60)
        kube.create(from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": namespace},
            "spec": {"nodeName": full, "containers": [{"name": "main", "image": "x.invalid/y:0",
                     "resources": {"requests": {"cpu": "24"}}}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
        }))  # fmt: skip
        extender = ManagedProcess("gpushare-extender-dra", argv, tmp_path).start()
        stack.callback(extender.stop)
        wait_until("extender ready", lambda: http_ok(f"{url}/readyz"), 60, processes=[extender])
        stack.enter_context(control_plane.scheduler(
            "kube-scheduler-dra-scored", profiles=[{"schedulerName": SCHEDULER}],
            extenders=[gpushare_dra_extender(f"{url}/gpushare-scheduler")],
        ))  # fmt: skip
        placed = []
        for name, memory in (("four", "4Gi"), ("sixteen", "16Gi"), ("eight", "8Gi")):
            claim_pod(kube, namespace, name, memory)
            bound = partial(bound_to, kube, namespace, name)
            placed.append(wait_for(f"{name} bound", bound, 60, processes=[extender]))
        assert placed == [full, full, empty], extender.log_tail()
        assert extender.running()


@dataclass(frozen=True)
class Lag:
    """The extender's watch of ResourceClaims held back from just before a pod's claim is made
    until ``release_after_s`` after kube-scheduler asks about the pod (``None``: never), or,
    with ``fails``, cut (the API server unreachable for the extender) until it is failing;
    whether the pod is scored, and the warning the extender logs when it is not."""

    name: str
    release_after_s: float | None
    scored: bool
    warning: str = ""
    fails: bool = False


LAGS = [
    Lag("the claim arrives within the wait: scored as if the watch had kept up", 0.3, True),
    Lag(
        "the claim never arrives: an empty answer after the wait, and the log says why",
        None,
        False,
        "not scored after 1 s: its claims {claim} are not in the extender's cache",
    ),
    Lag(
        "the watch of claims is failing: an empty answer at once, and the log says so",
        None,
        False,
        "not scored at once: its claims {claim} are not in the extender's cache and its watch "
        "of ResourceClaims is failing",
        fails=True,
    ),
]


@pytest.mark.parametrize("case", LAGS, ids=[c.name for c in LAGS])
def test_a_claim_pod_is_scored_though_the_extenders_watch_of_its_claim_lags(
    kube: Client, control_plane: ControlPlane, case: Lag, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-scheduler asks once its own informer has the pod's claim; the extender's watch of
    claims may not have it yet (a busy machine). The extender waits for it (at most 1 s) rather
    than answering ``[]``, which left the node to kube-scheduler's spreading plugins."""
    node = f"dra-lag-{uuid.uuid4().hex[:6]}"
    namespace = f"dra-{uuid.uuid4().hex[:6]}"
    gpus = [PhysicalGpu(0, f"GPU-{uuid.uuid4()}", 0, "Tesla-T4", 16384)]
    body = resource_slice(node, gpus, unit=MemoryUnit.GIB, generation=1)
    pod = {
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
    }  # fmt: skip
    request = {"Pod": pod, "NodeNames": [node, "no-slice"]}

    async def scenario() -> httpx2.Response:
        transport = FaultyTransport.for_control_plane(control_plane)
        client = AsyncClient(
            KubeConfig.from_file(control_plane.kubeconfig), trust_env=False, transport=transport
        )
        cache = DraCache(client, DRIVER)
        app = create_app(
            ExtenderState(),
            expire_interval_s=None,
            dra=DraScorer(cache, extender_policy("bestfit"), claim_wait_s=1.0),
        )
        extender = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://extender"
        )
        cache.start()
        try:
            await async_wait_until(
                "the cache lists the slice", lambda: cache.synced and node in cache.slices, 30
            )
            claim = from_dict(claim_body(namespace, "c", "4Gi"))
            if case.fails:
                transport.go_down()
                await async_wait_until("claims failing", lambda: cache.claims_failing, 30)
                await asyncio.to_thread(lambda: kube.create(claim))
            else:
                transport.hold_watches("resourceclaims")
                await client.create(claim)
            if case.release_after_s is not None:
                asyncio.get_running_loop().call_later(
                    case.release_after_s, transport.release_watches, "resourceclaims"
                )
            return await extender.post("/gpushare-scheduler/dra/prioritize", json=request)
        finally:
            transport.release_watches("resourceclaims")
            await extender.aclose()
            await cache.stop()
            await client.close()

    with contextlib.ExitStack() as stack:
        kube.create(from_dict(body))
        stack.callback(kube.delete, ResourceSlice, body["metadata"]["name"])
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}}))  # fmt: skip
        stack.callback(delete_namespace, kube, namespace)
        with caplog.at_level(logging.WARNING, logger="gpushare.extender.dra"):
            answer = asyncio.run(scenario())
    assert answer.status_code == 200, answer.text
    if case.scored:
        assert answer.json() == [{"Host": node, "Score": 10}, {"Host": "no-slice", "Score": 0}]
    else:
        assert answer.json() == []
        assert case.warning.format(claim=f"{namespace}/c") in caplog.text, caplog.text
