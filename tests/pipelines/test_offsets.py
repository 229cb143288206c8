"""The source's offsets and reads without Spark: the reader's methods called directly,
on both engines, against writers driven by real stream ID generators."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from roomstream.pipelines import source
from roomstream.pipelines.dbio import options_from_config, read_connection
from roomstream.pipelines.source import (
    MIN_SPLIT_TOKENS,
    RoomstreamStreamReader,
    SourceOptions,
    advance,
    fetch_batch,
    plan_ranges,
)
from roomstream.storage import Database, DatabaseConfig
from roomstream.streams.registry import BACKFILL, CACHES, EVENTS, get_updates_txn
from tests.support.pipelines import (
    Ev,
    events_generator,
    insert_events_txn,
    member,
    message,
    write_events,
)
from tests.support.streams import caches_generator, write_cache_rows

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
    await database.run_interaction(
        "insert_events", insert_events_txn, "w1", [(low_id, message("!r", "@b"))]
    )
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
        await database.run_interaction("write_cache_rows", write_cache_rows, cache_ids, "w")

    def backfill_txn(txn: Any) -> None:
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, received_ts, instance_name) VALUES"
            " (-1, 1, '$old1', '!r', 'm.room.message', '@z', 0, 0, 'w'),"
            " (-2, 1, '$old2', '!r', 'm.room.message', '@z', 0, 0, 'w')"
        )

    await database.run_interaction("backfill", backfill_txn)
    with read_connection(db_config) as conn:
        for stream in (EVENTS, CACHES, BACKFILL):
            batch = fetch_batch(conn, stream, "w", 0, 1000)
            expected, _, _ = await database.run_interaction(
                "get_updates", get_updates_txn, stream, "w", 0, 1000, 10_000
            )
            got = batch.to_pydict()
            # Byte for byte what replication would send for these rows.
            wire = [orjson.dumps(row).decode() for _, row in expected]
            assert list(zip(got["stream_id"], got["row_json"], strict=True)) == [
                (t, j) for (t, _), j in zip(expected, wire, strict=True)
            ]
            assert batch.num_rows, stream.name


def covered(ranges: list[Any]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for r in ranges:
        out.setdefault(r.writer, []).append((r.lo, r.hi))
    return out


def test_plan_ranges_splits_big_batches_for_every_core() -> None:
    # Two writers, 400k tokens in all: two tasks (one per core), each range covered once.
    big = plan_ranges({}, {"a": 200_000, "b": 200_000}, 1_000_000, min_partitions=2)
    assert covered(big) == {"a": [(0, 200_000)], "b": [(0, 200_000)]}
    # One writer alone is still split across the cores, contiguously.
    one = plan_ranges({"a": 100}, {"a": 200_100}, 1_000_000, min_partitions=2)
    assert covered(one) == {"a": [(100, 100_100), (100_100, 200_100)]}
    # partitionTokens still caps a task.
    capped = plan_ranges({}, {"a": 250_000}, 100_000, min_partitions=2)
    assert covered(capped) == {"a": [(0, 100_000), (100_000, 200_000), (200_000, 250_000)]}
    # A small batch (the latency case) stays one task per writer, however many cores.
    small = plan_ranges({"a": 10, "b": 10}, {"a": 12, "b": 11}, 1_000_000, min_partitions=8)
    assert covered(small) == {"a": [(10, 12)], "b": [(10, 11)]}
    mid = plan_ranges({}, {"a": MIN_SPLIT_TOKENS + 1}, 1_000_000, min_partitions=4)
    assert covered(mid) == {"a": [(0, MIN_SPLIT_TOKENS), (MIN_SPLIT_TOKENS, MIN_SPLIT_TOKENS + 1)]}
    # Writers with nothing new get no task.
    assert plan_ranges({"a": 5}, {"a": 5}, 10, min_partitions=2) == []


def test_partition_options_are_validated() -> None:
    opts = {"stream": "events", "path": "x.db"}
    parsed = SourceOptions.parse({**opts, "minPartitions": "3", "partitionTokens": "7"})
    assert (parsed.min_partitions, parsed.partition_tokens) == (3, 7)
    assert SourceOptions.parse(opts).min_partitions == source.DEFAULT_MIN_PARTITIONS
    for name in ("minPartitions", "partitionTokens"):
        with pytest.raises(ValueError, match=name):
            SourceOptions.parse({**opts, name: "0"})


async def test_typed_columns_agree_with_wire_rows(
    db_config: DatabaseConfig, database: Database
) -> None:
    """The column builders (struct conversion) give the wire row's values, per engine:
    outliers, rejections, memberships, state deltas (with and without an event), quotes,
    control characters and non-ASCII text."""
    gen = await events_generator(database, "w", ["w"])
    evs = [
        member("!r", "@a", "join"),
        Ev("!r", "m.room.message", '@q"uo\\te\n\x01', ts=-5),
        Ev("!r", "m.room.message", "@é✓", outlier=True),
        Ev("!r", "m.room.topic", "@a", state_key="", rejected=True),
        Ev("!r", "m.room.name", "@a", state_key="", prev_event_id="$prev"),
        Ev("!r", "m.room.topic", "@a", state_key="", delta_only=True),
    ]
    await write_events(database, gen, evs)
    with read_connection(db_config) as conn:
        batch = fetch_batch(conn, EVENTS, "w", 0, 1000)
    rows = batch.to_pylist()
    expected, _, _ = await database.run_interaction(
        "get_updates", get_updates_txn, EVENTS, "w", 0, 1000, 100
    )
    assert [(r["stream_id"], r["row_json"]) for r in rows] == [
        (t, orjson.dumps(row).decode()) for t, row in expected
    ]
    assert {r["stream"] for r in rows} == {"events"} and {r["instance_name"] for r in rows} == {"w"}
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ev") == 5 and kinds.count("state") == 3
    for r in rows:
        kind, data = orjson.loads(r["row_json"])
        assert kind == r["kind"]
        if kind == "ev":
            names = ("event_id", "room_id", "event_type", "state_key", "redacts", "relates_to")
            assert data == [*(r[n] for n in names), r["membership"], r["rejected"], r["outlier"]]
            assert r["sender"] is not None and r["origin_server_ts"] is not None
            assert r["prev_event_id"] is None
        else:
            assert data == [r["room_id"], r["event_type"], r["state_key"], r["event_id"]]
            assert r["sender"] is None and r["rejected"] is None
    by_sender = {r["sender"]: r for r in rows if r["kind"] == "ev"}
    assert by_sender['@q"uo\\te\n\x01']["origin_server_ts"] == -5
    assert by_sender["@é✓"]["outlier"] is True and by_sender["@é✓"]["rejected"] is False
    rejected = [r for r in rows if r["kind"] == "ev" and r["rejected"]]
    assert [r["event_type"] for r in rejected] == ["m.room.topic"]
    assert [r["prev_event_id"] for r in rows if r["kind"] == "state"] == [None, "$prev", None]
    # The state delta of an event shares its token and comes after it (table order).
    name_rows = [r for r in rows if r["event_type"] == "m.room.name"]
    assert [r["kind"] for r in name_rows] == ["ev", "state"]
    assert name_rows[0]["stream_id"] == name_rows[1]["stream_id"]


async def test_chunked_reads_equal_one_read(
    db_config: DatabaseConfig, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task reading its range in many small chunks yields the same rows, in the same
    order, as one read of the whole range (chunks are token ranges: an event and its state
    delta share a token, so they are never in different chunks)."""
    gen = await events_generator(database, "w", ["w"])
    evs = [member("!r", f"@u{i}", "join") if i % 3 == 0 else message("!r", "@a") for i in range(20)]
    ids = await write_events(database, gen, evs)
    r = reader(db_config)
    end = r.latestOffset({}, ALL)
    with read_connection(db_config) as conn:
        whole = fetch_batch(conn, EVENTS, "w", 0, end["w"]).to_pylist()
    monkeypatch.setattr(source, "READ_CHUNK_TOKENS", 3)
    (part,) = r.partitions({}, end)
    batches = list(r.read(part))
    assert len(batches) == -(-ids[-1] // 3)  # one record batch per chunk with rows
    assert [row for b in batches for row in b.to_pylist()] == whole
    assert len(whole) == 20 + 7  # every event, and a delta for each membership
