"""Read-path benchmarks (issue 10 §4), on SQLite and PostgreSQL:

1. ``visibility_rows``: a public room with 10,000 members (remote joins, batch-persisted),
   then messages: stored visibility rows per message (``timeline_events`` and
   ``visibility_memberships``), and per join. Target: 0 per-member rows per message.
2. ``sync``: a user in 100 rooms, 3 of which get a message after the token:
   :meth:`RoomReader.sync` from that token, p50/p99. Target p50 <= 1 ms.
3. ``latest``: the latest 20 events of the latest 100 rooms
   (:meth:`RoomReader.latest_rooms`), for a user in 100 rooms and one in 2,000 rooms
   (30 messages per room), without state and with current state. Target p50 <= 10 ms,
   2,000-room user within 2x of the 100-room user.
4. ``paginate``: back pagination, 100 events a page, through a room of 20,000
   messages persisted normally (a member who sees all of it): events/s, first pass
   (events parsed from the database), then the median of 5 passes with the caches warm
   (and the best pass, and events per CPU second); forward too.
5. ``million``: a 1,000,000-event ``joined``-visibility room, for a user who joined at
   event 990,000 and so sees the last 1%: time to the first page and events/s paging back
   until the end (which must not scan the 990,000 events before the join). Building a
   million events through the persister would take most of an hour here, so this room is
   bulk-loaded: ``timeline_events`` (what the reads seek over) and ``events`` rows for
   all million, the user's membership interval, and the stored JSON of the visible 1%
   (the only events this user's reads load).

Run ``python bench/bench_reading.py [--quick] [--engine sqlite|postgres]``; results go
to ``bench/results/reading.json`` (``reading.quick.json`` in quick mode).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench_rooms import (
    ENGINES,
    REMOTE,
    Bench,
    RemoteRoom,
    latency_summary,
    log,
    open_bench,
    persist_in_batches,
    remote_user,
)
from common import describe_machine, fmt_rate, machine_info, markdown_table, rate, write_results
from roomstream.events.model import Event
from roomstream.reading import RoomReader
from roomstream.storage import Transaction
from roomstream.storage.engines import EngineName

TARGET_SYNC_P50_MS = 1.0
TARGET_LATEST_P50_MS = 10.0
TARGET_LATEST_RATIO = 2.0
TARGET_PAGINATE_EVENTS_PER_S = 100_000.0


@dataclass(frozen=True)
class Sizes:
    members: int
    messages: int
    sync_rooms: int
    latest_small: int
    latest_big: int
    messages_per_room: int
    page_room_events: int
    million: int
    samples: int


FULL = Sizes(
    members=10_000,
    messages=1_000,
    sync_rooms=100,
    latest_small=100,
    latest_big=2_000,
    messages_per_room=30,
    page_room_events=20_000,
    million=1_000_000,
    samples=200,
)
QUICK = Sizes(
    members=1_000,
    messages=200,
    sync_rooms=100,
    latest_small=100,
    latest_big=300,
    messages_per_room=25,
    page_room_events=3_000,
    million=100_000,
    samples=40,
)


async def _count(bench: Bench, table: str) -> int:
    row = await bench.db.run_interaction(
        "bench_count_rows", lambda t: t.query_one(f"SELECT COUNT(*) FROM {table}")
    )
    return int(row[0])


# -- 1. visibility rows ----------------------------------------------------------------


async def bench_visibility_rows(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    room = await RemoteRoom.create(bench.engine, bench.remote_key)
    joins = [room.join(remote_user(i)) for i in range(sizes.members)]
    before_joins = {
        t: await _count(bench, t) for t in ("timeline_events", "visibility_memberships")
    }
    join_seconds, _ = await persist_in_batches(bench, joins, 1_000)
    after_joins = {t: await _count(bench, t) for t in before_joins}
    speaker = remote_user(0)
    messages = [room.message(speaker, n) for n in range(sizes.messages)]
    message_seconds, _ = await persist_in_batches(bench, messages, 1_000)
    after_messages = {t: await _count(bench, t) for t in before_joins}
    per_message = {t: (after_messages[t] - after_joins[t]) / sizes.messages for t in before_joins}
    per_join = {t: (after_joins[t] - before_joins[t]) / sizes.members for t in before_joins}
    log(
        f"  {sizes.members} members: per message {per_message}, per join {per_join};"
        f" joins {fmt_rate(rate(sizes.members, join_seconds))}/s,"
        f" messages {fmt_rate(rate(sizes.messages, message_seconds))}/s"
    )
    return {
        "members": sizes.members,
        "messages": sizes.messages,
        "rows_per_message": per_message,
        "member_rows_per_message": per_message["visibility_memberships"],
        "rows_per_join": per_join,
        "persist_joins_per_s": rate(sizes.members, join_seconds),
        "persist_messages_per_s": rate(sizes.messages, message_seconds),
    }


# -- rooms for the sync and latest benchmarks ---------------------------------------------


async def build_rooms(
    bench: Bench, count: int, users: list[str], messages: int, first_user_rooms: int
) -> list[RemoteRoom]:
    """``count`` public rooms; ``users[0]`` joins all, ``users[1:]`` the first
    ``first_user_rooms``; each room then gets ``messages`` messages from ``users[0]``."""
    rooms = []
    pending: list[Event] = []
    for index in range(count):
        room = await RemoteRoom.create(bench.engine, bench.remote_key)
        rooms.append(room)
        pending.append(room.join(users[0]))
        if index < first_user_rooms:
            pending.extend(room.join(u) for u in users[1:])
        pending.extend(room.message(users[0], n) for n in range(messages))
        if len(pending) >= 2_000:
            await persist_in_batches(bench, pending, 2_000)
            pending = []
    await persist_in_batches(bench, pending, 2_000)
    return rooms


#: CPU seconds of this process per timed call, by the last ``_timed`` (SQLite runs in
#: this process, PostgreSQL's server work is not counted). On a machine shared with other
#: work, CPU time says more about the code than wall time does.
LAST_CPU: list[float] = []


async def _timed(samples: int, call: Any) -> list[float]:
    await call()  # warm-up: caches, statement preparation
    seconds = []
    LAST_CPU.clear()
    for _ in range(samples):
        began, cpu = time.perf_counter(), time.process_time()
        await call()
        seconds.append(time.perf_counter() - began)
        LAST_CPU.append(time.process_time() - cpu)
    return seconds


def summary_with_cpu(seconds: list[float]) -> dict[str, Any]:
    out = latency_summary(seconds)
    out["cpu_p50_ms"] = round(sorted(LAST_CPU)[len(LAST_CPU) // 2] * 1000, 4)
    return out


# -- 2. sync -------------------------------------------------------------------------------


async def bench_sync(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    user = remote_user(900_001)
    reader = RoomReader.for_engine(bench.engine)
    rooms = await build_rooms(bench, sizes.sync_rooms, [user], 5, 0)
    await bench.settle()
    since = reader.current_token()
    changed = [rooms[7], rooms[42], rooms[91 % len(rooms)]]
    await persist_in_batches(bench, [r.message(user, 99) for r in changed], 10)
    result = await reader.sync(user, since)
    assert sorted(result.rooms) == sorted(r.room_id for r in changed), "sync found other rooms"
    seconds = await _timed(sizes.samples * 5, lambda: reader.sync(user, since))
    summary = summary_with_cpu(seconds)
    log(f"  sync, {len(rooms)} rooms, 3 changed: p50 {summary['p50_ms']} ms")
    return {"rooms": len(rooms), "changed": 3, **summary, "target_p50_ms": TARGET_SYNC_P50_MS}


# -- 3. latest rooms -----------------------------------------------------------------------


async def bench_latest(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    big, small = remote_user(900_002), remote_user(900_003)
    # A reader running while the rooms fill up (as in a server): its change cache has
    # seen every room's latest event, so it ranks rooms without asking the database.
    running = RoomReader.for_engine(bench.engine)
    await build_rooms(bench, sizes.latest_big, [big, small], sizes.messages_per_room,
                      sizes.latest_small)  # fmt: skip
    await bench.settle()
    out: dict[str, Any] = {"messages_per_room": sizes.messages_per_room}
    # A reader started afterwards has seen none: it reads every room's activity.
    fresh = RoomReader.for_engine(bench.engine)
    for user, rooms in ((small, sizes.latest_small), (big, sizes.latest_big)):
        seconds = await _timed(
            sizes.samples,
            lambda u=user: fresh.latest_rooms(  # type: ignore[misc]
                u, room_limit=100, event_limit=20, state="none"
            ),
        )
        out[f"fresh_reader_{rooms}_rooms"] = summary_with_cpu(seconds)
        p50 = out[f"fresh_reader_{rooms}_rooms"]["p50_ms"]
        log(f"  latest 20 x 100, user in {rooms} rooms, reader started after: p50 {p50} ms")
    reader = running
    for state in ("none", "current"):
        for label, user, rooms in (
            ("small", small, sizes.latest_small),
            ("big", big, sizes.latest_big),
        ):
            page = await reader.latest_rooms(user, room_limit=100, event_limit=20, state=state)
            assert len(page.rooms) == 100 and all(len(r.events) == 20 for r in page.rooms)
            seconds = await _timed(
                sizes.samples,
                lambda u=user, s=state: reader.latest_rooms(  # type: ignore[misc]
                    u, room_limit=100, event_limit=20, state=s
                ),
            )
            summary = summary_with_cpu(seconds)
            out[f"{label}_{state}"] = {"user_rooms": rooms, **summary}
            p50 = summary["p50_ms"]
            log(f"  latest 20 x 100, user in {rooms} rooms, state={state}: p50 {p50} ms")
        out[f"ratio_{state}"] = out[f"big_{state}"]["p50_ms"] / out[f"small_{state}"]["p50_ms"]
    out["target_p50_ms"] = TARGET_LATEST_P50_MS
    out["target_ratio"] = TARGET_LATEST_RATIO
    return out


# -- 4. pagination through a normal room --------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """One pass of back (or forward) pagination to the end of a room."""

    events: int
    seconds: float
    cpu_seconds: float  # this process's CPU time (SQLite's work included, not PostgreSQL's)
    first_page_seconds: float


async def _page_through(reader: RoomReader, user: str, room_id: str, direction: str) -> Pass:
    token = None
    events = 0
    first = 0.0
    began, cpu = time.perf_counter(), time.process_time()
    while True:
        chunk = await reader.paginate(user, room_id, token, direction=direction, limit=100)  # type: ignore[arg-type]
        if not first:
            first = time.perf_counter() - began
        events += len(chunk.events)
        if chunk.end is None:
            break
        token = chunk.end
    return Pass(events, time.perf_counter() - began, time.process_time() - cpu, first)


#: Warm passes per measure: on a machine shared with other work one pass's wall time
#: can be several times another's, so the median pass is reported (and the best).
WARM_PASSES = 5


async def _passes(
    reader: RoomReader, user: str, room_id: str, direction: str, count: int
) -> dict[str, Any]:
    """``count`` passes: events/s of the median pass by wall time (and of the best, and
    by CPU time), time to the first page of the median pass."""
    passes = [await _page_through(reader, user, room_id, direction) for _ in range(count)]
    by_wall = sorted(passes, key=lambda p: p.seconds)
    median = by_wall[len(by_wall) // 2]
    cpu = sorted(p.cpu_seconds for p in passes)[len(passes) // 2]
    return {
        "events": median.events,
        "passes": count,
        "seconds": round(median.seconds, 4),
        "events_per_s": rate(median.events, median.seconds),
        "best_events_per_s": rate(by_wall[0].events, by_wall[0].seconds),
        "cpu_events_per_s": rate(median.events, cpu),
        "first_page_ms": round(median.first_page_seconds * 1000, 3),
    }


async def bench_paginate(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    user = remote_user(900_004)
    room = await RemoteRoom.create(bench.engine, bench.remote_key)
    events = [room.join(user), *(room.message(user, n) for n in range(sizes.page_room_events))]
    await persist_in_batches(bench, events, 2_000)
    await bench.settle()
    # A fresh store: the first pass reads every event from the database.
    from roomstream.rooms.store import EventStore

    store = EventStore(bench.db, event_cache_size=sizes.page_room_events + 1_000)
    reader = RoomReader(store, bench.engine.streams)
    out: dict[str, Any] = {"room_events": sizes.page_room_events}
    for label in ("back_cold", "back_warm", "forward_warm"):
        direction = "f" if label.startswith("forward") else "b"
        passes = 1 if label.endswith("cold") else WARM_PASSES
        out[label] = await _passes(reader, user, room.room_id, direction, passes)
        wall, cpu = fmt_rate(out[label]["events_per_s"]), fmt_rate(out[label]["cpu_events_per_s"])
        log(f"  paginate {label}: {wall} events/s (median of {passes}; by CPU time {cpu})")
    out["target_events_per_s"] = TARGET_PAGINATE_EVENTS_PER_S
    return out


# -- 5. the million-event room, bulk-loaded ----------------------------------------------


def _load_million_txn(
    txn: Transaction,
    room_id: str,
    user: str,
    start: int,
    count: int,
    join_at: int,
    first_stream: int,
) -> None:
    """Rows for events ``start .. start+count`` of the room (event i at depth i + 1)."""
    timeline, events, payloads = [], [], []
    sender = f"@speaker:{REMOTE}"
    for i in range(start, start + count):
        event_id = f"$million{i:07d}"
        stream = first_stream + i
        is_join = i == join_at
        member_user = user if is_join else None
        membership = "join" if is_join else None
        event_type = "m.room.member" if is_join else "m.room.message"
        timeline.append(
            (room_id, i + 1, stream, event_id, "main", 3, None, member_user, membership, None)
        )
        events.append(
            (stream, i + 1, event_id, room_id, event_type, user if is_join else None,
             user if is_join else sender, None, None, membership, False, None, False,
             1_700_000_000_000 + i, 1_700_000_000_000 + i, "main")
        )  # fmt: skip
        if i >= join_at:
            data: dict[str, Any] = {
                "type": event_type,
                "room_id": room_id,
                "sender": user if is_join else sender,
                "content": {"membership": "join"}
                if is_join
                else {"msgtype": "m.text", "body": f"message {i}"},
                "origin_server_ts": 1_700_000_000_000 + i,
                "depth": i + 1,
                "prev_events": [f"$million{i - 1:07d}"],
                "auth_events": [],
                "hashes": {"sha256": "x"},
                "signatures": {},
            }
            if is_join:
                data["state_key"] = user
            payloads.append((event_id, room_id, "10", orjson.dumps(data)))
    txn.insert_many(
        "timeline_events",
        ("room_id", "topological_ordering", "stream_ordering", "event_id", "instance_name",
         "visibility", "visibility_after", "member_user", "membership", "replaces_state"),
        timeline,
    )  # fmt: skip
    txn.insert_many(
        "events",
        ("stream_ordering", "topological_ordering", "event_id", "room_id", "type", "state_key",
         "sender", "redacts", "relates_to", "membership", "outlier", "rejected_reason",
         "soft_failed", "origin_server_ts", "received_ts", "instance_name"),
        events,
    )  # fmt: skip
    txn.insert_many("event_json", ("event_id", "room_id", "room_version", "json"), payloads)
    if start <= join_at < start + count:
        # The user's membership interval: joined from the event after the join on.
        txn.insert_many(
            "visibility_memberships",
            ("room_id", "user_id", "topological_ordering", "stream_ordering", "membership"),
            [(room_id, user, join_at + 2, first_stream + join_at + 1, "join")],
        )


async def bench_million(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    room_id = "!million:bench.local"
    user = remote_user(900_005)
    total = sizes.million
    join_at = total - total // 100
    first_stream = 10_000_000_000
    began = time.perf_counter()
    chunk = 50_000
    for start in range(0, total, chunk):
        await bench.db.run_interaction(
            "load_million",
            _load_million_txn, room_id, user, start, min(chunk, total - start), join_at,
            first_stream,
        )  # fmt: skip
    load_seconds = time.perf_counter() - began
    await bench.settle()
    log(f"  bulk-loaded {total:,} events in {load_seconds:.1f} s")
    reader = RoomReader.for_engine(bench.engine)
    out: dict[str, Any] = {
        "events": total,
        "visible": total - join_at,
        "load_seconds": load_seconds,
    }
    for label in ("cold", "warm"):
        passes = 1 if label == "cold" else WARM_PASSES
        out[label] = await _passes(reader, user, room_id, "b", passes)
        count = out[label]["events"]
        assert count == total - join_at, f"saw {count} events, expected {total - join_at}"
        log(f"  1% of {total:,} ({label}): first page {out[label]['first_page_ms']:.2f} ms,"
            f" {fmt_rate(out[label]['events_per_s'])} events/s")  # fmt: skip
    # The page that runs into the join: it must not scan the history before it.
    token = await reader.position_of_event(room_id, f"$million{join_at + 50:07d}")
    last = []
    for _ in range(5):
        t0 = time.perf_counter()
        chunk_result = await reader.paginate(user, room_id, token, limit=100)
        last.append(time.perf_counter() - t0)
    assert len(chunk_result.events) == 50 and chunk_result.end is None
    out["last_page_ms"] = latency_summary(last)["p50_ms"]
    out["target_events_per_s"] = TARGET_PAGINATE_EVENTS_PER_S
    return out


# -- 6. rebuilding the visibility records -----------------------------------------------


async def _tables(bench: Bench, room_id: str) -> list[list[Any]]:
    def txn(t: Transaction) -> list[list[Any]]:
        return [
            t.query(
                f"SELECT * FROM {table} WHERE room_id = ?"
                " ORDER BY topological_ordering, stream_ordering, 2, 3, 4",
                (room_id,),
            )
            for table in ("timeline_events", "visibility_memberships")
        ]

    return await bench.db.run_interaction("tables", txn)


async def bench_backfill(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    """A room of ``members`` joins then ``page_room_events`` messages, persisted
    normally; its records wiped and rebuilt (``reading.backfill``): events/s, and the
    rebuilt rows must equal the persister's."""
    from roomstream.reading.backfill import VisibilityBackfill

    room = await RemoteRoom.create(bench.engine, bench.remote_key)
    events = [room.join(remote_user(i)) for i in range(sizes.members)]
    events += [
        room.message(remote_user(n % sizes.members), n) for n in range(sizes.page_room_events)
    ]
    await persist_in_batches(bench, events, 1_000)
    persisted = await _tables(bench, room.room_id)

    def wipe(t: Transaction) -> None:
        for table in ("timeline_events", "visibility_memberships"):
            t.execute(f"DELETE FROM {table} WHERE room_id = ?", (room.room_id,))

    await bench.db.run_interaction("wipe", wipe)
    cpu, wall = time.process_time(), time.perf_counter()
    done = await VisibilityBackfill(bench.db).rebuild_room(room.room_id)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    identical = await _tables(bench, room.room_id) == persisted
    log(
        f"  rebuilt {done.events} events ({sizes.members} members) in {wall:.2f} s"
        f" ({fmt_rate(rate(done.events, wall))}/s, {cpu:.2f} s CPU here,"
        f" {done.batches} transactions), identical rows: {identical}"
    )
    return {
        "events": done.events,
        "members": sizes.members,
        "seconds": wall,
        "cpu_seconds": cpu,
        "events_per_s": rate(done.events, wall),
        "transactions": done.batches,
        "identical": identical,
    }


