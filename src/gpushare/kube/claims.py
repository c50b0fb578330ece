"""ResourceClaims read from the API server for the DRA kubelet plugin
(``gpushare.dra.plugin.ClaimSource``): one GET per claim kubelet names, as the claim is now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import ResourceClaim

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error

__all__ = ["ApiClaims"]


class ApiClaims:
    """``claim(namespace, name)``: the ResourceClaim as JSON, through ``client``; ``LookupError``
    for a claim the API server does not have (404), ``ApiCallError`` (``gpushare.kube.errors``)
    for any other failure."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            found = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as error:
            if error.status.code == 404:
                raise LookupError(f"claim {namespace}/{name}") from None
            raise api_call_error(f"get ResourceClaim {namespace}/{name}", error) from error
        except CLIENT_ERRORS as error:
            raise api_call_error(f"get ResourceClaim {namespace}/{name}", error) from error
        document: Mapping[str, Any] = found.to_dict()
        return document
