"""Canonical JSON encoding and the strict decoder for untrusted input."""

from __future__ import annotations

import json
from typing import Any

import canonicaljson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.errors import BadEventError, Codes
from roomstream.events.canonical import (
    MAX_NESTING_DEPTH,
    MAX_SAFE_INTEGER,
    MIN_SAFE_INTEGER,
    _decode_slow,
    decode_json_object,
    encode_canonical_json,
    encode_canonical_json_fast,
)

# Examples from the spec's appendix "Canonical JSON" (input value -> canonical bytes).
SPEC_EXAMPLES: list[tuple[Any, bytes]] = [
    ({}, b"{}"),
    ({"one": 1, "two": "Two"}, b'{"one":1,"two":"Two"}'),
    ({"b": "2", "a": "1"}, b'{"a":"1","b":"2"}'),
    (
        {
            "auth": {
                "success": True,
                "mxid": "@john.doe:example.com",
                "profile": {
                    "display_name": "John Doe",
                    "three_pids": [
                        {"medium": "email", "address": "john.doe@example.org"},
                        {"medium": "msisdn", "address": "123456789"},
                    ],
                },
            }
        },
        b'{"auth":{"mxid":"@john.doe:example.com","profile":{"display_name":"John Doe",'
        b'"three_pids":[{"address":"john.doe@example.org","medium":"email"},'
        b'{"address":"123456789","medium":"msisdn"}]},"success":true}}',
    ),
    ({"a": "日本語"}, '{"a":"日本語"}'.encode()),
    ({"本": 2, "日": 1}, '{"日":1,"本":2}'.encode()),
    ({"a": "\u65e5"}, '{"a":"日"}'.encode()),
    ({"a": None}, b'{"a":null}'),
    # The spec's last example has input {"a": -0, "b": 1e10}; as Python values that is:
    ({"a": -0, "b": 10000000000}, b'{"a":0,"b":10000000000}'),
]


@pytest.mark.parametrize(("value", "expected"), SPEC_EXAMPLES)
def test_spec_examples_encode(value: Any, expected: bytes) -> None:
    assert encode_canonical_json(value) == expected
    assert encode_canonical_json_fast(value) == expected


def test_spec_example_texts_decode_to_same_canonical_form() -> None:
    text = b'{\n    "b": "2",\n    "a": "1"\n}'
    assert encode_canonical_json(decode_json_object(text)) == b'{"a":"1","b":"2"}'
    text = b'{\n    "a": "\\u65E5"\n}'
    assert encode_canonical_json(decode_json_object(text)) == '{"a":"日"}'.encode()


def test_keys_sort_by_code_point_not_utf16() -> None:
    # U+FF5E < U+1F600 by code point, but UTF-16 would put the surrogate pair first.
    value = {"\U0001f600": 1, "\uff5e": 2, "é": 3, "Z": 4, "a": 5}
    expected = canonicaljson.encode_canonical_json(value)
    assert encode_canonical_json_fast(value) == expected
    assert expected.index("\uff5e".encode()) < expected.index("\U0001f600".encode())


@pytest.mark.parametrize(
    "value",
    [{"a": 1.0}, {"a": 2**53}, {"a": -(2**53)}, {1: "x"}, {"a": float("nan")}, {"a": b"x"}],
)
def test_encoders_reject_non_canonical_values(value: Any) -> None:
    for encode in (encode_canonical_json, encode_canonical_json_fast):
        with pytest.raises(BadEventError) as e:
            encode(value)
        assert e.value.errcode == Codes.BAD_JSON


def test_encoder_rejects_lone_surrogate() -> None:
    for encode in (encode_canonical_json, encode_canonical_json_fast):
        with pytest.raises(BadEventError):
            encode({"a": "\ud800"})


def test_tuples_encode_as_arrays() -> None:
    assert encode_canonical_json({"a": (1, 2)}) == b'{"a":[1,2]}'


# --- decoding ---------------------------------------------------------------------------

ACCEPTED: list[tuple[bytes, dict[str, Any]]] = [
    (b"{}", {}),
    (b' \t\r\n{ "a" : [ 1 , { } ] } \n', {"a": [1, {}]}),
    (b'{"a":"\\u00e9\\/\\"\\\\\\n\\ud83d\\ude00"}', {"a": 'é/"\\\n\U0001f600'}),
    ('{"clé":"naïve ☃ 日本"}'.encode(), {"clé": "naïve ☃ 日本"}),
    (b'{"a":-0}', {"a": 0}),
    (b'{"max":9007199254740991,"min":-9007199254740991}', {"max": 2**53 - 1, "min": -(2**53) + 1}),
    (b'{"a":{"b":{"c":[true,false,null]}}}', {"a": {"b": {"c": [True, False, None]}}}),
    (b'{"a":"\\u0000"}', {"a": "\x00"}),
]


@pytest.mark.parametrize(("raw", "expected"), ACCEPTED)
def test_decode_accepts_unusual_but_valid_json(raw: bytes, expected: dict[str, Any]) -> None:
    assert decode_json_object(raw) == expected
    assert _decode_slow(raw) == expected


