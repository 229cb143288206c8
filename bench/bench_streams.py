"""Streams benchmarks: reserving stream IDs, position bookkeeping, reading updates.

Three areas, each on SQLite (a file in a temporary directory) and PostgreSQL (a throwaway
database ``roomstream_bench_<pid>``, dropped afterwards):

1. ``reserve``: reserve+complete throughput of :class:`StreamIdGenerator` in facts/s, with
   1 writer and with 4 writers (4 generators with different instance names sharing one
   :class:`Database` and one writer list, driven concurrently on one event loop, each
   stored position announced to the other three as replication would). Single
   reservations (``reserve()``) and batched ones (``reserve_many(n)``), each either
   writing one ``cache_invalidations`` row per fact (one batched insert per reservation)
   or reserving IDs only.
2. ``bookkeeping``: :class:`StreamPositionTracker` alone, no database: fetch_started /
   fetch_finished / complete with out-of-order completion, two fetches overlapping, IDs
   interleaved with other writers' and three remote writers advancing; ns per fact, with
   the cost of the driving loop itself measured separately and subtracted.
3. ``get_updates``: ``get_updates_txn`` paging through one writer's rows (of four) with
   limits 1,000 and 10,000, on the caches stream (one table) and the events stream
   (``events`` merged with ``current_state_delta_stream``); rows/s.

Run ``python bench/bench_streams.py [--quick]``; results go to
``bench/results/streams.json`` (``streams.quick.json`` in quick mode).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from common import (
    PG_ADMIN_DSN,
    describe_machine,
    fmt_rate,
    machine_info,
    markdown_table,
    rate,
    settle_database,
    write_results,
)
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.storage.engines import EngineName
from roomstream.streams import StreamIdGenerator, StreamPositionTracker
from roomstream.streams.registry import CACHES, EVENTS, StreamDefinition, get_updates_txn

ENGINES: tuple[EngineName, ...] = ("sqlite", "postgres")
TARGET_RESERVE_BATCHED = 50_000.0  # facts/s, PostgreSQL, reserve_many
TARGET_BOOKKEEPING_NS = 10_000.0  # ns per fact
TARGET_GET_UPDATES = 200_000.0  # rows/s
BENCH_WRITERS = 4


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does (total facts across all writers)."""

    facts_single: int
    facts_batched: dict[int, int]
    bookkeeping_facts: int
    fill_rows: int
    repeats: int


FULL = Sizes(
    facts_single=4_000,
    facts_batched={100: 100_000, 1000: 400_000},
    bookkeeping_facts=400_000,
    fill_rows=500_000,
    repeats=3,
)
QUICK = Sizes(
    facts_single=400,
    facts_batched={100: 10_000, 1000: 40_000},
    bookkeeping_facts=60_000,
    fill_rows=100_000,
    repeats=1,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- databases -------------------------------------------------------------------------


def _pg_dsn(dbname: str) -> str:
    base, _, _ = PG_ADMIN_DSN.rpartition("/")
    return f"{base}/{dbname}"


@dataclass
class BenchDatabase:
    """A prepared database under test, with what is needed to settle it between runs."""

    db: Database
    engine: EngineName
    dsn: str | None = None  # PostgreSQL only

    async def settle(self) -> None:
        """After bulk writes: fresh statistics, and (PostgreSQL) a vacuum and a checkpoint.

        Without it, autovacuum, hint-bit writes and a checkpoint land in the middle of the
        next measurement on this 2-core machine and make it noisy.
        """
        await settle_database(self.db, self.dsn)


@asynccontextmanager
async def open_database(engine: EngineName, workdir: Path) -> AsyncIterator[BenchDatabase]:
    """A fresh, migrated database on ``engine``; a PostgreSQL one is dropped afterwards."""
    if engine == "sqlite":
        db = connect(DatabaseConfig(engine="sqlite", path=str(workdir / "bench.db")))
        try:
            await prepare_database(db)
            yield BenchDatabase(db, engine)
        finally:
            await db.close()
        return
    name = f"roomstream_bench_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(drop)
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = _pg_dsn(name)
        db = connect(DatabaseConfig(engine="postgres", dsn=dsn, pool_min=2, pool_max=8))
        try:
            await prepare_database(db)
            yield BenchDatabase(db, engine, dsn)
        finally:
            await db.close()
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(drop)


def _reset_caches_txn(txn: Transaction) -> None:
    verb = "TRUNCATE" if txn.engine_name == "postgres" else "DELETE FROM"
    txn.execute(f"{verb} cache_invalidations")
    txn.execute("DELETE FROM stream_positions")


# -- 1. reserve + complete -------------------------------------------------------------


def _write_cache_rows_txn(txn: Transaction, ids: list[int], writer: str) -> None:
    now = int(time.time() * 1000)
    txn.executemany(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) VALUES (?, ?, ?, ?, ?)",
        [(i, writer, "get_user_by_id", f'["@user{i}:bench"]', now) for i in ids],
    )


