"""The ResourceClaimTemplates pods rewritten at admission claim from
(``gpushare.dra.templates``). The whole translation on the real control plane:
tests/cluster/test_dra_translation.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

from gpushare.cli.main import main
from gpushare.dra.templates import (
    claim_templates,
    share_template_name,
    share_templates,
    template_name,
    whole_template_name,
)
from gpushare.kube.codec import MemoryUnit


def test_one_template_per_size_asking_that_much_of_one_gpu() -> None:
    templates = claim_templates("team-a", 3)
    assert [t["metadata"]["name"] for t in templates] == [
        "gpushare-gpu-mem-1", "gpushare-gpu-mem-2", "gpushare-gpu-mem-3",
    ]  # fmt: skip
    assert {t["metadata"]["namespace"] for t in templates} == {"team-a"}
    (request,) = templates[2]["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpushare-gpu", "capacity": {"requests": {"memory": "3Gi"}}},
    }


def test_on_mib_nodes_the_sizes_are_mib() -> None:
    (template,) = claim_templates("ns", 1, unit=MemoryUnit.MIB, device_class="other")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "other",
                                  "capacity": {"requests": {"memory": "1Mi"}}}  # fmt: skip
    assert template_name(7) == "gpushare-gpu-mem-7"


@pytest.mark.parametrize("largest", [0, 5000])
def test_a_size_out_of_range_is_refused(largest: int) -> None:
    with pytest.raises(ValueError, match="accepted 1 to 4096"):
        claim_templates("ns", largest)
    result = CliRunner().invoke(main, ["dra-templates", "-n", "ns", "--largest", str(largest)])
    assert result.exit_code == 2
    assert "--largest" in result.output


def requests_of(template: dict[str, Any]) -> dict[str, Any]:
    """The template's ``spec.devices`` (requests and constraints)."""
    devices: dict[str, Any] = template["spec"]["spec"]["devices"]
    return devices


def test_gpu_manager_and_hami_templates_name_gpus_memory_and_compute() -> None:
    templates = {t["metadata"]["name"]: t for t in share_templates("ns", 2, [50, 0, 50], gpus=2)}
    assert sorted(templates) == sorted([
        "gpushare-gpu-whole", "gpushare-2gpus-whole",
        "gpushare-gpu-1gi-0pct", "gpushare-gpu-1gi-50pct",
        "gpushare-gpu-2gi-0pct", "gpushare-gpu-2gi-50pct",
        "gpushare-2gpus-1gi-0pct", "gpushare-2gpus-1gi-50pct",
        "gpushare-2gpus-2gi-0pct", "gpushare-2gpus-2gi-50pct",
    ])  # fmt: skip
    assert requests_of(templates["gpushare-gpu-2gi-50pct"]) == {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpushare-gpu",
                    "capacity": {"requests": {"memory": "2Gi", "cores": "50"}},
                },
            }
        ]
    }
    # a whole GPU asks all compute and no memory: the slice's memory default is all of it
    assert requests_of(templates["gpushare-gpu-whole"]) == {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpushare-gpu",
                    "capacity": {"requests": {"cores": "100"}},
                },
            }
        ]
    }
    # K GPUs: K distinct devices, each so much
    assert requests_of(templates["gpushare-2gpus-1gi-50pct"]) == {
        "requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpushare-gpu", "count": 2,
            "capacity": {"requests": {"memory": "1Gi", "cores": "50"}}}}],
        "constraints": [{"requests": ["gpu"], "distinctAttribute": "gpu.gpushare.io/uuid"}],
    }  # fmt: skip
    assert share_template_name(1, 8, 30) == "gpushare-gpu-8gi-30pct"
    assert share_template_name(3, 8, 30) == "gpushare-3gpus-8gi-30pct"
    assert whole_template_name(4) == "gpushare-4gpus-whole"


REFUSED = [
    pytest.param({"largest_gib": 0, "cores": [0]}, "largest size 0 GiB: accepted 1 to 4096",
                 id="a size below one GiB"),
    pytest.param({"largest_gib": 8, "cores": [100]}, "compute share 100 %: accepted 0 to 99",
                 id="a share of 100 percent (a whole GPU, made anyway)"),
    pytest.param({"largest_gib": 8, "cores": [-1]}, "compute share -1 %", id="a negative share"),
    pytest.param({"largest_gib": 8, "cores": [0], "gpus": 17},
                 "GPUs per container 17: accepted 1 to 16", id="more GPUs than 16"),
    pytest.param({"largest_gib": 4096, "cores": list(range(10)), "gpus": 2},
                 "81920 share templates", id="too many templates"),
]  # fmt: skip


@pytest.mark.parametrize(("arguments", "message"), REFUSED)
def test_share_templates_out_of_range_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        share_templates("ns", **arguments)


CLI_REFUSED = [
    pytest.param(["--cores", "10,x"], "'10,x': accepted whole percents 0-99", id="not a number"),
    pytest.param(["--cores", "100"], "compute share 100 %", id="a whole GPU as a share"),
    pytest.param(["--gpus", "0"], "0 is not in the range 1<=x<=16", id="no GPU"),
]  # fmt: skip


@pytest.mark.parametrize(("arguments", "message"), CLI_REFUSED)
def test_the_command_names_a_bad_share_before_it_connects(
    arguments: list[str], message: str
) -> None:
    result = CliRunner().invoke(main, ["dra-templates", "-n", "ns", "--largest", "4", *arguments])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
