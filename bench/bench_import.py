"""Bulk import throughput: events/s end to end (generation excluded), SQLite and PostgreSQL.

Usage::

    python bench/bench_import.py [--quick] [--events N] [--engines sqlite,postgres]

Generates a corpus once into ``bench/data/`` (reused by later runs with the same size and
seed; the directory should be git-ignored), starts one local Spark session (its start-up
is reported, and added to each engine's ``wall_seconds``), then times
:func:`roomstream.pipelines.importer.import_events` into a fresh database per engine:
reading, keying, the Spark tasks running the online persistence path, and the load into
the target. ``--quick`` uses 100,000 events.

Besides the end-to-end figure it measures the CPU cost per event of the online persistence
path alone (one process, no Spark, a sample of rooms) so the result can be read against
the machine: with ``c`` cores the Spark phase cannot beat ``c / cpu_per_event``. With
``--profile`` it prints the top functions of that sample under cProfile.

Writes ``bench/results/import.json`` (``import.quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import common  # type: ignore[import-not-found]
from roomstream.devtools.corpus import CorpusSpec, generate_corpus
from roomstream.pipelines.import_task import TaskSettings, key_line, persist_rooms
from roomstream.pipelines.importer import import_events
from roomstream.pipelines.session import spark_session
from roomstream.rooms.keys import load_keys_file
from roomstream.storage import DatabaseConfig

DATA_DIR = common.BENCH_DIR / "data"


#: Bumped when the generator's output changes (g2: soft-failed messages, double redactions).
GENERATOR = "g2"


def corpus_path(events: int, seed: int) -> Path:
    return DATA_DIR / f"corpus-{events}-seed{seed}-{GENERATOR}.jsonl"


def ensure_corpus(events: int, seed: int, workers: int | None) -> tuple[Path, float | None]:
    path = corpus_path(events, seed)
    if path.exists() and path.with_name(path.name + ".meta.json").exists():
        return path, None
    print(f"generating {events:,} events into {path} ...", flush=True)
    stats = generate_corpus(path, CorpusSpec(events=events, seed=seed), workers=workers)
    print(f"  {stats.rooms:,} rooms, {stats.forks:,} forks in {stats.seconds:.1f} s", flush=True)
    return path, stats.seconds


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def persist_cpu_sample(path: Path, sample_events: int, profile: bool) -> dict[str, Any]:
    """CPU seconds per event of the online persistence path (one process, no Spark)."""
    rooms: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    with path.open("rb") as f:
        for index, raw in enumerate(f):
            room, row = key_line((raw.rstrip(b"\n"), index))
            rooms[room].append(row)
    chosen: dict[str, list[tuple[int, bytes]]] = {}
    total = 0
    for room in sorted(rooms, key=lambda r: (len(rooms[r]), r)):  # small rooms first
        if total >= sample_events:
            break
        if len(rooms[room]) > sample_events // 2:
            continue
        chosen[room] = rooms[room]
        total += len(rooms[room])
    scratch = tempfile.mkdtemp(prefix="bench-import-sample-")
    try:
        settings = TaskSettings(
            source=str(path),
            work_dir=scratch,
            instance_name="main",
            verify_keys=load_keys_file(f"{path}.keys.json"),
        )
        profiler = cProfile.Profile() if profile else None
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = asyncio.run(persist_rooms(os.path.join(scratch, "sample.db"), chosen, settings))
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out: dict[str, Any] = {
        "events": result.events,
        "rooms": len(chosen),
        "cpu_seconds": round(cpu, 3),
        "wall_seconds": round(wall, 3),
        "cpu_us_per_event": round(cpu / max(result.events, 1) * 1e6, 1),
    }
    if profiler is not None:
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(25)
        out["profile_top"] = buffer.getvalue()
        print(buffer.getvalue())
    return out


def run_engine(
    engine: str, path: Path, spark: Any, partitions: int | None, spark_start: float
) -> dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="bench-import-")
    pg_name = None
    try:
        if engine == "sqlite":
            target = DatabaseConfig(engine="sqlite", path=os.path.join(scratch, "target.db"))
        else:
            pg_name = f"roomstream_bench_import_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(pg_name)))
            base = common.PG_ADMIN_DSN.rpartition("/")[0]
            target = DatabaseConfig(engine="postgres", dsn=f"{base}/{pg_name}")
        load_before = load_average()
        cpu = time.process_time()
        report = import_events(
            path,
            target,
            spark=spark,
            partitions=partitions,
            verify_keys=load_keys_file(f"{path}.keys.json"),
        )
        result = report.summary()
        # As `roomstream import` would see it: Spark's start plus the import.
        result["spark_start_seconds"] = round(spark_start, 2)
        result["wall_seconds"] = round(spark_start + report.seconds, 2)
        result["wall_events_per_second"] = round(report.events / result["wall_seconds"], 1)
        result["driver_cpu_seconds"] = round(time.process_time() - cpu, 2)
        result["load_average_before"] = load_before
        result["load_average_after"] = load_average()
        print(
            f"{engine:8s} {report.events:,} events in {report.seconds:.1f} s ="
            f" {common.fmt_rate(report.events_per_second)} events/s; wall"
            f" {result['wall_seconds']:.1f} s with Spark's start ="
            f" {common.fmt_rate(result['wall_events_per_second'])} events/s"
            f" (Spark {report.spark_seconds:.1f} s, load {report.load_seconds:.1f} s;"
            f" rejected {report.rejected:,}, invalid {report.invalid:,})",
            flush=True,
        )
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if pg_name is not None:
            with psycopg.connect(common.PG_ADMIN_DSN, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(pg_name)
                    )
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events")
    parser.add_argument("--events", type=int, help="corpus size (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None, help="generator processes")
    parser.add_argument("--sample", type=int, default=20_000, help="events in the CPU sample")
    parser.add_argument("--profile", action="store_true", help="cProfile the CPU sample")
    args = parser.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]

    info = common.machine_info()
    print(common.describe_machine(info), flush=True)
    path, generation_seconds = ensure_corpus(events, args.seed, args.workers)

    started = time.perf_counter()
    spark = spark_session(
        args.master,
        app_name="roomstream-bench-import",
        conf={"spark.ui.showConsoleProgress": "false"},
    )
    spark_start = time.perf_counter() - started

    results: dict[str, Any] = {
        "events": events,
        "corpus": str(path),
        "corpus_bytes": path.stat().st_size,
        "generation_seconds": generation_seconds,
        "spark_master": args.master,
        "spark_start_seconds": round(spark_start, 2),
        "target_events_per_second": 20_000,
        "engines": {},
    }
    results["persist_cpu_sample"] = persist_cpu_sample(path, args.sample, args.profile)
    per_event = results["persist_cpu_sample"]["cpu_us_per_event"]
    cores = os.cpu_count() or 1
    results["persist_ceiling_events_per_second"] = round(cores / (per_event / 1e6))
    print(
        f"online persistence path: {per_event} µs CPU per event -> at most"
        f" {results['persist_ceiling_events_per_second']:,} events/s on {cores} cores",
        flush=True,
    )
    try:
        for engine in engines:
            results["engines"][engine] = run_engine(
                engine, path, spark, args.partitions, spark_start
            )
    finally:
        spark.stop()
    out = common.write_results("import", results, args.quick)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
