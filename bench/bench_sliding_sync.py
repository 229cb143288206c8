"""Simplified sliding sync (MSC4186) against a user in many rooms, roomstream and Synapse.

Usage::

    python bench/bench_sliding_sync.py [--quick] [--engine sqlite|postgres]
        [--server roomstream|synapse] [--sizes 1000,10000] [--repeats N]

roomstream: a homeserver in this process (the Client-Server API on an aiohttp server on
loopback, over a fresh database) with one user in R rooms (R = 1,000 and 10,000; 100 and
1,000 with ``--quick``), each room created through the library (``LocalEventCreator``,
many rooms at once: the same persistence path as the API, without 10,000 HTTP calls)
with a name and one message. Synapse (``--server synapse``, the ``bench`` extra): a
Synapse process started as ``bench_client_api.py`` starts it (the benchmark deltas of
``shared/peers/synapse/config_patch.py``), the rooms created through its Client-Server
API with 16 requests in flight (R = 1,000 by default). Measured over HTTP, the same
requests for both:

- ``first_response``: a new connection's first request, one list of range [0, 19],
  ``timeline_limit`` 1 and three required state keys (ms, p50 and p90), and the very
  first one for the user (``cold``; roomstream then reads the whole room list once);
- ``wake``: a long-polling request with the connection's ``pos`` returning the message
  sent into the 100th most recent room, from the start of the send (ms, p50 and p90;
  the send alone is ``send_ms_p50``: through the library for roomstream, over HTTP for
  Synapse; ``wake_after_send_ms_p50``: from the send's return to the response);
- ``sync_v2_initial``: ``GET /sync`` without a filter for the same user (ms, median of
  up to 3; each with a distinct ``timeout``, ignored without ``since``, which keeps it
  out of Synapse's /sync response cache) — what a client without sliding sync waits for.

Each size records ``uptime``'s load averages before and after it.

Results: ``bench/results/sliding_sync.json`` (``sliding_sync_postgres.json`` on
PostgreSQL, ``sliding_sync_synapse_<engine>.json`` for Synapse).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg
from aiohttp import web
from aiohttp.test_utils import TestServer

import common
from roomstream.client import build_client_api
from roomstream.config import Config
from roomstream.homeserver import open_room_engine
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.sliding.store import SlidingStore
from roomstream.storage import DatabaseConfig
from roomstream.streams import InMemoryStream

SERVER = "bench.local"
PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
SIZES = {"full": [1_000, 10_000], "quick": [100, 1_000]}
SYNAPSE_SIZES = {"full": [1_000], "quick": [100]}
REPEATS = {"full": 30, "quick": 10}
BODY = {
    "conn_id": "room-list",
    "lists": {
        "all": {
            "ranges": [[0, 19]],
            "timeline_limit": 1,
            "required_state": [
                ["m.room.name", ""],
                ["m.room.avatar", ""],
                ["m.room.encryption", ""],
            ],
        }
    },
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def load_average() -> dict[str, Any]:
    """``uptime`` as printed, and its three load averages."""
    text = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    return {"uptime": text.strip(), "load": [round(x, 2) for x in os.getloadavg()]}


class HTTP:
    """Raw HTTP with orjson against one server, with one user's token."""

    def __init__(self, base: str, session: aiohttp.ClientSession) -> None:
        self.base = base
        self.session = session
        self.token = ""

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        data = None if body is None else orjson.dumps(body)
        async with self.session.request(
            method, self.base + path, data=data, headers=headers
        ) as resp:
            content = await resp.read()
            assert resp.status == 200, (path, resp.status, content[:300])
            return orjson.loads(content)


Send = Callable[[str, str], Awaitable[None]]


async def measure(
    http: HTTP, send: Send, rooms: list[str], repeats: int, v2_repeats: int
) -> dict[str, Any]:
    """``rooms``: the user's rooms, oldest activity first."""
    first: list[float] = []
    body: dict[str, Any] = {}
    cold = 0.0
    for i in range(repeats + 2):
        started = time.perf_counter()
        body = await http.call("POST", PATH, dict(BODY, conn_id=f"c{i}"))
        if i == 0:
            cold = (time.perf_counter() - started) * 1000
        if i >= 2:  # warm-up
            first.append((time.perf_counter() - started) * 1000)
    assert len(body["rooms"]) == 20 and body["lists"]["all"]["count"] == len(rooms), (
        len(body["rooms"]),
        body["lists"],
    )
    body = await http.call("POST", PATH, BODY)
    pos = body["pos"]
    # 100th most recent room: its message moves it to the top.
    target = rooms[-min(100, len(rooms))]
    wakes: list[float] = []
    sends: list[float] = []
    after: list[float] = []
    for i in range(repeats + 2):
        poll = asyncio.create_task(http.call("POST", f"{PATH}?timeout=30000&pos={pos}", BODY))
        await asyncio.sleep(0.05)  # let the request reach its wait (benchmark only)
        started = time.perf_counter()
        await send(target, f"wake {i}")
        sent = time.perf_counter()
        result = await poll
        done = time.perf_counter()
        assert target in result["rooms"], result
        pos = result["pos"]
        if i >= 2:
            wakes.append((done - started) * 1000)
            sends.append((sent - started) * 1000)
            after.append(max(0.0, done - sent) * 1000)
        target = rooms[-min(100 + i + 1, len(rooms))]
    v2: list[float] = []
    for i in range(v2_repeats):
        started = time.perf_counter()
        sync = await http.call("GET", f"/_matrix/client/v3/sync?timeout={i}")
        v2.append((time.perf_counter() - started) * 1000)
        assert len(sync["rooms"]["join"]) == len(rooms)
    return {
        "rooms": len(rooms),
        "first_response_ms": {"p50": pct(first, 0.5), "p90": pct(first, 0.9)},
        "cold_first_response_ms": round(cold, 2),
        "wake_ms": {"p50": pct(wakes, 0.5), "p90": pct(wakes, 0.9)},
        "send_ms_p50": pct(sends, 0.5),
        # From the send's return to the woken response (0 when it came first).
        "wake_after_send_ms_p50": pct(after, 0.5),
        "sync_v2_initial_ms": round(statistics.median(v2), 1),
        "repeats": repeats,
    }


