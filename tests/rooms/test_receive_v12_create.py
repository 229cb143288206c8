"""The receive path (``RoomEngine.receive_pdus``) on both engines refuses room version
12's malformed create references at the format check: nothing of the batch is stored
(before, the create event with a ``room_id`` was stored as rejected by the auth rules)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from roomstream.errors import BadEventError, Codes
from roomstream.events.canonical import encode_canonical_json
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    room_id_for_create_event,
)
from roomstream.events.hashing import add_content_hash
from roomstream.events.room_versions import ROOM_V12
from roomstream.events.signing import SigningKey, sign_event
from roomstream.rooms.engine import RoomEngine
from tests.support.rooms import REMOTE, remote_event

BOB = "@bob:remote.test"


def _create_data() -> dict[str, Any]:
    return build_event_dict(
        ROOM_V12,
        event_type="m.room.create",
        sender=BOB,
        content={"room_version": "12"},
        prev_events=[],
        auth_events=[],
        depth=1,
        state_key="",
        origin_server_ts=1_700_000_000_000,
    )


def _resigned(data: dict[str, Any], key: SigningKey) -> bytes:
    data = {k: v for k, v in data.items() if k not in ("hashes", "signatures")}
    data = add_content_hash(data)
    sign_event(data, REMOTE, key, room_version=ROOM_V12)
    return encode_canonical_json(data)


async def _count(engine: RoomEngine) -> int:
    return int(
        await engine.db.run_interaction(
            "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM events")[0]
        )
    )


async def test_a_create_event_with_a_room_id_is_refused_as_malformed(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    good = finalise_local_event(_create_data(), ROOM_V12, REMOTE, remote_key)
    bad = _resigned({**_create_data(), "room_id": room_id_for_create_event(good)}, remote_key)
    with pytest.raises(BadEventError) as info:
        await engine.receive_pdus([bad])
    assert info.value.errcode == Codes.BAD_JSON
    assert "room_id" in info.value.message
    assert await _count(engine) == 0
    # The well-formed create event is taken.
    (result,) = await engine.receive_pdus([good.raw])
    assert result.rejected_reason is None


async def test_an_event_listing_the_create_event_is_refused_as_malformed(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    create = finalise_local_event(_create_data(), ROOM_V12, REMOTE, remote_key)
    room_id = room_id_for_create_event(create)
    join = remote_event(
        remote_key, ROOM_V12, room_id, BOB, "m.room.member", {"membership": "join"},
        [create.event_id], [], 2, state_key=BOB,
    )  # fmt: skip
    listed = orjson.loads(join.raw)
    listed["auth_events"] = [create.event_id]
    with pytest.raises(BadEventError) as info:
        await engine.receive_pdus([create.raw, _resigned(listed, remote_key)])
    assert info.value.errcode == Codes.BAD_JSON
    assert create.event_id in info.value.message
    assert await _count(engine) == 0  # refused as a whole batch
    results = await engine.receive_pdus([create.raw, join.raw])
    assert [r.rejected_reason for r in results] == [None, None]
