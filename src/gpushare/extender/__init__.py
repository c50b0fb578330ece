"""The scheduler extender: the HTTP service kube-scheduler calls to filter, score and bind pods
that ask for ``aliyun.com/gpu-mem`` (wire format and kube-scheduler's side: docs/interfaces.md,
"The scheduler extender wire format"; the contracts: docs/design.md, "The extender").

* :mod:`~gpushare.extender.wire` — the extender wire types (msgspec structs, exact JSON keys);
* :mod:`~gpushare.extender.state` — ``ExtenderState`` (nodes, pods, and the ledger behind
  methods that say what callers need: ``allocation``, ``ledger_state``, ...) and the feeding
  methods ``gpushare.kube`` calls;
* :mod:`~gpushare.extender.bindapi` — ``Binder``, ``EventSink``: what the bind asks of the API
  server;
* :mod:`~gpushare.extender.scheduler` — the decisions (filter, prioritize, bind), no HTTP;
* :mod:`~gpushare.extender.binding` — ``BindVerb``, the bind verb ``Scheduler`` delegates to,
  with its locks (``PodLocks``, ``LoopLock``);
* :mod:`~gpushare.extender.memo` — the filter and prioritize cache (``NodeShapeCache``) and a
  pod's ``shape_key``;
* :mod:`~gpushare.extender.outcomes` — the refusal texts the verbs share;
* :mod:`~gpushare.extender.scoring` — policies for the extender and the 0–10 mapping;
* :mod:`~gpushare.extender.report` — the ``/inspect`` report;
* :mod:`~gpushare.extender.app` — ``create_app``, the starlette app;
* :mod:`~gpushare.extender.feed` — ``StateFeeder``: the API-server cache's changes into the state;
* :mod:`~gpushare.extender.apiserver` — ``ApiBinder`` and ``ApiEventSink`` on ``gpushare.kube``;
* :mod:`~gpushare.extender.live` — ``LiveExtender``: all of it with uvicorn on one event loop
  (what ``gpushare extender --kubeconfig`` runs).
"""

from gpushare.extender.app import DEFAULT_PORT, DEFAULT_PREFIX, create_app
from gpushare.extender.bindapi import Binder, BindEvent, Binding, EventSink, UnwiredBinder
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.state import ExtenderState

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PREFIX",
    "BindEvent",
    "Binder",
    "Binding",
    "EventSink",
    "ExtenderState",
    "Scheduler",
    "UnwiredBinder",
    "create_app",
]
