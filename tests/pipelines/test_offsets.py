"""The source's offsets and reads without Spark: the reader's methods called directly,
on both engines, against writers driven by real stream ID generators."""

from __future__ import annotations

from typing import Any

import orjson
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from roomstream.pipelines.dbio import options_from_config, read_connection
from roomstream.pipelines.source import (
    RoomstreamStreamReader,
    SourceOptions,
    advance,
    fetch_facts,
)
from roomstream.storage import Database, DatabaseConfig
from roomstream.streams.registry import BACKFILL, CACHES, EVENTS, get_updates_txn
from tests.pipelines.helpers import (
    events_generator,
    insert_events_txn,
    member,
    message,
    write_events,
)
from tests.streams.helpers import caches_generator, write_cache_rows

ALL = ReadAllAvailable()


def reader(config: DatabaseConfig, **options: str) -> RoomstreamStreamReader:
    opts = {"stream": "events", **options_from_config(config), **options}
    return RoomstreamStreamReader(SourceOptions.parse(opts))


def read_all(r: RoomstreamStreamReader, start: dict[str, int], end: dict[str, int]) -> list[Any]:
    rows = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            rows.extend(batch.to_pylist())
    return rows


async def test_batch_stops_below_an_id_in_flight(
    db_config: DatabaseConfig, database: Database
) -> None:
    gen = await events_generator(database, "w1", ["w1"])
    await write_events(database, gen, [message("!r", "@a")])
    low = gen.reserve_many(1)
    (low_id,) = await low.__aenter__()
    high_ids = await write_events(database, gen, [message("!r", "@a")])
    assert high_ids[0] > low_id
    r = reader(db_config)
    end = r.latestOffset({}, ALL)
    assert end == {"w1": low_id - 1}
    assert [row["stream_id"] for row in read_all(r, {}, end)] == [low_id - 1]
    # The lower ID commits: the next batch includes it and the one above it, once each.
    await database.run_interaction(insert_events_txn, "w1", [(low_id, message("!r", "@b"))])
    await low.__aexit__(None, None, None)
    end2 = r.latestOffset(end, ALL)
    assert end2 == {"w1": high_ids[0]}
    assert [row["stream_id"] for row in read_all(r, end, end2)] == [low_id, high_ids[0]]


async def test_linear_and_per_writer_views(db_config: DatabaseConfig, database: Database) -> None:
    a = await events_generator(database, "a", ["a", "b"])
    b = await events_generator(database, "b", ["a", "b"])
    slow = b.reserve_many(1)
    (slow_id,) = await slow.__aenter__()  # b holds the lower ID
    fast_ids = await write_events(database, a, [message("!r", "@a"), message("!r", "@a")])
    linear = reader(db_config).latestOffset({}, ALL)
    per_writer = reader(db_config, view="per_writer").latestOffset({}, ALL)
    assert linear == {"a": slow_id - 1, "b": slow_id - 1}
    assert per_writer["a"] == fast_ids[-1] and per_writer["b"] == slow_id - 1
    assert list(per_writer) == sorted(per_writer)  # stable JSON for Spark
    await slow.__aexit__(None, None, None)
    # b stores only what it knows: its own ID completed (it has not heard of a's IDs).
    linear2 = reader(db_config).latestOffset(linear, ALL)
    assert linear2 == {"a": slow_id, "b": slow_id}
    # Once b writes again, its position passes a's IDs and the linear position follows.
    await write_events(database, b, [message("!r", "@b")])
    linear3 = reader(db_config).latestOffset(linear2, ALL)
    assert linear3 == {"a": fast_ids[-1], "b": fast_ids[-1]}


