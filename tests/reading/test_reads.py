"""The reads one by one, on both engines: tokens, the client format, sync skipping
unchanged rooms, the latest rooms with a cursor, members, redactions (also before the
target and for a backfilled target), transaction IDs, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from roomstream.errors import MatrixError
from roomstream.events.signing import load_or_create_signing_key
from roomstream.reading import (
    EventsToken,
    InvalidTokenError,
    RoomPosition,
    RoomReader,
    RoomsCursor,
    encode_client_event,
    parse_pagination_token,
    read_side_participants,
)
from roomstream.reading import timeline as timeline_module
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet
from tests.support.reading_scenario import SERVER, Player

ALICE = f"@alice:{SERVER}"
BOB = f"@bob:{SERVER}"
CAROL = f"@carol:{SERVER}"
FEDERATION_KEYS = {"auth_events", "prev_events", "depth", "hashes", "signatures", "origin"}


@pytest.fixture
async def engine(database: Database, tmp_path: Path) -> RoomEngine:
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    return RoomEngine(database, streams, SERVER, "main", key, participants=read_side_participants())


@pytest.fixture
def reader(engine: RoomEngine) -> RoomReader:
    return RoomReader.for_engine(engine, include_age=False)


async def _room(engine: RoomEngine, *members: str) -> str:
    room_id, _ = await engine.creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT, name="r")
    for member in members:
        await engine.creator.create_event(
            room_id, member, "m.room.member", {"membership": "join"}, state_key=member
        )
    return room_id


async def _say(engine: RoomEngine, room_id: str, sender: str, body: str) -> str:
    created = await engine.creator.create_event(
        room_id, sender, "m.room.message", {"msgtype": "m.text", "body": body}
    )
    return created.event.event_id


# -- tokens ------------------------------------------------------------------------------


def test_events_tokens_round_trip_and_compare() -> None:
    single = EventsToken(42)
    assert single.to_string() == "s42" and EventsToken.parse("s42") == single
    multi = EventsToken(10, {"writer.one": 15, "w~2": 12, "w_3": 10})
    text = multi.to_string()
    assert "_" not in text and "/" not in text
    assert EventsToken.parse(text) == multi
    assert multi.writers == {"w~2": 12, "writer.one": 15}  # at the minimum: left out
    assert multi.covers("writer.one", 15) and not multi.covers("w~2", 13)
    assert multi.covers("other", 10) and not multi.covers("other", 11)
    assert single.is_before_or_equal(EventsToken(42, {"a": 50}))
    assert not multi.is_before_or_equal(EventsToken(14))
    assert (
        multi.advance(EventsToken(13)).to_string()
        == EventsToken(13, {"writer.one": 15}).to_string()
    )
    position = RoomPosition(7, -3)
    assert RoomPosition.parse(position.to_string()) == position
    assert parse_pagination_token("t7--3") == position
    assert parse_pagination_token("s5") == EventsToken(5)


@pytest.mark.parametrize("text", ["", "x1", "s", "s1.5", "m1", "m1~a", "t1", "t1-", "s" + "9" * 30])
def test_bad_tokens_are_refused_with_a_matrix_error(text: str) -> None:
    with pytest.raises(InvalidTokenError) as caught:
        parse_pagination_token(text)
    assert caught.value.http_status == 400 and caught.value.errcode == "M_INVALID_PARAM"
    with pytest.raises(InvalidTokenError):
        RoomsCursor.parse(text)


# -- the client format -------------------------------------------------------------------


async def test_one_format_everywhere(engine: RoomEngine, reader: RoomReader) -> None:
    room_id = await _room(engine, BOB)
    since = reader.current_token()
    topic = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "one"}, state_key=""
    )
    second = await engine.creator.create_event(
        room_id, ALICE, "m.room.topic", {"topic": "two"}, state_key=""
    )
    message = await _say(engine, room_id, BOB, "hello")
    await reader.record_transaction_id(message, room_id, BOB, "PHONE", "txn1")
    served: dict[str, list[bytes]] = {}

    def collect(events: list[dict[str, Any]]) -> None:
        for event in events:
            served.setdefault(event["event_id"], []).append(encode_client_event(event))

    sync = await reader.sync(BOB, since, device_id="PHONE")
    collect(sync.rooms[room_id].events)
    collect((await reader.paginate(BOB, room_id, None, limit=3, device_id="PHONE")).events)
    context = await reader.context(BOB, room_id, second.event.event_id, device_id="PHONE")
    collect([context.event, *context.events_before, *context.events_after])
    collect((await reader.latest_rooms(BOB, state="none", device_id="PHONE")).rooms[0].events)
    for event_id in (topic.event.event_id, second.event.event_id, message):
        single = await reader.get_event(BOB, event_id, device_id="PHONE")
        assert single is not None
        collect([single])
        assert len(set(served[event_id])) == 1, "the same bytes wherever it is served"
        assert len(served[event_id]) == 5
    shown = orjson.loads(served[second.event.event_id][0])
    assert not FEDERATION_KEYS & set(shown)
    assert set(shown) == {
        "content", "event_id", "origin_server_ts", "room_id", "sender", "state_key", "type",
        "unsigned",
    }  # fmt: skip
    assert shown["unsigned"] == {
        "prev_content": {"topic": "one"},
        "replaces_state": topic.event.event_id,
    }
    assert orjson.loads(served[message][0])["unsigned"] == {"transaction_id": "txn1"}
    # Another device of the same user, and other users, do not see the transaction ID.
    other = await reader.get_event(BOB, message, device_id="LAPTOP")
    assert other is not None and "unsigned" not in other
    assert await reader.event_for_transaction(room_id, BOB, "PHONE", "txn1") == message
    assert await reader.event_for_transaction(room_id, BOB, "LAPTOP", "txn1") is None


async def test_age_moves_with_the_clock(engine: RoomEngine) -> None:
    now = [2_000_000_000.0]
    reader = RoomReader.for_engine(engine, clock=lambda: now[0])
    room_id = await _room(engine)
    event_id = await _say(engine, room_id, ALICE, "x")
    sent = (await reader.get_event(ALICE, event_id)) or {}
    now[0] += 5
    later = (await reader.get_event(ALICE, event_id)) or {}
    assert later["unsigned"]["age"] - sent["unsigned"]["age"] == 5000


@pytest.mark.parametrize("version", ["10", "11"])
async def test_redacted_events_are_pruned_by_room_version(engine: RoomEngine, version: str) -> None:
    reader = RoomReader.for_engine(engine, include_age=False)
    room_id, _ = await engine.creator.create_room(ALICE, version=version)
    message = await _say(engine, room_id, ALICE, "secret")
    redaction = await engine.creator.create_event(
        room_id, ALICE, "m.room.redaction", {"reason": "oops"}, redacts=message
    )
    served = await reader.get_event(ALICE, message)
    assert served is not None and served["content"] == {}
    because = served["unsigned"]["redacted_because"]
    assert because["event_id"] == redaction.event.event_id
    assert because["content"]["reason"] == "oops"
    shown_redaction = await reader.get_event(ALICE, redaction.event.event_id)
    assert shown_redaction is not None
    if version == "10":
        assert shown_redaction["redacts"] == message  # top-level before v11
    else:
        # In the content, and copied to the top level for older clients (spec, v11).
        assert shown_redaction["content"]["redacts"] == message
        assert shown_redaction["redacts"] == message


# -- sync --------------------------------------------------------------------------------


async def test_sync_skips_unchanged_rooms_without_a_query(
    engine: RoomEngine, reader: RoomReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    rooms = [await _room(engine, BOB) for _ in range(6)]
    since = reader.current_token()
    await _say(engine, rooms[2], ALICE, "news")
    await _say(engine, rooms[4], ALICE, "more news")
    queried: list[str] = []
    original = timeline_module._new_rows_txn

    def spy(txn: Any, room_id: str, *args: Any) -> Any:
        queried.append(room_id)
        return original(txn, room_id, *args)

    monkeypatch.setattr(timeline_module, "_new_rows_txn", spy)
    result = await reader.sync(BOB, since, timeline_limit=5)
    assert sorted(result.rooms) == sorted([rooms[2], rooms[4]])
    assert sorted(queried) == sorted([rooms[2], rooms[4]])
    # Nothing new: no database interaction at all.
    calls = 0
    original_run = engine.db.run_interaction

    async def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await original_run(*args, **kwargs)

    monkeypatch.setattr(engine.db, "run_interaction", counting)
    again = await reader.sync(BOB, result.next_token)
    assert again.rooms == {} and again.membership_changes == [] and calls == 0
    # A token from a process that has seen further: the next token does not go back.
    ahead = EventsToken(result.next_token.maximum + 50)
    assert (await reader.sync(BOB, ahead)).next_token == ahead


async def test_sync_limited_prev_batch_and_membership_changes(
    engine: RoomEngine, reader: RoomReader
) -> None:
    room_id = await _room(engine, BOB)
    other = await _room(engine)
    since = reader.current_token()
    said = [await _say(engine, room_id, ALICE, str(i)) for i in range(5)]
    invite = await engine.creator.create_event(
        other, ALICE, "m.room.member", {"membership": "invite"}, state_key=BOB
    )
    result = await reader.sync(BOB, since, timeline_limit=3)
    timeline = result.rooms[room_id]
    assert [e["event_id"] for e in timeline.events] == said[2:]
    assert timeline.limited
    older = await reader.paginate(BOB, room_id, timeline.prev_batch, limit=2)
    assert [e["event_id"] for e in older.events] == [said[1], said[0]]
    assert [e["event_id"] for e in result.membership_changes] == [invite.event.event_id]
    assert result.rooms[other].membership == "invite"


# -- latest rooms --------------------------------------------------------------------------


async def test_latest_rooms_by_activity_with_a_cursor(
    engine: RoomEngine, reader: RoomReader
) -> None:
    rooms = [await _room(engine, BOB) for _ in range(5)]
    for room_id in (rooms[3], rooms[0], rooms[4]):
        await _say(engine, room_id, ALICE, "bump")
    expected = [rooms[4], rooms[0], rooms[3], rooms[2], rooms[1]]
    seen: list[str] = []
    cursor = None
    while True:
        page = await reader.latest_rooms(BOB, room_limit=2, event_limit=2, cursor=cursor)
        seen.extend(r.room_id for r in page.rooms)
        if page.next_cursor is None:
            break
        cursor = RoomsCursor.parse(page.next_cursor.to_string())
    assert seen == expected
    first = (await reader.latest_rooms(BOB, room_limit=1, event_limit=2)).rooms[0]
    current = await engine.store.get_current_state(rooms[4])
    assert sorted(e["event_id"] for e in first.state) == sorted(current.values())
    start = (
        await reader.latest_rooms(BOB, room_limit=1, event_limit=2, state="timeline_start")
    ).rooms[0]
    before = await engine.store.get_state_at(start.events[0]["event_id"], before=True)
    assert sorted(e["event_id"] for e in start.state) == sorted(before.values())


async def test_latest_rooms_ranks_rooms_the_change_cache_never_saw(engine: RoomEngine) -> None:
    rooms = [await _room(engine, BOB) for _ in range(5)]
    for room_id in (rooms[1], rooms[3]):
        await _say(engine, room_id, ALICE, "before the reader started")
    reader = RoomReader.for_engine(engine, include_age=False)  # knows no room's activity
    await _say(engine, rooms[0], ALICE, "after")  # known from the events stream
    expected = [rooms[0], rooms[3], rooms[1], rooms[4], rooms[2]]
    seen: list[str] = []
    cursor = None
    while True:
        page = await reader.latest_rooms(BOB, room_limit=2, event_limit=1, state="none",
                                         cursor=cursor)  # fmt: skip
        seen.extend(r.room_id for r in page.rooms)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected
    activities = [r.latest_activity for r in (await reader.latest_rooms(BOB, room_limit=5)).rooms]
    assert activities == sorted(activities, reverse=True)


# -- members -------------------------------------------------------------------------------


async def test_members_filtered_and_limited_to_what_the_user_saw(
    engine: RoomEngine, reader: RoomReader
) -> None:
    room_id = await _room(engine, BOB)
    await engine.creator.create_event(
        room_id, ALICE, "m.room.history_visibility", {"history_visibility": "joined"},
        state_key="",
    )  # fmt: skip
    leave = await engine.creator.create_event(
        room_id, BOB, "m.room.member", {"membership": "leave"}, state_key=BOB
    )
    await engine.creator.create_event(
        room_id, CAROL, "m.room.member", {"membership": "join"}, state_key=CAROL
    )
    now = await reader.members(ALICE, room_id)
    assert sorted(e["state_key"] for e in now) == [ALICE, BOB, CAROL]
    joined = await reader.members(ALICE, room_id, membership=["join"])
    assert sorted(e["state_key"] for e in joined) == [ALICE, CAROL]
    assert [
        e["state_key"] for e in await reader.members(ALICE, room_id, not_membership=["join"])
    ] == [BOB]
    # Bob left before Carol joined: he sees the members at his leave.
    bobs = await reader.members(BOB, room_id)
    assert sorted(e["state_key"] for e in bobs) == [ALICE, BOB]
    at_leave = await reader.members(ALICE, room_id, at=leave.event.event_id)
    assert sorted(e["state_key"] for e in at_leave) == [ALICE, BOB]
    with pytest.raises(MatrixError) as caught:
        await reader.members("@eve:read.test", room_id)
    assert caught.value.http_status == 403


# -- redactions and backfill -----------------------------------------------------------------


async def test_redaction_before_its_target_and_a_backfilled_target(
    engine: RoomEngine, reader: RoomReader, tmp_path: Path
) -> None:
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    player = Player(engine, key)
    room_id = await _room(engine, BOB)
    tip = (await engine.store.get_forward_extremities(room_id))[0]
    # A message and its redaction; the redaction is stored first.
    message = await player.send(room_id, BOB, "m.room.message", {"body": "x"}, persist=False)
    await player.send(room_id, ALICE, "m.room.redaction", {}, redacts=message.event_id)
    await engine.persister.persist_events([message])
    served = await reader.get_event(BOB, message.event_id)
    assert served is not None and served["content"] == {}
    # A backfilled old message (negative stream ordering), redacted before it arrived.
    old = await player.send(room_id, BOB, "m.room.message", {"body": "old"}, prevs=[tip],
                            persist=False)  # fmt: skip
    await player.send(room_id, ALICE, "m.room.redaction", {}, redacts=old.event_id)
    stored = await engine.persister.persist_events([old], backfilled=True)
    assert stored[0].stream_ordering < 0
    served = await reader.get_event(BOB, old.event_id)
    assert served is not None and served["content"] == {}
    assert "redacted_because" in served["unsigned"]
    # Paging back finds it by its topological position, visibility recorded for it too.
    page = await reader.paginate(BOB, room_id, None, limit=50)
    assert old.event_id in [e["event_id"] for e in page.events]
    assert await reader.is_visible(BOB, old.event_id)


# -- bad input -------------------------------------------------------------------------------


async def test_bad_arguments_are_matrix_errors(engine: RoomEngine, reader: RoomReader) -> None:
    room_id = await _room(engine)
    for call in (
        reader.paginate(ALICE, room_id, None, limit=0),
        reader.paginate(ALICE, room_id, None, limit=10_000),
        reader.paginate(ALICE, room_id, None, direction="x"),  # type: ignore[arg-type]
        reader.context(ALICE, room_id, "$nope"),
        reader.position_of_event(room_id, "$nope"),
        reader.sync(ALICE, None, timeline_limit=0),
    ):
        with pytest.raises(MatrixError) as caught:
            await call
        assert caught.value.http_status in (400, 404)
