"""Room-event benchmarks (issue 3 §6): creation, batch persistence, state reads, churn.

Four areas, each on SQLite (a file in a temporary directory) and PostgreSQL (a throwaway
database ``roomstream_bench_rooms_<pid>``, dropped afterwards):

1. ``create``: local events through :meth:`LocalEventCreator.create_event` (auth events,
   hash, sign, authorize, persist): one sender in one room; 16 concurrent senders in 16
   rooms; 16 concurrent senders (16 joined users) in one room. Events/s.
2. ``batch``: signed remote events (joins, then messages) in a few public rooms, built
   before timing, persisted with :meth:`EventPersister.persist_events` in batches of
   1,000 whose events interleave the rooms. Events/s.
3. ``reads``: a public room with 10,000 members (remote joins, batch-persisted): the full
   state (:meth:`EventStore.get_state_at`) at early, middle and late events, and one
   (type, state_key) (:meth:`EventStore.get_state_entry_at`) at random events; p50/p99.
4. ``churn``: the same room then takes leave/join churn; stored state rows per state
   event (``state_entries`` + ``state_branches``; ``state_groups`` reported beside), and
   the full-state reads again over the whole history.

Run ``python bench/bench_rooms.py [--quick] [--engine sqlite|postgres] [--profile]``;
results go to ``bench/results/rooms.json`` (``rooms.quick.json`` in quick mode).
``--profile`` runs cProfile around each timed phase and prints the top functions (main
thread only: database work on worker threads shows up as waiting in the event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion
from roomstream.events.signing import SigningKey, load_or_create_signing_key
from roomstream.reading import read_side_participants
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.storage.engines import EngineName
from roomstream.streams import StreamSet

T = TypeVar("T")

ENGINES: tuple[EngineName, ...] = ("sqlite", "postgres")
SERVER = "bench.local"
REMOTE = "remote.bench"
ALICE = f"@alice:{SERVER}"
SENDERS = 16

TARGET_CREATE_SEQUENTIAL = 1_500.0  # events/s, SQLite
TARGET_CREATE_CONCURRENT = 3_000.0  # events/s, SQLite, 16 senders
TARGET_BATCH = 20_000.0  # events/s
TARGET_FULL_STATE_MS = 50.0
TARGET_ENTRY_MS = 1.0
TARGET_ROWS_PER_STATE_EVENT = 2.0


@dataclass(frozen=True)
class Sizes:
    create_sequential: int
    create_concurrent: int  # total over the 16 senders
    batch_events: int
    batch_rooms: int
    batch_size: int
    members: int
    churn: int
    read_samples: int  # per position (early, middle, late)
    entry_samples: int


FULL = Sizes(
    create_sequential=3_000,
    create_concurrent=4_800,
    batch_events=20_000,
    batch_rooms=4,
    batch_size=1_000,
    members=10_000,
    churn=100_000,
    read_samples=200,
    entry_samples=2_000,
)
QUICK = Sizes(  # scaled down to stay under 3 minutes for both engines
    create_sequential=300,
    create_concurrent=320,
    batch_events=4_000,
    batch_rooms=4,
    batch_size=1_000,
    members=3_000,
    churn=3_000,
    read_samples=40,
    entry_samples=400,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- profiling -------------------------------------------------------------------------


@dataclass
class Profiler:
    """cProfile around timed phases when ``--profile`` is given; prints the top rows."""

    enabled: bool
    top: int = 25

    async def run(self, label: str, coro: Awaitable[T]) -> T:
        if not self.enabled:
            return await coro
        profile = cProfile.Profile()
        profile.enable()
        try:
            return await coro
        finally:
            profile.disable()
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("tottime").print_stats(self.top)
            stats.sort_stats("cumulative").print_stats(self.top)
            log(f"---- profile: {label}\n{out.getvalue()}")


# -- databases -------------------------------------------------------------------------


def _pg_dsn(dbname: str) -> str:
    base, _, _ = PG_ADMIN_DSN.rpartition("/")
    return f"{base}/{dbname}"


@dataclass
class Bench:
    """One engine under test: database, room engine, keys."""

    engine_name: EngineName
    db: Database
    engine: RoomEngine
    remote_key: SigningKey
    dsn: str | None = None

    async def settle(self) -> None:
        """Fresh planner statistics (and on PostgreSQL a vacuum) after bulk writes."""
        await settle_database(self.db, self.dsn)
        gc.collect()


@asynccontextmanager
async def open_bench(engine_name: EngineName, workdir: Path) -> AsyncIterator[Bench]:
    """A fresh, migrated database and a room engine; a PostgreSQL one is dropped after."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    local_key = load_or_create_signing_key(workdir / "keys", SERVER)
    remote_key = load_or_create_signing_key(workdir / "remote", REMOTE)
    drop: sql.Composed | None = None
    dsn: str | None = None
    if engine_name == "sqlite":
        config = DatabaseConfig(engine="sqlite", path=str(workdir / f"rooms-{os.getpid()}.db"))
    else:
        name = f"roomstream_bench_rooms_{os.getpid()}"
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(drop)
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        dsn = _pg_dsn(name)
        config = DatabaseConfig(engine="postgres", dsn=dsn, pool_min=2, pool_max=8)
    try:
        db = connect(config)
        try:
            await prepare_database(db)
            streams = await StreamSet.open(db, "main", {})
            engine = RoomEngine(
                db, streams, SERVER, "main", local_key, participants=read_side_participants()
            )
            yield Bench(engine_name, db, engine, remote_key, dsn)
        finally:
            await db.close()
    finally:
        if drop is not None:
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
                admin.execute(drop)


