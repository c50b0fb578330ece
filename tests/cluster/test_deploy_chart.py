"""The Helm chart against the real control plane: what it renders is what runs.

* Every object the chart renders — the committed manifests of ``deploy/manifests`` and a render
  with every option turned on — is accepted by kube-apiserver v1.37.1 in a server-side dry run
  (``dryRun=All``) with strict field validation (an unknown or misspelt field is refused).
* The chart's ServiceAccounts, ClusterRoles, Roles and their bindings are applied for real (in
  namespace ``gpushare-deploy``, so that other tests' identities are untouched), and tokens are
  issued for its ServiceAccounts. ``SelfSubjectAccessReview`` shows that each identity may do its
  work and is forbidden what it does not need, and raw calls with the tokens agree.
* The components then run with those identities: ``gpushare device-plugin`` (flags from the
  chart's DaemonSet, fake GPUs, a kubelet stand-in) reads the chart's node-config ConfigMap in
  the release namespace (where the DaemonSet's ``POD_NAMESPACE`` points), publishes its node's
  inventory with it and answers Allocate; the live extender (options from the chart's
  Deployment) syncs, filters and binds.
  kube-scheduler runs with (a) the extender entry of the chart's default-scheduler ConfigMap and
  (b) the second scheduler's whole configuration from its ConfigMap and its own identity;
  each schedules a GPU pod through the extender, and the pod gets its GPU from Allocate.

The schedulers reach the extender over HTTPS with the chart's helm-generated certificate and
check it as the chart configures them (``serverName`` the Service's DNS name, the CA from the
ConfigMap or the Secret). The device plugin's token is bound to a pod object on its node, as
kubelet issues it, and the chart's ``ValidatingAdmissionPolicy`` is installed: the plugin on node
A may change node A and A's pods and is refused node B and B's pods.

Only the extender's ``urlPrefix`` is changed (it points at the test's extender on loopback), the
CA files are where the test wrote them, the second scheduler gets a
``clientConnection.kubeconfig`` (in a cluster it uses its pod's service account) and the device
plugin a kubelet directory of its own.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import shutil
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.cli.deviceplugin import device_plugin
from gpushare.extender.callers import ClientAuth
from gpushare.extender.live import LiveOptions
from gpushare.extender.preemption import PreemptionOptions
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_IDX,
    GPU_COUNT,
    GPU_MEM,
    GPUSHARE_LABEL,
    INVENTORY,
)
from gpushare.kube.holds import parse_holds_ref
from gpushare.kube.lease import LeaseConfig
from gpushare.kube.peers import parse_selector
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    http_ok,
    unverified_context,
    wait_for,
    wait_until,
    write_kubeconfig,
)
from gpushare.testing.extender import pod_json
from gpushare.testing.helm import MANIFESTS, MANIFESTS_DIR, locate_helm, parse_yaml, render_objects
from gpushare.testing.kubelet import KubeletThread
from gpushare.testing.live_extender import ExtenderThread
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
NAMESPACE = "gpushare-deploy"  # the chart's release namespace in this module
EXTENDER, DEVICE_PLUGIN, SCHEDULER = (
    "gpushare-extender",
    "gpushare-device-plugin",
    "gpushare-scheduler",
)
SECOND_SCHEDULER_NAME = "gpushare-scheduler"  # the chart's default schedulerName
DEFAULT_PROFILE = "gpushare-chart-default"  # stands for default-scheduler in wiring (a)
GROUP_LABEL = "gpushare.io/test-group"
NODE = "deploy-chart-node"
WAIT_S = 30.0
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # set for pod-bound tokens
EVERY_OPTION: Obj = {  # a render with every branch of the templates taken
    "memoryUnit": "MiB",
    "imagePullSecrets": [{"name": "registry"}],
    "extender": {
        "policy": "fgd-cpu",
        "gpuUnit": 16384,
        "tls": {"enabled": True, "secretName": "gpushare-extender-tls", "clientCA": True},
        "networkPolicy": {
            "controlPlaneCIDRs": ["192.0.2.10/32", "2001:db8::/64"],
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        "service": {"type": "NodePort", "nodePort": 31234, "clusterIP": "10.0.0.200"},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {}},
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"prometheus.io/scrape": "true"},
    },
    "devicePlugin": {
        "fakeGpus": "2x16GiB:T4",
        "mps": True,
        "runtimeClassName": "nvidia",
        "podAnnotations": {"prometheus.io/port": "9445"},
    },
    "scheduler": {
        "tlsConfig": {"serverName": "gpushare-extender", "caData": "Y2E="},
        "second": {
            "enabled": True,
            "replicas": 2,
            "image": {"tag": "v1.37.1"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "x", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {}},
            "priorityClassName": "system-cluster-critical",
        },
    },
    "grafanaDashboard": {"enabled": True},
}


# ---- helpers -------------------------------------------------------------------------------


def api_path(control_plane: ControlPlane, obj: Mapping[str, Any], cache: dict[str, Any]) -> str:
    """The collection URL of ``obj``'s kind, from the API server's discovery."""
    version = obj["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    if version not in cache:
        status, body = control_plane.api_request("GET", base)
        assert status == 200, body
        cache[version] = body["resources"]
    (resource,) = [r for r in cache[version] if r["kind"] == obj["kind"] and "/" not in r["name"]]
    if resource["namespaced"]:
        return f"{base}/namespaces/{obj['metadata']['namespace']}/{resource['name']}"
    return f"{base}/{resource['name']}"


def issue_token(
    control_plane: ControlPlane, name: str, namespace: str, bound_to: Pod | None = None
) -> str:
    """A TokenRequest token for the existing ServiceAccount ``namespace/name`` (the chart's);
    with ``bound_to``, bound to that pod as kubelet's projected tokens are (the API server then
    records the pod's node in the token: user extra ``authentication.kubernetes.io/node-name``)."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 3600}
    if bound_to is not None:
        assert bound_to.metadata is not None
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_to.metadata.name,
            "uid": bound_to.metadata.uid,
        }
    status, body = control_plane.api_request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    assert status == 201, body
    return str(body["status"]["token"])


