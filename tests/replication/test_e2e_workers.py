"""End to end with real processes on loopback: 2 event writers + 1 reader, TCP and Redis.

A load generator sends events to the writers through the internal HTTP API (routed to the
room's owner) the whole time. One writer is SIGKILLed mid-stream and restarted; the reader
is SIGSTOPped for a while (over TCP: until a writer drops it for congestion) and resumed.
At the end the reader's record must hold every committed event exactly once, in order per
writer, and every linear position it recorded must cover only processed facts.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import yaml
from psycopg import sql

from roomstream.config import parse_config
from roomstream.errors import MatrixError
from roomstream.replication import endpoints as ep
from roomstream.replication.http import InternalHttpClient
from tests.support.ports import free_port
from tests.support.sharding import rooms_by_owner
from tests.support.wait import wait_for

# Three processes under continuous load: slow on a busy machine. Every wait below is bounded
# generously in seconds (only a failing run reaches a bound) or by a count of events.
pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]

ROOMS_PER_WRITER = 4
CONCURRENCY = 8
#: Events acknowledged while the reader is stopped by which a writer must have dropped it:
#: far more than the 8 KiB socket buffers plus 200 queued lines hold (about 700 events).
CONGESTION_EVENTS = 4000


class Proc:
    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self.args = args
        self.log = log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.popen = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CI": ""}
            )

    def signal(self, sig: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGCONT)
                self.popen.kill()
            self.popen.wait(10)

    async def terminate(self) -> int:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.popen.wait, 30)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def pg_schema(pg_database: str) -> Iterator[tuple[str, str]]:
    schema = f"e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    yield pg_database, schema


#: What a poll of a process that is (re)starting or busy may fail with: "not yet".
NOT_YET = (TimeoutError, OSError, MatrixError, KeyError)


class Load:
    """Sends events continuously; counts what was acknowledged per writer."""

    def __init__(self, client: InternalHttpClient, rooms: list[str], sender: str) -> None:
        self.client = client
        self.rooms = rooms
        self.sender = sender
        self.ok = 0
        self.failed = 0
        self.acknowledged: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = False

    def start(self) -> None:
        for i in range(CONCURRENCY):
            self._tasks.append(asyncio.create_task(self._run(i)))

    async def _run(self, worker: int) -> None:
        n = 0
        while not self._stop:
            room = self.rooms[(worker + n) % len(self.rooms)]
            n += 1
            try:
                call = ep.SendEventCall(
                    room, self.sender, "m.room.message", {"body": f"{worker}-{n}"}
                )
                owner = self.client.room_owner(room)
                result = await self.client.call(ep.SEND_EVENT, owner, call)
            except (TimeoutError, OSError, MatrixError, Exception):
                self.failed += 1
                await asyncio.sleep(0.02)  # back off from a dead writer; not synchronisation
                continue
            self.ok += 1
            self.acknowledged.add(result["event_id"])

    async def wait_more(self, count: int, limit: float = 300.0) -> None:
        target = self.ok + count

        async def enough() -> bool:
            return self.ok >= target

        await wait_for(enough, limit, f"{count} more events", interval=0.05, ignoring=NOT_YET)

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.parametrize("transport", ["tcp", "redis"])
async def test_writers_killed_and_slow_reader_lose_nothing(
    transport: str, tmp_path: Path, pg_schema: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    if transport == "redis":
        request.getfixturevalue("redis_url")
    dsn, schema = pg_schema
    server_name = f"e2e-{uuid.uuid4().hex[:8]}.test"
    raw_config = {
        "server_name": server_name,
        "data_dir": str(tmp_path / "data"),
        "database": {"engine": "postgres", "dsn": dsn, "schema": schema, "pool_min": 1},
        "stream_writers": {"events": ["w1", "w2"]},
        "instances": {
            "w1": {"replication_port": free_port(), "internal_port": free_port()},
            "w2": {"replication_port": free_port(), "internal_port": free_port()},
            "reader": {"internal_port": free_port()},
        },
        # A stopped reader must be dropped for congestion, never for silence: with the
        # default 15 s ping time-out, a slow machine (fewer events a second) let the ping
        # time-out fire first.
        "replication": {"transport": transport, "max_outbound_lines": 200, "ping_timeout": 600},
    }
    config_path = tmp_path / "roomstream.yaml"
    config_path.write_text(yaml.safe_dump(raw_config))
    config = parse_config(raw_config)
    record = tmp_path / "reader.jsonl"

    def proc(name: str, *extra: str) -> Proc:
        args = [sys.executable, "-m", "roomstream.cli", "-c", str(config_path), "run"]
        args += ["--instance", name, "--socket-buffer", "8192", *extra]
        return Proc(name, args, tmp_path / f"{name}.log")

    procs = {
        "w1": proc("w1"),
        "w2": proc("w2"),
        "reader": proc("reader", "--record", str(record)),
    }
    client = InternalHttpClient(config, timeout=10)
    load: Load | None = None

    async def healthy(name: str) -> dict[str, Any]:
        async def check() -> dict[str, Any]:
            return await client.call(ep.HEALTH, name, ep.HealthCall())

        return await wait_for(check, 120, f"{name} healthy", interval=0.05, ignoring=NOT_YET)

    try:
        for name in ("w1", "w2", "reader"):  # one at a time: the first one migrates
            procs[name].start()
            await healthy(name)
        alice = f"@alice:{server_name}"

        async def create(i: int) -> str:
            writer = ("w1", "w2")[i % 2]
            call = ep.CreateNamedRoomCall(alice, f"{writer}-{i}")
            return await client.call(ep.CREATE_NAMED_ROOM, writer, call)

        # Rooms on both writers whatever their random IDs hash to: the load must keep
        # going on w2 while w1 is down, and both writers must stream to the reader.
        owned = await rooms_by_owner(create, ["w1", "w2"], ROOMS_PER_WRITER)
        rooms = owned["w1"] + owned["w2"]
        load = Load(client, rooms, alice)
        load.start()
        await load.wait_more(300)

        # A writer dies mid-stream and comes back.
        procs["w1"].signal(signal.SIGKILL)
        procs["w1"].popen.wait(10)  # type: ignore[union-attr]
        await load.wait_more(150)
        procs["w1"].start()
        await healthy("w1")
        await load.wait_more(300)

        # A slow reader: stopped until a writer gives up on it (TCP) or for a while.
        procs["reader"].signal(signal.SIGSTOP)
        try:
            if transport == "tcp":
                stopped_at = load.ok

                async def congested() -> bool:
                    if any(
                        "congestion" in procs[w].log_text() and "reader" in procs[w].log_text()
                        for w in ("w1", "w2")
                    ):
                        return True
                    # Bounded by the events sent, not by how fast this machine sends them.
                    sent = load.ok - stopped_at
                    assert sent < CONGESTION_EVENTS, f"no congestion drop after {sent} events"
                    return False

                await wait_for(congested, 600, "a congestion drop", interval=0.05, ignoring=NOT_YET)
            else:
                await load.wait_more(400)
        finally:
            procs["reader"].signal(signal.SIGCONT)
        await load.wait_more(300)
        await load.stop()

        # Quiescence: the reader has processed up to every writer's announced position.
        async def settled() -> dict[str, Any] | None:
            written = {}
            for w in ("w1", "w2"):
                status = await client.call(ep.HEALTH, w, ep.HealthCall())
                if status["written"]["events"] != status["local"]["events"]:
                    return None  # a position store is still under way
                written[w] = status["written"]["events"]
            health = await client.call(ep.HEALTH, "reader", ep.HealthCall())
            if health["positions"].get("events") == written:
                return health
            return None

        final_health = await wait_for(
            settled, 300, "reader caught up", interval=0.05, ignoring=NOT_YET
        )
        assert await procs["reader"].terminate() == 0
        for writer in ("w1", "w2"):
            assert await procs[writer].terminate() == 0
    finally:
        if load is not None:
            await load.stop()
        for p in procs.values():
            p.kill()
        await client.close()

    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        db_events = conn.execute(
            "SELECT event_id, instance_name, stream_ordering FROM events"
            " WHERE stream_ordering > 0 ORDER BY stream_ordering"
        ).fetchall()
    check_record(record, db_events, acknowledged=load.acknowledged if load else set())
    if transport == "tcp":
        congested_writers = [w for w in ("w1", "w2") if "congestion" in procs[w].log_text()]
        assert congested_writers
        reconnects = [c["made"] for c in final_health["connections"]["clients"]]
        assert max(reconnects) >= 2, final_health


def check_record(
    record: Path, db_events: list[tuple[str, str, int]], acknowledged: set[str]
) -> None:
    lines = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    start = lines[0]["start"]["events"]
    rows: list[tuple[int, str, str, int]] = []  # (index, writer, event_id, token)
    linear: list[tuple[int, int]] = []
    for i, doc in enumerate(lines[1:], 1):
        if doc.get("stream") != "events":
            continue
        if "linear" in doc:
            linear.append((i, doc["linear"]))
        elif doc["row"][0] == "ev":
            rows.append((i, doc["writer"], doc["row"][1][0], doc["token"]))
    committed = {e: (w, t) for e, w, t in db_events if t > start.get(w, 0)}
    seen: dict[str, int] = defaultdict(int)
    for _, writer, event_id, token in rows:
        seen[event_id] += 1
        assert committed.get(event_id) == (writer, token), (event_id, writer, token)
    duplicates = [e for e, n in seen.items() if n > 1]
    assert not duplicates, f"processed twice: {duplicates[:5]}"
    missing = set(committed) - set(seen)
    assert not missing, f"{len(missing)} committed events never processed"
    assert acknowledged <= set(seen) | {e for e, _, t in db_events if t <= 0}
    assert len(committed) > 1000
    # In order per writer.
    per_writer: dict[str, list[int]] = defaultdict(list)
    for _, writer, _, token in rows:
        per_writer[writer].append(token)
    for writer, tokens in per_writer.items():
        assert tokens == sorted(tokens), f"{writer} processed out of order"
    # Every recorded linear position covers only processed facts.
    processed_at = {event_id: i for i, _, event_id, _ in rows}
    by_token = sorted((token, processed_at[e]) for e, (_, token) in committed.items())
    tokens_sorted = [t for t, _ in by_token]
    latest_so_far = list(itertools.accumulate((i for _, i in by_token), max))
    for index, position in linear:
        n = bisect.bisect_right(tokens_sorted, position)
        if n:
            assert latest_so_far[n - 1] < index, f"linear {position} recorded before its facts"
    assert linear, "no linear position recorded"
