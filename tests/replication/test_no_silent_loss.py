"""Replication loses nothing silently, and follows Synapse's Redis conventions.

Real nodes over real TCP sockets and the real Redis: rows of any length arrive (Redis
carries long lines as Synapse does; TCP keeps its 16 KiB limit and announces an over-long
row by position instead), a message the reader cannot parse makes it catch up rather than
skip a row, ``USER_IP`` travels on ``<server_name>/USER_IP``, and rows or positions of
streams (or writers) the reader does not know leave its connection alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from roomstream.caches import stream_invalidation_txn
from roomstream.replication.commands import (
    Command,
    PositionCommand,
    RdataCommand,
    UserIpCommand,
    parse_line,
)
from roomstream.replication.connection import ReplicationConnection
from roomstream.replication.redis_transport import user_ip_channel_name
from roomstream.replication.worker import ReplicationNode
from tests.support.replication import (
    TRANSPORTS,
    ClusterFactory,
    Recorder,
    assert_exactly_once_in_order,
    caches_writer_and_reader,
    caught_up,
    db_cache_rows,
    write_invalidations,
)
from tests.support.wait import wait_for


@pytest.fixture
def engine_name() -> str:
    return "sqlite"  # transport behaviour; one database engine is enough


async def write_row_with_key_of(node: ReplicationNode, size: int) -> int:
    """Commit one ``caches`` row whose line is about ``size`` bytes; returns its token."""
    generator = node.engine.streams.generator("caches")
    async with generator.reserve() as stream_id:
        await node.engine.db.run_interaction(
            "stream_invalidation",
            stream_invalidation_txn,
            stream_id,
            node.instance_name,
            "big",
            ["x" * size],
            1,
        )
    return stream_id


class Channel:
    """A raw Redis subscriber (like ``redis-cli subscribe``) collecting messages."""

    def __init__(self, url: str) -> None:
        self.client = aioredis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.messages: list[tuple[str, bytes]] = []
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self, *channels: str) -> None:
        await self.pubsub.subscribe(*channels)
        confirmed = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while confirmed < len(channels):  # wait for Redis to confirm every channel
            assert loop.time() < deadline, "Redis did not confirm the subscription"
            message = await self.pubsub.get_message(timeout=1)
            if message is not None and message["type"] == "subscribe":
                confirmed += 1
        self._task = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        async for message in self.pubsub.listen():
            if message["type"] == "message":
                self.messages.append((message["channel"].decode(), message["data"]))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.pubsub.aclose()
        await self.client.aclose()


@pytest.fixture
async def channel(redis_url: str) -> AsyncIterator[Channel]:
    ch = Channel(redis_url)
    try:
        yield ch
    finally:
        await ch.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rows_of_any_length_reach_readers(
    cluster_factory: ClusterFactory,
    transport: str,
    request: pytest.FixtureRequest,
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, transport)
    recorder = Recorder(reader)
    raw: Channel | None = None
    if transport == "redis":
        raw = Channel(request.getfixturevalue("redis_url"))
        await raw.subscribe(writer.config.server_name)
    try:
        # 24 KB and 120 KB lines: what a long account-data type and presence status make.
        for size in (100, 24_000, 120_000, 100):
            await write_row_with_key_of(writer, size)
        await write_invalidations(writer, 2)
        await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
        assert_exactly_once_in_order(recorder.rows, await db_cache_rows(writer, "w1"))
        if raw is not None:
            # Over Redis the long lines themselves were published, as Synapse does.
            await wait_for(
                lambda: any(len(data) > 120_000 for _, data in raw.messages), what="long line"
            )
            assert reader.redis is not None and reader.redis.unparseable == 0
    finally:
        if raw is not None:
            await raw.close()


async def test_unparseable_redis_message_is_caught_up_not_skipped(
    cluster_factory: ClusterFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, "redis")
    await write_invalidations(writer, 2)
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    recorder = Recorder(reader)
    link = writer.redis
    assert link is not None and reader.redis is not None
    original = link._enqueue
    corrupted: list[int | None] = []

    def enqueue(cmd: Command) -> None:
        # The first row from now on reaches the channel mangled, as a truncated line.
        if type(cmd) is RdataCommand and not corrupted:
            corrupted.append(cmd.token)
            link._queue.append((link.channel, f'RDATA caches w1 {cmd.token} ["bro'.encode()))
            return
        original(cmd)

    monkeypatch.setattr(link, "_enqueue", enqueue)
    await write_invalidations(writer, 1)  # its row is the mangled one
    await write_invalidations(writer, 3)  # later rows arrive intact
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    assert corrupted and corrupted[0] is not None
    assert reader.redis.unparseable == 1
    start = min(token for _, _, token, _ in recorder.rows)
    expected = [row for row in await db_cache_rows(writer, "w1") if row[0] >= start]
    assert start == corrupted[0]  # the mangled token was processed, first, from the database
    assert_exactly_once_in_order(recorder.rows, expected)


async def test_unparseable_tcp_line_reconnects_and_catches_up(
    cluster_factory: ClusterFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over TCP a line that does not parse ends the connection (``ERROR``); the reader
    reconnects and fetches from positions, so the row in that line is not lost either."""
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, "tcp")
    await write_invalidations(writer, 2)
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    recorder = Recorder(reader)
    original = ReplicationConnection.receive_data
    mangled: list[bytes] = []

    def receive_data(self: ReplicationConnection, data: bytes, now: float) -> list[Command]:
        # The first caches row the reader receives from now on arrives with broken JSON.
        at = data.find(b"RDATA caches w1 ")
        if at >= 0 and not mangled:
            row = data.index(b" [", at) + 1
            mangled.append(data[at:row])
            data = data[:row] + b"[" + data[row:]
        return original(self, data, now)

    monkeypatch.setattr(ReplicationConnection, "receive_data", receive_data)
    await write_invalidations(writer, 1)
    await write_invalidations(writer, 3)
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    assert mangled and reader.clients[0].connections_made == 2
    start = min(token for _, _, token, _ in recorder.rows)
    expected = [row for row in await db_cache_rows(writer, "w1") if row[0] >= start]
    assert len(expected) == 4
    assert_exactly_once_in_order(recorder.rows, expected)


