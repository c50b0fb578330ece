"""Per-node configuration, read (``gpushare.kube.codec.nodeconfig``): the ConfigMap
``gpushare-node-config``, its precedence, and every bad key reported with the node and the key.
YAML is read by the device plugin's loader (``gpushare.kube.nodeconfig.yaml_document``). Also
the inventory's ``serves`` field (written and read back compatibly) and the filter's
refusal of a kind of request a node does not serve (``gpushare.core.serves``)."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from gpushare.core.isolation import Enforcement
from gpushare.core.model import ContainerRequest, PodRequest
from gpushare.core.serves import Serves, serves_refusal
from gpushare.kube.codec import CodecError, InventoryGpu, MemoryUnit, inventory_annotation
from gpushare.kube.codec.nodeconfig import (
    NODE_CONFIG_KEY,
    GpuFacts,
    MemoryReserve,
    NodeConfig,
    configured_memory,
    node_config,
)
from gpushare.kube.codec.nodes import node_info
from gpushare.kube.nodeconfig import yaml_document

NODE = "gpu-1"
LABELS = {"pool": "training", "zone": "a"}
UUID0 = "GPU-0000aaaa-0000-4000-8000-000000000000"
UUID1 = "GPU-1111bbbb-0000-4000-8000-000000000001"
GPUS = [GpuFacts(0, UUID0, 16384), GpuFacts(1, UUID1, 16384)]
SUBJECT = f"node {NODE}: configmap gpushare/gpushare-node-config"


def configmap(text: str | None) -> dict[str, Any]:
    meta = {"name": "gpushare-node-config", "namespace": "gpushare"}
    return {"metadata": meta, "data": {} if text is None else {NODE_CONFIG_KEY: text}}


def read(text: str | None, labels: dict[str, str] = LABELS) -> NodeConfig:
    return node_config(configmap(text), NODE, labels, load=yaml_document)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, NodeConfig()),
        ("", NodeConfig()),
        ("nodes: []", NodeConfig()),
        (
            f"nodes: [{{name: {NODE}, memoryUnit: MiB, reservedMemory: 10%, "
            "excludeGpus: [1], serves: whole}]",
            NodeConfig(
                MemoryUnit.MIB, MemoryReserve(fraction=Fraction(1, 10)), frozenset({1}),
                frozenset(), Serves.WHOLE,
            ),
        ),
        (
            f"nodes: [{{name: {NODE}, reservedMemory: 0.25}}]",
            NodeConfig(reserved=MemoryReserve(fraction=Fraction(1, 4))),
        ),
        (
            f"nodes: [{{name: {NODE}, reservedMemory: 2GiB}}]",
            NodeConfig(reserved=MemoryReserve(mib=2048)),
        ),
        (
            f"nodes: [{{name: {NODE}, reservedMemory: 512MiB}}]",
            NodeConfig(reserved=MemoryReserve(mib=512)),
        ),
        (
            f'nodes: [{{name: {NODE}, excludeGpus: "0, {UUID1}"}}]',
            NodeConfig(excluded_indices=frozenset({0}), excluded_uuids=frozenset({UUID1})),
        ),
        (
            json.dumps({"nodes": [{"name": NODE, "serves": "shared"}]}),
            NodeConfig(serves=Serves.SHARED),
        ),
        ("nodes: [{selector: {pool: training}, serves: whole}]", NodeConfig(serves=Serves.WHOLE)),
        ("nodes: [{selector: {pool: inference}, serves: whole}]", NodeConfig()),
        ("nodes: [{name: gpu-2, serves: whole}]", NodeConfig()),
        (
            f"nodes: [{{selector: {{pool: training}}, serves: whole, memoryUnit: MiB}}, "
            f"{{name: {NODE}, serves: shared}}]",
            NodeConfig(memory_unit=MemoryUnit.MIB, serves=Serves.SHARED),
        ),
        (
            "defaults: {serves: shared, reservedMemory: 1GiB}\n"
            "nodes: [{selector: {zone: a}, serves: whole}]",
            NodeConfig(reserved=MemoryReserve(mib=1024), serves=Serves.WHOLE),
        ),
        (
            "nodes: [{name: gpu-2, serves: [not, checked]}, {selector: {pool: x}, serves: 7}]",
            NodeConfig(),
        ),
        (
            f"defaults: {{enforcement: library, requireEnforcement: true}}\n"
            f"nodes: [{{name: {NODE}, enforcement: driver}}]",
            NodeConfig(enforcement=Enforcement.DRIVER, require_enforcement=True),
        ),
        (
            f"defaults: {{requireEnforcement: true}}\n"
            f"nodes: [{{name: {NODE}, requireEnforcement: false}}]",
            NodeConfig(require_enforcement=False),
        ),
    ],
    ids=[
        "no config.yaml key: nothing configured",
        "an empty document: nothing configured",
        "no entries: nothing configured",
        "an entry by name sets every key",
        "a bare number below 1 is a fraction held back",
        "an amount in GiB",
        "an amount in MiB",
        "GPUs excluded by index and UUID in one string",
        "JSON is YAML too",
        "a selector that matches the node's labels applies",
        "a selector that does not match does not",
        "an entry naming another node does not",
        "the name beats the selector key by key, the selector fills the rest",
        "a selector beats the defaults, the defaults fill the rest",
        "the values of entries for other nodes are theirs to get wrong",
        "the backend by name beats the defaults, which require enforcement",
        "a node may opt out of the defaults' required enforcement",
    ],
)  # fmt: skip
def test_the_node_gets_its_entries_in_precedence_order(
    text: str | None, expected: NodeConfig
) -> None:
    assert read(text) == expected


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("nodes: [", "data.config.yaml", "not YAML at line 1"),
        ("- a list", "data.config.yaml", "not a mapping"),
        ("node: []", "data.config.yaml.node", "unknown key"),
        ("nodes: {name: x}", "nodes", "not a list"),
        ("nodes: [gpu-1]", "nodes[0]", "not a mapping"),
        ("nodes: [{serves: both}]", "nodes[0]", "needs exactly one of name and selector"),
        ("nodes: [{name: a, selector: {x: y}}]", "nodes[0]", "needs exactly one of name"),
        ("nodes: [{name: 7}]", "nodes[0].name", "not a node name"),
        ("nodes: [{selector: pool=training}]", "nodes[0].selector", "not a map of label"),
        (f"nodes: [{{name: {NODE}, memoryunit: MiB}}]", "nodes[0].memoryunit", "unknown key"),
        (f"nodes: [{{name: {NODE}, memoryUnit: KiB}}]", "nodes[0].memoryUnit", "unknown unit"),
        (f"nodes: [{{name: {NODE}, serves: all}}]", "nodes[0].serves", "unknown kind"),
        (f"nodes: [{{name: {NODE}, reservedMemory: 120%}}]", "nodes[0].reservedMemory",
         "100 % or more would leave nothing"),
        (f"nodes: [{{name: {NODE}, reservedMemory: 2048}}]", "nodes[0].reservedMemory",
         "a bare number is a fraction of the GPU and must be 0 to under 1"),
        (f"nodes: [{{name: {NODE}, reservedMemory: 2TB}}]", "nodes[0].reservedMemory",
         "not a percentage or an amount in MiB/GiB"),
        (f"nodes: [{{name: {NODE}, reservedMemory: true}}]", "nodes[0].reservedMemory",
         "not an amount"),
        (f"nodes: [{{name: {NODE}, excludeGpus: [gpu0]}}]", "nodes[0].excludeGpus",
         "'gpu0' is neither a GPU index nor a GPU UUID"),
        (f"nodes: [{{name: {NODE}, excludeGpus: {{a: 1}}}}]", "nodes[0].excludeGpus",
         "not a list of GPUs"),
        ("defaults: {serves: sometimes}", "defaults.serves", "unknown kind"),
        ("defaults: {enforcement: cgpu}", "defaults.enforcement", "unknown backend"),
        (f"nodes: [{{name: {NODE}, requireEnforcement: yes please}}]",
         "nodes[0].requireEnforcement", "not a boolean"),
        ("defaults: {name: x}", "defaults.name", "unknown key"),
        (f"nodes: [{{name: {NODE}}}, {{name: {NODE}}}]", "nodes[].name",
         "2 entries apply to the node by name; one at most may"),
        ("nodes: [{selector: {pool: training}}, {selector: {zone: a}}]", "nodes[].selector",
         "2 entries apply to the node by selector; one at most may"),
    ],
    ids=[
        "not YAML",
        "a document that is not a mapping",
        "a misspelt top-level key",
        "nodes that is not a list",
        "an entry that is not a mapping",
        "an entry with neither name nor selector",
        "an entry with both name and selector",
        "a name that is not a string",
        "a selector written as a string",
        "a misspelt key in an entry",
        "a unit gpushare does not advertise",
        "a kind of request that does not exist",
        "holding back all the memory and more",
        "a bare number of MiB (ambiguous)",
        "an amount in an unknown unit",
        "a boolean amount",
        "a GPU named neither by index nor by UUID",
        "GPUs written as a mapping",
        "a bad value in the defaults",
        "a backend gpushare does not have",
        "requireEnforcement that is not a boolean",
        "an entry key in the defaults",
        "two entries naming the node",
        "two selectors matching the node (refused, not guessed)",
    ],
)  # fmt: skip
def test_a_bad_entry_is_reported_with_the_node_and_the_key(
    text: str, key: str, problem: str
) -> None:
    with pytest.raises(CodecError) as error:
        read(text)
    message = str(error.value)
    assert message.startswith(f"{SUBJECT}: {key}=")
    assert f": {problem}" in message
    assert "; accepted: " in message


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (NodeConfig(), {0: 16384, 1: 16384}),
        (NodeConfig(reserved=MemoryReserve(fraction=Fraction(1, 10))), {0: 14745, 1: 14745}),
        (NodeConfig(reserved=MemoryReserve(mib=1024)), {0: 15360, 1: 15360}),
        (NodeConfig(excluded_indices=frozenset({0})), {1: 16384}),
        (NodeConfig(excluded_uuids=frozenset({UUID1})), {0: 16384}),
        (NodeConfig(excluded_indices=frozenset({0, 1})), {}),
    ],
    ids=[
        "nothing configured: every GPU whole",
        "a tenth held back, rounded up (1638.4 -> 1639 MiB)",
        "an amount held back",
        "a GPU excluded by index",
        "a GPU excluded by UUID",
        "every GPU excluded: the node shares none",
    ],
)
def test_configured_memory_per_gpu(config: NodeConfig, expected: dict[int, int]) -> None:
    assert configured_memory(config, NODE, GPUS, MemoryUnit.GIB) == expected


@pytest.mark.parametrize(
    ("config", "key", "problem"),
    [
        (NodeConfig(excluded_indices=frozenset({4}), sources=("nodes[0] (name gpu-1)",)),
         "excludeGpus", "the node has no such GPU; it has 0 (GPU-0000"),
        (NodeConfig(excluded_uuids=frozenset({"GPU-dead"}), sources=("defaults",)),
         "excludeGpus", "the node has no such GPU"),
        (NodeConfig(reserved=MemoryReserve(mib=16000), sources=("defaults",)),
         "reservedMemory", "leaves 384 MiB of GPU 0's 16384 MiB, less than one GiB"),
    ],
    ids=["an index the node lacks", "a UUID the node lacks", "a reservation leaving < 1 unit"],
)  # fmt: skip
def test_a_config_the_node_cannot_take_names_the_node_and_the_key(
    config: NodeConfig, key: str, problem: str
) -> None:
    with pytest.raises(CodecError) as error:
        configured_memory(config, NODE, GPUS, MemoryUnit.GIB)
    message = str(error.value)
    assert message.startswith(f"node {NODE}: node config ({', '.join(config.sources)}): {key}=")
    assert problem in message


# -- the inventory's serves -----------------------------------------------------------------


def node_with(annotation: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": NODE,
            "labels": {"gpushare": "true"},
            "annotations": {"gpushare.io/gpu-inventory": annotation},
        }
    }


GPU = InventoryGpu(0, UUID0, "T4", 16)


@pytest.mark.parametrize("serves", list(Serves), ids=[s.value for s in Serves])
def test_serves_round_trips_through_the_inventory(serves: Serves) -> None:
    annotation = inventory_annotation(MemoryUnit.GIB, [GPU], serves)
    assert ('"serves"' in annotation) == (serves is not Serves.BOTH)
    assert node_info(node_with(annotation)).serves is serves


def test_an_inventory_without_serves_serves_both() -> None:
    old = '{"unit":"GiB","gpus":[{"index":0,"memory":16}]}'  # written before serves existed
    assert node_info(node_with(old)).serves is Serves.BOTH


def test_an_unknown_serves_is_refused_with_the_node_and_key() -> None:
    bad = '{"unit":"GiB","gpus":[],"serves":"half"}'
    with pytest.raises(CodecError, match=f"node {NODE}: annotation gpushare.io/gpu-inventory="):
        node_info(node_with(bad))


# -- the refusal -----------------------------------------------------------------------------

SHARED = ContainerRequest("shared", gpu_share=4)
WHOLE = ContainerRequest("whole", gpu_share=0, exclusive=True)


@pytest.mark.parametrize(
    ("serves", "containers", "refusal"),
    [
        (Serves.BOTH, (SHARED, WHOLE), ""),
        (Serves.SHARED, (SHARED,), ""),
        (Serves.WHOLE, (WHOLE,), ""),
        (Serves.SHARED, (SHARED, WHOLE), "the node serves shared GPUs only (node config "
         "serves=shared); container(s) whole ask whole GPUs"),
        (Serves.WHOLE, (SHARED,), "the node serves whole GPUs only (node config "
         "serves=whole); container(s) shared ask a share of a GPU"),
    ],
    ids=[
        "a node serving both takes both",
        "a shared node takes a shared pod",
        "a whole node takes a whole-GPU pod",
        "a shared node refuses a pod with a whole-GPU container",
        "a whole node refuses a shared pod",
    ],
)  # fmt: skip
def test_a_node_refuses_the_kind_it_does_not_serve(
    serves: Serves, containers: tuple[ContainerRequest, ...], refusal: str
) -> None:
    assert serves_refusal(serves, PodRequest("ns/p", containers)) == refusal