# -- statistics ------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "samples": len(ms),
        "p50_ms": round(statistics.median(ms), 4),
        "p99_ms": round(percentile(ms, 99), 4),
        "max_ms": round(max(ms), 4),
        "mean_ms": round(statistics.fmean(ms), 4),
    }


# -- building remote events ------------------------------------------------------------


@dataclass
class RemoteRoom:
    """A public room (created locally) into which a remote server sends a linear chain."""

    room_id: str
    version: RoomVersion
    key: SigningKey
    power_levels: str
    join_rules: str
    create_id: str
    tip: str
    depth: int
    members: dict[str, str] = field(default_factory=dict)  # user -> membership event ID
    joined: set[str] = field(default_factory=set)
    ts: int = 1_700_000_000_000

    @classmethod
    async def create(cls, engine: RoomEngine, key: SigningKey) -> RemoteRoom:
        room_id, created = await engine.creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
        version, extremities, current = await engine.persister.get_room_state(room_id)
        (tip,) = extremities
        return cls(
            room_id,
            version,
            key,
            current[("m.room.power_levels", "")],
            current[("m.room.join_rules", "")],
            current[("m.room.create", "")],
            tip,
            created[-1].event.depth,
        )

    def _base_auth(self) -> list[str]:
        base = [self.power_levels]
        if not self.version.room_id_from_create_event:
            base.append(self.create_id)
        return base

    def _make(
        self,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        auth: list[str],
        state_key: str | None = None,
    ) -> Event:
        self.depth += 1
        self.ts += 1
        event = finalise_local_event(
            build_event_dict(
                self.version,
                event_type=event_type,
                sender=sender,
                content=content,
                prev_events=[self.tip],
                auth_events=auth,
                depth=self.depth,
                room_id=self.room_id,
                state_key=state_key,
                origin_server_ts=self.ts,
            ),
            self.version,
            REMOTE,
            self.key,
        )
        self.tip = event.event_id
        return event

    def join(self, user: str) -> Event:
        auth = [*self._base_auth(), self.join_rules]
        if user in self.members:
            auth.append(self.members[user])
        event = self._make(user, "m.room.member", {"membership": "join"}, auth, user)
        self.members[user] = event.event_id
        self.joined.add(user)
        return event

    def leave(self, user: str) -> Event:
        auth = [*self._base_auth(), self.members[user]]
        event = self._make(user, "m.room.member", {"membership": "leave"}, auth, user)
        self.members[user] = event.event_id
        self.joined.discard(user)
        return event

    def message(self, user: str, n: int) -> Event:
        auth = [*self._base_auth(), self.members[user]]
        content = {"msgtype": "m.text", "body": f"message {n} from {user}"}
        return self._make(user, "m.room.message", content, auth)


def remote_user(n: int) -> str:
    return f"@user{n:06d}:{REMOTE}"


