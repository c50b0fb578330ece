"""Reading a running program's Prometheus ``/metrics`` from a test or benchmark.

:func:`sample_sum` fetches the text exposition (never through a proxy: the targets are test
processes on loopback) and parses it with prometheus-client's own parser, so label order,
escaping and ``_total`` suffixes are the library's business, not a hand-written line split.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["sample_sum"]


def sample_sum(
    url: str,
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    timeout_s: float = 10.0,
    context: ssl.SSLContext | None = None,
) -> float:
    """The sum of every sample called ``name`` (e.g. ``gpushare_extender_requests_total``)
    whose labels include ``labels``, at ``url`` (HTTPS checked with ``context``); 0.0 when
    none matches. ``OSError`` (e.g. ``URLError``) when ``url`` does not answer."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    with opener.open(url, timeout=timeout_s) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and (labels or {}).items() <= sample.labels.items()
    )
