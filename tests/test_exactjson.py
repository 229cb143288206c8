"""roomstream.exactjson: the standard library's results (exact integers), orjson's speed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomstream import exactjson

scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: far beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=16,
)


def same(a: Any, b: Any) -> bool:
    """Equal with identical types all the way down (1 == 1.0 is not good enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(values, st.booleans(), st.booleans())
def test_decodes_like_the_standard_library(value: Any, ascii_only: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert same(exactjson.loads(text.encode() if as_bytes else text), json.loads(text))


def test_big_integers_stay_integers() -> None:
    assert exactjson.loads("[18446744073709551616]") == [2**64]
    assert type(exactjson.loads(b'{"a":-9223372036854775809}')["a"]) is int
    assert exactjson.loads("1234567890123456789") == 1234567890123456789
    assert exactjson.has_long_digit_run("x1234567890123456789y")
    assert not exactjson.has_long_digit_run("123456789012345678 9")


@pytest.mark.parametrize("text", ["[NaN]", "[Infinity]", "[1, ", "[12345678901234567890"])
def test_invalid_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        exactjson.loads(text)
