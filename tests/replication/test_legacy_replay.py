"""``REPLICATE <stream_name> <token>`` (the older protocol revision) over a real socket.

A plain client, as a script or ``nc`` would, asks a writer for a stream from an old token
while the writer keeps committing: it must get every row after the token exactly once, in
token order, then the live rows. ``ALL`` and ``NOW`` work as in the older document, and
a bare ``REPLICATE`` keeps the current protocol's answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from roomstream.replication import tcp
from roomstream.replication.worker import ReplicationNode
from tests.support.replication import (
    ClusterFactory,
    Raw,
    connect_to,
    db_cache_rows,
    tcp_instances,
    write_invalidations,
)


async def start_writer(cluster_factory: ClusterFactory) -> ReplicationNode:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"caches": ["w1"], "events": ["w1"]},
        instances=tcp_instances("w1"),
    )
    return await cluster.start("w1")


class Tail:
    """Reads a legacy subscription: RDATA rows (batches resolved to their token) and
    POSITION lines, in arrival order."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.rows: list[tuple[int, list[Any]]] = []
        self.positions: list[tuple[str, int, int]] = []
        self.streams: set[str] = set()
        self._batch: list[list[Any]] = []

    async def read_until(self, done: Any, wait: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not done():
            line = await self.raw.line(max(0.01, deadline - loop.time()))
            if not line:
                raise AssertionError("connection closed")
            name, _, rest = line.partition(" ")
            if name == "RDATA":
                stream, _writer, token, row = rest.split(" ", 3)
                self.streams.add(stream)
                if token == "batch":
                    self._batch.append(orjson.loads(row))
                    continue
                for batched in [*self._batch, orjson.loads(row)]:
                    self.rows.append((int(token), batched))
                self._batch = []
            elif name == "POSITION":
                stream, _writer, prev, new = rest.split(" ")
                self.positions.append((stream, int(prev), int(new)))
            elif name == "ERROR":
                raise AssertionError(line)


async def test_replay_from_an_old_token_while_writing_is_exact(
    cluster_factory: ClusterFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small replay pages: many round trips, so live pages arrive while the replay runs.
    monkeypatch.setattr(tcp, "REPLAY_PAGE_ROWS", 7)
    writer = await start_writer(cluster_factory)
    await write_invalidations(writer, 40)
    old = writer.broadcaster.stored_token("caches")
    await write_invalidations(writer, 200, rows_per_fact=2)  # history to replay (batches)

    async def keep_committing() -> None:
        for _ in range(4):
            await write_invalidations(writer, 50)
            await asyncio.sleep(0)  # interleave with the replay

    committing = asyncio.create_task(keep_committing())
    raw = await connect_to(writer)
    tail = Tail(raw)
    try:
        await raw.send(f"NAME tail\nREPLICATE caches {old}\n".encode())
        await committing
        expected = [row for row in await db_cache_rows(writer, "w1") if row[0] > old]
        assert len(expected) == 200 * 2 + 200
        last = expected[-1][0]  # committed; announced once its position is stored
        await tail.read_until(lambda: bool(tail.rows) and tail.rows[-1][0] == last)
        # Every row after the token exactly once, tokens in order.
        tokens = [token for token, _ in tail.rows]
        assert tokens == sorted(tokens)
        assert sorted(tail.rows, key=lambda r: (r[0], r[1][0])) == expected
        assert tail.streams == {"caches"}  # only the stream asked for
        # The caught-up announcement came once, between history and live rows.
        assert [p[0] for p in tail.positions] == ["caches"]
        _, prev, new = tail.positions[0]
        assert prev == new and old < new <= tokens[-1]
        # And then live rows, still exactly once.
        await write_invalidations(writer, 3)
        after = len(tail.rows)
        await tail.read_until(lambda: len(tail.rows) == after + 3)
        expected = [row for row in await db_cache_rows(writer, "w1") if row[0] > old]
        assert tail.rows == sorted(tail.rows, key=lambda r: (r[0], r[1][0])) == expected
    finally:
        raw.close()


async def test_replicate_all_now_and_the_bare_form(
    cluster_factory: ClusterFactory,
) -> None:
    writer = await start_writer(cluster_factory)
    await write_invalidations(writer, 5)
    now_raw = await connect_to(writer)
    bare_raw = await connect_to(writer)
    try:
        # NOW: nothing old, the current positions of every stream, then the live rows.
        await now_raw.send(b"REPLICATE ALL NOW\n")
        now = Tail(now_raw)
        await now.read_until(lambda: {p[0] for p in now.positions} == {"caches", "events"})
        position = writer.broadcaster.last_sent("caches")
        assert ("caches", position, position) in now.positions and not now.rows
        await write_invalidations(writer, 3)
        await now.read_until(lambda: len(now.rows) == 3)
        assert [t for t, _ in now.rows] == [position + 1, position + 2, position + 3]
        # A bare REPLICATE is the current protocol: positions, nothing replayed.
        await bare_raw.send(b"REPLICATE\n")
        line = await bare_raw.until("POSITION caches")
        stored = writer.broadcaster.stored_token("caches")
        assert line == f"POSITION caches w1 {stored} {stored}"
    finally:
        now_raw.close()
        bare_raw.close()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"REPLICATE no_such_stream 0\n", "ERROR unknown stream 'no_such_stream'"),
        (b"REPLICATE caches soon\n", "ERROR failed to parse line: REPLICATE token must be"),
    ],
)
async def test_replicate_refuses_unknown_streams_and_bad_tokens(
    cluster_factory: ClusterFactory,
    line: bytes,
    error: str,
) -> None:
    writer = await start_writer(cluster_factory)
    raw = await connect_to(writer)
    try:
        await raw.send(line)
        assert (await raw.until("ERROR")).startswith(error)
        await raw.eof()
    finally:
        raw.close()
