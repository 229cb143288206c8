"""Persisting room events on both engines: orderings, state, rejection, soft failure,
idempotence, losslessness, redactions and the DAG."""

from __future__ import annotations

import asyncio
import itertools
import json

import orjson
import pytest
from signedjson.types import SigningKey

from roomstream.errors import AuthError, BadEventError
from roomstream.events.model import Event
from roomstream.events.room_versions import (
    KNOWN_ROOM_VERSIONS,
    ROOM_V11,
    RoomVersion,
    room_version,
)
from roomstream.rooms.engine import RoomEngine
from tests.support.rooms import ALICE, BOB, REMOTE, public_room, remote_event, remote_join


@pytest.mark.parametrize("version", sorted(KNOWN_ROOM_VERSIONS))
async def test_create_room_builds_state_and_orderings(engine: RoomEngine, version: str) -> None:
    room_id, created = await engine.creator.create_room(ALICE, version=version, name="Lobby")
    orderings = [c.stream_ordering for c in created]
    assert orderings == sorted(orderings) and len(set(orderings)) == len(orderings)
    depths = [c.event.depth for c in created]
    assert depths == list(range(1, len(created) + 1))
    # A linear chain: each event's only prev is the one before.
    for prev, event in itertools.pairwise(created):
        assert event.event.prev_event_ids == [prev.event.event_id]
    assert await engine.store.get_forward_extremities(room_id) == [created[-1].event.event_id]
    current = await engine.store.get_current_state(room_id)
    assert current[("m.room.member", ALICE)] == created[1].event.event_id
    assert current[("m.room.name", "")] == created[-1].event.event_id
    assert await engine.store.get_room_version(room_id) == room_version(version)
    assert await engine.store.get_rooms_for_user(ALICE) == [room_id]
    # State before and after each event.
    for i, c in enumerate(created):
        after = await engine.store.get_state_at(c.event.event_id)
        assert after[c.event.state_tuple] == c.event.event_id
        before = await engine.store.get_state_at(c.event.event_id, before=True)
        assert c.event.state_tuple not in before or i == 0
        assert len(after) == i + 1


async def test_messages_and_state_at_any_event(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    first = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "one"}, state_key=""
    )
    message = await engine.creator.create_event(
        room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"}
    )
    second = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "two"}, state_key=""
    )
    topic = ("m.room.topic", "")
    assert await engine.store.get_state_entry_at(message.event.event_id, topic) == (
        first.event.event_id
    )
    assert await engine.store.get_state_entry_at(second.event.event_id, topic) == (
        second.event.event_id
    )
    assert await engine.store.get_state_entry_at(second.event.event_id, topic, before=True) == (
        first.event.event_id
    )
    # A message does not change state: before and after are the same.
    assert await engine.store.get_state_at(message.event.event_id) == (
        await engine.store.get_state_at(message.event.event_id, before=True)
    )


async def test_local_creation_refuses_unauthorised_events(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    with pytest.raises(AuthError):
        await engine.creator.create_event(
            room_id, "@mallory:local.test", "m.room.message", {"body": "not joined"}
        )
    # Nothing was stored for it.
    assert len(await engine.store.get_forward_extremities(room_id)) == 1


async def test_concurrent_senders_do_not_fork_the_dag(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    results = await asyncio.gather(
        *(
            engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": str(i)})
            for i in range(16)
        )
    )
    events = sorted(results, key=lambda r: r.stream_ordering)
    for prev, event in itertools.pairwise(events):
        assert event.event.prev_event_ids == [prev.event.event_id]
    assert await engine.store.get_forward_extremities(room_id) == [events[-1].event.event_id]


async def test_remote_join_message_and_rejection(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine)
    join, version, current = await remote_join(engine, remote_key, room_id)
    tip = join.prev_event_ids
    # A message sent before Bob's join is in the DAG: not allowed by its auth events.
    early = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.message",
        {"body": "too soon"},
        tip,
        [current[("m.room.power_levels", "")]],
        depth=10,
    )
    message = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.message",
        {"body": "hello"},
        [join.event_id],
        [current[("m.room.power_levels", "")], join.event_id],
        depth=11,
    )
    results = await engine.persister.persist_events([message, early, join])
    by_id = {r.event_id: r for r in results}
    assert by_id[join.event_id].rejected_reason is None
    assert by_id[message.event_id].rejected_reason is None
    assert by_id[early.event_id].rejected_reason is not None
    assert by_id[join.event_id].stream_ordering < by_id[message.event_id].stream_ordering
    assert await engine.store.get_forward_extremities(room_id) == [message.event_id]
    current = await engine.store.get_current_state(room_id)
    assert current[("m.room.member", BOB)] == join.event_id
    meta = await engine.store.get_meta([early.event_id])
    assert meta[early.event_id].rejected_reason


