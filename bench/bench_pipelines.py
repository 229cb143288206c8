"""Pipelines benchmark: streaming source throughput and commit-to-view latency.

    .venv/bin/python bench/bench_pipelines.py [--rows 200000] [--latency-samples 40]

1. Source throughput: ``rows`` facts prepared in SQLite (events stream, two writers),
   read by a streaming query with ``trigger(availableNow)`` into Spark's ``noop`` sink.
   Reported: facts/s over the query's own batch durations (``triggerExecution``), and over
   the wall time including query start-up.
2. Commit-to-view latency: a running views query (``processingTime`` 100 ms); a writer
   commits one message, and we time until ``view_user_stats`` shows it. p50 / p99.

Writes ``bench/results/pipelines.json`` with machine information (load average included:
the numbers depend on what else the machine runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyspark  # noqa: E402
from tests.support.pipelines import events_generator, message, write_events  # noqa: E402

from roomstream.pipelines.session import spark_session  # noqa: E402
from roomstream.pipelines.views import ViewsSink, start_views_query  # noqa: E402
from roomstream.storage import DatabaseConfig, connect, prepare_database  # noqa: E402

TARGET_FACTS_PER_S = 200_000
TARGET_P50_S = 2.0


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "spark_master": "local[2]",
    }


def prepare_rows(path: str, rows: int) -> None:
    asyncio.run(_migrate(path))
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " sender, origin_server_ts, received_ts, instance_name)"
            " VALUES (?, ?, ?, ?, 'm.room.message', ?, ?, ?, ?)",
            (
                (i, i, f"$e{i}", f"!room{i % 500}", f"@u{i % 5000}", 1_700_000_000_000 + i,
                 1_700_000_000_000 + i, "w1" if i % 2 else "w2")
                for i in range(1, rows + 1)
            ),
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
            " VALUES ('events', ?, ?)",
            [("w1", rows), ("w2", rows)],
        )
    conn.close()


async def _migrate(path: str) -> None:
    db = connect(DatabaseConfig(engine="sqlite", path=path))
    try:
        await prepare_database(db)
    finally:
        await db.close()


def bench_source(spark: Any, tmp: str, rows: int, runs: int = 2) -> dict[str, Any]:
    path = os.path.join(tmp, "source.db")
    prepare_rows(path, rows)
    loadavg_before = list(os.getloadavg())
    results = []
    for run in range(runs):
        started = time.perf_counter()
        query = (
            spark.readStream.format("roomstream")
            .option("stream", "events")
            .option("path", path)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", os.path.join(tmp, f"ckpt-source-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(timeout=600)
            wall = time.perf_counter() - started
            progress = [p for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()
        got = sum(int(p["numInputRows"]) for p in progress)
        batch_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        results.append(
            {"rows": got, "batches": len(progress), "batch_seconds": batch_s, "wall_seconds": wall}
        )
    best = min(results, key=lambda r: r["batch_seconds"])
    return {
        "rows": rows,
        "loadavg_before": loadavg_before,
        "runs": results,
        "facts_per_second_batches": best["rows"] / best["batch_seconds"],
        "facts_per_second_wall": best["rows"] / best["wall_seconds"],
        "target_facts_per_second": TARGET_FACTS_PER_S,
    }


async def bench_latency(spark: Any, tmp: str, samples: int) -> dict[str, Any]:
    config = DatabaseConfig(engine="sqlite", path=os.path.join(tmp, "latency.db"))
    db = connect(config)
    await prepare_database(db)
    gen = await events_generator(db, "w1", ["w1"])
    await write_events(db, gen, [message("!r", "@warmup")])
    sink = ViewsSink(config)
    query, _ = start_views_query(
        spark,
        config,
        os.path.join(tmp, "ckpt-views"),
        sink=sink,
        processing_time="100 milliseconds",
    )
    latencies = []
    loadavg_before = list(os.getloadavg())
    try:
        query.processAllAvailable()

        def seen_txn(txn: Any, user: str) -> bool:
            row = txn.query_one(
                "SELECT events_sent FROM view_user_stats WHERE user_id = ?", (user,)
            )
            return row is not None and int(row[0]) >= 1

        for i in range(samples):
            user = f"@lat{i}"
            await write_events(db, gen, [message("!r", user)])
            committed = time.perf_counter()  # rows committed and position stored
            deadline = committed + 60
            while not await db.run_interaction("seen", seen_txn, user):
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{user} not in the view after 60 s")
                await asyncio.sleep(0.01)
            latencies.append(time.perf_counter() - committed)
    finally:
        query.stop()
        sink.close()
        await db.close()
    latencies.sort()
    p99_index = min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))
    return {
        "samples": len(latencies),
        "loadavg_before": loadavg_before,
        "trigger": "processingTime 100 ms",
        "p50_seconds": statistics.median(latencies),
        "p99_seconds": latencies[p99_index],
        "max_seconds": latencies[-1],
        "target_p50_seconds": TARGET_P50_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument("--out", help="results file (default bench/results/pipelines.json)")
    parser.add_argument("--quick", action="store_true", help="50,000 rows, 10 latency samples")
    args = parser.parse_args()
    if args.quick:
        args.rows = min(args.rows, 50_000)
        args.latency_samples = min(args.latency_samples, 10)
    name = "pipelines.quick.json" if args.quick else "pipelines.json"
    args.out = args.out or str(ROOT / "bench" / "results" / name)
    info = machine()
    started = time.perf_counter()
    spark = spark_session("local[2]", app_name="roomstream-bench")
    info["session_start_seconds"] = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        source = bench_source(spark, tmp, args.rows)
        latency = asyncio.run(bench_latency(spark, tmp, args.latency_samples))
    spark.stop()
    info["loadavg_at_end"] = list(os.getloadavg())
    result = {"machine": info, "source_throughput": source, "commit_to_view_latency": latency}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