def plugin_pod(kube: Client, node: str) -> Pod:
    """The device plugin's pod on ``node`` as the DaemonSet makes it (its ServiceAccount, bound
    to the node); nothing runs it."""
    return kube.create(
        Pod(
            metadata=ObjectMeta(name=f"{DEVICE_PLUGIN}-{node}", namespace=NAMESPACE),
            spec=PodSpec(
                nodeName=node,
                serviceAccountName=DEVICE_PLUGIN,
                containers=[Container(name="device-plugin", image="registry.invalid/gpushare:0")],
            ),
        )
    )


def plugin_kubeconfig(control_plane: ControlPlane, kube: Client, node: str) -> Path:
    """A kubeconfig with the chart's device-plugin identity as kubelet gives it to the plugin's
    pod on ``node``: a token bound to that pod (created here)."""
    token = issue_token(control_plane, DEVICE_PLUGIN, NAMESPACE, plugin_pod(kube, node))
    return write_kubeconfig(
        control_plane.root / f"chart-{DEVICE_PLUGIN}-{node}.kubeconfig",
        control_plane.server,
        control_plane.credentials.ca_cert,
        {"token": token},
    )


def can_i(
    control_plane: ControlPlane,
    token: str,
    verb: str,
    resource: str,
    *,
    namespace: str = "",
    name: str = "",
    group: str = "",
) -> bool:
    """``kubectl auth can-i`` as the token's identity (a ``SelfSubjectAccessReview``)."""
    resource, _, subresource = resource.partition("/")
    attributes = {
        "verb": verb,
        "group": group,
        "resource": resource,
        "subresource": subresource,
        "namespace": namespace,
        "name": name,
    }
    status, body = control_plane.api_request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
        token=token,
    )
    assert status == 201, body
    return bool(body["status"]["allowed"])


def flag_values(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)