async def persist_in_batches(
    bench: Bench, events: list[Event], batch_size: int
) -> tuple[float, list[float]]:
    """Persist ``events`` in order, ``batch_size`` at a time; (total s, per-batch s)."""
    persister = bench.engine.persister
    per_batch: list[float] = []
    for start in range(0, len(events), batch_size):
        batch = events[start : start + batch_size]
        began = time.perf_counter()
        results = await persister.persist_events(batch)
        per_batch.append(time.perf_counter() - began)
        bad = [r for r in results if r.rejected_reason or r.soft_failed or r.outlier]
        if bad:
            raise RuntimeError(f"{len(bad)} events not accepted, first: {bad[0]}")
    return sum(per_batch), per_batch


# -- 1. local creation -----------------------------------------------------------------


async def _send_messages(bench: Bench, room_id: str, sender: str, count: int) -> None:
    create = bench.engine.creator.create_event
    for i in range(count):
        await create(room_id, sender, "m.room.message", {"msgtype": "m.text", "body": f"m{i}"})


async def _timed_creation(
    profiler: Profiler, label: str, name: str, work: Awaitable[Any], events: int
) -> dict[str, Any]:
    """Run one creation phase (profiled if asked), log and return its rate."""
    began = time.perf_counter()
    await profiler.run(label, work)
    seconds = time.perf_counter() - began
    log(f"  {name}: {fmt_rate(rate(events, seconds))} events/s")
    return {"events": events, "seconds": round(seconds, 3), "events_per_s": rate(events, seconds)}


async def bench_create(bench: Bench, sizes: Sizes, profiler: Profiler) -> dict[str, Any]:
    creator = bench.engine.creator
    out: dict[str, Any] = {}

    room_id, _ = await creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
    await _send_messages(bench, room_id, ALICE, 50)  # warm up
    n = sizes.create_sequential
    out["sequential"] = await _timed_creation(
        profiler,
        "create sequential",
        "create sequential",
        _send_messages(bench, room_id, ALICE, n),
        n,
    )

    per = sizes.create_concurrent // SENDERS
    rooms = []
    for _ in range(SENDERS):
        rid, _ = await creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
        rooms.append(rid)
    total = per * SENDERS
    out["concurrent_16_rooms"] = await _timed_creation(
        profiler,
        "create 16 rooms",
        "create 16 senders / 16 rooms",
        asyncio.gather(*(_send_messages(bench, rid, ALICE, per) for rid in rooms)),
        total,
    )

    room_id, _ = await creator.create_room(ALICE, preset=RoomPreset.PUBLIC_CHAT)
    users = [f"@sender{i:02d}:{SERVER}" for i in range(SENDERS)]
    for user in users:
        await creator.create_event(
            room_id, user, "m.room.member", {"membership": "join"}, state_key=user
        )
    out["concurrent_16_users_one_room"] = await _timed_creation(
        profiler,
        "create 16 users one room",
        "create 16 senders / 1 room",
        asyncio.gather(*(_send_messages(bench, room_id, user, per) for user in users)),
        total,
    )
    return out


# -- 2. batch persistence --------------------------------------------------------------


