"""Rooms of every version 1 to 12 on both engines: created here, joined and written to
by a remote server, stored and read back losslessly (the received bytes, the parsed
values -- floats and integers beyond 64 bits in versions 1 to 5 --, and in versions 1
and 2 the event ID the PDU carries)."""

from __future__ import annotations

import pytest
from signedjson.types import SigningKey

from roomstream.errors import BadEventError
from roomstream.events.canonical import encode_canonical_json_fast
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS
from roomstream.rooms.engine import RoomEngine
from tests.support.rooms import ALICE, BOB, REMOTE, SERVER, public_room, remote_join

VERSIONS = sorted(KNOWN_ROOM_VERSIONS, key=int)


@pytest.mark.parametrize("version_id", VERSIONS)
async def test_every_version_round_trips(
    engine: RoomEngine, remote_key: SigningKey, version_id: str
) -> None:
    room_id = await public_room(engine, version_id)
    join, version, _ = await remote_join(engine, remote_key, room_id)
    [joined] = await engine.receive_pdus([join.raw])
    assert joined.new and joined.rejected_reason is None and not joined.soft_failed

    # Bob's message, as his server would send it: pretty-printed (not canonical) bytes.
    content: dict[str, object] = {"msgtype": "m.text", "body": "hello"}
    if not version.strict_canonical_json:
        content.update({"weight": 0.5, "huge": 2**70 + 3, "small": -(2**60)})
    current = await engine.store.get_current_state(room_id)
    auth = [current[("m.room.power_levels", "")], current[("m.room.member", BOB)]]
    if not version.room_id_from_create_event:
        auth.append(current[("m.room.create", "")])
    message = finalise_local_event(
        build_event_dict(
            version,
            event_type="m.room.message",
            sender=BOB,
            content=content,
            prev_events=[join.event_id],
            auth_events=auth,
            depth=join.depth + 1,
            room_id=room_id,
        ),
        version,
        REMOTE,
        remote_key,
    )
    raw = encode_canonical_json_fast(message.data, strict=False).replace(b",", b", ")
    [stored] = await engine.receive_pdus([raw])
    assert stored.new and stored.rejected_reason is None and not stored.soft_failed
    assert stored.event_id == message.event_id

    read = (await engine.store.get_events([message.event_id]))[message.event_id]
    assert read.raw == raw  # the bytes as received
    assert read.data == message.data
    assert read.data["content"] == content
    assert read.room_version == version
    assert read.prev_event_ids == [join.event_id]
    if version.event_ids_in_pdu:
        assert message.event_id == message.data["event_id"]
        assert message.event_id.endswith(":" + REMOTE)
        # This server's own events carry IDs on its name.
        created = (await engine.store.get_events([current[("m.room.member", ALICE)]])).popitem()
        assert created[0].endswith(":" + SERVER) and created[1].data["event_id"] == created[0]
    else:
        assert "event_id" not in read.data
    assert await engine.store.get_forward_extremities(room_id) == [message.event_id]


@pytest.mark.parametrize("version_id", ["6", "10", "12"])
async def test_floats_refused_from_version_6(
    engine: RoomEngine, remote_key: SigningKey, version_id: str
) -> None:
    room_id = await public_room(engine, version_id)
    join, _version, _ = await remote_join(engine, remote_key, room_id)
    tampered = join.raw.replace(b'"depth":', b'"weight":1.5,"depth":')
    with pytest.raises(BadEventError):
        await engine.receive_pdus([tampered])
