"""Rooms of every version 1 to 12 on both engines: created here, joined and written to
by a remote server, stored and read back losslessly (the received bytes, the parsed
values -- floats and integers beyond 64 bits in versions 1 to 5 --, and in versions 1
and 2 the event ID the PDU carries)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import pytest
from signedjson.types import SigningKey

from roomstream.errors import BadEventError
from roomstream.events.canonical import encode_canonical_json_fast
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS
from roomstream.rooms.engine import RoomEngine
from roomstream.state.resolution import resolve_state
from tests.support.rooms import (
    ALICE,
    BOB,
    REMOTE,
    SERVER,
    public_room,
    remote_event,
    remote_join,
)

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


class _StoreEvents:
    """The engine's stored events as a state resolution store (v1 needs no more)."""

    def __init__(self, engine: RoomEngine) -> None:
        self.engine = engine

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        return await self.engine.store.get_events(list(event_ids))

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Sequence[set[str]]
    ) -> set[str]:
        raise AssertionError("state resolution v1 never asks for auth chains")


async def test_a_fork_in_a_version_1_room_merges_with_state_resolution_v1(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    """Bob leaves on one branch and changes his display name on another; Alice's next
    event merges them, and the state the store records before it is state resolution
    v1's answer (a store that offers no auth chains is enough for v1)."""
    room_id = await public_room(engine, "1")
    join, version, _ = await remote_join(engine, remote_key, room_id)
    await engine.receive_pdus([join.raw])
    current = await engine.store.get_current_state(room_id)
    auth = [
        current[("m.room.create", "")],
        current[("m.room.power_levels", "")],
        current[("m.room.member", BOB)],
    ]
    branches = []
    for content in ({"membership": "leave"}, {"membership": "join", "displayname": "B"}):
        join_rules = [current[("m.room.join_rules", "")]] if content["membership"] == "join" else []
        event = remote_event(
            remote_key,
            version,
            room_id,
            BOB,
            "m.room.member",
            content,
            [join.event_id],
            auth + join_rules,
            depth=join.depth + 1,
            state_key=BOB,
        )
        branches.append(event)
    await engine.receive_pdus([e.raw for e in branches])
    assert sorted(await engine.store.get_forward_extremities(room_id)) == sorted(
        e.event_id for e in branches
    )
    merge = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "merged"}, state_key=""
    )
    states = [await engine.store.get_state_at(e.event_id) for e in branches]
    expected = await resolve_state(room_id, version, states, _StoreEvents(engine))
    before_merge = await engine.store.get_state_at(merge.event.event_id, before=True)
    assert before_merge == expected
    # v1 replays memberships oldest first, equal depths by descending SHA-1 of the ID,
    # each allowed after the other here: the smallest SHA-1 is applied last and stays.
    # (v2 would keep the larger event ID, both having the same timestamp.)
    winner = min(branches, key=lambda e: hashlib.sha1(e.event_id.encode()).hexdigest())
    assert before_merge[("m.room.member", BOB)] == winner.event_id
    assert sorted(merge.event.prev_event_ids) == sorted(e.event_id for e in branches)
