"""Reading a kubeconfig file with one-line errors (``tests/test_cli_kubeconfig.py``).

lightkube's ``KubeConfig.from_file`` trusts the file: ``/etc/passwd`` ends in
``AttributeError: 'str' object has no attribute 'get'``, a context naming a missing cluster in a
``KeyError``. ``load_kubeconfig`` reads, parses and checks the file first and raises
``KubeconfigError`` (a lightkube ``ConfigError``) whose message is one line that starts with
``kubeconfig <path>: `` and says what is wrong and what is expected. The shape checked is
kubectl's (``clientcmd/api/v1``: ``clusters``, ``contexts``, ``users`` lists of named entries,
``current-context``).

``check_files`` looks for the files a context's entries point at (a client certificate, its
key, the cluster's CA, a token file) before lightkube opens them: a kubeconfig left behind by a
cluster that is gone (``make demo-down``) names certificates that are gone too, and lightkube's
``FileNotFoundError`` names neither the file nor the entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml
from lightkube import KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ConfigError

__all__ = ["KubeconfigError", "check_files", "load_kubeconfig", "select_context"]

_EXPECTED = "expected a kubeconfig (a YAML mapping with 'clusters' and 'contexts' lists)"
_MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024
"""Larger files are refused unread (kubeconfigs are kilobytes, inline certificates included)."""


class KubeconfigError(ConfigError):
    """A kubeconfig that cannot be used: ``path`` and a one-line ``problem``."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(problem.split())
        super().__init__(f"kubeconfig {self.path}: {self.problem}")


def _read(path: Path) -> str:
    try:
        with path.open("rb") as file:
            raw = file.read(_MAX_KUBECONFIG_BYTES + 1)
    except FileNotFoundError:
        raise KubeconfigError(path, "no such file") from None
    except IsADirectoryError:
        raise KubeconfigError(path, "is a directory, expected a file") from None
    except OSError as error:
        raise KubeconfigError(path, f"cannot read it: {error.strerror or error}") from None
    if len(raw) > _MAX_KUBECONFIG_BYTES:
        raise KubeconfigError(
            path, f"larger than {_MAX_KUBECONFIG_BYTES // 2**20} MiB; {_EXPECTED}"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise KubeconfigError(
            path, f"not text (byte {error.start} is not UTF-8); {_EXPECTED}"
        ) from None


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        conf = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or type(error).__name__
        raise KubeconfigError(path, f"not YAML{where}: {problem}; {_EXPECTED}") from None
    if not isinstance(conf, dict):
        kind = "empty" if conf is None else f"YAML {type(conf).__name__}"
        raise KubeconfigError(path, f"not a kubeconfig ({kind}); {_EXPECTED}")
    for key in ("clusters", "contexts", "users"):
        entries = conf.get(key, [] if key == "users" else None)
        if entries is None and key != "users":
            raise KubeconfigError(path, f"not a kubeconfig (no '{key}'); {_EXPECTED}")
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
        ):
            raise KubeconfigError(
                path, f"'{key}' must be a list of entries, each with a 'name'; {_EXPECTED}"
            )
    current = conf.get("current-context")
    if current is not None and not isinstance(current, str):
        raise KubeconfigError(path, f"'current-context' must be a string, got {current!r}")
    return conf


def load_kubeconfig(path: Path | str) -> KubeConfig:
    """The kubeconfig at ``path`` (``~`` expanded), checked; ``KubeconfigError`` naming the file
    and the problem when it is missing, unreadable, not YAML or not a kubeconfig."""
    file = Path(path).expanduser()
    conf = _parse(file, _read(file))
    try:
        return KubeConfig.from_dict(conf, fname=file)
    except (KeyError, TypeError, ValueError, msgspec.ValidationError) as error:
        detail = str(error) or type(error).__name__
        raise KubeconfigError(file, f"not a valid kubeconfig: {detail}") from None


def select_context(config: KubeConfig, context: str | None) -> SingleConfig:
    """The ``context`` of ``config`` (default: its current context); ``KubeconfigError`` when
    it is not there or names a cluster or user the file does not have."""
    where = config.fname or "(in-cluster)"
    names = ", ".join(sorted(config.contexts)) or "none"
    name = context if context is not None else config.current_context
    if name is None:
        raise KubeconfigError(
            where, f"no current-context; choose one with --context (contexts: {names})"
        )
    found = config.contexts.get(name)
    if found is None:
        raise KubeconfigError(where, f"no context {name!r} (contexts: {names})")
    if found.cluster not in config.clusters:
        raise KubeconfigError(
            where, f"context {name!r} names cluster {found.cluster!r}, which the file lacks"
        )
    if found.user and found.user not in config.users:
        raise KubeconfigError(
            where, f"context {name!r} names user {found.user!r}, which the file lacks"
        )
    single = config.get(context_name=name)
    if single is None:  # pragma: no cover - get() returns or raises for a named context
        raise KubeconfigError(where, f"no context {name!r} (contexts: {names})")
    return single


def check_files(single: SingleConfig) -> None:
    """``KubeconfigError`` naming the first file that context ``single`` points at and that is
    not there (or not a file): the cluster's ``certificate-authority``, the user's
    ``client-certificate``, ``client-key`` and ``tokenFile``, each only where lightkube would
    open it (inline ``*-data`` takes precedence for the user's certificate and key, the file
    for the CA, as in ``lightkube.config.client_adapter``). Relative paths are resolved against
    the kubeconfig's folder, as kubectl does. The message names the kubeconfig, the entry
    (``users entry 'u'``), its key (``client-certificate``) and the missing path."""
    where = single.fname or "(in-cluster)"
    cluster, user, context = single.cluster, single.user, single.context
    entries: list[tuple[str, str, str | None]] = [
        (f"clusters entry {context.cluster!r}", "certificate-authority", cluster.certificate_auth)
    ]
    if user is not None:
        owner = f"users entry {context.user or ''!r}"
        entries += [
            (owner, "client-certificate", None if user.client_cert_data else user.client_cert),
            (owner, "client-key", None if user.client_key_data else user.client_key),
            (owner, "tokenFile", user.token_file),
        ]
    for owner, key, named in entries:
        if not named:
            continue
        path = Path(single.abs_file(named)).expanduser()
        if path.is_file():
            continue
        state = "is not a file" if path.exists() else "does not exist"
        raise KubeconfigError(
            where,
            f"{owner} points {key} at {path}, which {state} (the cluster this kubeconfig was "
            "written for may be gone: use a current kubeconfig)",
        )
