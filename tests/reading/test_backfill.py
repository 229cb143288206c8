"""Rebuilding the visibility records from the stored events (``reading/backfill.py``).

Rooms are persisted through the normal write path (``tests/support/reading_scenario.py``: joins,
leaves, invites, kicks, bans, visibility changes, redactions, forks, late chains landing
in the middle); their two tables are snapshotted, wiped and rebuilt. On both engines:

- ``timeline_events`` comes back identical; ``visibility_memberships`` identical where the
  room was persisted in topological order (no fork or late chain), and otherwise the same
  membership for every user at every timeline event (the table's invariant: persisting
  out of order can leave a redundant row that an in-order replay does not write);
- every read then matches the naive oracle (``check_room`` of the property test);
- re-running (missing-only or reset) changes nothing; batches of 1, 3 and a tiny state
  budget give the same rows as one large batch;
- events persisted after the records were lost, before the rebuild (a server that ran
  with empty records) end up right too;
- a database at schema version 4 with events comes out of ``prepare_database`` plus
  ``run_pending`` (what start-up and ``roomstream migrate`` run) with the rows the
  persister wrote, and ``roomstream migrate`` / ``rebuild-visibility`` do so as commands.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomstream.cli import main as cli_main
from roomstream.config import load_config
from roomstream.events.signing import load_or_create_signing_key
from roomstream.homeserver import open_room_engine
from roomstream.reading import RoomReader, read_side_participants
from roomstream.reading.backfill import VisibilityBackfill
from roomstream.reading.visibility import timeline_lock
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.streams import StreamSet
from tests.support.migrations import downgrade_txn
from tests.support.reading_scenario import (
    FIXED,
    SERVER,
    Move,
    PlayedRoom,
    Player,
    check_room,
    scripts,
)

Rows = list[tuple[Any, ...]]


@asynccontextmanager
async def opened(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Player]:
    database = connect(db_config)
    try:
        await prepare_database(database)
        streams = await StreamSet.open(database, "main", {})
        key = load_or_create_signing_key(tmp_path / "keys", SERVER)
        engine = RoomEngine(
            database, streams, SERVER, "main", key, participants=read_side_participants()
        )
        player = Player(engine, key)
        player.rooms = await database.run_interaction(
            "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM rooms")[0]
        )
        yield player
    finally:
        await database.close()


def _tables_txn(txn: Transaction, room_id: str) -> tuple[Rows, Rows]:
    timeline = txn.query(
        "SELECT room_id, topological_ordering, stream_ordering, event_id, instance_name,"
        " visibility, visibility_after, member_user, membership, replaces_state"
        " FROM timeline_events WHERE room_id = ?"
        " ORDER BY topological_ordering, stream_ordering",
        (room_id,),
    )
    members = txn.query(
        "SELECT room_id, user_id, topological_ordering, stream_ordering, membership"
        " FROM visibility_memberships WHERE room_id = ?"
        " ORDER BY user_id, topological_ordering, stream_ordering",
        (room_id,),
    )
    return [tuple(r) for r in timeline], [tuple(r) for r in members]


async def tables(database: Database, room_id: str) -> tuple[Rows, Rows]:
    return await database.run_interaction("tables", _tables_txn, room_id)


async def wipe(database: Database, room_id: str | None = None) -> None:
    def txn(t: Transaction) -> None:
        for table in ("timeline_events", "visibility_memberships"):
            if room_id is None:
                t.execute(f"DELETE FROM {table}")
            else:
                t.execute(f"DELETE FROM {table} WHERE room_id = ?", (room_id,))

    await database.run_interaction("wipe", txn)


def memberships_at_events(timeline: Rows, members: Rows) -> dict[tuple[str, str], str | None]:
    """(user, event) -> the user's membership in the state before the event, as the
    interval rows say (the row with the largest position not after the event)."""
    by_user: dict[str, list[tuple[tuple[int, int], str | None]]] = {}
    for _, user, topo, stream, membership in members:
        by_user.setdefault(user, []).append(((topo, stream), membership))
    result: dict[tuple[str, str], str | None] = {}
    for user, rows in by_user.items():
        rows.sort()
        for row in timeline:
            position, event_id = (row[1], row[2]), row[3]
            current = None
            for at, membership in rows:
                if at > position:
                    break
                current = membership
            result[(user, event_id)] = current
    return result


def in_order(script: Sequence[Move]) -> bool:
    """Persisted in topological order: no event built on an older one."""
    return not any(m[0] in ("fork", "late_chain") for m in script)


async def assert_rebuilt(
    database: Database, played: PlayedRoom, script: Sequence[Move], before: tuple[Rows, Rows]
) -> None:
    timeline, members = await tables(database, played.room_id)
    assert timeline == before[0]
    if in_order(script):
        assert members == before[1]
    assert memberships_at_events(timeline, members) == memberships_at_events(*before)


async def rebuild_and_check(
    player: Player, cases: list[tuple[list[Move], str]], batch_sizes: Sequence[int]
) -> None:
    engine = player.engine
    database = engine.db
    reader = RoomReader.for_engine(engine)
    for script, version in cases:
        played = await player.play(script, version)
        persisted = await tables(database, played.room_id)
        assert persisted[0], "the room has a timeline"
        rebuilt: tuple[Rows, Rows] | None = None
        for batch_size in batch_sizes:
            await wipe(database, played.room_id)
            backfill = VisibilityBackfill(database, batch_size=batch_size, state_budget=5)
            done = await backfill.rebuild_room(played.room_id)
            assert done.events == len(persisted[0])
            await assert_rebuilt(database, played, script, persisted)
            # The same rows whatever the batch size.
            now = await tables(database, played.room_id)
            assert rebuilt is None or now == rebuilt
            rebuilt = now
        # Idempotent: running again records nothing; a reset gives the same rows.
        again = await VisibilityBackfill(database).rebuild_room(played.room_id)
        assert again.events == 0
        assert await tables(database, played.room_id) == rebuilt
        reset = await VisibilityBackfill(database, batch_size=2).rebuild_room(
            played.room_id, reset=True
        )
        assert reset.events == len(persisted[0])
        assert await tables(database, played.room_id) == rebuilt
        # And every read agrees with the oracle.
        await check_room(engine, reader, played)


#: Events that are stored but in no timeline: a message on a branch from before its
#: sender's ban (soft-failed), a join by a banned user (rejected).
OFF_TIMELINE: list[tuple[list[Move], str]] = [
    (
        [("join", "bob"), ("message", "bob"), ("ban", "bob"),
         ("fork", "bob", "message", 1, "shared"), ("message", "alice"),
         ("join", "bob"), ("message", "alice")],
        "12",
    ),
]  # fmt: skip


async def test_fixed_rooms_are_rebuilt(db_config: DatabaseConfig, tmp_path: Path) -> None:
    async with opened(db_config, tmp_path) as player:
        await rebuild_and_check(player, FIXED, (1000, 3, 1))


async def test_events_in_no_timeline_stay_out(db_config: DatabaseConfig, tmp_path: Path) -> None:
    async with opened(db_config, tmp_path) as player:
        await rebuild_and_check(player, OFF_TIMELINE, (1000, 1))
        soft_failed, rejected = await player.engine.db.run_interaction(
            "test_query",
            lambda t: t.query_one(
                "SELECT SUM(CASE WHEN soft_failed THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN rejected_reason IS NULL THEN 0 ELSE 1 END) FROM events"
            ),
        )
        assert (soft_failed, rejected) == (1, 1), "the script stores one of each"


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=scripts, version=st.sampled_from(["10", "12"]), batch=st.integers(1, 4))
def test_rebuilt_rooms_match_the_persisted_records_and_the_oracle(
    db_config: DatabaseConfig, tmp_path: Path, script: list[Move], version: str, batch: int
) -> None:
    async def run() -> None:
        async with opened(db_config, tmp_path) as player:
            await rebuild_and_check(player, [(script, version)], (1000, batch))

    asyncio.run(run())


async def test_events_persisted_after_the_records_were_lost(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    """A server that ran with empty records (upgraded without a backfill) recorded its
    new events on its own; filling in the older ones keeps every read right."""
    async with opened(db_config, tmp_path) as player:
        engine, database = player.engine, player.engine.db
        reader = RoomReader.for_engine(engine)
        for script, version in FIXED:
            played = await player.play(script, version)
            await wipe(database, played.room_id)
            users = played.users
            # New traffic while the old events have no records: a join, messages, a leave.
            for sender, kind in (
                ("eve", "join"),
                ("alice", "message"),
                ("eve", "message"),
                ("bob", "leave"),
                ("alice", "message"),
            ):
                user = users[sender]
                if kind == "message":
                    await player.send(played.room_id, user, "m.room.message", {"body": "new"})
                else:
                    await player.send(
                        played.room_id,
                        user,
                        "m.room.member",
                        {"membership": kind},
                        state_key=user,
                    )
            await VisibilityBackfill(database, batch_size=3).rebuild_room(played.room_id)
            await check_room(engine, reader, played)
            # A reset gives what a clean replay gives: the same membership at each event.
            timeline, members = await tables(database, played.room_id)
            await VisibilityBackfill(database).rebuild_room(played.room_id, reset=True)
            after = await tables(database, played.room_id)
            assert after[0] == timeline
            assert memberships_at_events(*after) == memberships_at_events(timeline, members)


# -- upgrading a database persisted before the visibility tables -------------------------


async def persisted_then_downgraded(
    db_config: DatabaseConfig, tmp_path: Path
) -> tuple[dict[str, tuple[Rows, Rows]], list[str]]:
    """Rooms persisted by today's persister, then the database taken back to schema
    version 4 (events and state, no visibility records); returns the records the
    persister had written, by room, and the rooms that were played in order."""
    async with opened(db_config, tmp_path) as player:
        database = player.engine.db
        records: dict[str, tuple[Rows, Rows]] = {}
        ordered: list[str] = []
        for script, version in FIXED:
            played = await player.play(script, version)
            records[played.room_id] = await tables(database, played.room_id)
            if in_order(script):
                ordered.append(played.room_id)
        await database.run_interaction("downgrade", downgrade_txn, 5)
        versions = await database.run_interaction(
            "test_query", lambda t: t.query("SELECT version FROM schema_version ORDER BY version")
        )
        assert [v[0] for v in versions] == [1, 2, 3, 4]
    return records, ordered


async def assert_upgraded(
    database: Database, records: dict[str, tuple[Rows, Rows]], ordered: list[str]
) -> None:
    for room_id, before in records.items():
        timeline, members = await tables(database, room_id)
        assert timeline == before[0]
        if room_id in ordered:
            assert members == before[1]
        assert memberships_at_events(timeline, members) == memberships_at_events(*before)
    assert await VisibilityBackfill(database).pending_rooms() == 0


async def test_an_old_database_is_rebuilt_when_migrated(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    records, ordered = await persisted_then_downgraded(db_config, tmp_path)
    database = connect(db_config)
    try:
        await prepare_database(database)
        backfill = VisibilityBackfill(database)
        # Migration 7 listed exactly the rooms with events.
        assert await backfill.pending_rooms() == len(records)
        done = await backfill.run_pending()
        assert done.rooms == len(records)
        await assert_upgraded(database, records, ordered)
        # Nothing left to do: a second start finds no room pending.
        assert (await backfill.run_pending()).rooms == 0
    finally:
        await database.close()


async def test_a_new_database_has_nothing_pending(database: Database) -> None:
    assert await VisibilityBackfill(database).pending_rooms() == 0


def _config_file(db_config: DatabaseConfig, tmp_path: Path) -> Path:
    path = tmp_path / "roomstream.yaml"
    if db_config.engine == "sqlite":
        path.write_text(
            f"data_dir: {tmp_path}\ndatabase: {{engine: sqlite, path: {db_config.path}}}\n"
        )
    else:
        path.write_text(
            f"data_dir: {tmp_path}\n"
            f"database: {{engine: postgres, dsn: '{db_config.dsn}', schema: {db_config.schema}}}\n"
        )
    return path


def test_roomstream_migrate_rebuilds_an_old_database(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    records, ordered = asyncio.run(persisted_then_downgraded(db_config, tmp_path))
    config = _config_file(db_config, tmp_path)
    assert cli_main(["-c", str(config), "migrate"]) == 0

    async def check() -> None:
        database = connect(db_config)
        try:
            await assert_upgraded(database, records, ordered)
        finally:
            await database.close()

    asyncio.run(check())


def test_roomstream_rebuild_visibility(db_config: DatabaseConfig, tmp_path: Path) -> None:
    records, ordered = asyncio.run(persisted_then_downgraded(db_config, tmp_path))

    async def upgrade_without_backfill() -> None:
        database = connect(db_config)
        try:
            await prepare_database(database)
            await database.run_interaction(
                "test_query", lambda t: t.execute("DELETE FROM visibility_backfill_rooms")
            )
        finally:
            await database.close()

    asyncio.run(upgrade_without_backfill())
    config = _config_file(db_config, tmp_path)
    first = sorted(records)[0]
    assert cli_main(["-c", str(config), "rebuild-visibility", "--room", first]) == 0

    async def rows() -> dict[str, tuple[Rows, Rows]]:
        database = connect(db_config)
        try:
            return {room: await tables(database, room) for room in records}
        finally:
            await database.close()

    one = asyncio.run(rows())
    assert one[first][0] == records[first][0]
    assert all(one[room] == ([], []) for room in records if room != first)
    assert cli_main(["-c", str(config), "rebuild-visibility", "--batch-size", "2"]) == 0

    async def check() -> None:
        database = connect(db_config)
        try:
            await assert_upgraded(database, records, ordered)
        finally:
            await database.close()

    asyncio.run(check())


async def test_start_up_rebuilds_an_old_database_in_the_background(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    records, ordered = await persisted_then_downgraded(db_config, tmp_path)
    config = load_config(str(_config_file(db_config, tmp_path)))
    engine = await open_room_engine(config)
    try:
        # The visibility rebuild, and the relations and search indexes' (0022 lists the
        # rooms too: tests/client/test_index_backfill.py).
        tasks = {task.get_name(): task for task in engine.background}
        assert set(tasks) == {"visibility-backfill", "index-backfill"}
        done = await tasks["visibility-backfill"]
        assert done.rooms == len(records)
        await assert_upgraded(engine.db, records, ordered)
        assert (await tasks["index-backfill"]).rooms == len(records)
    finally:
        await engine.close()
    # The next start finds nothing to do.
    engine = await open_room_engine(config)
    try:
        assert engine.background == []
    finally:
        await engine.close()


async def test_rebuild_while_the_room_gets_events(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    """The rebuild (one event per transaction) and persists into the same room run at once
    (each on its own database thread); whatever the interleaving, every read is right."""
    async with opened(db_config, tmp_path) as player:
        engine, database = player.engine, player.engine.db
        reader = RoomReader.for_engine(engine)
        script, version = FIXED[0]
        played = await player.play(script, version)
        await wipe(database, played.room_id)
        users = played.users

        async def traffic() -> None:
            for n, (sender, kind) in enumerate(
                [("eve", "join"), ("dave", "join"), ("alice", "message"), ("eve", "message"),
                 ("dave", "leave"), ("alice", "message"), ("eve", "leave"), ("alice", "message")]
            ):  # fmt: skip
                user = users[sender]
                if kind == "message":
                    body = {"body": f"new {n}"}
                    await player.send(played.room_id, user, "m.room.message", body)
                else:
                    content = {"membership": kind}
                    await player.send(
                        played.room_id, user, "m.room.member", content, state_key=user
                    )

        backfill = VisibilityBackfill(database, batch_size=1)
        await asyncio.gather(backfill.rebuild_room(played.room_id), traffic())
        # The persister recorded the new events, the rebuild the old ones: none is left.
        assert (await backfill.rebuild_room(played.room_id)).events == 0
        await check_room(engine, reader, played)


async def test_a_persist_waits_for_a_rebuild_batch(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    """The persister takes the room's timeline lock that each rebuild transaction holds:
    while one holds it, a persist into the room does not commit (on PostgreSQL the two
    would otherwise both append after the same "last event")."""
    async with opened(db_config, tmp_path) as player:
        database = player.engine.db
        played = await player.play([("join", "bob"), ("message", "bob")], "12")
        held, release = threading.Event(), threading.Event()

        def hold(txn: Transaction) -> None:
            txn.lock_exclusively(timeline_lock(played.room_id))
            held.set()
            release.wait(60)

        holder = asyncio.create_task(database.run_interaction("hold", hold))
        assert await asyncio.to_thread(held.wait, 60)
        body = {"body": "waits"}
        send = asyncio.create_task(
            player.send(played.room_id, played.users["alice"], "m.room.message", body)
        )
        finished, _ = await asyncio.wait({send}, timeout=1.0)
        try:
            # Not a timing assumption: with the lock held, it cannot have finished.
            assert not finished
        finally:
            release.set()
            await holder
        event = await send
        timeline, _ = await tables(database, played.room_id)
        assert timeline[-1][3] == event.event_id
