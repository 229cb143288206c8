"""The room queries other servers make (fedinbound): /state, /state_ids, /event,
/event_auth, /backfill, /get_missing_events, answered only to a server in the room (or
any, in a world-readable room), and with history visibility for servers (Synapse's
filter_events_for_server): whole under ``shared``, redacted before the server's join
under ``joined``. Both engines."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from signedjson.types import SigningKey

from roomstream.events.hashing import compute_event_id
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V12
from roomstream.federation.server import FederationServer
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import (
    FederationTestClient,
    federation_client,
    remote_member_event,
)
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import ALICE, BOB, public_room, remote_join

V1 = "/_matrix/federation/v1"
STRANGER = "stranger.test"


async def say(engine: RoomEngine, room_id: str, body: str) -> str:
    created = await engine.creator.create_event(
        room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": body}
    )
    return created.event.event_id


async def room_with_history(
    engine: RoomEngine, remote_key: SigningKey, visibility: str
) -> tuple[str, str, Event, str]:
    """Alice's room under ``visibility``: her message before Bob (remote.test) joins, his
    join, her message after. Returns (room, message before, Bob's join, message after)."""
    room_id = await public_room(engine)
    await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.history_visibility",
        {"history_visibility": visibility},
        state_key="",
    )
    before = await say(engine, room_id, "before Bob")
    join, _, _ = await remote_join(engine, remote_key, room_id)
    [result] = await engine.receive_pdus([join.raw])
    assert result.rejected_reason is None
    after = await say(engine, room_id, "after Bob")
    return room_id, before, join, after


def q(value: str) -> str:
    return quote(value, safe="")


async def backfill(
    fed: FederationTestClient, room_id: str, from_id: str, origin: str = "remote.test"
) -> tuple[int, Any]:
    return await fed.call(
        "GET", f"{V1}/backfill/{q(room_id)}", params={"v": from_id, "limit": "50"}, origin=origin
    )