async def test_soft_failure_against_current_state(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine)
    join, version, current = await remote_join(engine, remote_key, room_id)
    pl = current[("m.room.power_levels", "")]
    base = [] if version.room_id_from_create_event else [current[("m.room.create", "")]]
    await engine.persister.persist_events([join])
    ban = await engine.creator.create_event(
        room_id, ALICE, "m.room.member", {"membership": "ban"}, state_key=BOB
    )
    # Bob's server, not yet aware of the ban, sends a message on top of his join.
    late = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.message",
        {"body": "am I banned?"},
        [join.event_id],
        [*base, pl, join.event_id],
        depth=11,
    )
    (result,) = await engine.persister.persist_events([late])
    assert result.rejected_reason is None
    assert result.soft_failed
    # Soft-failed: stored with state, but neither an extremity nor current state.
    assert await engine.store.get_forward_extremities(room_id) == [ban.event.event_id]
    assert (await engine.store.get_state_at(late.event_id))[("m.room.member", BOB)] == (
        join.event_id
    )


async def test_persisting_twice_is_a_no_op(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine)
    created = await engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": "x"})
    (again,) = await engine.persister.persist_events([created.event])
    assert not again.new
    assert again.stream_ordering == created.stream_ordering
    count = await engine.db.run_interaction(
        "test_query",
        lambda t: t.query_one(
            "SELECT COUNT(*) FROM events WHERE event_id = ?", (created.event.event_id,)
        )[0],
    )
    assert count == 1


async def test_exact_bytes_are_kept(engine: RoomEngine, remote_key: SigningKey) -> None:
    """Unusual but valid JSON (order, whitespace, escapes, non-ASCII) is stored as is."""
    room_id = await public_room(engine, "11")
    join, version, current = await remote_join(engine, remote_key, room_id)
    message = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.message",
        {"body": 'caf\u00e9 \u2603 \U0001f600 "quoted" / slash', "msgtype": "m.text"},
        [join.event_id],
        [current[("m.room.create", "")], current[("m.room.power_levels", "")], join.event_id],
        depth=11,
    )
    data = orjson.loads(message.raw)
    # Re-encode by hand: reversed key order, spaces, \u escapes and an escaped slash.
    body = json.dumps(data["content"]["body"]).replace("/", "\\/")  # \u escapes, \/
    odd_content = '{ "msgtype" : "m.text" ,\n "body" : ' + body + " }"
    parts = [
        f'"{k}" :  {orjson.dumps(v).decode()}' for k, v in reversed(data.items()) if k != "content"
    ]
    raw = ("{\n  " + ",\n  ".join([*parts, f'"content": {odd_content}']) + "\n}").encode()
    assert raw != message.raw
    results = await engine.receive_pdus([join.raw, raw])
    assert [r.rejected_reason for r in results] == [None, None]
    assert results[1].event_id == message.event_id  # same event, other bytes
    assert await engine.store.get_event_raw(message.event_id) == raw
    engine.store._events.invalidate_all()
    loaded = await engine.store.get_event(message.event_id)
    assert loaded is not None and loaded.raw == raw
    assert loaded.content["body"] == data["content"]["body"]


async def test_bad_input_persists_nothing(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    before = await engine.db.run_interaction(
        "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM events")[0]
    )
    cases = [
        b"{not json",
        b'{"type": "m.room.message", "room_id": "' + room_id.encode() + b'"}',
        b'{"type": 1.5}',
        b"[]",
    ]
    for raw in cases:
        with pytest.raises(BadEventError) as info:
            await engine.receive_pdus([raw])
        assert info.value.errcode in ("M_NOT_JSON", "M_BAD_JSON", "M_NOT_FOUND")
    after = await engine.db.run_interaction(
        "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM events")[0]
    )
    assert after == before