async def seed(engine: RoomEngine, user_id: str, rooms: int, concurrency: int) -> list[str]:
    """``rooms`` rooms with a name and a message each; oldest activity first."""
    creator = engine.creator
    room_ids: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    # Distinct creation times: a version-12 room ID is the hash of its create event.
    base_ms = int(time.time() * 1000) - rooms

    async def one(i: int) -> None:
        async with gate:
            room_id, _ = await creator.create_room(
                user_id,
                preset=RoomPreset.PRIVATE_CHAT,
                name=f"room {i}",
                origin_server_ts=base_ms + i,
            )
            await creator.create_event(
                room_id, user_id, "m.room.message", {"msgtype": "m.text", "body": f"hello {i}"}
            )
            room_ids.append(room_id)  # in the order the messages completed

    await asyncio.gather(*(one(i) for i in range(rooms)))
    return room_ids


def v2_repeats_for(rooms: int) -> int:
    return 3 if rooms <= 1000 else 1


async def run_roomstream(
    engine_name: str,
    rooms: int,
    repeats: int,
    work: Path,
    concurrency: int,
    keep: str | None = None,
) -> dict[str, Any]:
    """``keep``: a SQLite file (or a PostgreSQL schema) kept after the run and, when it
    already holds the user's rooms, reused without seeding (seeding 10,000 rooms takes
    minutes on a loaded machine; the measurements need not wait for it)."""
    schema = ""
    if engine_name == "sqlite":
        path = Path(keep) if keep else work / f"bench{rooms}.db"
        database = DatabaseConfig(engine="sqlite", path=str(path))
        dsn = None
    else:
        schema = keep or f"bench_sliding_{rooms}_{int(time.time())}"
        dsn = common.PG_ADMIN_DSN
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        database = DatabaseConfig(engine="postgres", dsn=dsn, schema=schema)
    config = Config(server_name=SERVER, data_dir=str(work / f"data{rooms}"), database=database)
    engine = await open_room_engine(config)
    process = build_client_api(config, engine, None, typing_stream=InMemoryStream("typing"))
    app = web.Application()
    process.api.install(app)
    server = TestServer(app)
    await server.start_server()
    session = aiohttp.ClientSession()
    http = HTTP(str(server.make_url("")).rstrip("/"), session)
    credentials = {"username": "alice", "password": "bench-password"}
    try:
        user_id = f"@alice:{SERVER}"
        existing = await SlidingStore(engine.db).room_list(user_id) if keep else []
        if existing:
            login = {"type": "m.login.password", "user": "alice", "password": "bench-password"}
            reg = await http.call("POST", "/_matrix/client/v3/login", login)
            http.token = reg["access_token"]
            assert len(existing) == rooms, (len(existing), rooms)
            room_ids = [e.room_id for e in reversed(existing)]
            seeded = None
        else:
            reg = await http.call(
                "POST",
                "/_matrix/client/v3/register",
                {**credentials, "auth": {"type": "m.login.dummy"}},
            )
            http.token = reg["access_token"]
            user_id = reg["user_id"]
            started = time.perf_counter()
            room_ids = await seed(engine, user_id, rooms, concurrency)
            seeded = round(time.perf_counter() - started, 1)
        await common.settle_database(engine.db, dsn)

        async def send(room_id: str, text: str) -> None:
            await engine.creator.create_event(
                room_id, user_id, "m.room.message", {"msgtype": "m.text", "body": text}
            )

        load_before = load_average()
        result = await measure(http, send, room_ids, repeats, v2_repeats_for(rooms))
        result["seed_seconds"] = seeded  # None: a kept database was reused
        result["seed_concurrency"] = concurrency
        result["load_before"] = load_before
        result["load_after"] = load_average()
        return result
    finally:
        await session.close()
        await server.close()
        process.close()
        await engine.close()
        if engine_name == "postgres" and not keep:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def wait_for_file(path: Path) -> None:
    """Block until ``path`` exists (an operator's go signal, polled each second)."""
    while not path.exists():
        time.sleep(1)


