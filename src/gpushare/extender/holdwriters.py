"""Warn when identities besides the extender may write the preemption holds ConfigMap.

The holds ConfigMap is the extender's alone (docs/install.md, "Preemption holds"). Every
``interval_s`` :class:`HoldWriterCheck` asks the API server which broad identities may change
it (``gpushare.kube.writers.foreign_writers``) and exports how many such grants there are,
``gpushare_extender_holds_foreign_writers`` (0 as it should be; -1 while the question cannot be
asked, e.g. without RBAC ``subjectaccessreviews`` ``create``). A change is logged: a warning
naming each grant and what to do, or an info line once they are gone; a failure to ask is
logged once until it succeeds. The chart's alert ``GpushareHoldsWritableByOthers`` fires on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["HoldWriterCheck"]

log = logging.getLogger(__name__)


class HoldWriterCheck:
    """The check of ConfigMap ``where`` (``namespace/name``) through ``ask`` (module doc), its
    gauge on ``registry``."""

    def __init__(
        self,
        ask: Callable[[], Awaitable[list[str]]],
        where: str,
        registry: CollectorRegistry,
        *,
        interval_s: float = 600.0,
    ) -> None:
        self._ask = ask
        self._where = where
        self._interval_s = interval_s
        self._last: list[str] | None = None
        self._failing = False
        self.writers = Gauge(
            "gpushare_extender_holds_foreign_writers",
            "Grants that let identities besides the extender change the preemption holds "
            "ConfigMap (0 as it should be; -1 while they cannot be checked).",
            registry=registry,
        )
        self.writers.set(-1)

    async def check(self) -> list[str] | None:
        """Ask once; the grants found (``None`` when the API server could not be asked)."""
        try:
            found = await self._ask()
        except Exception as error:
            self.writers.set(-1)
            if not self._failing:
                log.warning(
                    "cannot check who else may write the preemption holds %s (grant the "
                    "extender subjectaccessreviews create, as the chart does): %s",
                    self._where, error,
                )  # fmt: skip
            self._failing = True
            return None
        self._failing = False
        self.writers.set(len(found))
        if found and found != self._last:
            log.warning(
                "the preemption holds %s are writable by others: %s. A forged hold can keep "
                "GPUs from lower-priority pods until --preemption-hold-max (it never evicts: "
                "holds are checked against the API server first); grant ConfigMap write in "
                "that namespace to the extender alone, or move the release to a namespace of "
                "its own (docs/install.md, \"Preemption holds\")",
                self._where, "; ".join(found),
            )  # fmt: skip
        elif not found and self._last:
            log.info("the preemption holds %s are writable by the extender alone again",
                     self._where)  # fmt: skip
        self._last = found
        return found

    async def run(self) -> None:
        """Check now and every ``interval_s``, until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self._interval_s)
