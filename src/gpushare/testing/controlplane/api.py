"""The API helpers of :class:`~gpushare.testing.controlplane.ControlPlane`: clients,
service-account identities and raw requests."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import Namespace, ServiceAccount, ServiceAccountToken
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from gpushare.testing.controlplane.credentials import Credentials, write_kubeconfig
from gpushare.testing.controlplane.errors import ControlPlaneError


class ApiAccess:
    """Talking to a running control plane; mixed into ``ControlPlane``, which sets the fields."""

    root: Path
    credentials: Credentials
    kubeconfig: Path
    server: str

    # ---- clients and identities --------------------------------------------------------

    def client(self, kubeconfig: Path | None = None) -> Client:
        """A lightkube client (admin unless another kubeconfig is given); close it after use."""
        config = KubeConfig.from_file(kubeconfig or self.kubeconfig)
        return Client(config, trust_env=False, field_manager="gpushare-tests")

    def service_account_token(
        self,
        name: str,
        namespace: str,
        rules: Sequence[PolicyRule],
        *,
        expiration_seconds: int = 3600,
    ) -> str:
        """A bearer token for ServiceAccount ``namespace/name`` with a ClusterRole of ``rules``.

        The token comes from the TokenRequest API (signed with the control plane's
        service-account key), so RBAC is exercised exactly as for an in-cluster component.
        """
        with self.client() as client:
            with contextlib.suppress(ApiError):  # already exists
                client.create(Namespace(metadata=ObjectMeta(name=namespace)))
            with contextlib.suppress(ApiError):
                client.create(ServiceAccount(metadata=ObjectMeta(name=name, namespace=namespace)))
            role_name = f"gpushare-test:{namespace}:{name}"
            client.apply(
                ClusterRole(metadata=ObjectMeta(name=role_name), rules=list(rules)),
                force=True,
            )
            client.apply(
                ClusterRoleBinding(
                    metadata=ObjectMeta(name=role_name),
                    roleRef=RoleRef(
                        apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role_name
                    ),
                    subjects=[Subject(kind="ServiceAccount", name=name, namespace=namespace)],
                ),
                force=True,
            )
            token = client.create(
                ServiceAccountToken(
                    metadata=ObjectMeta(name=name, namespace=namespace),
                    spec=TokenRequestSpec(audiences=[], expirationSeconds=expiration_seconds),
                ),
                name,
                namespace=namespace,
            )
        if token.status is None or not token.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return token.status.token

    def service_account_kubeconfig(
        self,
        name: str,
        namespace: str,
        rules: Sequence[PolicyRule],
        *,
        expiration_seconds: int = 3600,
    ) -> Path:
        """A kubeconfig with :meth:`service_account_token`'s token for ``namespace/name``."""
        token = self.service_account_token(
            name, namespace, rules, expiration_seconds=expiration_seconds
        )
        return write_kubeconfig(
            self.root / f"sa-{namespace}-{name}.kubeconfig",
            self.server,
            self.credentials.ca_cert,
            {"token": token},
        )

    def api_request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """A raw JSON request to the API server (admin, or ``token``): (HTTP status, body).

        For calls lightkube cannot make: it decodes the 201 ``Status`` that a ``pods/binding``
        POST returns as a ``Binding`` and raises although the bind succeeded.
        """
        context = ssl.create_default_context(cafile=str(self.credentials.ca_cert))
        headers = {"Accept": "application/json"}
        if token is None:
            context.load_cert_chain(
                str(self.credentials.admin_cert), str(self.credentials.admin_key)
            )
        else:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            f"{self.server}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as resp:
                return int(resp.status), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read() or b"null")
