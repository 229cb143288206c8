"""The views: the streaming job's tables equal a from-scratch rebuild (PostgreSQL through
Spark's JDBC reader, SQLite through the source's batch reader), on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from roomstream.pipelines.views import (
    EventJsonContentLookup,
    MappingContentLookup,
    ViewsSink,
    read_snapshot,
    rebuild_views,
    start_views_query,
)
from roomstream.storage import Database, DatabaseConfig, Transaction
from tests.pipelines.scenario import PRIV, PUB, SOLO, Scenario

pytestmark = pytest.mark.spark


def contents_txn(txn: Transaction) -> dict[str, dict[str, object]]:
    import orjson

    return {
        r[0]: orjson.loads(r[1])["content"]
        for r in txn.query("SELECT event_id, json FROM event_json")
    }


async def test_streaming_views_equal_rebuild(
    spark: SparkSession, db_config: DatabaseConfig, database: Database, tmp_path: Path
) -> None:
    scenario = Scenario(database)
    await scenario.setup()
    sink = ViewsSink(db_config, lookup=EventJsonContentLookup(), parquet_path=str(tmp_path / "pq"))
    query, _ = start_views_query(spark, db_config, str(tmp_path / "ckpt"), sink=sink)
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
    lookup = MappingContentLookup(await database.run_interaction(contents_txn))
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