async def test_backfilled_events_get_negative_orderings(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    version = ROOM_V11
    create = remote_event(
        remote_key,
        version,
        "!old:remote.test",
        BOB,
        "m.room.create",
        {"room_version": "11"},
        [],
        [],
        depth=1,
        state_key="",
    )
    join = remote_event(
        remote_key,
        version,
        "!old:remote.test",
        BOB,
        "m.room.member",
        {"membership": "join"},
        [create.event_id],
        [create.event_id],
        depth=2,
        state_key=BOB,
    )
    results = await engine.persister.persist_events([join, create], backfilled=True)
    assert sorted(r.stream_ordering for r in results) == [-2, -1]
    assert all(r.rejected_reason is None for r in results)
    # Backfilled history never shows up as new in the events stream.
    updates = await engine.streams.get_updates("events", "main", 0, 10**9, 100)
    assert all(u[1][1][0] not in (create.event_id, join.event_id) for u in updates[0])
    backfill = await engine.streams.get_updates("backfill", "main", 0, 2, 100)
    assert [t for t, _ in backfill[0]] == [1, 2]


async def test_events_stream_carries_events_and_state(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    created = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "t"}, state_key=""
    )
    position = engine.streams.generator("events").get_position("main")
    assert position == created.stream_ordering
    updates, _, _ = await engine.streams.get_updates(
        "events", "main", created.stream_ordering - 1, position, 100
    )
    assert updates == [
        (
            created.stream_ordering,
            (
                "ev",
                (
                    created.event.event_id,
                    room_id,
                    "m.room.topic",
                    "",
                    None,
                    None,
                    None,
                    False,
                    False,
                ),
            ),
        ),
        (created.stream_ordering, ("state", (room_id, "m.room.topic", "", created.event.event_id))),
    ]


async def test_redaction_applies_and_keeps_raw(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    message = await engine.creator.create_event(
        room_id, ALICE, "m.room.message", {"body": "secret", "msgtype": "m.text"}
    )
    redaction = await engine.creator.create_event(
        room_id, ALICE, "m.room.redaction", {}, redacts=message.event.event_id
    )
    # The write side records the redaction; the read side prunes what it serves
    # (tests/reading/test_reads.py), and the received bytes stay as they were.
    meta = (await engine.store.get_meta([message.event.event_id]))[message.event.event_id]
    assert meta.redacted_by == redaction.event.event_id
    assert await engine.store.get_event_raw(message.event.event_id) == message.event.raw


async def test_dag_walking(engine: RoomEngine) -> None:
    room_id = await public_room(engine)
    messages = [
        await engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": str(i)})
        for i in range(6)
    ]
    ids = [m.event.event_id for m in messages]
    back = await engine.store.get_backfill_events(room_id, [ids[-1]], 3)
    assert back == [ids[-1], ids[-2], ids[-3]]
    missing = await engine.store.get_missing_events(room_id, [ids[1]], [ids[5]], 10)
    assert missing == ids[2:5]
    missing = await engine.store.get_missing_events(room_id, [ids[1]], [ids[5]], 2)
    assert missing == ids[3:5]
    page = await engine.store.paginate_backwards(room_id, None, 2)
    assert [p[0] for p in page] == [ids[5], ids[4]]
    page2 = await engine.store.paginate_backwards(room_id, page[-1][1:], 2)
    assert [p[0] for p in page2] == [ids[3], ids[2]]


async def test_fork_and_merge_resolves_state(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine, "11")
    join, version, current = await remote_join(engine, remote_key, room_id)
    create, pl = current[("m.room.create", "")], current[("m.room.power_levels", "")]
    await engine.persister.persist_events([join])
    # Alice sets a topic on a branch that has not seen Bob's join.
    topic = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "fork"}, state_key=""
    )
    assert topic.event.prev_event_ids == [join.event_id]
    side = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.name",
        {"name": "nope"},
        [join.event_id],
        [create, pl, join.event_id],
        depth=11,
        state_key="",
    )
    (side_result,) = await engine.persister.persist_events([side])
    # Bob lacks the state level: rejected, not a fork.
    assert side_result.rejected_reason is not None
    other = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.message",
        {"body": "branch"},
        [join.event_id],
        [create, pl, join.event_id],
        depth=11,
    )
    await engine.persister.persist_events([other])
    assert set(await engine.store.get_forward_extremities(room_id)) == {
        topic.event.event_id,
        other.event_id,
    }
    merged = await engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": "m"})
    assert set(merged.event.prev_event_ids) == {topic.event.event_id, other.event_id}
    state = await engine.store.get_state_at(merged.event.event_id)
    assert state[("m.room.topic", "")] == topic.event.event_id
    assert state[("m.room.member", BOB)] == join.event_id
    assert await engine.store.get_forward_extremities(room_id) == [merged.event.event_id]
    assert REMOTE in BOB