def _count_rows_txn(txn: Transaction) -> int:
    return int(txn.query_one("SELECT COUNT(*) FROM cache_invalidations")[0])


def _announcer(others: list[StreamIdGenerator]) -> Callable[[str, int], None]:
    """A position listener standing in for replication: tell the other writers."""

    def announce(writer: str, position: int) -> None:
        for other in others:
            other.advance(writer, position)

    return announce


async def _drive_writer(
    db: Database, gen: StreamIdGenerator, facts: int, batch: int, with_rows: bool
) -> None:
    writer = gen.instance_name
    for _ in range(facts // batch):
        if batch == 1:
            async with gen.reserve() as stream_id:
                if with_rows:
                    await db.run_interaction(
                        "write_cache_rows", _write_cache_rows_txn, [stream_id], writer
                    )
        else:
            async with gen.reserve_many(batch) as ids:
                if with_rows:
                    await db.run_interaction("write_cache_rows", _write_cache_rows_txn, ids, writer)


async def bench_reserve_case(
    target: BenchDatabase, writers: int, batch: int, total_facts: int, with_rows: bool
) -> dict[str, Any]:
    db = target.db
    await db.run_interaction("reset_caches", _reset_caches_txn)
    await target.settle()
    names = [f"w{i}" for i in range(writers)]
    gens = [
        await StreamIdGenerator.create(
            db, CACHES.name, CACHES.sequence, CACHES.table_refs, names, name
        )
        for name in names
    ]
    for gen in gens:
        gen.add_position_listener(_announcer([o for o in gens if o is not gen]))
    per_writer = max(batch, total_facts // writers // batch * batch)
    # Warm-up: one reservation per writer (connections, prepared plans, first positions).
    await asyncio.gather(*(_drive_writer(db, g, batch, batch, with_rows) for g in gens))
    started = time.perf_counter()
    await asyncio.gather(*(_drive_writer(db, g, per_writer, batch, with_rows) for g in gens))
    seconds = time.perf_counter() - started
    facts = per_writer * writers

    # Sanity: once idle writers have stored and announced their positions (as they do
    # periodically), everyone's linear position reaches the top; all rows are there.
    for _ in range(2):
        for gen in gens:
            await gen.store_local_position()
    linear = {g.get_linear_position() for g in gens}
    top = max(g.tracker.max_seen for g in gens)
    if linear != {top}:
        raise AssertionError(f"linear positions {linear} did not all reach {top}")
    if with_rows:
        rows = await db.run_interaction("count_rows", _count_rows_txn)
        if rows != facts + batch * writers:
            raise AssertionError(f"expected {facts + batch * writers} rows, found {rows}")
    return {
        "writers": writers,
        "batch": batch,
        "with_rows": with_rows,
        "facts": facts,
        "seconds": round(seconds, 4),
        "facts_per_s": round(rate(facts, seconds), 1),
    }


async def bench_reserve(target: BenchDatabase, sizes: Sizes) -> list[dict[str, Any]]:
    out = []
    for writers in (1, BENCH_WRITERS):
        for batch, total in ((1, sizes.facts_single), *sizes.facts_batched.items()):
            for with_rows in (True, False):
                case = await bench_reserve_case(target, writers, batch, total, with_rows)
                log(
                    f"  reserve writers={writers} batch={batch} rows={with_rows}:"
                    f" {fmt_rate(case['facts_per_s'])} facts/s"
                )
                out.append(case)
    return out


# -- 2. bookkeeping --------------------------------------------------------------------


class _NullTracker:
    """Same interface as the tracker, doing nothing: measures the driving loop alone."""

    def fetch_started(self) -> int:
        return 0

    def fetch_finished(self, token: int, ids: list[int]) -> None:
        return None

    def complete(self, ids: list[int]) -> None:
        return None

    def advance(self, writer: str, position: int) -> bool:
        return False


@dataclass(frozen=True)
class _Script:
    """Precomputed randomness so the timed loop only calls the tracker."""

    batch: int
    reservations: int
    id_blocks: list[list[int]]
    picks: list[int]


WINDOW = 16  # reservations in flight at once (open "async with" blocks)
OVERLAP = 2  # fetches under way at once
REMOTE_EVERY = 4  # a remote writer announces a position every 4 reservations
REMOTES = ("r1", "r2", "r3")


def _make_script(facts: int, batch: int, seed: int) -> _Script:
    rng = random.Random(seed)
    reservations = facts // batch
    blocks: list[list[int]] = []
    next_id = 1
    for _ in range(reservations):
        blocks.append(list(range(next_id, next_id + batch)))
        # The other three writers take IDs from the same sequence in between.
        next_id += batch + rng.randrange(0, 3 * batch + 1)
    picks = [rng.randrange(1 << 30) for _ in range(reservations)]
    return _Script(batch, reservations, blocks, picks)


def _drive_tracker(tracker: Any, script: _Script) -> int:
    """Run the script against ``tracker``; returns elapsed nanoseconds."""
    blocks, picks = script.id_blocks, script.picks
    pending: list[tuple[int, list[int]]] = []
    open_blocks: list[list[int]] = []
    lag = WINDOW * script.batch * 4
    gc.collect()
    started = time.perf_counter_ns()
    for step in range(script.reservations):
        pending.append((tracker.fetch_started(), blocks[step]))
        if len(pending) >= OVERLAP:
            token, ids = pending.pop(0)
            tracker.fetch_finished(token, ids)
            open_blocks.append(ids)
        if len(open_blocks) >= WINDOW:
            # Complete a random open reservation: out-of-order completion.
            i = picks[step] % len(open_blocks)
            open_blocks[i], open_blocks[-1] = open_blocks[-1], open_blocks[i]
            tracker.complete(open_blocks.pop())
        if step % REMOTE_EVERY == 0:
            tracker.advance(REMOTES[step % 3], blocks[step][0] - lag)
    for token, ids in pending:
        tracker.fetch_finished(token, ids)
        open_blocks.append(ids)
    for ids in reversed(open_blocks):
        tracker.complete(ids)
    return time.perf_counter_ns() - started


def _new_tracker() -> StreamPositionTracker:
    writers = ["local", *REMOTES]
    return StreamPositionTracker(writers, "local", dict.fromkeys(writers, 0), 0)


def bench_bookkeeping(sizes: Sizes) -> list[dict[str, Any]]:
    out = []
    for batch in (1, 100):
        script = _make_script(sizes.bookkeeping_facts, batch, seed=batch)
        facts = script.reservations * batch
        gross, base = [], []
        for _ in range(max(3, sizes.repeats)):
            tracker = _new_tracker()
            gross.append(_drive_tracker(tracker, script))
            base.append(_drive_tracker(_NullTracker(), script))
            expected = script.id_blocks[-1][-1]
            if tracker.position("local") != expected:
                raise AssertionError(f"local position {tracker.position('local')} != {expected}")
        gross_ns = min(gross) / facts
        base_ns = min(base) / facts
        case = {
            "batch": batch,
            "facts": facts,
            "window": WINDOW,
            "ns_per_fact": round(gross_ns - base_ns, 1),
            "ns_per_fact_including_driver": round(gross_ns, 1),
            "driver_ns_per_fact": round(base_ns, 1),
            "ns_per_reservation": round((gross_ns - base_ns) * batch, 1),
        }
        log(f"  bookkeeping batch={batch}: {case['ns_per_fact']} ns/fact")
        out.append(case)
    return out


# -- 3. get_updates --------------------------------------------------------------------

# Rows come from 4 writers in runs of 3 consecutive IDs: w0 w0 w0 w1 w1 w1 ...
_SERIES = {
    "postgres": "FROM generate_series(1, ?) AS s(g)",
    "sqlite": "FROM (WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < ?)"
    " SELECT g FROM s)",
}
_WRITER_EXPR = f"'w' || ((g / 3) % {BENCH_WRITERS})"


def _fill_caches_txn(txn: Transaction, rows: int) -> None:
    verb = "TRUNCATE" if txn.engine_name == "postgres" else "DELETE FROM"
    txn.execute(f"{verb} cache_invalidations")
    txn.execute(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        f" invalidation_ts) SELECT g, {_WRITER_EXPR}, 'get_user_by_id',"
        f" '[\"@user' || g || ':bench\"]', 1700000000000 + g {_SERIES[txn.engine_name]}",
        (rows,),
    )


def _fill_events_txn(txn: Transaction, rows: int) -> None:
    """``rows`` events, every fifth a membership event with one current-state delta."""
    txn.execute(
        "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
        " state_key, sender, redacts, relates_to, membership, outlier, rejected_reason,"
        " soft_failed, origin_server_ts, received_ts, instance_name)"
        " SELECT g, g, '$event' || g || ':bench', '!room' || (g % 100) || ':bench',"
        " CASE WHEN g % 5 = 0 THEN 'm.room.member' ELSE 'm.room.message' END,"
        " CASE WHEN g % 5 = 0 THEN '@user' || g || ':bench' END,"
        " '@user' || (g % 50) || ':bench', NULL,"
        " CASE WHEN g % 7 = 0 THEN '$event' || (g - 1) || ':bench' END,"
        " CASE WHEN g % 5 = 0 THEN 'join' END, FALSE, NULL, FALSE,"
        f" 1700000000000 + g, 1700000000000 + g, {_WRITER_EXPR} {_SERIES[txn.engine_name]}",
        (rows,),
    )
    txn.execute(
        "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type,"
        " state_key, event_id, prev_event_id)"
        " SELECT stream_ordering, instance_name, room_id, type, state_key, event_id, NULL"
        " FROM events WHERE state_key IS NOT NULL"
    )


async def _page_through(
    db: Database, stream: StreamDefinition, writer: str, upto: int, limit: int
) -> tuple[int, int, float]:
    """Read every row of ``writer`` up to ``upto``; (rows, pages, seconds)."""
    rows = pages = 0
    from_token = 0
    started = time.perf_counter()
    while True:
        updates, new_upto, limited = await db.run_interaction(
            "get_updates", get_updates_txn, stream, writer, from_token, upto, limit
        )
        rows += len(updates)
        pages += 1
        if not limited:
            break
        from_token = new_upto
    return rows, pages, time.perf_counter() - started


def _count_txn(txn: Transaction, table: str, writer: str | None) -> int:
    if writer is None:
        return int(txn.query_one(f"SELECT COUNT(*) FROM {table}")[0])
    return int(txn.query_one(f"SELECT COUNT(*) FROM {table} WHERE instance_name = ?", (writer,))[0])


async def bench_get_updates(target: BenchDatabase, sizes: Sizes) -> list[dict[str, Any]]:
    db = target.db
    out = []
    upto = sizes.fill_rows
    for stream, fill in ((CACHES, _fill_caches_txn), (EVENTS, _fill_events_txn)):
        started = time.perf_counter()
        await db.run_interaction("fill", fill, sizes.fill_rows)
        await target.settle()
        seconds = time.perf_counter() - started
        log(f"  filled {stream.name} with {sizes.fill_rows:,} facts in {seconds:.1f} s")
        expected = total_rows = 0
        for table in stream.tables:
            expected += await db.run_interaction("count", _count_txn, table.ref.table, "w0")
            total_rows += await db.run_interaction("count", _count_txn, table.ref.table, None)
        for limit in (1_000, 10_000):
            await _page_through(db, stream, "w0", upto, limit)  # warm the caches
            runs = []
            for _ in range(sizes.repeats):
                rows, pages, seconds = await _page_through(db, stream, "w0", upto, limit)
                if rows != expected:
                    raise AssertionError(f"{stream.name}: read {rows} rows, expected {expected}")
                runs.append(seconds)
            best = min(runs)
            case = {
                "stream": stream.name,
                "tables": [t.ref.table for t in stream.tables],
                "table_rows": total_rows,
                "limit": limit,
                "rows": rows,
                "pages": pages,
                "seconds": round(best, 4),
                "rows_per_s": round(rate(rows, best), 1),
                "runs_s": [round(r, 4) for r in runs],
            }
            log(f"  get_updates {stream.name} limit={limit}: {fmt_rate(case['rows_per_s'])} rows/s")
            out.append(case)
    return out


# -- report ----------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render_markdown(results: dict[str, Any]) -> str:
    parts = []
    rows = []
    for engine in ENGINES:
        for case in results[engine]["reserve"]:
            verdict = ""
            if engine == "postgres" and case["batch"] > 1:
                verdict = _verdict(case["facts_per_s"] >= TARGET_RESERVE_BATCHED)
            rows.append(
                [
                    engine,
                    str(case["writers"]),
                    "reserve()" if case["batch"] == 1 else f"reserve_many({case['batch']})",
                    "with row writes" if case["with_rows"] else "IDs only",
                    f"{case['facts']:,}",
                    fmt_rate(case["facts_per_s"]),
                    verdict,
                ]
            )
    parts.append(
        markdown_table(
            ["engine", "writers", "reservation", "per fact", "facts timed", "facts/s", "≥ 50,000"],
            rows,
        )
    )
    rows = [
        [
            "reserve()" if c["batch"] == 1 else f"reserve_many({c['batch']})",
            f"{c['ns_per_fact'] / 1000:.2f}",
            f"{c['ns_per_reservation'] / 1000:.2f}",
            f"{c['driver_ns_per_fact'] / 1000:.2f}",
            _verdict(c["ns_per_fact"] <= TARGET_BOOKKEEPING_NS),
        ]
        for c in results["bookkeeping"]
    ]
    parts.append(
        markdown_table(
            ["pattern", "µs / fact", "µs / reservation", "driver µs / fact", "target ≤ 10 µs"],
            rows,
        )
    )
    rows = []
    for engine in ENGINES:
        for c in results[engine]["get_updates"]:
            rows.append(
                [
                    engine,
                    c["stream"] + f" ({' + '.join(c['tables'])})",
                    f"{c['limit']:,}",
                    f"{c['rows']:,} / {c['table_rows']:,}",
                    str(c["pages"]),
                    fmt_rate(c["rows_per_s"]),
                    _verdict(c["rows_per_s"] >= TARGET_GET_UPDATES),
                ]
            )
    parts.append(
        markdown_table(
            ["engine", "stream", "limit", "rows read / in tables", "pages", "rows/s", "≥ 200,000"],
            rows,
        )
    )
    return "\n\n".join(parts)


async def run(sizes: Sizes, engines: tuple[EngineName, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    log("bookkeeping (no database)")
    results["bookkeeping"] = bench_bookkeeping(sizes)
    with tempfile.TemporaryDirectory(prefix="roomstream-bench-") as tmp:
        for engine in engines:
            log(f"{engine}")
            async with open_database(engine, Path(tmp)) as target:
                results[engine] = {
                    "reserve": await bench_reserve(target, sizes),
                    "get_updates": await bench_get_updates(target, sizes),
                }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="roomstream streams benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes (well under 2 min)")
    parser.add_argument(
        "--engine", choices=ENGINES, action="append", help="only this engine (repeatable)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    engines = tuple(args.engine) if args.engine else ENGINES
    log(describe_machine(machine_info()))
    started = time.perf_counter()
    results = asyncio.run(run(sizes, engines))
    results["sizes"] = {
        "facts_single": sizes.facts_single,
        "facts_batched": sizes.facts_batched,
        "bookkeeping_facts": sizes.bookkeeping_facts,
        "fill_rows": sizes.fill_rows,
        "repeats": sizes.repeats,
    }
    results["targets"] = {
        "reserve_batched_postgres_facts_per_s": TARGET_RESERVE_BATCHED,
        "bookkeeping_ns_per_fact": TARGET_BOOKKEEPING_NS,
        "get_updates_rows_per_s": TARGET_GET_UPDATES,
    }
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    path = write_results("streams", results, args.quick)
    if set(engines) == set(ENGINES):
        print(render_markdown(results))
    log(f"wrote {path} in {results['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
