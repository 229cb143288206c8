"""``view_media_stats``: uploads per user and UTC day, derived from the ``media`` table
(uploads are on no stream) by the views sink in each micro-batch's transaction, and
recomputed whole by a rebuild; on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from roomstream.media.metadata import (
    Content,
    complete_pending_txn,
    insert_media_txn,
    insert_pending_txn,
)
from roomstream.pipelines.views import (
    MEDIA_STATS_MARGIN_MS,
    EventJsonContentLookup,
    ViewsSink,
    compute_media_stats_txn,
    day_number,
    media_type_key,
    read_snapshot,
    read_snapshot_txn,
    rebuild_views,
    refresh_media_stats_txn,
    start_views_query,
)
from roomstream.storage import Database, DatabaseConfig, Transaction
from tests.support.pipelines import BASE_TS, DAY_MS
from tests.support.pipelines_scenario import Scenario

ALICE, BOB = "@alice:x", "@bob:x"
DAY0 = "2023-11-14"  # the UTC day of BASE_TS
DAY1 = "2023-11-15"


def content(media_type: str, length: int) -> Content:
    return Content(media_type, "f", length, "0" * 64, None, None, False)


def upload_txn(t: Transaction, media_id: str, user: str, ts: int, media_type: str, n: int) -> None:
    insert_media_txn(t, media_id, user, ts, content(media_type, n), authenticated=True)


async def upload(db: Database, media_id: str, user: str, ts: int, media_type: str, n: int) -> None:
    await db.run_interaction("upload", upload_txn, media_id, user, ts, media_type, n)


def test_media_type_key() -> None:
    assert media_type_key("image/PNG; charset=binary") == "image/png"
    assert media_type_key(" text/plain ") == "text/plain"
    assert media_type_key(None) == "application/octet-stream"
    assert media_type_key("") == "application/octet-stream"


async def test_refresh_counts_completed_uploads_per_user_and_day(database: Database) -> None:
    """Types merge after normalising; pending uploads are not counted until completed; a
    refresh from a day keeps the rows before it and replaces the rest; refreshing again
    changes nothing."""
    await upload(database, "m1", ALICE, BASE_TS, "image/png", 100)
    await upload(database, "m2", ALICE, BASE_TS + 5, "image/PNG; x=y", 20)
    await upload(database, "m3", ALICE, BASE_TS + 6, "image/jpeg", 7)
    await upload(database, "m4", BOB, BASE_TS + DAY_MS, "", 3)
    await database.run_interaction(
        "pending", insert_pending_txn, "p1", BOB, BASE_TS, authenticated=True
    )
    stats = await database.run_interaction("stats", compute_media_stats_txn)
    assert stats == {
        (ALICE, DAY0): (3, 127, {"image/jpeg": 1, "image/png": 2}),
        (BOB, DAY1): (1, 3, {"application/octet-stream": 1}),
    }
    assert await database.run_interaction("refresh", refresh_media_stats_txn) == 2

    # Bob's pending upload completes on day 1; a row for day 0 written now is not seen by
    # a refresh from day 1, which leaves day 0's row as it was.
    done = await database.run_interaction(
        "complete", complete_pending_txn, "p1", BOB, BASE_TS + DAY_MS + 1, content("video/mp4", 50)
    )
    assert done
    await upload(database, "m5", ALICE, BASE_TS + 9, "image/gif", 1)
    day1 = day_number(BASE_TS + DAY_MS)
    for _ in range(2):  # idempotent
        assert await database.run_interaction("refresh", refresh_media_stats_txn, day1) == 1
        snap = await database.run_interaction("snap", read_snapshot_txn)
        assert snap.media_stats == {
            (ALICE, DAY0): (3, 127, {"image/jpeg": 1, "image/png": 2}),
            (BOB, DAY1): (2, 53, {"application/octet-stream": 1, "video/mp4": 1}),
        }
    # A full refresh counts everything.
    await database.run_interaction("refresh", refresh_media_stats_txn)
    snap = await database.run_interaction("snap", read_snapshot_txn)
    types = {"image/gif": 1, "image/jpeg": 1, "image/png": 2}
    assert snap.media_stats[(ALICE, DAY0)] == (4, 128, types)


@pytest.mark.spark
async def test_streamed_media_stats_and_rebuild(
    spark: SparkSession, db_config: DatabaseConfig, database: Database, tmp_path: Path
) -> None:
    """The sink's first batch counts every day (the job may have been down while uploads
    went on); later batches recompute the days from (previous refresh - margin), so an
    upload written now is counted by the next batch, and one whose upload_ts is older than
    that window (a clock skewed beyond the margin) only by the rebuild, which counts every
    upload and leaves the streamed rows as they were otherwise."""
    now = BASE_TS + 10 * DAY_MS
    clock = [now]
    await upload(database, "old1", ALICE, BASE_TS, "image/png", 100)
    await upload(database, "old2", BOB, BASE_TS + DAY_MS, "image/jpeg", 40)
    scenario = Scenario(database)
    await scenario.setup()
    sink = ViewsSink(
        db_config,
        lookup=EventJsonContentLookup(),
        parquet_path=str(tmp_path / "pq"),
        clock=lambda: clock[0],
    )
    query, _ = start_views_query(spark, db_config, str(tmp_path / "ckpt"), sink=sink)
    try:
        await scenario.step(0)
        query.processAllAvailable()
        assert sink.media_refreshed_ms == now
        first = read_snapshot(db_config).media_stats
        assert first == {
            (ALICE, DAY0): (1, 100, {"image/png": 1}),
            (BOB, DAY1): (1, 40, {"image/jpeg": 1}),
        }

        await upload(database, "new1", ALICE, now + 1, "image/png", 9)
        # Within the margin before the last refresh: still counted.
        await upload(database, "new2", BOB, now - MEDIA_STATS_MARGIN_MS // 2, "text/plain", 2)
        await upload(database, "late", BOB, now - 3 * DAY_MS, "image/png", 5)
        clock[0] = now + 60_000
        await scenario.step(1)
        query.processAllAvailable()
    finally:
        query.stop()
        sink.close()
    today = "2023-11-24"
    streamed = read_snapshot(db_config)
    assert streamed.media_stats == {
        **first,
        (ALICE, today): (1, 9, {"image/png": 1}),
        (BOB, today): (1, 2, {"text/plain": 1}),
    }
    parquet = spark.read.parquet(str(tmp_path / "pq" / "view_media_stats")).collect()
    assert {(r["user_id"], r["day"]): (r["uploads"], r["bytes"], dict(r["content_types"]))
            for r in parquet} == streamed.media_stats  # fmt: skip

    rebuilt = rebuild_views(spark, db_config, write=True)
    late = (BOB, "2023-11-21")
    assert rebuilt.snapshot.media_stats == {**streamed.media_stats, late: (1, 5, {"image/png": 1})}
    assert read_snapshot(db_config).media_stats == rebuilt.snapshot.media_stats

    # A new sink's first refresh (here outside a batch, as run_views(once=True) ends) is
    # a full one too.
    fresh = ViewsSink(db_config, sink_name="views-2", clock=lambda: clock[0])
    try:
        fresh.refresh_media_stats()
    finally:
        fresh.close()
    assert read_snapshot(db_config).media_stats == rebuilt.snapshot.media_stats