# -- driver --------------------------------------------------------------------------------


async def run_engine(
    engine_name: EngineName, sizes: Sizes, workdir: Path, only: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    phases = (
        ("visibility_rows", bench_visibility_rows),
        ("sync", bench_sync),
        ("latest", bench_latest),
        ("paginate", bench_paginate),
        ("million", bench_million),
        ("backfill", bench_backfill),
    )
    for name, phase in phases:
        if only and name not in only:
            continue
        log(f"[{engine_name}] {name}")
        async with open_bench(engine_name, workdir / f"{engine_name}-{name}") as bench:
            out[name] = await phase(bench, sizes)
    return out


def report(results: dict[str, Any]) -> str:
    rows = []
    for engine, r in results["engines"].items():
        latest = r["latest"]
        rows.append([
            engine,
            f"{r['visibility_rows']['member_rows_per_message']:.3f}",
            f"{r['sync']['p50_ms']:.3f}",
            f"{latest['small_none']['p50_ms']:.2f} / {latest['big_none']['p50_ms']:.2f}",
            f"{latest['small_current']['p50_ms']:.2f} / {latest['big_current']['p50_ms']:.2f}",
            fmt_rate(r["paginate"]["back_warm"]["events_per_s"]),
            fmt_rate(r["paginate"]["back_cold"]["events_per_s"]),
            f"{r['million']['cold']['first_page_ms']:.2f} ms, "
            + fmt_rate(r["million"]["cold"]["events_per_s"]),
        ])  # fmt: skip
    return markdown_table(
        ["engine", "member rows/message", "sync p50 ms", "latest p50 ms (100 / 2,000 rooms)",
         "latest + state p50 ms", "back pages events/s (warm)", "(cold)",
         "1% of 1M: first page, events/s"],
        rows,
    )  # fmt: skip


async def main_async(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    engines = [args.engine] if args.engine else list(ENGINES)
    info = machine_info()
    log(describe_machine(info))
    results: dict[str, Any] = {"sizes": sizes.__dict__, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="bench-reading-") as tmp:
        for engine_name in engines:
            results["engines"][engine_name] = await run_engine(
                engine_name, sizes, Path(tmp), args.phase
            )
    if args.phase:
        # A partial run: its own file, the full run's stays as it is.
        path = write_results("reading." + "-".join(args.phase), results, args.quick)
        return 0
    path = write_results("reading", results, args.quick)
    print(report(results))
    log(f"results: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--engine", choices=ENGINES, help="only this engine")
    parser.add_argument(
        "--phase",
        action="append",
        choices=["visibility_rows", "sync", "latest", "paginate", "million", "backfill"],
        help="only this phase (repeatable); results go to reading.<phases>.json",
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