async def test_crashed_writer_restart_moves_past_dead_id(
    db_config: DatabaseConfig, database: Database
) -> None:
    a = await events_generator(database, "a", ["a", "b"])
    b = await events_generator(database, "b", ["a", "b"])
    await write_events(database, b, [member("!r", "@b", "join")])
    dead = b.reserve_many(1)
    (dead_id,) = await dead.__aenter__()  # b "crashes": this ID never completes
    later = await write_events(database, a, [message("!r", "@a")])
    r = reader(db_config)
    end = r.latestOffset({}, ALL)
    assert end["a"] == end["b"] == dead_id - 1
    # b restarts: a new generator loads, registering a position past the dead ID.
    await events_generator(database, "b", ["a", "b"])
    end2 = r.latestOffset(end, ALL)
    assert end2["a"] >= later[0] and end2["b"] >= later[0]
    tokens = [row["stream_id"] for row in read_all(r, end, end2)]
    assert later[0] in tokens and dead_id not in tokens


async def test_writers_discovered_and_pinned(db_config: DatabaseConfig, database: Database) -> None:
    a = await events_generator(database, "a", ["a"])
    await write_events(database, a, [message("!r", "@a")])
    r = reader(db_config, view="per_writer")
    start = r.latestOffset({}, ALL)
    assert list(start) == ["a"]
    c = await events_generator(database, "c", ["a", "c"])  # a writer added later
    ids = await write_events(database, c, [message("!r", "@c")])
    end = r.latestOffset(start, ALL)
    assert list(end) == ["a", "c"] and end["c"] >= ids[0]
    rows = read_all(r, start, end)
    assert [(x["instance_name"], x["stream_id"]) for x in rows] == [("c", ids[0])]
    # Pinned: only the named writers are read; an unregistered one waits at the sequence.
    pinned = reader(db_config, writers="a,zz").latestOffset({}, ALL)
    assert list(pinned) == ["a", "zz"] and pinned["a"] == pinned["zz"]


async def test_offsets_never_go_back_and_read_limits(
    db_config: DatabaseConfig, database: Database
) -> None:
    assert advance({"a": 5, "b": 9}, {"a": 7, "b": 3}) == {"a": 7, "b": 9}
    gen = await events_generator(database, "w", ["w"])
    ids = await write_events(database, gen, [message("!r", "@a") for _ in range(10)])
    r = reader(db_config)
    capped = r.latestOffset({}, ReadMaxRows(4))
    assert capped == {"w": ids[3]}
    r.prepareForTriggerAvailableNow()  # bound: nothing written after this is read
    await write_events(database, gen, [message("!r", "@a")])
    assert r.latestOffset(capped, ALL) == {"w": ids[-1]}


async def test_reads_equal_get_updates(db_config: DatabaseConfig, database: Database) -> None:
    """Wire rows from the source are exactly what get_updates_txn returns, for a
    two-table stream (events + state), a negative one (backfill) and caches."""
    gen = await events_generator(database, "w", ["w"])
    await write_events(database, gen, [member("!r", "@a", "join"), message("!r", "@a")])
    caches = await caches_generator(database, "w", ["w"])
    async with caches.reserve_many(3) as cache_ids:
        await database.run_interaction(write_cache_rows, cache_ids, "w")

    def backfill_txn(txn: Any) -> None:
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, received_ts, instance_name) VALUES"
            " (-1, 1, '$old1', '!r', 'm.room.message', '@z', 0, 0, 'w'),"
            " (-2, 1, '$old2', '!r', 'm.room.message', '@z', 0, 0, 'w')"
        )

    await database.run_interaction(backfill_txn)
    with read_connection(db_config) as conn:
        for stream in (EVENTS, CACHES, BACKFILL):
            facts = fetch_facts(conn, stream, "w", 0, 1000)
            expected, _, _ = await database.run_interaction(
                get_updates_txn, stream, "w", 0, 1000, 10_000
            )
            got = [(f.token, orjson.loads(orjson.dumps(f.row))) for f in facts]
            assert got == [(t, orjson.loads(orjson.dumps(row))) for t, row in expected]
            assert facts, stream.name
