"""``exactjson.nested_deeper_than`` against the recursive definition of depth."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from roomstream.exactjson import nested_deeper_than

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=30,
)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@given(json_values, st.integers(0, 12))
def test_nested_deeper_than_is_depth_over_limit(value: Any, limit: int) -> None:
    assert nested_deeper_than(value, limit) == (depth(value) > limit)


def test_deeper_than_the_recursion_limit() -> None:
    value: Any = {}
    for _ in range(100_000):
        value = [value]
    assert nested_deeper_than(value, 99_999) and not nested_deeper_than(value, 100_001)
