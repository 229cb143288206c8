"""The read path's in-memory caches stay within their bounds (issue 17 §3: a reader's
memory under steady traffic levels off): the formatted-event cache and the event cache
never hold more than their size, however many events are served, on both engines; and
the event cache is a least-recently-used map (a property test against a naive list)."""

from __future__ import annotations

from pathlib import Path

from roomstream.events.signing import load_or_create_signing_key
from roomstream.reading import RoomReader, read_side_participants
from roomstream.reading.reader import RoomReader as ReaderClass
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.rooms.store import EventStore
from roomstream.storage import Database
from roomstream.streams import StreamSet
from tests.support.reading_scenario import SERVER

ALICE = f"@alice:{SERVER}"
BOUND = 5
MESSAGES = 4 * BOUND


def test_default_format_cache_is_the_event_cache_size() -> None:
    # The two caches of served events level off together (bench_memory.py).
    import inspect

    reader_default = inspect.signature(ReaderClass.__init__).parameters["format_cache_size"]
    store_default = inspect.signature(EventStore.__init__).parameters["event_cache_size"]
    assert reader_default.default == store_default.default == 20_000


async def test_served_events_are_cached_within_the_bounds(
    database: Database, tmp_path: Path
) -> None:
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    engine = RoomEngine(
        database, streams, SERVER, "main", key, participants=read_side_participants()
    )
    engine.store._events.resize(BOUND)  # the store the reader reads through
    reader = RoomReader.for_engine(engine, include_age=False, format_cache_size=BOUND)
    room_id, _ = await engine.creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
    since = reader.current_token()
    sent = []
    for n in range(MESSAGES):
        created = await engine.creator.create_event(
            room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": f"m{n}"}
        )
        sent.append(created.event.event_id)
    page = await reader.paginate(ALICE, room_id, None, limit=MESSAGES)
    assert len(page.events) == MESSAGES  # all served...
    sync = await reader.sync(ALICE, since)
    assert [e["event_id"] for e in sync.rooms[room_id].events][-3:] == sent[-3:]
    for event_id in sent:
        assert await reader.get_event(ALICE, event_id) is not None
    assert 0 < len(reader.formatter.cache) <= BOUND  # ...and at most BOUND kept
    assert 0 < len(engine.store._events) <= BOUND


async def test_room_locks_are_kept_only_while_in_use(database: Database, tmp_path: Path) -> None:
    """The writer's per-room locks: one lock per room while it is held or awaited, and
    none kept for rooms no longer being written (they grew with every room before)."""
    import asyncio

    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    engine = RoomEngine(
        database, streams, SERVER, "main", key, participants=read_side_participants()
    )
    persister = engine.persister
    for _ in range(3):
        await engine.creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
    assert len(persister._locks) == 0
    first = persister.room_lock("!a:x")
    entered = asyncio.Event()
    order: list[str] = []

    async def second() -> None:
        entered.set()
        async with persister.room_lock("!a:x"):
            order.append("second")

    async with first:
        task = asyncio.create_task(second())
        await entered.wait()
        assert persister.room_lock("!a:x") is first  # the same lock while held
        order.append("first")
    await task
    assert order == ["first", "second"]
    del first
    assert len(persister._locks) == 0