def only_container(objects: list[Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return dict(container)


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def scheduler_config(objects: list[Obj], name: str) -> Obj:
    (config,) = parse_yaml(find(objects, "ConfigMap", name)["data"]["kube-scheduler-config.yaml"])
    return config


HOST_CA_FILE = "/etc/kubernetes/gpushare-extender-ca.crt"  # wiring (a): the hosts' copies
HOST_CLIENT = ("/etc/kubernetes/gpushare-extender-client.crt",
               "/etc/kubernetes/gpushare-extender-client.key")  # fmt: skip
MOUNTED_CA_FILE = "/etc/kubernetes/gpushare-extender-ca/ca.crt"  # wiring (b): its mounts
MOUNTED_CLIENT = ("/etc/kubernetes/gpushare-extender-client/tls.crt",
                  "/etc/kubernetes/gpushare-extender-client/tls.key")  # fmt: skip


def with_tls(entry: Obj, ca_file: str, client: tuple[str, str]) -> Obj:
    """gpushare's extender entry as the chart writes it with TLS: https, the Service's DNS name
    as the certificate's name, the CA in ``ca_file``, kube-scheduler's client certificate and
    key in ``client``."""
    server_name = f"{EXTENDER}.{NAMESPACE}.svc"
    tls = {"serverName": server_name, "caFile": ca_file,
           "certFile": client[0], "keyFile": client[1]}  # fmt: skip
    return {**gpushare_extender(entry["urlPrefix"]), "enableHTTPS": True, "tlsConfig": tls}


_NOBODY = pod_json("x", 4, namespace=NAMESPACE, uid="u")  # a pod nobody made
UNAUTHENTICATED_BODIES: dict[str, Obj] = {  # one body per verb
    "filter": {"Pod": _NOBODY, "NodeNames": [NODE]},
    "prioritize": {"Pod": _NOBODY, "NodeNames": [NODE]},
    "bind": {"PodName": "x", "PodNamespace": NAMESPACE, "PodUID": "u", "Node": NODE},
    "preempt": {"Pod": _NOBODY, "NodeNameToMetaVictims": {NODE: {"Pods": [{"UID": "v"}]}}},
}


def _post(
    url: str, body: Obj, ca_file: Path, client: tuple[Path, Path] | None = None
) -> tuple[int, str]:
    """POST ``body`` to ``url`` over HTTPS, the certificate checked against ``ca_file`` for the
    Service's DNS name (as kube-scheduler's ``tlsConfig.serverName``), presenting the client
    certificate and key ``client`` when given: the status and the text."""
    context = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        context.load_cert_chain(*client)
    server_name = f"{EXTENDER}.{NAMESPACE}.svc"
    with httpx.Client(verify=context, timeout=10) as http:
        request = http.build_request(
            "POST", url, json=body, extensions={"sni_hostname": server_name}
        )
        response = http.send(request)
    return response.status_code, response.text


def write_secret(chart: list[Obj], name: str, directory: Path) -> dict[str, Path]:
    """The rendered Secret's files in ``directory``, as its volume would mount them."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, value in find(chart, "Secret", name)["data"].items():
        files[key] = directory / key
        files[key].write_bytes(base64.b64decode(value))
    return files


# ---- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> list[Obj]:
    """The chart rendered for namespace ``gpushare-deploy`` with the second scheduler on."""
    return render_objects(
        {"scheduler": {"second": {"enabled": True}}}, namespace=NAMESPACE, helm=locate_helm()
    )


@dataclass(frozen=True)
class Installed:
    """The chart's RBAC applied for real, and a token for each of its ServiceAccounts."""

    tokens: dict[str, str]
    kubeconfigs: dict[str, Path]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, chart: list[Obj]) -> Iterator[Installed]:
    with control_plane.client() as admin, contextlib.suppress(ApiError):
        admin.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    cache: dict[str, Any] = {}
    created: list[str] = []
    for obj in chart:  # RBAC, and the device plugin's per-node admission policy
        if obj["kind"] in RBAC_KINDS + POLICY_KINDS:
            path = api_path(control_plane, obj, cache)
            status, body = control_plane.api_request("POST", path, obj)
            assert status == 201, body
            if obj["kind"] != "ServiceAccount":
                created.append(f"{path}/{obj['metadata']['name']}")
    tokens: dict[str, str] = {}
    kubeconfigs: dict[str, Path] = {}
    for name in (EXTENDER, DEVICE_PLUGIN, SCHEDULER):
        tokens[name] = issue_token(control_plane, name, NAMESPACE)
        kubeconfigs[name] = write_kubeconfig(
            control_plane.root / f"chart-{name}.kubeconfig",
            control_plane.server,
            control_plane.credentials.ca_cert,
            {"token": tokens[name]},
        )
    yield Installed(tokens, kubeconfigs)
    for path in reversed(created):  # cluster-wide grants must not outlive the module
        control_plane.api_request("DELETE", path)


# ---- the tests -----------------------------------------------------------------------------


def test_every_rendered_object_passes_a_server_side_dry_run(control_plane: ControlPlane) -> None:
    with control_plane.client() as admin, contextlib.suppress(ApiError):
        admin.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    renders = {
        name: parse_yaml((MANIFESTS_DIR / name).read_text(encoding="utf-8")) for name in MANIFESTS
    }
    renders["every option"] = render_objects(EVERY_OPTION, namespace=NAMESPACE)
    renders["generated certificate"] = render_objects(
        {"scheduler": {"second": {"enabled": True}}}, namespace=NAMESPACE
    )
    cache: dict[str, Any] = {}
    checked = dict.fromkeys(renders, 0)
    for label, objects in renders.items():
        assert objects, label
        for obj in objects:
            path = api_path(control_plane, obj, cache)
            status, body = control_plane.api_request(
                "POST", f"{path}?dryRun=All&fieldValidation=Strict", obj
            )
            what = f"{label}: {obj['kind']} {obj['metadata']['name']}"
            assert status == 201, f"{what}: {body}"
            assert body["metadata"]["name"] == obj["metadata"]["name"], what
            checked[label] += 1
    assert checked == {
        # 18 + the node-config ConfigMap, its Role and RoleBinding, the 16 preemption holds
        # ConfigMaps (the shards), their Role and RoleBinding
        "gpushare.yaml": 39,
        "gpushare-with-scheduler.yaml": 47,  # + the second scheduler's 8
        "every option": 48,  # + the dashboard
        # + the extender's Secret and kube-scheduler's client certificate
        "generated certificate": 49,
    }
    # A dry run stores nothing.
    status, _ = control_plane.api_request(
        "GET", "/api/v1/namespaces/kube-system/serviceaccounts/gpushare-extender"
    )
    assert status == 404


# (verb, resource, namespace, name, group) for SelfSubjectAccessReview
Access = tuple[str, str, str, str, str]
WORK_NS = "default"
ALLOWED: dict[str, list[Access]] = {
    EXTENDER: [
        ("list", "nodes", "", "", ""),
        ("watch", "nodes", "", "", ""),
        ("list", "pods", "", "", ""),  # all namespaces
        ("watch", "pods", "", "", ""),
        ("get", "pods", WORK_NS, "", ""),
        ("create", "pods/binding", WORK_NS, "", ""),
        ("create", "events", WORK_NS, "", ""),
        ("create", "leases", NAMESPACE, "", "coordination.k8s.io"),
        ("get", "leases", NAMESPACE, "gpushare-extender", "coordination.k8s.io"),
        ("update", "leases", NAMESPACE, "gpushare-extender", "coordination.k8s.io"),
        ("create", "pods/eviction", WORK_NS, "", ""),
        ("list", "poddisruptionbudgets", "", "", "policy"),
        ("watch", "poddisruptionbudgets", "", "", "policy"),
        ("get", "configmaps", NAMESPACE, "gpushare-preemption-holds", ""),
        ("list", "configmaps", NAMESPACE, "gpushare-preemption-holds", ""),
        ("watch", "configmaps", NAMESPACE, "gpushare-preemption-holds", ""),
        ("patch", "configmaps", NAMESPACE, "gpushare-preemption-holds", ""),
        ("watch", "configmaps", NAMESPACE, "gpushare-preemption-holds-15", ""),  # the last shard
        ("patch", "configmaps", NAMESPACE, "gpushare-preemption-holds-15", ""),
        ("patch", "pods/status", WORK_NS, "", ""),  # the requeue: a status condition
        ("create", "subjectaccessreviews", "", "", "authorization.k8s.io"),  # holds writers
    ],
    DEVICE_PLUGIN: [
        ("get", "nodes", "", "", ""),
        ("patch", "nodes", "", "", ""),
        ("patch", "nodes/status", "", "", ""),
        ("list", "pods", "", "", ""),
        ("watch", "pods", "", "", ""),
        ("get", "pods", WORK_NS, "", ""),
        ("patch", "pods", WORK_NS, "", ""),
        ("create", "events", WORK_NS, "", ""),
    ],
    SCHEDULER: [
        ("list", "nodes", "", "", ""),
        ("watch", "pods", "", "", ""),
        ("create", "pods/binding", WORK_NS, "", ""),
        ("patch", "pods/status", WORK_NS, "", ""),
        ("list", "persistentvolumeclaims", "", "", ""),
        ("create", "leases", NAMESPACE, "", "coordination.k8s.io"),
        ("get", "leases", NAMESPACE, SECOND_SCHEDULER_NAME, "coordination.k8s.io"),
        ("update", "leases", NAMESPACE, SECOND_SCHEDULER_NAME, "coordination.k8s.io"),
        ("get", "configmaps", "kube-system", "extension-apiserver-authentication", ""),
    ],
}
FORBIDDEN: dict[str, list[Access]] = {
    EXTENDER: [
        ("patch", "pods", WORK_NS, "", ""),  # the Binding carries the annotations
        ("update", "pods/status", WORK_NS, "", ""),
        ("get", "nodes", "", "", ""),
        ("delete", "pods", WORK_NS, "", ""),
        ("create", "pods", WORK_NS, "", ""),
        ("update", "pods", WORK_NS, "", ""),
        ("patch", "nodes", "", "", ""),
        ("patch", "nodes/status", "", "", ""),
        ("delete", "nodes", "", "", ""),
        ("get", "secrets", WORK_NS, "", ""),
        ("get", "configmaps", WORK_NS, "", ""),
        ("patch", "configmaps", NAMESPACE, "another-configmap", ""),
        ("delete", "configmaps", NAMESPACE, "gpushare-preemption-holds", ""),
        ("patch", "configmaps", NAMESPACE, "gpushare-preemption-holds-16", ""),  # no such shard
        ("create", "poddisruptionbudgets", WORK_NS, "", "policy"),
        ("update", "leases", NAMESPACE, "another-lease", "coordination.k8s.io"),
        ("create", "leases", WORK_NS, "", "coordination.k8s.io"),
    ],
    DEVICE_PLUGIN: [
        ("create", "pods/binding", WORK_NS, "", ""),
        ("delete", "nodes", "", "", ""),
        ("list", "nodes", "", "", ""),
        ("update", "nodes", "", "", ""),
        ("delete", "pods", WORK_NS, "", ""),
        ("create", "pods", WORK_NS, "", ""),
        ("get", "secrets", WORK_NS, "", ""),
    ],
    SCHEDULER: [
        ("update", "leases", NAMESPACE, "another-scheduler", "coordination.k8s.io"),
        ("get", "secrets", WORK_NS, "", ""),
        ("patch", "nodes", "", "", ""),
        ("delete", "nodes", "", "", ""),
        ("patch", "pods", WORK_NS, "", ""),
    ],
}


@pytest.mark.parametrize("identity", [EXTENDER, DEVICE_PLUGIN, SCHEDULER])
def test_each_chart_identity_may_do_its_work_and_nothing_more(
    control_plane: ControlPlane, installed: Installed, identity: str
) -> None:
    token = installed.tokens[identity]

    def check(access: Access) -> bool:
        verb, resource, namespace, name, group = access
        return can_i(
            control_plane, token, verb, resource, namespace=namespace, name=name, group=group
        )

    assert [a for a in ALLOWED[identity] if not check(a)] == []
    assert [a for a in FORBIDDEN[identity] if check(a)] == []


def test_raw_calls_with_the_chart_identities(
    control_plane: ControlPlane, installed: Installed
) -> None:
    """What the access reviews say, through the real request path."""
    extender, plugin = installed.tokens[EXTENDER], installed.tokens[DEVICE_PLUGIN]
    pod_name = "deploy-chart-raw"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": WORK_NS},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
    }
    status, body = control_plane.api_request("POST", f"/api/v1/namespaces/{WORK_NS}/pods", pod)
    assert status == 201, body
    try:
        pods = f"/api/v1/namespaces/{WORK_NS}/pods"
        assert control_plane.api_request("GET", "/api/v1/nodes", token=extender)[0] == 200
        assert control_plane.api_request("GET", "/api/v1/pods", token=extender)[0] == 200
        assert control_plane.api_request("DELETE", f"{pods}/{pod_name}", token=extender)[0] == 403
        assert control_plane.api_request("POST", pods, pod, token=extender)[0] == 403
        assert control_plane.api_request("GET", "/api/v1/pods", token=plugin)[0] == 200
        assert control_plane.api_request("GET", "/api/v1/nodes", token=plugin)[0] == 403  # list
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod_name, "namespace": WORK_NS},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "nowhere"},
        }
        status, body = control_plane.api_request(
            "POST", f"{pods}/{pod_name}/binding", binding, token=plugin
        )
        assert status == 403, body
        with control_plane.client(installed.kubeconfigs[EXTENDER]) as client:
            with pytest.raises(ApiError) as refused:
                client.patch(
                    Pod,
                    pod_name,
                    {"metadata": {"annotations": {"gpushare.io/test": "patched"}}},
                    namespace=WORK_NS,
                    patch_type=PatchType.MERGE,
                )
            assert refused.value.status.code == 403
            with pytest.raises(ApiError) as refused:
                client.patch(Node, "anything", {"metadata": {"labels": {"x": "y"}}})
            assert refused.value.status.code == 403
        with control_plane.client(installed.kubeconfigs[DEVICE_PLUGIN]) as client:
            with pytest.raises(ApiError) as refused:
                client.delete(Node, "anything")
            assert refused.value.status.code == 403
    finally:
        control_plane.api_request("DELETE", f"/api/v1/namespaces/{WORK_NS}/pods/{pod_name}")


