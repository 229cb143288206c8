"""Rebuilding the relations and search indexes (``reading/index_backfill.py``), on both
engines:

- a database taken back to before migrations 0016/0017 (events, no index) comes out of
  start-up (``open_room_engine``: migrate, then the rebuild in the background) with
  exactly the rows the persister had written, and ``/relations``, ``/threads`` and
  ``/search`` answer as before;
- a rebuild over rooms partly indexed writes nothing twice, run again changes nothing,
  and a stopped rebuild resumes from the position it recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from roomstream.config import Config
from roomstream.reading.index_backfill import IndexBackfill, list_rooms_txn
from roomstream.storage import Database, DatabaseConfig, Transaction, connect
from tests.support.client import room_with, send
from tests.support.homeserver import Homeserver, User, make_config, serve_homeserver
from tests.support.migrations import downgrade_txn
from tests.support.relations import relate
from tests.support.wait import wait_for

Rows = dict[str, list[tuple[Any, ...]]]


@asynccontextmanager
async def serving(config: Config) -> AsyncIterator[Homeserver]:
    """The ``homeserver`` fixture's server, for a config a test opens more than once."""
    async with serve_homeserver(config) as server:
        yield server


def _index_txn(txn: Transaction) -> Rows:
    """Both indexes' rows (the search index as event, room and key: its text is stored
    per engine)."""
    return {
        "event_relations": sorted(
            tuple(r)
            for r in txn.query(
                "SELECT event_id, room_id, relates_to_id, relation_type, aggregation_key,"
                " event_type, sender, topological_ordering, stream_ordering FROM event_relations"
            )
        ),
        "threads": sorted(tuple(r) for r in txn.query("SELECT * FROM threads")),
        "event_search": sorted(
            tuple(r) for r in txn.query("SELECT event_id, room_id, key FROM event_search")
        ),
    }


async def index(database: Database) -> Rows:
    return await database.run_interaction("test_query", _index_txn)


class Story:
    """Two rooms with a thread, a reaction, a reference, an edit and searchable text."""

    def __init__(self) -> None:
        self.rooms: list[str] = []
        self.root = self.reply = self.fruit = ""
        self.alice: User | None = None
        self.bob: User | None = None

    async def write(self, hs: Homeserver) -> None:
        alice, bob = self.alice, self.bob = [await hs.register(n) for n in ("alice", "bob")]
        for n in range(2):
            room_id = await room_with(hs, alice, bob)
            self.rooms.append(room_id)
            await hs.ok(
                "PUT", f"/rooms/{room_id}/state/m.room.topic", {"topic": f"topic {n}"},
                token=alice.token,
            )  # fmt: skip
            self.root = await send(hs, alice, room_id, f"thread root {n}")
            for i in range(3):
                self.reply = await relate(
                    hs, bob, room_id, "m.thread", self.root, body=f"reply {n}.{i}"
                )
            await relate(hs, alice, room_id, "m.annotation", self.root, event_type="m.reaction",
                         key="👍")  # fmt: skip
            await relate(hs, bob, room_id, "m.reference", self.root, body="see above")
            await relate(hs, alice, room_id, "m.replace", self.root, body="* edited")
            self.fruit = await send(hs, bob, room_id, f"pineapple number {n}")

    async def check_reads(self, hs: Homeserver) -> None:
        assert self.alice is not None and self.bob is not None
        room_id = self.rooms[-1]
        replies = await hs.ok(
            "GET", f"/rooms/{room_id}/relations/{self.root}/m.thread", token=self.alice.token
        )
        assert replies["chunk"][0]["event_id"] == self.reply
        assert len(replies["chunk"]) == 3
        threads = await hs.ok("GET", f"/rooms/{room_id}/threads", token=self.bob.token)
        assert [e["event_id"] for e in threads["chunk"]] == [self.root]
        found = await hs.ok(
            "POST",
            "/search",
            {"search_categories": {"room_events": {"search_term": "pineapple"}}},
            token=self.alice.token,
        )
        results = found["search_categories"]["room_events"]["results"]
        assert len(results) == 2 and self.fruit in {r["result"]["event_id"] for r in results}


