"""``/keys/query``'s formatting of stored keys (roomstream.e2e.key_format): the splice of
stored JSON text must give exactly what decoding, adding ``unsigned`` and merging the
uploaded signatures gives, for any stored object and display name."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from roomstream.e2e.key_format import device_keys_json, format_user_keys

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
names = st.none() | st.text()
signatures = st.none() | st.dictionaries(
    st.text(min_size=1), st.dictionaries(st.text(min_size=1), st.text(), max_size=2), max_size=2
)


def expected(stored: dict[str, Any], name: str | None, extra: Any) -> dict[str, Any]:
    """What the answer must hold, computed the plain way."""
    keys = dict(stored)
    if extra:
        own = keys.get("signatures")
        merged = {
            u: dict(s)
            for u, s in (own.items() if isinstance(own, dict) else ())
            if isinstance(s, dict)
        }
        for user, by_key in extra.items():
            merged.setdefault(user, {}).update(by_key)
        keys["signatures"] = merged
    unsigned = dict(keys["unsigned"]) if isinstance(keys.get("unsigned"), dict) else {}
    if name is not None:
        unsigned["device_display_name"] = name
    keys["unsigned"] = unsigned
    return keys


@given(
    st.dictionaries(st.text(), json_values, max_size=5)
    | st.fixed_dictionaries({"unsigned": json_values}, optional={"user_id": st.text()}),
    names,
    signatures,
)
def test_formatted_device_keys_equal_the_decoded_way(
    stored: dict[str, Any], name: str | None, extra: Any
) -> None:
    text = device_keys_json(orjson.dumps(stored).decode(), name, extra)
    assert orjson.loads(text) == expected(stored, name, extra)


def test_a_user_s_formatted_keys_hold_every_device_and_merge_signatures() -> None:
    device = {"user_id": "@a:x", "device_id": 'D"1', "keys": {'ed25519:D"1': "k"}}
    master = {"user_id": "@a:x", "usage": ["master"], "keys": {"ed25519:pub": "pub"}}
    formatted = format_user_keys(
        {'D"1': (orjson.dumps(device).decode(), 'Ph\u00f6ne "1"'), "D2": ('{"a":1}', None)},
        {"master": ("pub", orjson.dumps(master).decode())},
        {"pub": {"@b:x": {"ed25519:B": "sig"}}},
    )
    everything = orjson.loads(orjson.dumps(formatted.all_devices))
    assert everything == {
        'D"1': {**device, "unsigned": {"device_display_name": 'Ph\u00f6ne "1"'}},
        "D2": {"a": 1, "unsigned": {}},
    }
    assert orjson.loads(orjson.dumps(formatted.select(["D2", "gone"]))) == {
        "D2": {"a": 1, "unsigned": {}}
    }
    assert orjson.loads(orjson.dumps(formatted.cross["master"])) == {
        **master,
        "signatures": {"@b:x": {"ed25519:B": "sig"}},
    }
