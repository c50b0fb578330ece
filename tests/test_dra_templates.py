"""The ResourceClaimTemplates pods rewritten from ``aliyun.com/gpu-mem`` claim from
(``gpushare.dra.templates``). The whole translation on the real control plane:
tests/cluster/test_dra_translation.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpushare.cli.main import main
from gpushare.dra.templates import claim_templates, template_name
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
