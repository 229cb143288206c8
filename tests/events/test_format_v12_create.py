"""Room version 12's create event at the format check (``parse_pdu``): a create event
carrying a ``room_id``, or another event listing the create event in ``auth_events``,
is malformed (``M_BAD_JSON``), as Synapse refuses it, before any auth rule runs."""

from __future__ import annotations

from typing import Any

import pytest
from signedjson.key import decode_signing_key_base64

from roomstream.errors import BadEventError, Codes
from roomstream.events.canonical import encode_canonical_json
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    parse_pdu,
    room_id_for_create_event,
)
from roomstream.events.hashing import add_content_hash
from roomstream.events.room_versions import ROOM_V11, ROOM_V12, RoomVersion
from roomstream.events.signing import sign_event

KEY = decode_signing_key_base64("ed25519", "a_test", "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1")
SERVER = "example.org"
ALICE = "@alice:example.org"


def _signed(data: dict[str, Any], version: RoomVersion) -> bytes:
    """Hashed, signed canonical bytes of ``data`` as given (no format check on the way)."""
    data = add_content_hash(dict(data))
    sign_event(data, SERVER, KEY, room_version=version)
    return encode_canonical_json(data)


def _create(version: RoomVersion = ROOM_V12, **extra: Any) -> dict[str, Any]:
    data = build_event_dict(
        version,
        event_type="m.room.create",
        sender=ALICE,
        content={"room_version": version.identifier},
        prev_events=[],
        auth_events=[],
        depth=1,
        state_key="",
        room_id=None if version is ROOM_V12 else "!room:example.org",
        origin_server_ts=1_700_000_000_000,
    )
    return {**data, **extra}


def _refused(raw: bytes, version: RoomVersion, *words: str) -> None:
    with pytest.raises(BadEventError) as info:
        parse_pdu(raw, version)
    assert info.value.errcode == Codes.BAD_JSON
    for word in words:
        assert word in info.value.message


def test_the_v12_create_event_parses_without_a_room_id() -> None:
    event = parse_pdu(_signed(_create(), ROOM_V12), ROOM_V12)
    assert "room_id" not in event.data


@pytest.mark.parametrize("room_id", ["!room:example.org", "!" + "A" * 43, "", None, 5])
def test_a_v12_create_event_with_a_room_id_is_malformed(room_id: object) -> None:
    # Any value, even null or one that is the event's own derived ID: the key is absent.
    _refused(_signed(_create(room_id=room_id), ROOM_V12), ROOM_V12, "room_id")


def test_a_v12_create_event_naming_its_own_room_is_malformed() -> None:
    own = room_id_for_create_event(finalise_local_event(_create(), ROOM_V12, SERVER, KEY))
    _refused(_signed(_create(room_id=own), ROOM_V12), ROOM_V12, "room_id")


def test_a_v11_create_event_still_needs_its_room_id() -> None:
    assert parse_pdu(_signed(_create(ROOM_V11), ROOM_V11), ROOM_V11).room_id == (
        "!room:example.org"
    )


def _member(version: RoomVersion, room_id: str, auth_events: list[str]) -> dict[str, Any]:
    return build_event_dict(
        version,
        event_type="m.room.member",
        sender=ALICE,
        content={"membership": "join"},
        prev_events=[auth_events[-1]] if auth_events else ["$prev"],
        auth_events=auth_events,
        depth=2,
        state_key=ALICE,
        room_id=room_id,
        origin_server_ts=1_700_000_000_001,
    )


def test_a_v12_event_listing_the_create_event_in_auth_events_is_malformed() -> None:
    create = finalise_local_event(_create(), ROOM_V12, SERVER, KEY)
    room_id = room_id_for_create_event(create)
    listed = _member(ROOM_V12, room_id, [create.event_id])
    _refused(_signed(listed, ROOM_V12), ROOM_V12, "auth_events", create.event_id)
    # Also among other auth events, in any position.
    listed = _member(ROOM_V12, room_id, ["$other", create.event_id, "$third"])
    _refused(_signed(listed, ROOM_V12), ROOM_V12, "auth_events")
    # Not listing it is the v12 form, and passes the format check.
    assert parse_pdu(_signed(_member(ROOM_V12, room_id, ["$other"]), ROOM_V12), ROOM_V12)


def test_before_v12_the_create_event_is_listed_as_usual() -> None:
    create = finalise_local_event(_create(ROOM_V11), ROOM_V11, SERVER, KEY)
    member = _member(ROOM_V11, create.room_id, [create.event_id])
    assert parse_pdu(_signed(member, ROOM_V11), ROOM_V11).auth_event_ids == [create.event_id]


def test_local_events_are_held_to_the_same_rule() -> None:
    create = finalise_local_event(_create(), ROOM_V12, SERVER, KEY)
    member = _member(ROOM_V12, room_id_for_create_event(create), [create.event_id])
    with pytest.raises(BadEventError) as info:
        finalise_local_event(member, ROOM_V12, SERVER, KEY)
    assert info.value.errcode == Codes.BAD_JSON
