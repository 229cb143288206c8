"""Simplified sliding sync (MSC4186) against a user in many rooms.

Usage::

    python bench/bench_sliding_sync.py [--quick] [--engine sqlite|postgres]

A homeserver in this process (the Client-Server API on an aiohttp server on loopback,
over a fresh database) with one user in R rooms (R = 1,000 and 10,000; 100 and 1,000
with ``--quick``), each room created with a name and one message. Measured over HTTP:

- ``first_response``: a new connection's first request, one list of range [0, 19],
  ``timeline_limit`` 1 and three required state keys (ms, p50 and p90), and the very
  first one of the process for the user (``cold``: it reads the whole room list);
- ``wake``: a long-polling request with the connection's ``pos`` returning the message
  sent into the 100th most recent room, from the start of the send (ms, p50 and p90; the
  send itself is ``send`` below, p50);
- ``sync_v2_initial``: ``GET /sync`` without a filter for the same user (ms, median) —
  what a client without sliding sync waits for.

Results: ``bench/results/sliding_sync.json`` (``sliding_sync_postgres.json`` on PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
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
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import DatabaseConfig
from roomstream.streams import InMemoryStream

SERVER = "bench.local"
PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
SIZES = {"full": [1_000, 10_000], "quick": [100, 1_000]}
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


class Bench:
    def __init__(self, server: TestServer, session: aiohttp.ClientSession, engine: RoomEngine):
        self.server = server
        self.session = session
        self.engine = engine
        self.token = ""

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        data = None if body is None else orjson.dumps(body)
        url = self.server.make_url(path)
        async with self.session.request(method, url, data=data, headers=headers) as resp:
            content = await resp.read()
            assert resp.status == 200, (path, resp.status, content[:300])
            return orjson.loads(content)


async def seed(bench: Bench, user_id: str, rooms: int) -> list[str]:
    creator = bench.engine.creator
    room_ids: list[str] = []
    gate = asyncio.Semaphore(8)
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
            room_ids.append(room_id)

    await asyncio.gather(*(one(i) for i in range(rooms)))
    return room_ids


async def measure(bench: Bench, user_id: str, rooms: list[str], repeats: int) -> dict[str, Any]:
    first: list[float] = []
    body: dict[str, Any] = {}
    cold = 0.0
    for i in range(repeats + 2):
        started = time.perf_counter()
        body = await bench.call("POST", PATH, dict(BODY, conn_id=f"c{i}"))
        if i == 0:
            # The process's first request for the user reads the whole room list.
            cold = (time.perf_counter() - started) * 1000
        if i >= 2:  # warm-up
            first.append((time.perf_counter() - started) * 1000)
    assert len(body["rooms"]) == 20 and body["lists"]["all"]["count"] == len(rooms)
    body = await bench.call("POST", PATH, BODY)
    pos = body["pos"]
    # 100th most recent room: its message moves it to the top.
    target = rooms[-min(100, len(rooms))]
    creator = bench.engine.creator
    wakes: list[float] = []
    sends: list[float] = []
    for i in range(repeats + 2):
        poll = asyncio.create_task(bench.call("POST", f"{PATH}?timeout=30000&pos={pos}", BODY))
        await asyncio.sleep(0.05)  # let the request reach its wait (benchmark only)
        started = time.perf_counter()
        await creator.create_event(
            target, user_id, "m.room.message", {"msgtype": "m.text", "body": f"wake {i}"}
        )
        sent = time.perf_counter()
        result = await poll
        done = time.perf_counter()
        assert target in result["rooms"], result
        pos = result["pos"]
        if i >= 2:
            wakes.append((done - started) * 1000)
            sends.append((sent - started) * 1000)
        target = rooms[-min(100 + i + 1, len(rooms))]
    v2: list[float] = []
    for _ in range(3 if len(rooms) <= 1000 else 1):
        started = time.perf_counter()
        sync = await bench.call("GET", "/_matrix/client/v3/sync")
        v2.append((time.perf_counter() - started) * 1000)
        assert len(sync["rooms"]["join"]) == len(rooms)
    return {
        "rooms": len(rooms),
        "first_response_ms": {"p50": pct(first, 0.5), "p90": pct(first, 0.9)},
        "cold_first_response_ms": round(cold, 2),
        "wake_ms": {"p50": pct(wakes, 0.5), "p90": pct(wakes, 0.9)},
        "send_ms_p50": pct(sends, 0.5),
        "sync_v2_initial_ms": round(statistics.median(v2), 1),
    }


async def run_size(engine_name: str, rooms: int, repeats: int, work: Path) -> dict[str, Any]:
    if engine_name == "sqlite":
        database = DatabaseConfig(engine="sqlite", path=str(work / f"bench{rooms}.db"))
        dsn = None
    else:
        schema = f"bench_sliding_{rooms}_{int(time.time())}"
        dsn = common.PG_ADMIN_DSN
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        database = DatabaseConfig(engine="postgres", dsn=dsn, schema=schema)
    config = Config(server_name=SERVER, data_dir=str(work / f"data{rooms}"), database=database)
    engine = await RoomEngine.open(config)
    process = build_client_api(config, engine, None, typing_stream=InMemoryStream("typing"))
    app = web.Application()
    process.api.install(app)
    server = TestServer(app)
    await server.start_server()
    session = aiohttp.ClientSession()
    bench = Bench(server, session, engine)
    try:
        reg = await bench.call(
            "POST",
            "/_matrix/client/v3/register",
            {"username": "alice", "password": "bench-password", "auth": {"type": "m.login.dummy"}},
        )
        bench.token = reg["access_token"]
        started = time.perf_counter()
        room_ids = await seed(bench, reg["user_id"], rooms)
        seeded = time.perf_counter() - started
        await common.settle_database(engine.db, dsn)
        result = await measure(bench, reg["user_id"], room_ids, repeats)
        result["seed_seconds"] = round(seeded, 1)
        return result
    finally:
        await session.close()
        await server.close()
        process.close()
        await engine.close()
        if engine_name == "postgres":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = "quick" if args.quick else "full"
    results: dict[str, Any] = {"engine": args.engine, "sizes": []}
    with tempfile.TemporaryDirectory(prefix="bench-sliding-") as tmp:
        for rooms in SIZES[mode]:
            out = await run_size(args.engine, rooms, REPEATS[mode], Path(tmp))
            print(orjson.dumps(out).decode(), flush=True)
            results["sizes"].append(out)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    name = "sliding_sync" if args.engine == "sqlite" else f"sliding_sync_{args.engine}"
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
            ],
            rows,
        )
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
