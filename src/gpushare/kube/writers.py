"""Who besides the extender may write the preemption holds ConfigMap: access reviews.

The holds ConfigMap (``gpushare.kube.holds``) is to be written by the extender alone: the
chart grants ``patch`` on it to the extender's ServiceAccount and to nobody else. A hold is
checked against the API server before anyone is evicted for it (``gpushare.extender.
preemption``, "Trust"), but a forged one can still keep GPUs from lower-priority pods for up to
``--preemption-hold-max``, so an operator who grants ConfigMap write in that namespace more
widely should hear about it.

Nobody can list every identity of a cluster, but the grants that matter are the broad ones: to
every authenticated user, to every ServiceAccount, to every ServiceAccount of the namespace
(``edit`` bound to ``system:serviceaccounts:<namespace>`` is a common shortcut), to the
namespace's ``default`` ServiceAccount (which every pod there runs as unless told otherwise),
and to anonymous requests. :func:`foreign_writers` asks the API server, with one
``SubjectAccessReview`` per subject and verb (``patch``, ``update``, ``delete`` of that name,
``create`` in the namespace), which of them may: the answer is the API server's authorizer's
(RBAC and any webhook), not a reading of the RBAC objects. RBAC: ``subjectaccessreviews``
``create`` (:data:`RBAC_RULES`); the kube-system controllers that may write anything there
(the garbage collector, the namespace controller) are part of the control plane and not asked
about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SubjectAccessReview

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error

__all__ = ["RBAC_RULES", "Subject", "broad_subjects", "foreign_writers"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["subjectaccessreviews"],
        "verbs": ["create"],
    },
)
"""What :func:`foreign_writers` needs of its identity's RBAC."""

WRITE_VERBS = ("patch", "update", "delete", "create")
"""The verbs that change the ConfigMap (``create`` is asked in the namespace: its name is in the
body, so RBAC cannot limit it to one name)."""


@dataclass(frozen=True, slots=True)
class Subject:
    """An identity to ask about: a ``user`` or a ``group`` (one of them)."""

    user: str = ""
    group: str = ""

    def __str__(self) -> str:
        return f"user {self.user}" if self.user else f"group {self.group}"


def broad_subjects(namespace: str) -> tuple[Subject, ...]:
    """The identities whose write access would let many write the holds (module doc)."""
    return (
        Subject(group="system:authenticated"),
        Subject(group="system:unauthenticated"),
        Subject(group="system:serviceaccounts"),
        Subject(group=f"system:serviceaccounts:{namespace}"),
        Subject(user=f"system:serviceaccount:{namespace}:default"),
    )


async def foreign_writers(
    client: AsyncClient,
    namespace: str,
    names: str | Sequence[str],
    subjects: Sequence[Subject] | None = None,
) -> list[str]:
    """``"<subject> may <verb>"`` for each of ``subjects`` (default: :func:`broad_subjects`)
    that the API server lets change ConfigMap ``namespace/name`` for every name of ``names``
    (one name, or the holds' shards: ``gpushare.kube.holds.HoldsRef.names``), ``"<subject>
    may <verb> <name>, ..."`` where only some of them; empty when none may. ``create`` is
    asked once (it names no object). Raises :class:`~gpushare.kube.errors.ApiCallError` when
    a review cannot be made (403 without :data:`RBAC_RULES`)."""
    every = [names] if isinstance(names, str) else list(names)
    found: list[str] = []
    for subject in subjects if subjects is not None else broad_subjects(namespace):
        for verb in WRITE_VERBS:
            asked = [None] if verb == "create" else every
            allowed = [n for n in asked if await _allowed(client, subject, verb, namespace, n)]
            if allowed == asked:
                found.append(f"{subject} may {verb}")
            elif allowed:
                found.append(f"{subject} may {verb} {', '.join(str(n) for n in allowed)}")
    return found


async def _allowed(
    client: AsyncClient, subject: Subject, verb: str, namespace: str, name: str | None
) -> bool:
    review = SubjectAccessReview(
        spec=SubjectAccessReviewSpec(
            user=subject.user or None,
            groups=[subject.group] if subject.group else None,
            resourceAttributes=ResourceAttributes(
                verb=verb, resource="configmaps", namespace=namespace, name=name
            ),
        )
    )
    try:
        answer = await client.create(review)
    except CLIENT_ERRORS as exc:
        raise api_call_error("POST subjectaccessreviews", exc) from exc
    return answer.status is not None and bool(answer.status.allowed)
