"""Why a pod went where it went (gpushare.core.explain): the bind's text, the policy and the
best nodes' scores as sent, in one line of at most 1 KiB."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.explain import (
    MAX_NODES_SHOWN,
    MESSAGE_MAX_BYTES,
    Placement,
    bounded,
    placement_message,
)

BOUND = "gpushare: pod ns/p bound to node n3: container main on GPU 0 (8 GiB each)"
SEVEN = Placement.of("binpack", {"n1": 7, "n3": 10, "n2": 7, "n4": 3, "n5": 0, "n6": 0, "n7": 0})
LONG = "node-" + "x" * 248  # a 253-character DNS name


@pytest.mark.parametrize(
    ("placement", "node", "shown", "expected"),
    [
        pytest.param(SEVEN, "n3", 5,
                     f"{BOUND}; policy binpack; scores 0-10 of the 7 node(s) it fits: n3 10, "
                     "n1 7, n2 7, n4 3, n5 0 and 2 more",
                     id="best-five-by-score-then-name-and-the-rest-counted"),
        pytest.param(SEVEN, "n7", 2,
                     f"{BOUND}; policy binpack; scores 0-10 of the 7 node(s) it fits: n3 10, "
                     "n1 7 and 5 more; chosen n7 0 (kube-scheduler's own scores outweighed)",
                     id="chosen-node-below-the-best-is-named-with-its-score"),
        pytest.param(Placement.of("spread", {"n3": 10}, 1), "n3", 5,
                     f"{BOUND}; policy spread; scores 0-10 of the 1 node(s) it fits: n3 10",
                     id="one-scored-node-nothing-counted"),
        pytest.param(Placement("fgd-spare", (), 1), "n3", 5,
                     f"{BOUND}; policy fgd-spare; the only node that passed the filter "
                     "(not scored)",
                     id="lone-node-kube-scheduler-did-not-score"),
        pytest.param(Placement("fgd-spare", (), 0), "n3", 5,
                     f"{BOUND}; policy fgd-spare; not scored",
                     id="nothing-known-says-not-scored"),
        pytest.param(None, "n3", 5, BOUND, id="no-placement-kept-the-bind-text-alone"),
    ],
)  # fmt: skip
def test_placement_message(
    placement: Placement | None, node: str, shown: int, expected: str
) -> None:
    assert placement_message(BOUND, placement, node, shown=shown) == expected


@pytest.mark.parametrize(
    ("placement", "bound", "max_bytes", "keeps"),
    [
        pytest.param(Placement.of("binpack", {f"{LONG}-{i}": 10 - i for i in range(10)}),
                     BOUND, MESSAGE_MAX_BYTES, ("and ", "more", "policy binpack"),
                     id="long-node-names-are-shortened-and-fewer-named-within-1-KiB"),
        pytest.param(Placement.of("binpack", {f"n{i}": i % 11 for i in range(5000)}),
                     BOUND, MESSAGE_MAX_BYTES, ("of the 5000 node(s)", "and 4995 more"),
                     id="five-thousand-nodes-five-named-the-rest-counted"),
        pytest.param(SEVEN, BOUND + "; container x on GPU 1 (8 GiB each)" * 40,
                     MESSAGE_MAX_BYTES, ("...",),
                     id="a-bind-text-too-long-alone-is-cut-with-an-ellipsis"),
        pytest.param(SEVEN, BOUND, 120, (BOUND,),
                     id="a-small-bound-names-fewer-nodes-before-cutting"),
    ],
)  # fmt: skip
def test_placement_message_is_bounded(
    placement: Placement, bound: str, max_bytes: int, keeps: tuple[str, ...]
) -> None:
    text = placement_message(bound, placement, placement.scores[0][0], max_bytes=max_bytes)
    assert len(text.encode()) <= max_bytes
    for words in keeps:
        assert words in text


@given(
    scores=st.dictionaries(st.text(min_size=1, max_size=253), st.integers(0, 10), max_size=50),
    bound=st.text(max_size=2000),
    node=st.text(max_size=253),
)
def test_any_placement_fits_an_event_message(scores: dict[str, int], bound: str, node: str) -> None:
    text = placement_message(bound, Placement.of("binpack", scores), node)
    assert len(text.encode()) <= MESSAGE_MAX_BYTES
    assert text.startswith(bound[:100])


def test_no_more_nodes_are_named_than_shown() -> None:
    many = Placement.of("binpack", {f"n{i}": 10 for i in range(50)})
    listed = placement_message(BOUND, many, "n0").split("it fits: ", 1)[1]
    assert listed == "n0 10, n1 10, n10 10, n11 10, n12 10 and 45 more"
    assert listed.count(",") == MAX_NODES_SHOWN - 1
    assert bounded("é" * 600, 8) == "éé..."  # a cut never splits a character
