"""Gaps in a room's DAG (fedinbound, ``federation/gaps.py``): a PDU whose prev events are
unknown gets them through ``get_missing_events``, or else the state at the gap through
``/state_ids`` + ``/event`` (stored as outliers), from a fake outbound client. Both
engines."""

from __future__ import annotations

from signedjson.types import SigningKey

from roomstream.events.model import Event
from roomstream.federation.server import FederationServer
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import (
    SEND,
    FakeFederationClient,
    federation_client,
    joined_room,
    remote_member_event,
    txn,
)
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import BOB, REMOTE, remote_event

CAROL = "@carol:remote.test"


def chain_message(key: SigningKey, engine_room: tuple[Event, str], body: str) -> Event:
    prev, room_id = engine_room
    return remote_event(
        key,
        prev.room_version,
        room_id,
        BOB,
        "m.room.message",
        {"msgtype": "m.text", "body": body},
        [prev.event_id],
        list(prev.auth_event_ids),
        prev.depth + 1,
    )


async def test_a_gap_is_filled_through_get_missing_events(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    extremities = await engine.store.get_forward_extremities(room_id)
    m1 = await remote_member_event(
        engine, remote_key, room_id, BOB, "m.room.message", {"msgtype": "m.text", "body": "1"}
    )
    m2 = chain_message(remote_key, (m1, room_id), "2")
    m3 = chain_message(remote_key, (m2, room_id), "3")
    client = FakeFederationClient(missing=[m2, m1])  # any order: stored oldest first
    async with federation_client(FederationServer(engine, client=client)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(m3))
    assert (status, answer) == (200, {"pdus": {m3.event_id: {}}})
    assert [r[0] for r in client.requests] == ["POST"]
    assert "/get_missing_events/" in client.requests[0][2]
    assert client.contents[0] == {
        "earliest_events": sorted(extremities),
        "latest_events": [m3.event_id],
        "limit": 10,
        "min_depth": min(e.depth for e in (await engine.store.get_events(extremities)).values()),
    }
    meta = await engine.store.get_meta([m1.event_id, m2.event_id, m3.event_id])
    assert all(not m.outlier and m.rejected_reason is None for m in meta.values())
    assert len(meta) == 3
    assert await engine.store.get_forward_extremities(room_id) == [m3.event_id]
    # In the timeline, in order.
    assert meta[m1.event_id].stream_ordering < meta[m2.event_id].stream_ordering
    assert meta[m2.event_id].stream_ordering < meta[m3.event_id].stream_ordering


async def test_a_gap_left_open_gets_its_state_through_state_ids(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    [old_tip] = await engine.store.get_forward_extremities(room_id)
    state_before_carol = await engine.store.get_current_state(room_id)
    # Carol joins on the remote server; we never see her join, only her message after it.
    carol_join = await remote_member_event(
        engine, remote_key, room_id, CAROL, "m.room.member", {"membership": "join"}, state_key=CAROL
    )
    after_join = dict(state_before_carol)
    after_join[("m.room.member", CAROL)] = carol_join.event_id
    hello = await remote_member_event(
        engine,
        remote_key,
        room_id,
        CAROL,
        "m.room.message",
        {"msgtype": "m.text", "body": "hello"},
        prev_events=[carol_join.event_id],
        depth=carol_join.depth + 1,
        auth_state=after_join,
    )
    client = FakeFederationClient(missing=[])  # get_missing_events finds nothing
    client.add(carol_join, *(await engine.store.get_events(state_before_carol.values())).values())
    client.states[carol_join.event_id] = sorted(state_before_carol.values())
    async with federation_client(FederationServer(engine, client=client)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(hello))
    assert (status, answer) == (200, {"pdus": {hello.event_id: {}}})
    paths = [p for _, _, p in client.requests]
    assert "/get_missing_events/" in paths[0] and "/state_ids/" in paths[1]
    assert any(p.endswith("/event/" + carol_join.event_id.replace("$", "%24")) for p in paths)
    meta = await engine.store.get_meta([carol_join.event_id, hello.event_id])
    # The missing prev event is an outlier (a backwards extremity's neighbour); the event
    # after the gap is in the timeline, with the state the remote vouched for.
    assert meta[carol_join.event_id].outlier
    assert not meta[hello.event_id].outlier
    assert meta[hello.event_id].rejected_reason is None
    assert not meta[hello.event_id].soft_failed
    before = await engine.store.get_state_at(hello.event_id, before=True)
    assert before == after_join
    # The old tip stays an extremity (only an outlier names it, as in Synapse); the
    # room's current state resolves both sides: Carol is in.
    assert sorted(await engine.store.get_forward_extremities(room_id)) == sorted(
        [old_tip, hello.event_id]
    )
    assert await engine.store.get_membership(room_id, CAROL) == "join"


async def test_without_a_client_an_event_after_a_gap_is_an_outlier(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    orphan = await remote_member_event(
        engine,
        remote_key,
        room_id,
        BOB,
        "m.room.message",
        {"msgtype": "m.text", "body": "orphan"},
        prev_events=["$never-seen"],
    )
    async with federation_client(FederationServer(engine)) as fed:
        status, answer = await fed.call("PUT", SEND + "t", txn(orphan), origin=REMOTE)
    assert (status, answer) == (200, {"pdus": {orphan.event_id: {}}})
    assert (await engine.store.get_meta([orphan.event_id]))[orphan.event_id].outlier
