"""``gpushare extender --leader-elect*``: the options, their defaults (8/6/1 s, kube-system,
``gpushare-extender``, an identity from the downward API) and timing rules that are refused
with every broken rule named (client-go's ``NewLeaderElector`` checks)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from gpushare.cli.leader import lease_config
from gpushare.cli.main import main

DEFAULTS: dict[str, Any] = {
    "leader_elect": True,
    "lease_duration_s": 8.0,
    "renew_deadline_s": 6.0,
    "retry_period_s": 1.0,
    "lease_namespace": None,
    "lease_name": "gpushare-extender",
    "lease_identity": None,
}


def test_help_lists_the_leader_election_options() -> None:
    result = CliRunner().invoke(main, ["extender", "--help"])
    assert result.exit_code == 0
    for option in (
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-namespace",
        "--leader-elect-resource-name",
        "--leader-elect-identity",
    ):
        assert option in result.output


def test_without_leader_elect_there_is_no_lease() -> None:
    assert lease_config(**{**DEFAULTS, "leader_elect": False}) is None


def test_defaults_come_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "gpushare-extender-7d9f-abcde")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("POD_NAMESPACE", "gpushare")
    config = lease_config(**DEFAULTS)
    assert config is not None
    assert (config.namespace, config.name) == ("gpushare", "gpushare-extender")
    assert config.identity.startswith("gpushare-extender-7d9f-abcde_10.1.2.3_")
    assert (config.lease_duration_s, config.renew_deadline_s, config.retry_period_s) == (8, 6, 1)
    assert lease_config(**DEFAULTS) != config  # a fresh suffix per process


def test_namespace_falls_back_to_kube_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    config = lease_config(**{**DEFAULTS, "lease_identity": "me"})
    assert config is not None
    assert (config.namespace, config.identity) == ("kube-system", "me")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--leader-elect-lease-duration", "5"], "lease_duration_s (5) must be > renew_deadline_s"),
        (["--leader-elect-renew-deadline", "1"], "renew_deadline_s (1) must be > retry_period_s"),
        (["--leader-elect-retry-period", "0"], "0 is not in the range"),
    ],
    ids=["lease-shorter-than-renew", "renew-too-short-for-retry", "zero-retry"],
)
def test_bad_timings_are_refused_with_the_rule(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["extender", "--leader-elect", *args, "--port", "1"])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_in_memory_takes_no_leader_election() -> None:
    result = CliRunner().invoke(main, ["extender", "--in-memory", "--leader-elect", "--port", "1"])
    assert result.exit_code == 2
    assert "--in-memory takes no --leader-elect" in result.output