REJECTED: list[tuple[bytes, str]] = [
    (b"", Codes.NOT_JSON),
    (b"{", Codes.NOT_JSON),
    (b'{"a":}', Codes.NOT_JSON),
    (b"{'a':1}", Codes.NOT_JSON),
    (b'{"a":1}x', Codes.NOT_JSON),
    (b'{"a":1,}', Codes.NOT_JSON),
    (b'{"a":01}', Codes.NOT_JSON),
    (b'{"a":"\x01"}', Codes.NOT_JSON),  # raw control character in a string
    (b'{"a":"\xff"}', Codes.NOT_JSON),  # invalid UTF-8
    (b'{"a":"\xed\xa0\x80"}', Codes.NOT_JSON),  # UTF-8-encoded surrogate
    (b"\xef\xbb\xbf{}", Codes.NOT_JSON),  # byte order mark
    ('{"a":1}'.encode("utf-16"), Codes.NOT_JSON),
    (b"[]", Codes.BAD_JSON),
    (b'"str"', Codes.BAD_JSON),
    (b"1", Codes.BAD_JSON),
    (b"null", Codes.BAD_JSON),
    (b'{"a":1.0}', Codes.BAD_JSON),
    (b'{"a":1e5}', Codes.BAD_JSON),
    (b'{"a":1E+2}', Codes.BAD_JSON),
    (b'{"a":-0.5}', Codes.BAD_JSON),
    (b'{"a":NaN}', Codes.BAD_JSON),
    (b'{"a":Infinity}', Codes.BAD_JSON),
    (b'{"a":-Infinity}', Codes.BAD_JSON),
    (b'{"a":9007199254740992}', Codes.BAD_JSON),
    (b'{"a":-9007199254740992}', Codes.BAD_JSON),
    (b'{"a":18446744073709551616}', Codes.BAD_JSON),
    (b'{"a":' + b"9" * 5000 + b"}", Codes.BAD_JSON),
    (b'{"a":1,"a":1}', Codes.BAD_JSON),
    (b'{"a":1, "a":2}', Codes.BAD_JSON),
    (b'{"x":{"a":1,"b":2,"a":3}}', Codes.BAD_JSON),
    (b'{"x":[{"k":1,"k":1}]}', Codes.BAD_JSON),
    (b'{"\\u0061":1,"a":2}', Codes.BAD_JSON),  # duplicate only after unescaping
    (b'{"a":"\\ud800"}', Codes.BAD_JSON),  # lone surrogate escape
    (b'{"a":"\\udc00\\ud800"}', Codes.BAD_JSON),
    (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", Codes.BAD_JSON),
]


@pytest.mark.parametrize(("raw", "errcode"), REJECTED)
def test_decode_rejects_with_right_code(raw: bytes, errcode: str) -> None:
    for decode in (decode_json_object, _decode_slow):
        with pytest.raises(BadEventError) as e:
            decode(raw)
        assert e.value.errcode == errcode, e.value.message


def _nested(depth: int) -> bytes:
    # depth containers in total: the top-level object plus depth-1 arrays.
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_nesting_limit() -> None:
    assert decode_json_object(_nested(MAX_NESTING_DEPTH))
    with pytest.raises(BadEventError) as e:
        decode_json_object(_nested(MAX_NESTING_DEPTH + 1))
    assert e.value.errcode == Codes.BAD_JSON


def test_decode_requires_bytes() -> None:
    with pytest.raises(TypeError):
        decode_json_object("{}")  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=MIN_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


@settings(max_examples=300)
@given(json_objects)
def test_round_trip_and_encoders_agree(value: dict[str, Any]) -> None:
    try:
        expected = canonicaljson.encode_canonical_json(value)
    except UnicodeEncodeError:
        # Lone surrogates: canonicaljson cannot produce UTF-8; ours must refuse too.
        with pytest.raises(BadEventError):
            encode_canonical_json(value)
        with pytest.raises(BadEventError):
            encode_canonical_json_fast(value)
        return
    assert encode_canonical_json(value) == expected
    assert encode_canonical_json_fast(value) == expected
    assert decode_json_object(expected) == value
    assert encode_canonical_json(decode_json_object(expected)) == expected


@settings(max_examples=200)
@given(json_objects, st.sampled_from([None, 0, 2]), st.booleans())
def test_formatting_does_not_change_value(
    value: dict[str, Any], indent: int | None, ascii_only: bool
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass"
    )
    try:
        canonical = canonicaljson.encode_canonical_json(value)
    except UnicodeEncodeError:
        with pytest.raises(BadEventError):
            decode_json_object(text)
        return
    assert encode_canonical_json(decode_json_object(text)) == canonical


numbers = st.integers() | st.floats(allow_nan=True, allow_infinity=True)


class _Raw(str):
    """JSON text that is spliced in verbatim (so objects may repeat keys)."""


def _enc(v: Any) -> str:
    return v if isinstance(v, _Raw) else json.dumps(v)


loose_values: st.SearchStrategy[Any] = st.deferred(
    lambda: (
        st.none()
        | st.booleans()
        | numbers
        | st.text(max_size=5)
        | st.lists(loose_values, max_size=3)
        | st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), loose_values), max_size=3).map(
            lambda pairs: _Raw("{" + ",".join(f"{json.dumps(k)}:{_enc(v)}" for k, v in pairs) + "}")
        )
    )
)


def _outcome(decode: Any, raw: bytes) -> Any:
    try:
        return ("ok", decode(raw))
    except BadEventError as e:
        return ("error", e.errcode)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "é"]), loose_values), max_size=5))
def test_fast_path_agrees_with_careful_parser(pairs: list[tuple[str, Any]]) -> None:
    # Built by hand so that duplicate keys, floats and huge integers all occur.
    raw = ("{" + ",".join(f"{json.dumps(k)}:{_enc(v)}" for k, v in pairs) + "}").encode()
    assert _outcome(decode_json_object, raw) == _outcome(_decode_slow, raw)