async def run_synapse(
    engine_name: str,
    rooms: int,
    repeats: int,
    work: Path,
    concurrency: int,
    wait_for: str | None = None,
) -> dict[str, Any]:
    """``wait_for``: after seeding, wait until this file exists before measuring (seed
    early, measure when the machine is quieter)."""
    import bench_client_api as peer

    async with peer.synapse(engine_name, work) as server, aiohttp.ClientSession() as session:
        client = peer.Client(server.url, session)
        user = await client.register("alice")
        http = HTTP(server.url, session)
        http.token = user.token
        room_ids: list[str] = []

        async def one(i: int) -> None:
            body = {"preset": "private_chat", "name": f"room {i}"}
            created = await client.call("POST", "/createRoom", user.token, body)
            await client.send(user, created["room_id"], f"hello {i}")
            room_ids.append(created["room_id"])  # in the order the messages completed

        started = time.perf_counter()
        await peer.bounded(concurrency, [one(i) for i in range(rooms)])
        seeded = time.perf_counter() - started
        print(f"  (synapse: {rooms} rooms created in {seeded:.0f} s)", flush=True)
        if wait_for:
            print(f"  (waiting for {wait_for})", flush=True)
            await asyncio.to_thread(wait_for_file, Path(wait_for))

        async def send(room_id: str, text: str) -> None:
            await client.send(user, room_id, text)

        load_before = load_average()
        result = await measure(http, send, room_ids, repeats, v2_repeats_for(rooms))
        result["seed_seconds"] = round(seeded, 1)
        result["seed_concurrency"] = concurrency
        result["load_before"] = load_before
        result["load_after"] = load_average()
        result["synapse"] = server.info
        return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = "quick" if args.quick else "full"
    results: dict[str, Any] = {"server": args.server, "engine": args.engine, "sizes": []}
    sizes = SIZES[mode] if args.server == "roomstream" else SYNAPSE_SIZES[mode]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    repeats = args.repeats or REPEATS[mode]
    for rooms in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-sliding-") as tmp:
            if args.server == "roomstream":
                keep = args.keep.replace("{rooms}", str(rooms)) if args.keep else None
                out = await run_roomstream(
                    args.engine, rooms, repeats, Path(tmp), args.seed_c, keep
                )
            else:
                out = await run_synapse(args.engine, rooms, repeats, Path(tmp), 16, args.wait_for)
        print(orjson.dumps(out).decode(), flush=True)
        results["sizes"].append(out)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--server", choices=["roomstream", "synapse"], default="roomstream")
    parser.add_argument("--sizes", help="comma-separated room counts (overrides the mode's)")
    parser.add_argument("--repeats", type=int, help="measured requests per figure")
    parser.add_argument(
        "--seed-c", type=int, default=64, help="rooms created at once (roomstream seeding)"
    )
    parser.add_argument(
        "--keep",
        help="roomstream: keep the seeded database, a SQLite path or PostgreSQL schema"
        " ('{rooms}' is replaced by the size), and reuse it when it is there",
    )
    parser.add_argument("--wait-for", help="synapse: measure once this file exists")
    parser.add_argument("--seed-only", action="store_true", help="with --keep: seed, no figures")
    args = parser.parse_args()
    if args.seed_only:
        global measure

        async def no_figures(*_: Any) -> dict[str, Any]:
            return {}

        measure = no_figures  # type: ignore[assignment]
    results = asyncio.run(run(args))
    if args.seed_only:
        return
    name = "sliding_sync" if args.engine == "sqlite" else f"sliding_sync_{args.engine}"
    if args.server == "synapse":
        name = f"sliding_sync_synapse_{args.engine}"
    defaults = (SIZES if args.server == "roomstream" else SYNAPSE_SIZES)[
        "quick" if args.quick else "full"
    ]
    if args.sizes and [int(x) for x in args.sizes.split(",")] != defaults:
        name += "_" + args.sizes.replace(",", "_")
    path = common.write_results(name, results, args.quick)
    rows = [
        [
            f"{r['rooms']:,}",
            f"{r['first_response_ms']['p50']}",
            f"{r['first_response_ms']['p90']}",
            f"{r['cold_first_response_ms']}",
            f"{r['wake_ms']['p50']}",
            f"{r['send_ms_p50']}",
            f"{r['sync_v2_initial_ms']}",
            f"{r['seed_seconds']}",
            " ".join(str(x) for x in r["load_before"]["load"]),
        ]
        for r in results["sizes"]
    ]
    print(
        common.markdown_table(
            [
                "rooms",
                "first [0,19] p50 ms",
                "p90 ms",
                "cold first ms",
                "wake p50 ms",
                "of which send ms",
                "sync v2 initial ms",
                "seed s",
                "load before",
            ],
            rows,
        )
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
