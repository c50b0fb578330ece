"""Hypothesis strategies shared by the property tests: any JSON value, as the API server or a
client could send it."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["json_values"]


def json_values(*, text_size: int, items: int, max_leaves: int) -> st.SearchStrategy[Any]:
    """Any JSON value (no NaN): ``null``, booleans, integers, floats and strings of at most
    ``text_size`` characters, nested in lists and objects of at most ``items`` entries, with
    at most ``max_leaves`` scalars in all."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    return st.recursive(
        scalars | st.text(max_size=text_size),
        lambda children: (
            st.lists(children, max_size=items)
            | st.dictionaries(st.text(max_size=text_size), children, max_size=items)
        ),
        max_leaves=max_leaves,
    )