async def test_user_ip_travels_on_its_own_channel(
    cluster_factory: ClusterFactory,
    channel: Channel,
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, "redis")
    server_name = writer.config.server_name
    assert user_ip_channel_name(server_name) == f"{server_name}/USER_IP"
    await channel.subscribe(server_name, f"{server_name}/USER_IP")
    assert reader.redis is not None and writer.redis is not None
    # USER_IP has no catch-up (Redis drops what nobody is subscribed to, as for Synapse):
    # send it only once the reader's subscription is confirmed.
    await asyncio.wait_for(reader.redis.subscribed.wait(), 60)
    received: list[Command] = []
    reader.redis.on_command = received.append
    sent = UserIpCommand("@u:" + server_name, "token", "10.0.0.1", "curl", None, 1234)
    writer.redis.send(sent)
    await wait_for(lambda: sent in received, what="USER_IP at the other process")
    await wait_for(lambda: any(b"USER_IP" in d for _, d in channel.messages), what="published")
    user_ip = [(c, d) for c, d in channel.messages if d.startswith(b"USER_IP ")]
    assert [c for c, _ in user_ip] == [f"{server_name}/USER_IP"]
    assert parse_line(user_ip[0][1]) == sent
    # A USER_IP published by another process (Synapse) on that channel is received too.
    publisher = channel.client
    await publisher.publish(
        f"{server_name}/USER_IP", b'USER_IP @v:hs ["t","10.0.0.2","ua","DEV",5]'
    )
    await wait_for(
        lambda: UserIpCommand("@v:hs", "t", "10.0.0.2", "ua", "DEV", 5) in received,
        what="USER_IP from the channel",
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unknown_stream_or_writer_does_not_break_the_connection(
    cluster_factory: ClusterFactory,
    transport: str,
    request: pytest.FixtureRequest,
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, transport)
    await write_invalidations(writer, 2)
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    recorder = Recorder(reader)
    strange: list[Command] = [
        PositionCommand("no_such_stream", "w1", 5, 5),
        RdataCommand("no_such_stream", "w1", 6, ["x"]),
        RdataCommand("no_such_stream", "w1", None, ["y"]),
        PositionCommand("caches", "w9", 3, 3),  # a writer nobody configured
        RdataCommand("caches", "w9", 4, ["c", ["k"], 1]),
        PositionCommand("caches", "w9", 6, 8),  # a "gap" for it: fetched, found empty
    ]
    if transport == "tcp":
        assert writer.server is not None
        connections = list(writer.server._connections)
        assert len(connections) == 1
        connections[0].send_commands(strange)
    else:
        redis_url: str = request.getfixturevalue("redis_url")
        client: Any = aioredis.Redis.from_url(redis_url)
        try:
            for line in (
                b"POSITION no_such_stream w1 5 5",
                b'RDATA no_such_stream w1 6 ["x"]',
                b'RDATA no_such_stream w1 batch ["y"]',
                b"POSITION caches w9 3 3",
                b'RDATA caches w9 4 ["c",["k"],1]',
                b"POSITION caches w9 6 8",
            ):
                await client.publish(writer.config.server_name, line)
        finally:
            await client.aclose()
    await write_invalidations(writer, 3)
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    start = min(token for _, _, token, _ in recorder.rows)
    expected = [row for row in await db_cache_rows(writer, "w1") if row[0] >= start]
    assert len(expected) == 3
    assert_exactly_once_in_order([r for r in recorder.rows if r[1] == "w1"], expected)
    if transport == "tcp":
        assert reader.clients[0].connections_made == 1
    else:
        assert reader.redis is not None
        assert (reader.redis.subscriptions, reader.redis.unparseable) == (1, 0)
