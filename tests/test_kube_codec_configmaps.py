"""Alibaba's ``kube-system/unhealthy-gpu-<node>`` ConfigMap, read
(``gpushare.kube.codec.configmaps``): the GPUs an operator marked unhealthy by hand."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.kube.codec import CodecError
from gpushare.kube.codec.configmaps import marked_unhealthy, unhealthy_configmap_name

NODE_GPUS = frozenset({0, 1, 2, 3})


def configmap(data: dict[str, Any] | None) -> dict[str, Any]:
    meta = {"name": unhealthy_configmap_name("gpu-1"), "namespace": "kube-system"}
    return {"metadata": meta, **({"data": data} if data is not None else {})}


@pytest.mark.parametrize(
    ("data", "marked"),
    [
        ({"gpus": "0,2"}, {0, 2}),
        ({"gpus": " 1 , 3 "}, {1, 3}),
        ({"gpus": "2"}, {2}),
        ({"gpus": ""}, set()),
        ({}, set()),
        (None, set()),
    ],
    ids=[
        "Alibaba's format: indices separated by commas",
        "spaces around the indices are allowed",
        "one GPU",
        "an empty value marks none",
        "no gpus key marks none (Alibaba: skip)",
        "no data at all marks none",
    ],
)
def test_marked_gpus(data: dict[str, Any] | None, marked: set[int]) -> None:
    assert marked_unhealthy(configmap(data), NODE_GPUS) == marked


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("zero", "not GPU indices"),
        ("0;1", "not GPU indices"),
        ("-1", "not GPU indices"),
        ("1,,2", "not GPU indices"),
        ("0,7", "names GPU 7; the node has GPUs 0, 1, 2, 3"),
    ],
    ids=[
        "a word (Alibaba would mark GPU 0)",
        "another separator",
        "a negative index",
        "an empty part",
        "a GPU the node does not have",
    ],
)
def test_a_value_that_cannot_be_read_names_the_configmap_key_and_value(
    value: str, problem: str
) -> None:
    with pytest.raises(CodecError) as error:
        marked_unhealthy(configmap({"gpus": value}), NODE_GPUS)
    assert str(error.value).startswith(
        f"configmap kube-system/unhealthy-gpu-gpu-1: data.gpus={value!r}: {problem}; accepted: "
    )