NODE_A, NODE_B = "deploy-chart-own-a", "deploy-chart-own-b"
REFUSAL = "gpushare device plugin on node {own} may only change its own node and that node's pods"


def _refusal(call: Callable[[], object]) -> str:
    """The message of the 403 that ``call`` gets (fails when it is allowed or fails otherwise)."""
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.status.code == 403, refused.value.status
    return str(refused.value.status.message)


def test_the_device_plugin_may_change_only_its_own_node_and_its_pods(
    control_plane: ControlPlane, kube: Client, installed: Installed
) -> None:
    """The chart's ValidatingAdmissionPolicy on the real API server: the device plugin's identity
    on node A (a token bound to its pod there, as kubelet issues it) may patch node A, its
    status and a pod on A, and is refused node B, its status and a pod on B, with the policy's
    message; a token that names no node is refused everything."""
    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(NODE_A), plain_node(NODE_B)])
        stack.callback(delete_nodes, kube, [NODE_A, NODE_B])
        for node in (NODE_A, NODE_B):
            kube.create(
                Pod(
                    metadata=ObjectMeta(name=f"workload-on-{node}", namespace=WORK_NS),
                    spec=PodSpec(nodeName=node, containers=[Container(name="c", image="x")]),
                )
            )
            stack.callback(
                kube.delete, Pod, f"workload-on-{node}", namespace=WORK_NS, grace_period=0
            )
        kubeconfig = plugin_kubeconfig(control_plane, kube, NODE_A)
        stack.callback(
            kube.delete, Pod, f"{DEVICE_PLUGIN}-{NODE_A}", namespace=NAMESPACE, grace_period=0
        )
        plugin = stack.enter_context(control_plane.client(kubeconfig))

        # The identity the API server sees: the plugin's ServiceAccount, on node A.
        token = json.loads(kubeconfig.read_text())["users"][0]["user"]["token"]
        status, review = control_plane.api_request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            token=token,
        )
        assert status == 201, review
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{DEVICE_PLUGIN}"
        assert user["extra"][NODE_NAME_EXTRA] == [NODE_A]

        def label(kind: Any, name: str, namespace: str | None = None) -> Callable[[], object]:
            return label_with(plugin, kind, name, namespace, value="own-node")

        # The policy takes effect once the API server has loaded it (moments after creation).
        wait_until(
            "the own-node policy refuses node B",
            lambda: _try_refused(label(Node, NODE_B)),
            WAIT_S,
        )
        label(Node, NODE_A)()
        label(Node.Status, NODE_A)()
        label(Pod, f"workload-on-{NODE_A}", WORK_NS)()
        own = REFUSAL.format(own=NODE_A)
        assert f"{own}, not node {NODE_B}" in _refusal(label(Node, NODE_B))
        assert f"{own}, not node {NODE_B}" in _refusal(label(Node.Status, NODE_B))
        assert f"{own}, not pod {WORK_NS}/workload-on-{NODE_B} on node {NODE_B}" in _refusal(
            label(Pod, f"workload-on-{NODE_B}", WORK_NS)
        )
        # A token bound to no pod (so naming no node) changes nothing.
        with control_plane.client(installed.kubeconfigs[DEVICE_PLUGIN]) as unbound:
            message = _refusal(label_with(unbound, Node, NODE_A, value="unbound"))
        assert "with a token that names no node" in message, message
        # The extender is not the device plugin: the policy leaves it alone (RBAC refuses it).
        with control_plane.client(installed.kubeconfigs[EXTENDER]) as extender:
            refused = _refusal(label_with(extender, Node, NODE_B))
        assert 'cannot patch resource "nodes"' in refused, refused