async def bench_batch(bench: Bench, sizes: Sizes, profiler: Profiler) -> dict[str, Any]:
    per_room = sizes.batch_events // sizes.batch_rooms
    joins_per_room = max(1, per_room // 10)
    rooms = [
        await RemoteRoom.create(bench.engine, bench.remote_key) for _ in range(sizes.batch_rooms)
    ]
    began = time.perf_counter()
    streams: list[list[Event]] = []
    for r, room in enumerate(rooms):
        users = [remote_user(r * 1_000_000 + i) for i in range(joins_per_room)]
        events = [room.join(u) for u in users]
        events += [room.message(users[i % len(users)], i) for i in range(per_room - joins_per_room)]
        streams.append(events)
    # Interleave: every batch holds a slice of each room's chain, in order.
    per_batch_per_room = sizes.batch_size // sizes.batch_rooms
    ordered: list[Event] = []
    for start in range(0, per_room, per_batch_per_room):
        for events in streams:
            ordered.extend(events[start : start + per_batch_per_room])
    build_s = time.perf_counter() - began
    log(f"  built {len(ordered)} remote events in {build_s:.1f} s")
    await bench.settle()
    total_s, per_batch = await profiler.run(
        "batch persistence", persist_in_batches(bench, ordered, sizes.batch_size)
    )
    log(f"  batch persistence: {fmt_rate(rate(len(ordered), total_s))} events/s")
    return {
        "events": len(ordered),
        "rooms": sizes.batch_rooms,
        "joins": joins_per_room * sizes.batch_rooms,
        "batch_size": sizes.batch_size,
        "build_seconds": round(build_s, 3),
        "seconds": round(total_s, 3),
        "events_per_s": rate(len(ordered), total_s),
        "batch_ms": latency_summary(per_batch),
    }


# -- 3. state reads --------------------------------------------------------------------


def positions(events: list[str], samples: int, rng: random.Random) -> dict[str, list[str]]:
    """Event IDs sampled from the first 10%, the middle 10% and the last 10%."""
    n = len(events)
    spans = {
        "early": (0, max(1, n // 10)),
        "middle": (int(n * 0.45), max(int(n * 0.45) + 1, int(n * 0.55))),
        "late": (n - max(1, n // 10), n),
    }
    return {
        name: [events[rng.randrange(lo, hi)] for _ in range(samples)]
        for name, (lo, hi) in spans.items()
    }


async def time_full_state(
    bench: Bench, samples: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    store = bench.engine.store
    out: dict[str, dict[str, float]] = {}
    for name, ids in samples.items():
        await store.get_state_at(ids[0])  # warm the page cache for this region
        times: list[float] = []
        sizes: list[int] = []
        for event_id in ids:
            began = time.perf_counter()
            state = await store.get_state_at(event_id)
            times.append(time.perf_counter() - began)
            sizes.append(len(state))
        out[name] = {**latency_summary(times), "state_size_median": statistics.median(sizes)}
        log(
            f"    full state {name:<6}: p50 {out[name]['p50_ms']:.2f} ms,"
            f" p99 {out[name]['p99_ms']:.2f} ms, {statistics.median(sizes):.0f} entries"
        )
    return out


async def time_entries(
    bench: Bench, event_ids: list[str], keys: list[StateKey], samples: int, rng: random.Random
) -> dict[str, float]:
    store = bench.engine.store
    times: list[float] = []
    for _ in range(samples):
        event_id, key = rng.choice(event_ids), rng.choice(keys)
        began = time.perf_counter()
        await store.get_state_entry_at(event_id, key)
        times.append(time.perf_counter() - began)
    summary = latency_summary(times)
    log(f"    single entry: p50 {summary['p50_ms']:.3f} ms, p99 {summary['p99_ms']:.3f} ms")
    return summary


@dataclass
class MemberRoom:
    room: RemoteRoom
    history: list[str]  # every remote event ID, in order
    users: list[str]


async def build_member_room(
    bench: Bench, sizes: Sizes, profiler: Profiler
) -> tuple[MemberRoom, dict[str, Any]]:
    room = await RemoteRoom.create(bench.engine, bench.remote_key)
    users = [remote_user(i) for i in range(sizes.members)]
    began = time.perf_counter()
    joins = [room.join(u) for u in users]
    build_s = time.perf_counter() - began
    total_s, per_batch = await profiler.run(
        "10k joins", persist_in_batches(bench, joins, sizes.batch_size)
    )
    log(f"  {len(joins)} joins persisted: {fmt_rate(rate(len(joins), total_s))} events/s")
    stats = {
        "members": len(joins),
        "build_seconds": round(build_s, 3),
        "seconds": round(total_s, 3),
        "events_per_s": rate(len(joins), total_s),
        "batch_ms": latency_summary(per_batch),
    }
    return MemberRoom(room, [e.event_id for e in joins], users), stats


async def bench_reads(
    bench: Bench, member_room: MemberRoom, sizes: Sizes, rng: random.Random
) -> dict[str, Any]:
    await bench.settle()
    samples = positions(member_room.history, sizes.read_samples, rng)
    full = await time_full_state(bench, samples)
    keys: list[StateKey] = [("m.room.member", u) for u in member_room.users[::97]]
    keys += [("m.room.power_levels", ""), ("m.room.join_rules", ""), ("m.room.name", "")]
    entry = await time_entries(bench, member_room.history, keys, sizes.entry_samples, rng)
    return {"events_in_room": len(member_room.history), "full_state": full, "entry": entry}


# -- 4. churn --------------------------------------------------------------------------


def _state_rows_txn(txn: Transaction, room_id: str) -> dict[str, int]:
    def count(query: str) -> int:
        return int(txn.query_one(query, (room_id,))[0])

    branches = "SELECT branch_id FROM state_branches WHERE room_id = ?"
    return {
        "state_entries": count(
            f"SELECT COUNT(*) FROM state_entries WHERE branch_id IN ({branches})"
        ),
        "state_branches": count("SELECT COUNT(*) FROM state_branches WHERE room_id = ?"),
        "state_groups": count("SELECT COUNT(*) FROM state_groups WHERE room_id = ?"),
        "state_events": count(
            "SELECT COUNT(*) FROM events WHERE room_id = ? AND state_key IS NOT NULL"
            " AND rejected_reason IS NULL AND outlier = FALSE"
        ),
        "events": count("SELECT COUNT(*) FROM events WHERE room_id = ?"),
        "event_state": count(
            "SELECT COUNT(*) FROM event_state WHERE event_id IN"
            " (SELECT event_id FROM events WHERE room_id = ?)"
        ),
    }


async def bench_churn(
    bench: Bench, member_room: MemberRoom, sizes: Sizes, profiler: Profiler, rng: random.Random
) -> dict[str, Any]:
    room = member_room.room
    users = member_room.users
    left: list[str] = []
    began = time.perf_counter()
    changes: list[Event] = []
    for _ in range(sizes.churn):
        # Keep the room near its size: rejoin someone once ~1% of members have left.
        if left and (len(left) > len(users) // 100 or rng.random() < 0.5):
            user = left.pop(rng.randrange(len(left)))
            changes.append(room.join(user))
        else:
            user = rng.choice(users)
            while user not in room.joined:
                user = rng.choice(users)
            changes.append(room.leave(user))
            left.append(user)
    build_s = time.perf_counter() - began
    log(f"  built {len(changes)} membership changes in {build_s:.1f} s")
    total_s, per_batch = await profiler.run(
        "churn", persist_in_batches(bench, changes, sizes.batch_size)
    )
    log(f"  churn persisted: {fmt_rate(rate(len(changes), total_s))} events/s")
    member_room.history.extend(e.event_id for e in changes)
    rows = await bench.db.run_interaction("state_rows", _state_rows_txn, room.room_id)
    per_state_event = (rows["state_entries"] + rows["state_branches"]) / rows["state_events"]
    with_groups = per_state_event + rows["state_groups"] / rows["state_events"]
    log(f"  rows: {rows}; entries+branches per state event {per_state_event:.3f}")
    await bench.settle()
    samples = positions(member_room.history, sizes.read_samples, rng)
    full = await time_full_state(bench, samples)
    return {
        "changes": len(changes),
        "members_at_end": len(room.joined),
        "build_seconds": round(build_s, 3),
        "seconds": round(total_s, 3),
        "events_per_s": rate(len(changes), total_s),
        "batch_ms": latency_summary(per_batch),
        "rows": rows,
        "entries_and_branches_per_state_event": round(per_state_event, 4),
        "with_state_groups_per_state_event": round(with_groups, 4),
        "events_in_room": len(member_room.history),
        "full_state": full,
    }


# -- driver ----------------------------------------------------------------------------


async def run_engine(
    engine_name: EngineName, sizes: Sizes, profiler: Profiler, workdir: Path
) -> dict[str, Any]:
    rng = random.Random(3)
    out: dict[str, Any] = {}
    out["load_average_start"] = os.getloadavg()
    async with open_bench(engine_name, workdir) as bench:
        log(f"[{engine_name}] local creation")
        out["create"] = await bench_create(bench, sizes, profiler)
        log(f"[{engine_name}] batch persistence")
        out["batch"] = await bench_batch(bench, sizes, profiler)
        log(f"[{engine_name}] {sizes.members}-member room")
        member_room, out["member_room"] = await build_member_room(bench, sizes, profiler)
        out["reads"] = await bench_reads(bench, member_room, sizes, rng)
        log(f"[{engine_name}] churn")
        out["churn"] = await bench_churn(bench, member_room, sizes, profiler, rng)
    # Other work on this machine skews every figure: record how busy it was.
    out["load_average_end"] = os.getloadavg()
    log(f"[{engine_name}] load average {out['load_average_start']} -> {out['load_average_end']}")
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def summarise(results: dict[str, Any]) -> str:
    """Markdown tables of the figures, each target marked."""
    rows: list[list[str]] = []
    for engine_name, r in results["engines"].items():
        c = r["create"]
        seq = c["sequential"]["events_per_s"]
        rooms16 = c["concurrent_16_rooms"]["events_per_s"]
        users16 = c["concurrent_16_users_one_room"]["events_per_s"]
        sqlite = engine_name == "sqlite"
        rows.append(
            [
                engine_name,
                "create, sequential",
                f"{fmt_rate(seq)} ev/s",
                f"≥ 1,500 ev/s: {verdict(seq >= TARGET_CREATE_SEQUENTIAL)}" if sqlite else "—",
            ]
        )
        rows.append(
            [
                engine_name,
                "create, 16 senders / 16 rooms",
                f"{fmt_rate(rooms16)} ev/s",
                f"≥ 3,000 ev/s: {verdict(rooms16 >= TARGET_CREATE_CONCURRENT)}" if sqlite else "—",
            ]
        )
        rows.append(
            [
                engine_name,
                "create, 16 senders / 1 room",
                f"{fmt_rate(users16)} ev/s",
                f"≥ 3,000 ev/s: {verdict(users16 >= TARGET_CREATE_CONCURRENT)}" if sqlite else "—",
            ]
        )
        b = r["batch"]["events_per_s"]
        rows.append(
            [
                engine_name,
                f"batch persist ({r['batch']['events']:,} ev, batches of 1,000)",
                f"{fmt_rate(b)} ev/s",
                f"≥ 20,000 ev/s: {verdict(b >= TARGET_BATCH)}",
            ]
        )
        m = r["member_room"]["events_per_s"]
        rows.append(
            [
                engine_name,
                f"batch persist {r['member_room']['members']:,} joins",
                f"{fmt_rate(m)} ev/s",
                "—",
            ]
        )
        ch = r["churn"]["events_per_s"]
        rows.append(
            [
                engine_name,
                f"batch persist {r['churn']['changes']:,} churn",
                f"{fmt_rate(ch)} ev/s",
                "—",
            ]
        )
        for phase, block in (
            (f"{r['member_room']['members']:,} members", r["reads"]["full_state"]),
            ("after churn", r["churn"]["full_state"]),
        ):
            for pos in ("early", "middle", "late"):
                s = block[pos]
                rows.append(
                    [
                        engine_name,
                        f"full state, {phase}, {pos} ({s['state_size_median']:,.0f} entries)",
                        f"p50 {s['p50_ms']:.2f} ms / p99 {s['p99_ms']:.2f} ms",
                        f"≤ 50 ms: {verdict(s['p99_ms'] <= TARGET_FULL_STATE_MS)}",
                    ]
                )
        e = r["reads"]["entry"]
        rows.append(
            [
                engine_name,
                "single (type, state_key)",
                f"p50 {e['p50_ms']:.3f} ms / p99 {e['p99_ms']:.3f} ms",
                f"≤ 1 ms: {verdict(e['p99_ms'] <= TARGET_ENTRY_MS)}",
            ]
        )
        per = r["churn"]["entries_and_branches_per_state_event"]
        groups = r["churn"]["with_state_groups_per_state_event"]
        rows.append(
            [
                engine_name,
                "state rows per state event (entries + branches)",
                f"{per:.3f} (with state_groups: {groups:.3f})",
                f"≤ 2: {verdict(per <= TARGET_ROWS_PER_STATE_EVENT)}",
            ]
        )
    return markdown_table(["engine", "measure", "figure", "target"], rows)


async def main_async(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    profiler = Profiler(args.profile)
    engines = [args.engine] if args.engine else list(ENGINES)
    log(describe_machine(machine_info()))
    results: dict[str, Any] = {"sizes": sizes.__dict__, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="roomstream-bench-rooms-") as tmp:
        for engine_name in engines:
            began = time.perf_counter()
            results["engines"][engine_name] = await run_engine(
                engine_name, sizes, profiler, Path(tmp) / engine_name
            )
            log(f"[{engine_name}] done in {time.perf_counter() - began:.0f} s")
    path = write_results("rooms", results, args.quick)
    print(summarise(results))
    log(f"results: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (< 3 minutes)")
    parser.add_argument("--engine", choices=ENGINES, help="only this engine")
    parser.add_argument("--profile", action="store_true", help="cProfile each timed phase")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