async def test_state_event_and_auth_queries(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id, _, join, after = await room_with_history(engine, remote_key, "shared")
    state = await engine.store.get_state_at(after, before=True)
    create_id = state[("m.room.create", "")]
    async with federation_client(FederationServer(engine)) as fed:
        status, ids = await fed.call("GET", f"{V1}/state_ids/{q(room_id)}?event_id={q(after)}")
        assert status == 200
        assert ids["pdu_ids"] == sorted(state.values())
        assert create_id in ids["auth_chain_ids"]
        assert join.event_id not in ids["auth_chain_ids"]  # nothing's auth event
        status, full = await fed.call("GET", f"{V1}/state/{q(room_id)}?event_id={q(after)}")
        assert status == 200
        pdus = await engine.store.get_events(ids["pdu_ids"])
        assert full["pdus"] == [pdus[i].data for i in ids["pdu_ids"]]
        assert len(full["auth_chain"]) == len(ids["auth_chain_ids"])
        status, got = await fed.call("GET", f"{V1}/event/{q(after)}")
        assert status == 200 and got["origin"] == "local.test"
        [pdu] = got["pdus"]
        assert pdu == (await engine.store.get_event(after)).data  # type: ignore[union-attr]
        status, auth = await fed.call("GET", f"{V1}/event_auth/{q(room_id)}/{q(after)}")
        assert status == 200
        chain = {e["type"] for e in auth["auth_chain"]}
        assert {"m.room.create", "m.room.member", "m.room.power_levels"} <= chain
        # Unknown things are 404s; a missing parameter 400.
        status, body = await fed.call("GET", f"{V1}/event/{q('$nope')}")
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
        status, body = await fed.call("GET", f"{V1}/state_ids/{q(room_id)}")
        assert (status, body["errcode"]) == (400, "M_MISSING_PARAM")
        status, body = await fed.call("GET", f"{V1}/state_ids/{q('!nope:x')}?event_id=$x")
        assert status == 404


async def test_a_server_never_in_the_room_gets_403(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, before, _, after = await room_with_history(engine, remote_key, "shared")
    async with federation_client(FederationServer(engine)) as fed:
        for method, path, body in [
            ("GET", f"{V1}/state_ids/{q(room_id)}?event_id={q(after)}", None),
            ("GET", f"{V1}/state/{q(room_id)}?event_id={q(after)}", None),
            ("GET", f"{V1}/event/{q(after)}", None),
            ("GET", f"{V1}/event_auth/{q(room_id)}/{q(after)}", None),
            ("GET", f"{V1}/backfill/{q(room_id)}?v={q(after)}&limit=5", None),
            (
                "POST",
                f"{V1}/get_missing_events/{q(room_id)}",
                {"earliest_events": [before], "latest_events": [after], "limit": 5},
            ),
        ]:
            status, answer = await fed.call(method, path, body, origin=STRANGER)
            assert (status, answer["errcode"]) == (403, "M_FORBIDDEN"), path
            status, _ = await fed.call(method, path, body)
            assert status == 200, path


async def test_backfill_under_shared_shows_history_before_the_join_whole(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, before, join, after = await room_with_history(engine, remote_key, "shared")
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await backfill(fed, room_id, after)
    assert status == 200
    ids = [await _id_of(engine, p) for p in answer["pdus"]]
    # Newest first, down to the create event.
    assert ids[:3] == [after, join.event_id, before]
    assert answer["pdus"][-1]["type"] == "m.room.create"
    by_id = dict(zip(ids, answer["pdus"], strict=True))
    assert by_id[before]["content"]["body"] == "before Bob"


async def test_backfill_under_joined_redacts_what_came_before_the_join(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, before, join, after = await room_with_history(engine, remote_key, "joined")
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await backfill(fed, room_id, after)
        assert status == 200
        by_id = {await _id_of(engine, p): p for p in answer["pdus"]}
        assert by_id[after]["content"]["body"] == "after Bob"
        assert by_id[join.event_id]["content"]["membership"] == "join"
        # Before the join: there, linked, but redacted (hashes and signatures kept).
        assert by_id[before]["content"] == {}
        assert "hashes" in by_id[before] and "signatures" in by_id[before]
        status, got = await fed.call("GET", f"{V1}/event/{q(before)}")
        assert status == 200 and got["pdus"][0]["content"] == {}
        body = {"earliest_events": [], "latest_events": [after], "limit": 10}
        status, missing = await fed.call("POST", f"{V1}/get_missing_events/{q(room_id)}", body)
        assert status == 200
        by_id = {await _id_of(engine, p): p for p in missing["events"]}
        assert by_id[before]["content"] == {}
        assert by_id[join.event_id]["content"]["membership"] == "join"
        # Oldest first.
        depths = [p["depth"] for p in missing["events"]]
        assert depths == sorted(depths)


async def test_a_server_that_left_sees_nothing_after_it_left(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, _, _, after = await room_with_history(engine, remote_key, "shared")
    leave = await remote_member_event(
        engine, remote_key, room_id, BOB, "m.room.member", {"membership": "leave"}, state_key=BOB
    )
    [result] = await engine.receive_pdus([leave.raw])
    assert result.rejected_reason is None
    later = await say(engine, room_id, "after Bob left")
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await backfill(fed, room_id, later)
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
        # At an event while it was in, it may still ask.
        status, answer = await backfill(fed, room_id, after)
        assert status == 200


async def test_a_world_readable_room_answers_any_server(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, before, _, after = await room_with_history(engine, remote_key, "joined")
    await engine.creator.create_event(
        room_id,
        ALICE,
        "m.room.history_visibility",
        {"history_visibility": "world_readable"},
        state_key="",
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await backfill(fed, room_id, after, origin=STRANGER)
    assert status == 200
    by_id = {await _id_of(engine, p): p for p in answer["pdus"]}
    # Still redacted where the visibility at the event was "joined" and the stranger
    # had nobody in.
    assert by_id[before]["content"] == {}
    assert by_id[after]["content"] == {}


async def _id_of(engine: RoomEngine, pdu: dict[str, Any]) -> str:
    """The event ID of a PDU of a room version 12 room (what public_room makes)."""
    return compute_event_id(pdu, ROOM_V12)