async def test_an_upgraded_database_is_indexed_at_start_up(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    config = make_config(db_config, tmp_path)
    story = Story()
    async with serving(config) as hs:
        await story.write(hs)
        written = await index(hs.engine.db)
    assert len(written["event_relations"]) == 12 and len(written["threads"]) == 2
    assert len(written["event_search"]) == 2 * (1 + 1 + 3 + 1 + 1 + 1)  # topic, messages

    database = connect(db_config)
    try:
        await database.run_interaction("downgrade", downgrade_txn, 16)
        tables = await database.run_interaction(
            "test_query",
            lambda t: t.query(
                "SELECT name FROM sqlite_master WHERE name = 'event_relations'"
                if t.engine_name == "sqlite"
                else "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_name = 'event_relations'"
            ),
        )
        assert tables == []
    finally:
        await database.close()

    async with serving(config) as hs:
        # Migration 0022 listed both rooms; the start-up's background rebuild indexes them.
        backfill = IndexBackfill(hs.engine.db)

        async def done() -> bool:
            return await backfill.pending_rooms() == 0

        await wait_for(done, 60, "the index rebuild")
        assert await index(hs.engine.db) == written
        await story.check_reads(hs)


async def test_a_rebuild_writes_nothing_twice_and_resumes(homeserver: Homeserver) -> None:
    hs = homeserver
    story = Story()
    await story.write(hs)
    database = hs.engine.db
    written = await index(database)
    first, second = story.rooms

    # Everything indexed already: a rebuild of every room (in batches of 2) adds nothing.
    await database.run_interaction("test_list", list_rooms_txn, story.rooms)
    done = await IndexBackfill(database, batch_size=2).run_pending()
    assert done.rooms == 2 and done.events == len(written["event_search"]) + 2  # reactions
    assert await index(database) == written

    # The first room's indexes lost (persisted before 0016/0017), the second's search
    # index too: a rebuild restores exactly them.
    def lose_txn(txn: Transaction) -> None:
        for table in ("event_relations", "threads"):
            txn.execute(f"DELETE FROM {table} WHERE room_id = ?", (first,))
        txn.execute("DELETE FROM event_search WHERE room_id IN (?, ?)", (first, second))

    await database.run_interaction("test_lose", lose_txn)
    await database.run_interaction("test_list", list_rooms_txn, story.rooms)
    await IndexBackfill(database, batch_size=3).run_pending()
    assert await index(database) == written
    assert await IndexBackfill(database).pending_rooms() == 0
    # Run again, unlisted: nothing changes.
    await IndexBackfill(database).rebuild_room(first)
    assert await index(database) == written
    await story.check_reads(hs)

    # A rebuild that stopped after some batches resumes after the position it recorded:
    # what precedes it is not read again.
    await database.run_interaction("test_lose", lose_txn)
    await database.run_interaction("test_list", list_rooms_txn, [second])
    orderings = await database.run_interaction(
        "test_query",
        lambda t: t.query(
            "SELECT stream_ordering FROM events WHERE room_id = ? AND type = 'm.room.message'"
            " ORDER BY stream_ordering",
            (second,),
        ),
    )
    resume_after = int(orderings[-2][0])  # every message but the last
    await database.run_interaction(
        "test_stop",
        lambda t: t.execute(
            "UPDATE index_backfill_rooms SET done_through = ? WHERE room_id = ?",
            (resume_after, second),
        ),
    )
    done = await IndexBackfill(database).run_pending()
    assert done.rooms == 1 and done.events == 1
    searchable = (await index(database))["event_search"]
    assert searchable == [(story.fruit, second, "content.body")]
