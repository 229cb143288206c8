"""Content hashes, reference hashes and event IDs, checked against known answers."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.canonical import decode_json_object
from roomstream.events.hashing import (
    add_content_hash,
    check_content_hash,
    compute_content_hash,
    compute_event_id,
    compute_reference_hash,
    decode_base64,
    encode_base64,
    encode_base64_urlsafe,
    room_id_from_create_event_id,
)
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12
from tests.events.vectors import (
    REAL_CREATE_EVENT,
    REAL_CREATE_EVENT_ID,
    SPEC_MINIMAL_EVENT,
    SPEC_MINIMAL_HASH,
    SPEC_REDACTABLE_EVENT,
    SPEC_REDACTABLE_HASH,
)

EVENT_ID_RE = re.compile(r"\$[A-Za-z0-9_\-]{43}")


@pytest.mark.parametrize(
    ("event", "expected"),
    [(SPEC_MINIMAL_EVENT, SPEC_MINIMAL_HASH), (SPEC_REDACTABLE_EVENT, SPEC_REDACTABLE_HASH)],
)
def test_spec_content_hashes(event: dict[str, Any], expected: str) -> None:
    assert encode_base64(compute_content_hash(event)) == expected
    hashed = add_content_hash(dict(event))
    assert hashed["hashes"] == {"sha256": expected}
    assert check_content_hash(hashed)


def test_real_event_id_and_content_hash() -> None:
    event = decode_json_object(REAL_CREATE_EVENT)
    assert check_content_hash(event)
    assert compute_event_id(event, ROOM_V10) == REAL_CREATE_EVENT_ID
    # v11 keeps the whole create content and drops origin/prev_state: a different ID.
    assert compute_event_id(event, ROOM_V11) != REAL_CREATE_EVENT_ID


def test_event_id_shape() -> None:
    for version in (ROOM_V10, ROOM_V11, ROOM_V12):
        event_id = compute_event_id(SPEC_MINIMAL_EVENT, version)
        assert EVENT_ID_RE.fullmatch(event_id)
        assert "=" not in event_id and "+" not in event_id and "/" not in event_id


def test_reference_hash_ignores_signatures_unsigned_and_redactable_content() -> None:
    event = add_content_hash(dict(SPEC_REDACTABLE_EVENT))
    base = compute_reference_hash(event, ROOM_V11)
    changed = dict(event, signatures={"x": {"ed25519:1": "abc"}}, unsigned={"age": 5})
    changed["age_ts"] = 12345  # not kept by redaction, so not hashed
    assert compute_reference_hash(changed, ROOM_V11) == base
    # Changing content alone keeps the reference hash but breaks the content hash...
    tampered = dict(event, content={"body": "something else"})
    assert compute_reference_hash(tampered, ROOM_V11) == base
    assert not check_content_hash(tampered)
    # ...and re-hashing it changes the reference hash through ``hashes``.
    assert compute_reference_hash(add_content_hash(tampered), ROOM_V11) != base
    # Kept keys change it directly.
    assert compute_reference_hash(dict(event, depth=4), ROOM_V11) != base


def test_add_content_hash_keeps_other_algorithms() -> None:
    event = dict(SPEC_MINIMAL_EVENT, hashes={"sha512": "zzz", "sha256": "old"})
    add_content_hash(event)
    assert event["hashes"] == {"sha512": "zzz", "sha256": SPEC_MINIMAL_HASH}


@pytest.mark.parametrize(
    "hashes", [None, "x", {}, {"sha256": 5}, {"sha256": "!!!"}, {"sha256": "a"}, {"sha256": "é"}]
)
def test_check_content_hash_false_for_missing_or_malformed(hashes: Any) -> None:
    assert not check_content_hash(dict(SPEC_MINIMAL_EVENT, hashes=hashes))


def test_base64_helpers() -> None:
    assert encode_base64(b"foob") == "Zm9vYg"
    assert encode_base64(b"\xfb\xff") == "+/8"
    assert encode_base64_urlsafe(b"\xfb\xff") == "-_8"
    for text in ("+/8", "-_8", "+/8="):
        assert decode_base64(text) == b"\xfb\xff"
    with pytest.raises(ValueError):
        decode_base64("Zm9vY")


def test_room_id_from_create_event_id() -> None:
    assert room_id_from_create_event_id("$abc") == "!abc"
    with pytest.raises(ValueError):
        room_id_from_create_event_id("!abc")


event_strategy = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["m.room.message", "m.room.member", "m.room.create", "x.custom"]),
        "sender": st.just("@alice:example.org"),
        "room_id": st.just("!room:example.org"),
        "content": st.dictionaries(
            st.text(max_size=6),
            st.text(max_size=10) | st.integers(-(2**53) + 1, 2**53 - 1) | st.none(),
            max_size=5,
        ),
        "depth": st.integers(0, 2**53 - 1),
        "origin_server_ts": st.integers(0, 2**53 - 1),
        "prev_events": st.lists(st.just("$" + "A" * 43), max_size=2),
        "auth_events": st.lists(st.just("$" + "B" * 43), max_size=2),
    },
    optional={"state_key": st.text(max_size=5), "unsigned": st.just({"age": 1})},
)


@settings(max_examples=150)
@given(event_strategy, st.randoms(use_true_random=False), st.sampled_from([None, 0, 3]))
def test_event_id_independent_of_key_order_and_whitespace(
    event: dict[str, Any], rnd: Any, indent: int | None
) -> None:
    add_content_hash(event)
    keys = list(event)
    rnd.shuffle(keys)
    reordered = {k: event[k] for k in keys}
    raw = json.dumps(reordered, indent=indent, ensure_ascii=rnd.random() < 0.5).encode()
    parsed = decode_json_object(raw)
    for version in (ROOM_V10, ROOM_V11, ROOM_V12):
        assert compute_event_id(parsed, version) == compute_event_id(event, version)
    assert check_content_hash(parsed)
