"""parse_pdu for received events, and building local events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from signedjson.key import decode_signing_key_base64

from roomstream.errors import BadEventError, Codes
from roomstream.events.canonical import encode_canonical_json
from roomstream.events.format import (
    MAX_PDU_SIZE,
    MAX_RAW_PDU_BYTES,
    ContentHashMismatchError,
    build_event_dict,
    finalise_local_event,
    parse_pdu,
    room_id_for_create_event,
)
from roomstream.events.hashing import add_content_hash, compute_event_id
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from roomstream.events.signing import (
    get_verify_key,
    load_or_create_signing_key,
    sign_event,
    verify_event_signature,
)
from tests.events.vectors import REAL_CREATE_EVENT, REAL_CREATE_EVENT_ID

KEY = decode_signing_key_base64("ed25519", "a_test", "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1")

SERVER = "example.org"
V12_ROOM = "!Nhcu5BS-UMnFX7hBVfVSoXiD7OgH6iRT-xyIuqDnpYQ"

EID = "$Rqnc-F-dvnEYJTyHq_iKxU2bZ1CI92-kuZq3a5lr5Zg"


def room_for(version: RoomVersion) -> str:
    return V12_ROOM if version is ROOM_V12 else "!room:example.org"


def message(version: RoomVersion = ROOM_V12, **content: Any) -> dict[str, Any]:
    return build_event_dict(
        version,
        event_type="m.room.message",
        sender="@alice:example.org",
        room_id=room_for(version),
        content={"msgtype": "m.text", "body": "héllo / wörld", **content},
        prev_events=[EID],
        auth_events=[EID, EID.replace("R", "S")],
        depth=12,
        origin_server_ts=1_700_000_000_000,
    )


def signed_raw(event: dict[str, Any], version: RoomVersion = ROOM_V12) -> bytes:
    return finalise_local_event(event, version, SERVER, KEY).raw


def hashed_raw(event: dict[str, Any]) -> bytes:
    """Canonical bytes with a valid content hash (for inputs that must pass the hash)."""
    event = dict(event)
    event.setdefault("signatures", {})
    return encode_canonical_json(add_content_hash(event))


def test_real_event_parses_with_expected_id() -> None:
    event = parse_pdu(REAL_CREATE_EVENT, ROOM_V10, expected_event_id=REAL_CREATE_EVENT_ID)
    assert event.event_id == REAL_CREATE_EVENT_ID
    assert event.raw == REAL_CREATE_EVENT
    assert event.type == "m.room.create" and event.room_id == "!uXDCzlYgCTHtiWCkEx:jki.re"
    with pytest.raises(BadEventError) as e:
        parse_pdu(REAL_CREATE_EVENT, ROOM_V10, expected_event_id="$somethingelse")
    assert e.value.errcode == Codes.BAD_JSON and "mismatch" in e.value.message


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11, ROOM_V12])
def test_local_event_round_trip(version: RoomVersion) -> None:
    local = finalise_local_event(message(version), version, SERVER, KEY)
    assert local.raw == encode_canonical_json(local.data)
    assert local.data == orjson.loads(local.raw)
    assert local.event_id == compute_event_id(local.data, version)
    assert verify_event_signature(local.data, SERVER, get_verify_key(KEY), room_version=version)
    received = parse_pdu(local.raw, version, expected_event_id=local.event_id)
    assert received.data == local.data and received.raw == local.raw


def _unusual_serialisations(data: dict[str, Any]) -> list[bytes]:
    reversed_keys = {k: data[k] for k in reversed(list(data))}
    escaped = json.dumps(reversed_keys, ensure_ascii=True, indent=3).replace("/", "\\/")
    return [
        json.dumps(reversed_keys).encode(),
        escaped.encode(),
        json.dumps(data, indent="\t", separators=(" ,\r\n", " :  ")).encode(),
        b"\n\n  " + json.dumps(data, ensure_ascii=False).encode() + b"  \r\n",
    ]


def test_lossless_and_formatting_independent() -> None:
    local = finalise_local_event(
        message(nested={"deep": [{"x": "\u00e9\u2028\U0001f600"}, None, True]}),
        ROOM_V12,
        SERVER,
        KEY,
    )
    for raw in _unusual_serialisations(local.data):
        assert raw != local.raw
        event = parse_pdu(raw, ROOM_V12, expected_event_id=local.event_id)
        assert event.raw == raw  # byte-identical, never re-serialised
        assert event.data == local.data
        assert event.event_id == local.event_id


def test_escaped_slash_and_unicode_escape_literal() -> None:
    local = finalise_local_event(message(body="a/é"), ROOM_V12, SERVER, KEY)
    raw = local.raw.replace(b"a/\xc3\xa9", b"a\\/\\u00e9")
    assert raw != local.raw
    assert parse_pdu(raw, ROOM_V12).event_id == local.event_id


def _mutations() -> list[tuple[str, Any, str]]:
    missing = object()
    return [
        # (key, new value or `missing`, expected errcode)
        ("type", missing, Codes.BAD_JSON),
        ("type", 5, Codes.BAD_JSON),
        ("type", "t" * 256, Codes.TOO_LARGE),
        ("type", "é" * 128, Codes.TOO_LARGE),  # 256 bytes, 128 characters
        ("sender", missing, Codes.BAD_JSON),
        ("sender", "alice", Codes.BAD_JSON),
        ("sender", "@alice", Codes.BAD_JSON),
        ("sender", "@alice:bad host", Codes.BAD_JSON),
        ("sender", "@a:" + "x" * 300, Codes.TOO_LARGE),
        ("room_id", missing, Codes.BAD_JSON),
        ("room_id", 1, Codes.BAD_JSON),
        ("room_id", "!room:example.org", Codes.BAD_JSON),  # not a v12 room ID
        ("room_id", "!short", Codes.BAD_JSON),
        ("state_key", None, Codes.BAD_JSON),
        ("state_key", "s" * 256, Codes.TOO_LARGE),
        ("content", missing, Codes.BAD_JSON),
        ("content", [], Codes.BAD_JSON),
        ("depth", missing, Codes.BAD_JSON),
        ("depth", -1, Codes.BAD_JSON),
        ("depth", True, Codes.BAD_JSON),
        ("depth", "5", Codes.BAD_JSON),
        ("origin_server_ts", missing, Codes.BAD_JSON),
        ("origin_server_ts", "now", Codes.BAD_JSON),
        ("prev_events", missing, Codes.BAD_JSON),
        ("prev_events", EID, Codes.BAD_JSON),
        ("prev_events", [1], Codes.BAD_JSON),
        ("auth_events", missing, Codes.BAD_JSON),
        ("auth_events", ["not-an-event-id"], Codes.BAD_JSON),
        ("hashes", missing, Codes.BAD_JSON),
        ("hashes", {}, Codes.BAD_JSON),
        ("signatures", missing, Codes.BAD_JSON),
        ("signatures", {"example.org": "sig"}, Codes.BAD_JSON),
        ("signatures", {"example.org": {"ed25519:1": 5}}, Codes.BAD_JSON),
    ]


@pytest.mark.parametrize(("key", "value", "errcode"), _mutations())
def test_bad_fields(key: str, value: Any, errcode: str) -> None:
    data = dict(finalise_local_event(message(), ROOM_V12, SERVER, KEY).data)
    if isinstance(value, object) and type(value) is object:
        del data[key]
    else:
        data[key] = value
    raw = orjson.dumps(data)
    with pytest.raises(BadEventError) as e:
        parse_pdu(raw, ROOM_V12)
    assert e.value.errcode == errcode, e.value.message


@pytest.mark.parametrize(
    ("raw", "errcode"),
    [
        (b"", Codes.NOT_JSON),
        (b"not json", Codes.NOT_JSON),
        (b'{"type":"\xff"}', Codes.NOT_JSON),
        (b"[]", Codes.BAD_JSON),
        (b'{"depth":1.5}', Codes.BAD_JSON),
        (b'{"depth":9007199254740992}', Codes.BAD_JSON),
        (b'{"a":NaN}', Codes.BAD_JSON),
        (b'{"type":"a","type":"b"}', Codes.BAD_JSON),
        (b" " * (MAX_RAW_PDU_BYTES + 1), Codes.TOO_LARGE),
    ],
)
def test_bad_json_through_parse_pdu(raw: bytes, errcode: str) -> None:
    with pytest.raises(BadEventError) as e:
        parse_pdu(raw, ROOM_V11)
    assert e.value.errcode == errcode


def test_size_limit_is_on_canonical_json() -> None:
    base = message()
    base_len = len(signed_raw(message(padding="")))
    fits = dict(base, content=dict(base["content"], padding="x" * (MAX_PDU_SIZE - base_len)))
    raw = signed_raw(fits)
    assert len(raw) == MAX_PDU_SIZE
    parse_pdu(raw, ROOM_V12)
    # The same event with whitespace is longer than the limit as received but is fine.
    spaced = json.dumps(orjson.loads(raw), indent=2).encode()
    assert len(spaced) > MAX_PDU_SIZE
    assert parse_pdu(spaced, ROOM_V12).event_id == parse_pdu(raw, ROOM_V12).event_id
    # One more byte of content is too large (locally and when received).
    too_big = dict(fits, content=dict(fits["content"], padding=fits["content"]["padding"] + "x"))
    with pytest.raises(BadEventError) as e:
        finalise_local_event(too_big, ROOM_V12, SERVER, KEY)
    assert e.value.errcode == Codes.TOO_LARGE
    event = sign_event(add_content_hash(dict(too_big)), SERVER, KEY, room_version=ROOM_V12)
    assert len(encode_canonical_json(event)) == MAX_PDU_SIZE + 1
    with pytest.raises(BadEventError) as e:
        parse_pdu(orjson.dumps(event), ROOM_V12)
    assert e.value.errcode == Codes.TOO_LARGE


def test_content_hash_mismatch() -> None:
    local = finalise_local_event(message(), ROOM_V12, SERVER, KEY)
    tampered = dict(local.data, content={"body": "changed"})
    with pytest.raises(ContentHashMismatchError) as e:
        parse_pdu(orjson.dumps(tampered), ROOM_V12)
    assert e.value.errcode == Codes.BAD_JSON
    assert isinstance(e.value, BadEventError)
    # The spec's fallback: the redacted copy, with the same event ID.
    redacted = e.value.redacted_event
    assert redacted.event_id == local.event_id
    assert redacted.data["content"] == {}
    # A redacted copy never matches its content hash; receiving one gives the same result.
    with pytest.raises(ContentHashMismatchError) as again:
        parse_pdu(redacted.raw, ROOM_V12)
    assert again.value.redacted_event.event_id == local.event_id
    assert again.value.redacted_event.raw == redacted.raw


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11, ROOM_V12])
def test_redacts_placement(version: RoomVersion) -> None:
    event = build_event_dict(
        version,
        event_type="m.room.redaction",
        sender="@alice:example.org",
        room_id=room_for(version),
        content={"reason": "spam"},
        prev_events=[EID],
        auth_events=[EID],
        depth=3,
        redacts=EID,
    )
    if version.updated_redaction_rules:
        assert event["content"]["redacts"] == EID and "redacts" not in event
    else:
        assert event["redacts"] == EID and "redacts" not in event["content"]
    parsed = parse_pdu(signed_raw(event, version), version)
    assert parsed.redacts == EID
    # The other placement alone is not enough for this version.
    moved = dict(event, content={"reason": "spam"})
    moved.pop("redacts", None)
    if version.updated_redaction_rules:
        moved["redacts"] = EID
    else:
        moved["content"] = {"redacts": EID}
    with pytest.raises(BadEventError) as e:
        parse_pdu(hashed_raw(moved), version)
    assert e.value.errcode == Codes.BAD_JSON


def test_v12_create_event_and_room_id() -> None:
    create = build_event_dict(
        ROOM_V12,
        event_type="m.room.create",
        sender="@alice:example.org",
        state_key="",
        content={"room_version": "12"},
        prev_events=[],
        auth_events=[],
        depth=1,
    )
    assert "room_id" not in create
    event = finalise_local_event(create, ROOM_V12, SERVER, KEY)
    room_id = room_id_for_create_event(event)
    assert room_id == "!" + event.event_id[1:] == event.room_id
    parsed = parse_pdu(event.raw, ROOM_V12, expected_event_id=event.event_id)
    assert room_id_for_create_event(parsed) == room_id
    # Later events in the room use the derived room ID, which passes the v12 grammar.
    member = build_event_dict(
        ROOM_V12,
        event_type="m.room.member",
        sender="@alice:example.org",
        room_id=room_id,
        state_key="@alice:example.org",
        content={"membership": "join"},
        prev_events=[event.event_id],
        auth_events=[],
        depth=2,
    )
    assert parse_pdu(signed_raw(member), ROOM_V12).room_id == room_id
    with pytest.raises(ValueError):
        build_event_dict(
            ROOM_V12, event_type="m.room.create", sender="@a:b", room_id=room_id,
            content={}, prev_events=[], auth_events=[], depth=1,
        )  # fmt: skip


def test_v11_create_needs_room_id_with_domain() -> None:
    create = build_event_dict(
        ROOM_V11,
        event_type="m.room.create",
        sender="@alice:example.org",
        room_id="!abc:example.org",
        state_key="",
        content={"room_version": "11"},
        prev_events=[],
        auth_events=[],
        depth=1,
    )
    event = finalise_local_event(create, ROOM_V11, SERVER, KEY)
    assert room_id_for_create_event(event) == "!abc:example.org"
    without = dict(create)
    del without["room_id"]
    with pytest.raises(BadEventError):
        parse_pdu(hashed_raw(without), ROOM_V11)
    with pytest.raises(ValueError):
        build_event_dict(
            ROOM_V11, event_type="m.room.create", sender="@a:b", content={},
            prev_events=[], auth_events=[], depth=1,
        )  # fmt: skip


def test_historical_user_ids_and_server_name_forms_accepted() -> None:
    for sender in ("@Ünïcode!:example.org", "@:example.org", "@a:1.2.3.4:8448", "@a:[::1]:80"):
        data = message(ROOM_V11)
        data["sender"] = sender
        assert parse_pdu(signed_raw(data, ROOM_V11), ROOM_V11).sender == sender


def test_finalise_rejects_bad_local_events() -> None:
    with pytest.raises(BadEventError) as e:
        finalise_local_event(message(ratio=0.5), ROOM_V12, SERVER, KEY)
    assert e.value.errcode == Codes.BAD_JSON
    with pytest.raises(BadEventError):
        finalise_local_event(dict(message(), event_id="$x"), ROOM_V12, SERVER, KEY)
    with pytest.raises(BadEventError):
        finalise_local_event(dict(message(), sender="nobody"), ROOM_V12, SERVER, KEY)


def test_finalise_does_not_modify_input_and_copies(tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path, SERVER)
    data = message(tags=("a", "b"))
    before = json.dumps(data, sort_keys=True)
    event = finalise_local_event(data, ROOM_V12, SERVER, key)
    assert json.dumps(data, sort_keys=True) == before
    assert event.data["content"]["tags"] == ["a", "b"]
    data["content"]["body"] = "changed later"
    assert event.data["content"]["body"] == "héllo / wörld"


# --- fuzzing: nothing but BadEventError may escape ------------------------------------------

VALID = signed_raw(message())
ERRCODES = {Codes.NOT_JSON, Codes.BAD_JSON, Codes.TOO_LARGE}


def check_parses_or_bad_event(raw: bytes, version: RoomVersion) -> None:
    """Any outcome but an Event or a BadEventError with a known errcode fails the test."""
    try:
        event = parse_pdu(raw, version)
    except BadEventError as e:
        assert e.errcode in ERRCODES
        return
    assert event.raw == raw
    assert event.event_id == compute_event_id(event.data, version)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(raw: bytes) -> None:
    check_parses_or_bad_event(raw, ROOM_V12)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete"]),
            st.integers(0, len(VALID) - 1),
            st.binary(min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_mutated_valid_pdu(mutations: list[tuple[str, int, bytes]]) -> None:
    raw = bytearray(VALID)
    for op, pos, data in mutations:
        pos %= max(len(raw), 1)
        if op == "flip":
            raw[pos] ^= data[0] or 1
        elif op == "insert":
            raw[pos:pos] = data
        else:
            del raw[pos : pos + len(data)]
    for version in (ROOM_V10, ROOM_V11, ROOM_V12):
        check_parses_or_bad_event(bytes(raw), version)


json_tokens = st.sampled_from(
    [b"{", b"}", b"[", b"]", b",", b":", b'"type"', b'"content"', b'"depth"', b"1", b"-0",
     b"1.5", b"1e400", b"null", b"true", b'"\\ud800"', b'"\\u0000"', b" ", b"9" * 30]
)  # fmt: skip


@settings(max_examples=400)
@given(st.lists(json_tokens, max_size=40))
def test_fuzz_token_soup(tokens: list[bytes]) -> None:
    check_parses_or_bad_event(b"".join(tokens), ROOM_V12)


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11, ROOM_V12])
def test_a_received_event_id_key_is_refused(version: RoomVersion) -> None:
    """A top-level ``event_id`` is never taken as the event's ID: the PDU is refused
    (Synapse answers M_BAD_JSON too), signed and hashed as it may be."""
    forged = "$forged_event_id_that_clients_would_see"
    data = dict(message(version), event_id=forged)
    event = add_content_hash(data)
    sign_event(event, SERVER, KEY, room_version=version)
    with pytest.raises(BadEventError) as e:
        parse_pdu(orjson.dumps(event), version)
    assert e.value.errcode == Codes.BAD_JSON
    assert "event_id" in e.value.message