def _try_refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiError as error:
        return error.status.code == 403
    return False


def label_with(
    client: Client, kind: Any, name: str, namespace: str | None = None, *, value: str = "other"
) -> Callable[[], object]:
    """A call that annotates ``kind`` ``name`` (``gpushare.io/test: value``) as ``client``."""
    body = {"metadata": {"annotations": {"gpushare.io/test": value}}}
    return lambda: client.patch(kind, name, body, namespace=namespace, patch_type=PatchType.MERGE)


def _gpu_pod(name: str, scheduler: str, gib: int) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE),
        spec=PodSpec(
            schedulerName=scheduler,
            nodeSelector={GROUP_LABEL: "deploy-chart"},
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/e2e:0",
                    resources=ResourceRequirements(limits={GPU_MEM: str(gib)}),
                )
            ],
        ),
    )


def _annotations(kube: Client, name: str, namespace: str = NAMESPACE) -> dict[str, str]:
    pod = kube.get(Pod, name, namespace=namespace)
    return dict((pod.metadata.annotations if pod.metadata else None) or {})


@contextlib.contextmanager
def second_scheduler(
    control_plane: ControlPlane, chart: list[Obj], installed: Installed, url_prefix: str, tmp: Path
) -> Iterator[ManagedProcess]:
    """kube-scheduler as the chart's Deployment runs it: its ConfigMap's configuration, its
    command's flags, its ServiceAccount's identity (plus a loopback port and a kubeconfig)."""
    config = scheduler_config(chart, f"{SCHEDULER}-config")
    (entry,) = config["extenders"]
    assert entry["urlPrefix"].startswith("https://")
    assert entry == with_tls(entry, MOUNTED_CA_FILE, MOUNTED_CLIENT)
    # The CA file is the Secret's ca.crt, the client certificate and key the client Secret's,
    # as the Deployment mounts them.
    pod = find(chart, "Deployment", SCHEDULER)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "extender-ca"]
    assert volume["secret"] == {
        "secretName": f"{EXTENDER}-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    (volume,) = [v for v in pod["volumes"] if v["name"] == "extender-client"]
    assert volume["secret"] == {
        "secretName": f"{EXTENDER}-client",
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    mounted = write_secret(chart, f"{EXTENDER}-tls", tmp / "extender-ca")["ca.crt"]
    client = write_secret(chart, f"{EXTENDER}-client", tmp / "extender-client")
    tls = {**entry["tlsConfig"], "caFile": str(mounted), "certFile": str(client["tls.crt"]),
           "keyFile": str(client["tls.key"])}  # fmt: skip
    config["extenders"] = [{**entry, "urlPrefix": url_prefix, "tlsConfig": tls}]
    config["clientConnection"] = {"kubeconfig": str(installed.kubeconfigs[SCHEDULER])}
    config_path = tmp / "kube-scheduler-config.yaml"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    main = only_container(chart, "Deployment", SCHEDULER)
    command = [c for c in main["command"][1:] if not c.startswith("--config=")]
    (port,) = free_ports(1)
    argv = [str(control_plane.binaries.path("kube-scheduler")), f"--config={config_path}"]
    argv += [*command, "--bind-address=127.0.0.1", f"--secure-port={port}"]
    argv += [f"--cert-dir={tmp / 'certs'}"]
    proc = ManagedProcess("kube-scheduler-chart-second", argv, tmp).start()
    try:
        # the scheduler's self-signed serving cert, loopback
        ready = functools.partial(http_ok, f"https://127.0.0.1:{port}/readyz", unverified_context())
        wait_until("the chart's second scheduler /readyz", ready, 60.0, processes=[proc])
        yield proc
    finally:
        proc.stop()


def test_the_chart_schedules_gpu_pods_with_its_identities_and_configuration(
    control_plane: ControlPlane,
    kube: Client,
    chart: list[Obj],
    installed: Installed,
    tmp_path: Path,
) -> None:
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-chart-", dir="/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, socket_dir, ignore_errors=True)
        labels = {GPUSHARE_LABEL: "true", GROUP_LABEL: "deploy-chart"}
        create_nodes(kube, [plain_node(NODE, labels=labels)])
        stack.callback(delete_nodes, kube, [NODE])
        kubelet = stack.enter_context(KubeletThread(socket_dir))

        # The device plugin: the DaemonSet's flags and the chart's identity.
        daemon = only_container(chart, "DaemonSet", DEVICE_PLUGIN)
        known = {o for p in device_plugin.params for o in p.opts}
        command, *flags = daemon["args"]
        assert command == "device-plugin"
        assert {a.split("=", 1)[0] for a in flags} <= known
        local = {  # this machine's stand-ins for the DaemonSet's mounts and port
            "--device-plugin-dir": str(socket_dir),
            "--proc-root": "/proc",
            "--metrics-port": str(free_ports(1)[0]),
        }
        args = [command] + [
            f"{a.split('=', 1)[0]}={local[a.split('=', 1)[0]]}"
            if a.split("=", 1)[0] in local
            else a
            for a in flags
        ]
        argv = gpushare_argv(*args)
        argv += ["--node-name", NODE, "--fake-gpus", "2x16GiB:T4", "--no-health"]
        # The node config: the chart's ConfigMap in the release namespace, found through
        # POD_NAMESPACE (the downward API's metadata.namespace; given here as its flag), read
        # with the chart's Role there. Its content says serves=shared, seen in the inventory.
        env = {e["name"]: e for e in daemon["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        argv += ["--node-config-namespace", NAMESPACE]
        node_config = find(chart, "ConfigMap", "gpushare-node-config")
        assert node_config["metadata"]["namespace"] == NAMESPACE
        kube.create(
            ConfigMap(
                metadata=ObjectMeta(name="gpushare-node-config", namespace=NAMESPACE),
                data={"config.yaml": "defaults: {serves: shared}\n"},
            )
        )
        stack.callback(kube.delete, ConfigMap, "gpushare-node-config", namespace=NAMESPACE)
        # Its token is bound to its pod on NODE, as kubelet issues it: the chart's own-node
        # admission policy (installed) lets it change NODE and NODE's pods only.
        stack.callback(
            kube.delete, Pod, f"{DEVICE_PLUGIN}-{NODE}", namespace=NAMESPACE, grace_period=0
        )
        argv += ["--kubeconfig", str(plugin_kubeconfig(control_plane, kube, NODE))]
        plugin = ManagedProcess("gpushare-device-plugin-chart", argv, tmp_path).start()
        stack.callback(plugin.stop)
        kubelet.call(kubelet.kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity == 32, WAIT_S))

        def inventory_published() -> Node | None:
            node = kube.get(Node, NODE)
            annotations = (node.metadata.annotations if node.metadata else None) or {}
            capacity = (node.status.capacity if node.status else None) or {}
            configured = '"serves":"shared"' in annotations.get(INVENTORY, "")
            return node if configured and capacity.get(GPU_COUNT) == "2" else None

        wait_for(
            "the plugin's configured inventory and aliyun.com/gpu-count on the node",
            inventory_published,
            WAIT_S,
            processes=[plugin],
        )
        kubelet.sync_node_status(kube, NODE)  # kubelet's node-status sync

        # The extender: the Deployment's options, the chart's identity and its certificate (the
        # helm-generated Secret, mounted where the Deployment's --tls-* flags say).
        ext = flag_values(only_container(chart, "Deployment", EXTENDER)["args"])
        assert ext["host"] == "$(POD_IP)"
        # the forward hop: mutual TLS on the peer port, the release CA, the Service's name,
        # the replicas' labels (docs/install.md, "High availability")
        assert (ext["peer-port"], ext["peer-ca"], ext["peer-server-name"]) == (
            "12346", "/etc/gpushare/tls/ca.crt", f"{EXTENDER}.{NAMESPACE}.svc",
        )  # fmt: skip
        assert parse_selector(ext["peer-selector"])["app.kubernetes.io/component"] == "extender"
        assert (ext["tls-cert"], ext["tls-key"]) == (
            "/etc/gpushare/tls/tls.crt",
            "/etc/gpushare/tls/tls.key",
        )
        secret = write_secret(chart, f"{EXTENDER}-tls", tmp_path / "extender-tls")
        # kube-scheduler's client certificate: the extender checks callers against the client
        # Secret's CA, mounted where --tls-client-ca says; the verbs need it (--tls-client-auth)
        assert (ext["tls-client-ca"], ext["tls-client-auth"]) == (
            "/etc/gpushare/client-ca/ca.crt", "required",
        )  # fmt: skip
        client = write_secret(chart, f"{EXTENDER}-client", tmp_path / "extender-client")
        options = LiveOptions(
            tls_cert=secret["tls.crt"],
            tls_key=secret["tls.key"],
            tls_client_ca=client["ca.crt"],
            tls_client_auth=ClientAuth(ext["tls-client-auth"]),
            prefix=ext["prefix"],
            policy=ext["policy"],
            gpu_unit=int(ext["gpu-unit"]) if "gpu-unit" in ext else None,  # None: derived
            assume_ttl_s=float(ext["assume-ttl"]),
            handshake_timeout_s=float(ext["handshake-timeout"]),
            bind_timeout_s=float(ext["bind-timeout"]),
            backoff=Backoff(initial_s=0.05, max_s=0.5),
            peer_port=free_ports(1)[0],  # the chart's 12346: a pod's own; here any free one
            peer_ca=secret["ca.crt"] if ext["peer-ca"] == "/etc/gpushare/tls/ca.crt" else None,
            peer_server_name=ext["peer-server-name"],
            peer_selector=parse_selector(ext["peer-selector"]),
            preemption=PreemptionOptions(
                wait_s=float(ext["preemption-wait"]),
                hold_max_s=float(ext["preemption-hold-max"]),
            ),
            holds_configmap=parse_holds_ref(ext["preemption-holds"]),
            hold_shards=int(ext["preemption-hold-shards"]),
            leader_election=LeaseConfig(
                namespace=ext["leader-elect-resource-namespace"],
                name=ext["leader-elect-resource-name"],
                identity="chart-extender-0",
                lease_duration_s=float(ext["leader-elect-lease-duration"]),
                renew_deadline_s=float(ext["leader-elect-renew-deadline"]),
                retry_period_s=float(ext["leader-elect-retry-period"]),
            ),
        )
        extender = stack.enter_context(ExtenderThread(installed.kubeconfigs[EXTENDER], options))
        wait_for("extender /readyz 200", lambda: extender.get("/readyz")[0] == 200 or None)

        def admitted(name: str, gib: int) -> None:
            def bound() -> Pod | None:
                pod = kube.get(Pod, name, namespace=NAMESPACE)
                return pod if pod.spec is not None and pod.spec.nodeName else None

            pod = wait_for(f"pod {name} bound", bound, WAIT_S)
            assert pod.spec is not None
            assert pod.spec.nodeName == NODE
            gpu = _annotations(kube, name)[ALIYUN_IDX]
            response = kubelet.call(kubelet.kubelet.allocate(GPU_MEM, size=gib))
            envs = dict(response.container_responses[0].envs)
            assert envs[ALIYUN_IDX] == gpu, envs
            wait_until(
                f"{name} marked assigned by the device plugin",
                lambda: _annotations(kube, name).get(ALIYUN_ASSIGNED) == "true",
                WAIT_S,
                processes=[plugin],
            )

        # A replica that just took the Lease answers 503 until its relist is done ("still
        # rebuilding"; kube-scheduler retries): wait for that, then every verb answers.
        wait_for(
            "the leader rebuilt",
            lambda: _post(extender.url_prefix + "/prioritize",
                          UNAUTHENTICATED_BODIES["prioritize"], secret["ca.crt"],
                          (client["tls.crt"], client["tls.key"]))[0] == 200 or None,
        )  # fmt: skip
        # The chart's default: every verb refuses a caller without kube-scheduler's certificate.
        for verb, body in UNAUTHENTICATED_BODIES.items():
            code, answer = _post(extender.url_prefix + "/" + verb, body, secret["ca.crt"])
            assert (code, "needs a client certificate" in answer) == (401, True), (verb, answer)
            code, answer = _post(extender.url_prefix + "/" + verb, body, secret["ca.crt"],
                                 (client["tls.crt"], client["tls.key"]))  # fmt: skip
            assert code == 200, (verb, answer)

        # (a) the default scheduler's configuration: the ConfigMap's extender entry, over
        # HTTPS, checking the extender's certificate for the Service's name against the CA the
        # ConfigMap carries (copied to the control-plane host's caFile), and presenting the
        # client Secret's certificate (copied to the host's certFile and keyFile).
        configmap = "gpushare-default-scheduler-config"
        (entry,) = scheduler_config(chart, configmap)["extenders"]
        assert entry == with_tls(entry, HOST_CA_FILE, HOST_CLIENT)
        ca_file = tmp_path / "gpushare-extender-ca.crt"
        ca_file.write_text(find(chart, "ConfigMap", configmap)["data"]["extender-ca.crt"])
        assert ca_file.read_bytes() == secret["ca.crt"].read_bytes()
        tls = {**entry["tlsConfig"], "caFile": str(ca_file), "certFile": str(client["tls.crt"]),
               "keyFile": str(client["tls.key"])}  # fmt: skip
        assert extender.url_prefix.startswith("https://127.0.0.1:")
        with control_plane.scheduler(
            "kube-scheduler-chart-default",
            profiles=[{"schedulerName": DEFAULT_PROFILE}],
            extenders=[{**entry, "urlPrefix": extender.url_prefix, "tlsConfig": tls}],
        ):
            kube.create(_gpu_pod("via-default", DEFAULT_PROFILE, 8))
            admitted("via-default", 8)

        # (b) the second scheduler, as its Deployment runs it.
        second_dir = tmp_path / "second"
        second_dir.mkdir()
        with second_scheduler(control_plane, chart, installed, extender.url_prefix, second_dir):
            kube.create(_gpu_pod("via-second", SECOND_SCHEDULER_NAME, 4))
            admitted("via-second", 4)
        for name in ("via-default", "via-second"):
            kube.delete(Pod, name, namespace=NAMESPACE, grace_period=0)
