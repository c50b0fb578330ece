"""Creating ResourceClaimTemplates (``gpushare dra-templates``): each created unless one of
that name exists (then left as it is)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error

__all__ = ["ensure_templates"]


async def ensure_templates(
    client: AsyncClient, templates: Iterable[Mapping[str, Any]]
) -> tuple[int, int]:
    """Create each of ``templates`` (ResourceClaimTemplate JSON) that does not exist yet;
    ``(created, existing)``. ``ApiCallError`` for any other failure."""
    created = existing = 0
    for template in templates:
        meta = template["metadata"]
        what = f"create ResourceClaimTemplate {meta['namespace']}/{meta['name']}"
        try:
            await client.create(from_dict(dict(template)))
            created += 1
        except ApiError as error:
            if error.status.code != 409:
                raise api_call_error(what, error) from error
            existing += 1
        except CLIENT_ERRORS as error:
            raise api_call_error(what, error) from error
    return created, existing
