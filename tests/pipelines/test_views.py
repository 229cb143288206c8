"""The views: the streaming job's tables equal a from-scratch rebuild (PostgreSQL through
Spark's JDBC reader, SQLite through the source's batch reader), on both engines."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from roomstream.pipelines.views import (
    VIEWS_MAX_BATCH_ROWS,
    EventJsonContentLookup,
    MappingContentLookup,
    ViewsSink,
    read_snapshot,
    rebuild_views,
    start_views_query,
    summarize_facts,
)
from roomstream.storage import Database, DatabaseConfig
from tests.support.pipelines import contents_txn
from tests.support.pipelines_scenario import PRIV, PUB, SOLO, Scenario

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("batch_rows", [VIEWS_MAX_BATCH_ROWS, 2], ids=["default", "tiny"])
async def test_streaming_views_equal_rebuild(
    spark: SparkSession,
    db_config: DatabaseConfig,
    database: Database,
    tmp_path: Path,
    batch_rows: int,
) -> None:
    """The driver-side summaries (one Spark job a batch) equal Spark's aggregation in the
    rebuild, whether a step arrives in one micro-batch or is cut into batches of 2 facts."""
    scenario = Scenario(database)
    await scenario.setup()
    sink = ViewsSink(db_config, lookup=EventJsonContentLookup(), parquet_path=str(tmp_path / "pq"))
    query, _ = start_views_query(
        spark, db_config, str(tmp_path / "ckpt"), sink=sink, max_rows_per_batch=batch_rows
    )
    try:
        for i in range(Scenario.STEPS):
            await scenario.step(i)
            query.processAllAvailable()
    finally:
        query.stop()
        sink.close()
    assert len(sink.applied) >= Scenario.STEPS
    streamed = read_snapshot(db_config)

    # The stub lookup (a mapping) gives the same answers as the event_json table.
    lookup = MappingContentLookup(await database.run_interaction("contents", contents_txn))
    rebuilt = rebuild_views(spark, db_config, lookup=lookup, write=False)
    assert rebuilt.snapshot == streamed
    # The rebuild covered exactly what the stream delivered (same linear position).
    assert min(rebuilt.offset.values()) > 0

    stats = streamed.room_stats
    # joined, invited, left, banned, current_state_events, is_public, last_activity_ts
    assert stats[PUB][:6] == (2, 0, 0, 1, 4, True)  # alice, zed; mallory banned
    assert stats[PRIV][:6] == (1, 1, 1, 0, 4, True)  # alice; carol reset to invite; bob left
    assert stats[SOLO][:6] == (1, 0, 0, 0, 1, False)  # topic removed
    assert streamed.user_stats["@alice"] == (2, 7)  # 2 rooms; 3 members + 1 rule + 3 msgs
    assert "@eve" not in streamed.user_stats  # only an outlier and a rejected event
    assert streamed.directory == {"@alice": "Alice in priv", "@zed": "Zed"}
    assert sum(streamed.daily_messages.values()) == 7
    assert streamed.daily_messages[(PUB, "2023-11-14")] == 2

    # Parquet for analysts mirrors the tables.
    directory = spark.read.parquet(str(tmp_path / "pq" / "view_user_directory")).collect()
    assert {r["user_id"]: r["display_name"] for r in directory} == streamed.directory

    # Writing the rebuild replaces the tables with identical contents.
    rebuild_views(spark, db_config, lookup=lookup, write=True)
    assert read_snapshot(db_config) == streamed


def test_summarize_facts_follows_spark_semantics() -> None:
    """Counted events exclude outliers and rejected events (a NULL flag counts as false);
    days are floor(ts / day) (negative timestamps go to the day before 1970); a state
    delta takes its membership from a member event of the same batch, else NULL."""
    day = 86_400_000
    rows = [
        # kind, event_id, room, type, state_key, membership, rejected, outlier, sender, ts, sid
        ("ev", "$m", "!a", "m.room.message", None, None, False, False, "@u", 5, 1),
        ("ev", "$n", "!a", "m.room.message", None, None, None, None, "@u", -5, 2),
        ("ev", "$o", "!a", "m.room.message", None, None, False, True, "@o", 9 * day, 3),
        ("ev", "$r", "!b", "m.room.message", None, None, True, False, "@r", 9 * day, 4),
        ("ev", "$j", "!b", "m.room.member", "@u", "join", False, False, "@u", day + 1, 5),
        ("state", "$j", "!b", "m.room.member", "@u", None, None, None, None, None, 5),
        ("state", "$x", "!b", "m.room.member", "@v", None, None, None, None, None, 6),
        ("state", None, "!c", "m.room.topic", "", None, None, None, None, None, 7),
    ]
    names = (
        "kind", "event_id", "room_id", "event_type", "state_key", "membership", "rejected",
        "outlier", "sender", "origin_server_ts", "stream_id",
    )  # fmt: skip
    types = {"rejected": pa.bool_(), "outlier": pa.bool_(), "origin_server_ts": pa.int64()}
    table = pa.table(
        {
            n: pa.array(
                [r[i] for r in rows], types.get(n, pa.int64() if n == "stream_id" else pa.string())
            )
            for i, n in enumerate(names)
        }
    )
    batch = summarize_facts(table)
    assert sorted(batch.events_sent) == [("@u", 3)]
    assert sorted(batch.daily) == [("!a", -1, 1), ("!a", 0, 1)]
    assert sorted(batch.activity) == [("!a", 5), ("!b", day + 1)]
    assert batch.state == [
        (5, "!b", "m.room.member", "@u", "$j", "join"),
        (6, "!b", "m.room.member", "@v", "$x", None),
        (7, "!c", "m.room.topic", "", None, None),
    ]
    assert sorted(batch.rooms) == ["!a", "!b", "!c"]