async def test_event_with_unknown_prev_events_is_an_outlier(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await public_room(engine, "11")
    join, _, _ = await remote_join(
        engine, remote_key, room_id, prev_events=["$unknown_prev_event"], depth=50
    )
    (result,) = await engine.persister.persist_events([join])
    assert result.outlier and result.rejected_reason is None
    # No state of its own, not an extremity, not current state.
    with pytest.raises(LookupError):
        await engine.store.get_state_at(join.event_id)
    assert join.event_id not in await engine.store.get_forward_extremities(room_id)
    assert ("m.room.member", BOB) not in await engine.store.get_current_state(room_id)


async def test_failed_commit_leaves_nothing_and_the_room_recovers(
    engine: RoomEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    room_id = await public_room(engine)
    tip_before = await engine.store.get_forward_extremities(room_id)
    count_sql = "SELECT COUNT(*) FROM events WHERE room_id = ?"
    before = await engine.db.run_interaction(
        "test_query", lambda t: t.query_one(count_sql, (room_id,))[0]
    )
    persister = engine.persister
    original = persister._persist_txn
    calls = 0

    def failing(txn, orderings, pending):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        original(txn, orderings, pending)  # write everything, then fail the transaction
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(persister, "_persist_txn", failing)
    outcomes = await asyncio.gather(
        *(
            engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": str(i)})
            for i in range(5)
        ),
        return_exceptions=True,
    )
    assert calls >= 1
    assert all(isinstance(o, Exception) for o in outcomes), outcomes
    after = await engine.db.run_interaction(
        "test_query", lambda t: t.query_one(count_sql, (room_id,))[0]
    )
    assert after == before
    assert await engine.store.get_forward_extremities(room_id) == tip_before
    monkeypatch.setattr(persister, "_persist_txn", original)
    # The room is reloaded from the database and carries on from where it really was.
    created = await engine.creator.create_event(room_id, ALICE, "m.room.message", {"body": "ok"})
    assert created.event.prev_event_ids == tip_before
    assert await engine.store.get_forward_extremities(room_id) == [created.event.event_id]


async def test_concurrent_senders_across_rooms_share_commits(engine: RoomEngine) -> None:
    rooms = [await public_room(engine) for _ in range(4)]
    results = await asyncio.gather(
        *(
            engine.creator.create_event(room, ALICE, "m.room.message", {"body": f"{i}"})
            for i in range(5)
            for room in rooms
        )
    )
    orderings = [r.stream_ordering for r in results]
    assert len(set(orderings)) == len(orderings)
    for room in rooms:
        mine = sorted(
            (r for r in results if r.event.room_id == room), key=lambda r: r.stream_ordering
        )
        for prev, event in itertools.pairwise(mine):
            assert event.event.prev_event_ids == [prev.event.event_id]
        assert await engine.store.get_forward_extremities(room) == [mine[-1].event.event_id]
        # Stream order within a room follows the DAG.
        depths = [r.event.depth for r in mine]
        assert depths == sorted(depths)


async def _bob_in_room(
    engine: RoomEngine, remote_key: SigningKey, version: str = "11"
) -> tuple[str, RoomVersion, Event, list[str]]:
    """A public room Bob has joined: (room, version, his join, auth events for his messages)."""
    room_id, room_v, join, auth = await _bob_joining(engine, remote_key, version)
    await engine.persister.persist_events([join])
    return room_id, room_v, join, auth


async def _bob_joining(
    engine: RoomEngine, remote_key: SigningKey, version: str = "11"
) -> tuple[str, RoomVersion, Event, list[str]]:
    """A public room and Bob's join to it, not persisted yet: (room, version, his join, auth
    events for his messages once he has joined)."""
    room_id = await public_room(engine, version)
    join, room_v, current = await remote_join(engine, remote_key, room_id)
    base = [] if room_v.room_id_from_create_event else [current[("m.room.create", "")]]
    return room_id, room_v, join, [*base, current[("m.room.power_levels", "")], join.event_id]


async def _event_rows(engine: RoomEngine, sql: str, *args: object) -> list[tuple[object, ...]]:
    return await engine.db.run_interaction(
        "test_query", lambda t: [tuple(r) for r in t.query(sql, args)]
    )


async def test_double_redaction_in_one_batch_keeps_the_first_persisted(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, version, join, auth = await _bob_in_room(engine, remote_key)
    message = remote_event(
        remote_key, version, room_id, BOB, "m.room.message", {"body": "x"}, [join.event_id],
        auth, depth=11,
    )  # fmt: skip
    await engine.persister.persist_events([message])

    def redaction(depth: int, n: int) -> Event:
        return remote_event(
            remote_key, version, room_id, BOB, "m.room.redaction",
            {"reason": str(n), "redacts": message.event_id}, [message.event_id], auth,
            depth=depth,
        )  # fmt: skip

    # Two concurrent redactions of the message: the shallower one is persisted first; pick
    # them so that it has the LARGER event ID (an order by event ID picks the other one).
    n = 0
    while True:
        first, second = redaction(12, n), redaction(13, n)
        if first.event_id > second.event_id:
            break
        n += 1
    results = await engine.persister.persist_events([second, first])
    orderings = {r.event_id: r.stream_ordering for r in results}
    assert orderings[first.event_id] < orderings[second.event_id]
    meta = await engine.store.get_meta([message.event_id])
    assert meta[message.event_id].redacted_by == first.event_id


async def test_every_current_state_change_of_a_batch_is_a_delta_row(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, version, join, auth = await _bob_joining(engine, remote_key)
    leave = remote_event(
        remote_key, version, room_id, BOB, "m.room.member", {"membership": "leave"},
        [join.event_id], auth, depth=11, state_key=BOB,
    )  # fmt: skip
    results = await engine.persister.persist_events([leave, join])
    orderings = {r.event_id: r.stream_ordering for r in results}
    rows = await _event_rows(
        engine,
        "SELECT stream_id, event_id, prev_event_id FROM current_state_delta_stream"
        " WHERE room_id = ? AND type = 'm.room.member' AND state_key = ? ORDER BY stream_id",
        room_id,
        BOB,
    )
    # The join and then the leave, each at its own event's stream ordering.
    assert rows == [
        (orderings[join.event_id], join.event_id, None),
        (orderings[leave.event_id], leave.event_id, join.event_id),
    ]
    assert (await engine.store.get_current_state(room_id))[("m.room.member", BOB)] == (
        leave.event_id
    )


async def test_outlier_gets_state_when_its_prev_event_arrives(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id, version, join, auth = await _bob_joining(engine, remote_key)
    topic = remote_event(
        remote_key, version, room_id, BOB, "m.room.message", {"body": "hi"},
        [join.event_id], auth, depth=11,
    )  # fmt: skip
    later = remote_event(
        remote_key, version, room_id, BOB, "m.room.message", {"body": "again"},
        [topic.event_id], auth, depth=12,
    )  # fmt: skip
    # The messages arrive first: outliers (and, their auth event unknown, rejected).
    first = await engine.persister.persist_events([later, topic])
    assert all(r.outlier and r.rejected_reason for r in first)
    before = {r.event_id: r.stream_ordering for r in first}
    (joined,) = await engine.persister.persist_events([join])
    assert joined.new and not joined.outlier
    # Both are decided again, with state, as if received after the join.
    meta = await engine.store.get_meta([topic.event_id, later.event_id])
    for event_id in (topic.event_id, later.event_id):
        assert not meta[event_id].outlier and meta[event_id].rejected_reason is None
        assert meta[event_id].stream_ordering > before[event_id]
        assert (await engine.store.get_state_at(event_id))[("m.room.member", BOB)] == (
            join.event_id
        )
    assert meta[topic.event_id].stream_ordering > joined.stream_ordering
    assert await engine.store.get_forward_extremities(room_id) == [later.event_id]
    assert (await engine.store.get_current_state(room_id))[("m.room.member", BOB)] == (
        join.event_id
    )
    # Persisting them again changes nothing.
    again = await engine.persister.persist_events([topic, later])
    assert not any(r.new or r.outlier for r in again)
