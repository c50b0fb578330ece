"""A real Kubernetes control plane on loopback for the cluster-test tiers.

:class:`ControlPlane` runs etcd, kube-apiserver, kube-scheduler and kwok (and, for the real-node
tier, kube-controller-manager) as child processes,
built from the Go module proxy by ``scripts/build-controlplane.sh`` (see ``docs/testing.md``):

* every process listens on a free 127.0.0.1 port and owns a directory under one temporary root;
* kube-apiserver has RBAC on, TLS from a throw-away CA, a service-account signing key, and an
  admin identity (client certificate in ``system:masters``) in ``<root>/admin.kubeconfig``;
* kube-scheduler reads a ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``) file
  that may carry ``extenders``; :meth:`ControlPlane.scheduler` starts further schedulers with
  their own profiles and extenders for one test;
* kwok marks nodes annotated ``kwok.x-k8s.io/node: fake`` Ready and runs the pods bound to them;
* readiness waits on health endpoints and API conditions (short polls with a deadline, never a
  fixed sleep); a process that dies while being waited for fails at once with its log. The
  poll loop (:mod:`gpushare.testing.controlplane.polling`: :func:`wait_for`, :func:`wait_until`
  and their async siblings) is the one every test tier waits with;
* :meth:`ControlPlane.stop` terminates every process group (SIGTERM, then SIGKILL), copies the
  logs to ``log_dir`` when one is given, and removes the temporary root, whatever happened before.

Test-only code: it needs the ``test`` extra (lightkube) and the binaries, and nothing in the
``gpushare`` runtime packages may import it.
"""

from gpushare.testing.controlplane.binaries import (
    BINARY_NAMES,
    BUILD_SCRIPT,
    KWOK_STAGES,
    REPO_ROOT,
    Binaries,
)
from gpushare.testing.controlplane.credentials import (
    Credentials,
    unverified_kubeconfig,
    write_kubeconfig,
)
from gpushare.testing.controlplane.errors import ControlPlaneError
from gpushare.testing.controlplane.plane import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SERVICE_ACCOUNT_ISSUER,
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlane,
)
from gpushare.testing.controlplane.polling import (
    async_wait_for,
    async_wait_until,
    wait_for,
    wait_until,
)
from gpushare.testing.controlplane.processes import (
    ManagedProcess,
    free_ports,
    gpushare_argv,
    http_ok,
    unverified_context,
)
from gpushare.testing.controlplane.scheduler_config import (
    PREEMPTION_CANDIDATE_NODES,
    SCHEDULER_CONFIG_API_VERSION,
    gpushare_dra_extender,
    gpushare_extender,
    gpushare_profile,
    scheduler_configuration,
)

__all__ = [
    "BINARY_NAMES",
    "BUILD_SCRIPT",
    "KWOK_NODE_ANNOTATION",
    "KWOK_NODE_ANNOTATION_VALUE",
    "KWOK_STAGES",
    "PREEMPTION_CANDIDATE_NODES",
    "REPO_ROOT",
    "SCHEDULER_CONFIG_API_VERSION",
    "SERVICE_ACCOUNT_ISSUER",
    "SERVICE_CLUSTER_IP_RANGE",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "Credentials",
    "ManagedProcess",
    "async_wait_for",
    "async_wait_until",
    "free_ports",
    "gpushare_argv",
    "gpushare_dra_extender",
    "gpushare_extender",
    "gpushare_profile",
    "http_ok",
    "scheduler_configuration",
    "unverified_context",
    "unverified_kubeconfig",
    "wait_for",
    "wait_until",
    "write_kubeconfig",
]
