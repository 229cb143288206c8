"""Writers and readers as in-process nodes on one database, over real TCP and real Redis.

Every node is a full :class:`ReplicationNode` (its own ``Database`` connection pool, stream
generators, follower and transport), so two nodes are two processes' worth of objects.
Tests that make sense on both transports are parametrised over ``tcp`` and ``redis``.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from roomstream.caches import CacheInvalidator, stream_invalidation_txn
from roomstream.config import Config
from roomstream.homeserver import Homeserver, open_room_engine
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.worker import ReplicationNode
from roomstream.storage import DatabaseConfig, Transaction
from roomstream.streams import STREAMS
from tests.support.ports import free_port
from tests.support.replication import TRANSPORTS, make_config
from tests.support.wait import wait_for


class Cluster:
    """Starts nodes of one configuration and stops them all."""

    def __init__(self, config: Config, tmp_path: Path) -> None:
        self.config = config
        self.tmp_path = tmp_path
        self.nodes: dict[str, ReplicationNode] = {}
        #: The whole process of each node (its listeners and Client-Server API).
        self.servers: dict[str, Homeserver] = {}

    async def start(self, name: str, **kwargs: Any) -> ReplicationNode:
        config = self.config.with_instance(name)
        engine = await open_room_engine(config)
        server = Homeserver(config, engine, **kwargs)
        await server.start()
        self.servers[name] = server
        self.nodes[name] = server.replication
        return server.replication

    async def stop(self, name: str) -> None:
        del self.nodes[name]
        server = self.servers.pop(name)

        async def stop_node() -> None:
            await server.stop()
            await server.engine.close()

        # A stop that hangs fails with the stuck tasks' stacks, instead of an opaque
        # pytest-timeout much later (asyncio.wait, unlike wait_for, does not cancel it).
        task = asyncio.ensure_future(stop_node())
        done, _ = await asyncio.wait({task}, timeout=60)
        if not done:
            raise AssertionError(f"stopping {name} hung:\n{task_stacks()}")
        task.result()

    async def close(self) -> None:
        for name in list(self.nodes):
            await self.stop(name)


def task_stacks() -> str:
    """Every pending asyncio task with its stack, for a failure message."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        out.write(f"--- {task!r}\n")
        task.print_stack(file=out)
    return out.getvalue()


ClusterFactory = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def cluster_factory(
    db_config: DatabaseConfig, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[ClusterFactory]:
    clusters: list[Cluster] = []

    async def factory(transport: str, **kwargs: Any) -> Cluster:
        if transport == "redis":
            request.getfixturevalue("redis_url")  # fails under CI=true when Redis is down
        cluster = Cluster(make_config(db_config, tmp_path, transport, **kwargs), tmp_path)
        clusters.append(cluster)
        return cluster

    try:
        yield factory
    finally:
        for cluster in clusters:
            await cluster.close()


def tcp_instances(*names: str, http: bool = False) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        spec: dict[str, Any] = {"replication_port": free_port()}
        if http:
            spec["http_port"] = free_port()
            spec["internal_port"] = free_port()
        out[name] = spec
    return out


def internal_auth(config: Config) -> dict[str, str]:
    """The header the internal HTTP API wants from every caller."""
    return {"Authorization": f"Bearer {effective_shared_secret(config)}"}


async def caches_writer_and_reader(
    cluster_factory: ClusterFactory, transport: str
) -> tuple[Cluster, ReplicationNode, ReplicationNode]:
    """Start the commonest cluster here: ``w1`` writes ``caches`` (and ``events``), and a
    ``reader`` follows it."""
    cluster = await cluster_factory(
        transport,
        stream_writers={"caches": ["w1"], "events": ["w1"]},
        instances=tcp_instances("w1", "reader"),
    )
    return cluster, await cluster.start("w1"), await cluster.start("reader")


class Recorder:
    """Wraps a node's follower callbacks to record what it processed."""

    def __init__(self, node: ReplicationNode) -> None:
        self.rows: list[tuple[str, str, int, Any]] = []
        self.tokens: list[tuple[str, str, int]] = []
        inner_process = node.process

        def process(stream: str, writer: str, token: int, rows: list[Any]) -> None:
            self.tokens.append((stream, writer, token))
            self.rows.extend((stream, writer, token, row) for row in rows)
            inner_process(stream, writer, token, rows)

        node.follower.callbacks = _Callbacks(process, node.advanced)


class _Callbacks:
    def __init__(self, process: Any, advanced: Any) -> None:
        self.process = process
        self.advanced = advanced


def _invalidate_many_txn(txn: Transaction, stream_id: int, instance: str, names: list[str]) -> None:
    for name in names:
        stream_invalidation_txn(txn, stream_id, instance, name, ["k", name], 1)


async def write_invalidations(node: ReplicationNode, count: int, rows_per_fact: int = 1) -> None:
    generator = node.engine.streams.generator("caches")
    for i in range(count):
        names = [f"cache{i}_{j}" for j in range(rows_per_fact)]
        async with generator.reserve() as stream_id:
            await node.engine.db.run_interaction(
                _invalidate_many_txn, stream_id, node.instance_name, names
            )


async def db_cache_rows(node: ReplicationNode, writer: str) -> list[tuple[int, list[Any]]]:
    rows = await node.engine.db.run_interaction(
        lambda txn: txn.query(
            "SELECT stream_id, cache_func, keys, invalidation_ts FROM cache_invalidations"
            " WHERE instance_name = ? ORDER BY stream_id, cache_func",
            (writer,),
        )
    )
    return [(int(r[0]), [r[1], orjson.loads(r[2]), int(r[3])]) for r in rows]


def caught_up(reader: ReplicationNode, writer: ReplicationNode, stream: str) -> Callable[[], bool]:
    """The writer has stored (so announced) everything it completed, and the reader has
    processed up to that position. (Writers may store positions in the background, so
    "stored" alone can lag behind facts that are already committed.)"""
    streams = writer.engine.streams

    def check() -> bool:
        token = writer.broadcaster.stored_token(stream)
        if stream in streams:
            generator = streams.generator(stream)
            local = generator.get_local_position()
            if (-local if STREAMS[stream].negative else local) != token:
                return False
        return reader.follower.processed(stream, writer.instance_name) == token

    return check


def assert_exactly_once_in_order(
    recorded: list[tuple[str, str, int, Any]], expected: list[tuple[int, list[Any]]]
) -> None:
    got = [(token, list(row)) for _, _, token, row in recorded]
    # Within a token the order of rows follows the table; compare as sorted groups.
    assert sorted(got, key=lambda x: (x[0], x[1][0])) == expected
    tokens = [t for t, _ in got]
    assert tokens == sorted(tokens), "rows processed out of order"


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reader_processes_every_row_once_and_invalidates_caches(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, transport)
    recorder = Recorder(reader)
    cache = reader.caches.register("cache3_0")
    cache.set(("k", "cache3_0"), "stale")
    cache.set(("k", "other"), "fresh")
    await write_invalidations(writer, 10)
    await write_invalidations(writer, 5, rows_per_fact=3)  # batched RDATA
    await wait_for(caught_up(reader, writer, "caches"), what="reader caught up")
    assert_exactly_once_in_order(recorder.rows, await db_cache_rows(writer, "w1"))
    assert ("k", "cache3_0") not in cache
    assert cache.get(("k", "other")) == "fresh"
    # The reader's generator follows what it processed.
    generator = reader.engine.streams.generator("caches")
    assert generator.get_position("w1") == writer.broadcaster.stored_token("caches")
    assert generator.get_linear_position() == generator.get_position("w1")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reconnect_catches_up_without_loss_or_duplicates(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, transport)
    recorder = Recorder(reader)
    await write_invalidations(writer, 5)
    await wait_for(caught_up(reader, writer, "caches"))
    for round_ in range(3):
        if transport == "tcp":
            client = reader.clients[0]
            made = client.connections_made
            client.disconnect()
            await write_invalidations(writer, 7, rows_per_fact=2)
            await wait_for(lambda c=client, m=made: c.connections_made > m, what="reconnect")
        else:
            assert reader.redis is not None
            subs = reader.redis.subscriptions
            await reader.redis.disconnect()
            await write_invalidations(writer, 7, rows_per_fact=2)
            await wait_for(lambda s=subs: reader.redis.subscriptions > s, what="resubscribe")  # type: ignore[union-attr]
        await write_invalidations(writer, 3)
        await wait_for(caught_up(reader, writer, "caches"), what=f"catch-up {round_}")
    assert_exactly_once_in_order(recorder.rows, await db_cache_rows(writer, "w1"))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reader_started_late_fetches_history_from_positions(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    cluster, writer, reader = await caches_writer_and_reader(cluster_factory, transport)
    recorder = Recorder(reader)
    start = reader.follower.processed("caches", "w1")
    await cluster.stop("reader")
    await write_invalidations(writer, 6)
    # A reader starting now begins at the stored positions it loads: nothing older is
    # replayed, nothing newer is skipped.
    reader = await cluster.start("reader")
    recorder = Recorder(reader)
    loaded = reader.follower.processed("caches", "w1")
    assert loaded is not None and start is not None and loaded >= start
    await write_invalidations(writer, 4)
    await wait_for(caught_up(reader, writer, "caches"))
    expected = [r for r in await db_cache_rows(writer, "w1") if r[0] > loaded]
    assert_exactly_once_in_order(recorder.rows, expected)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_idle_writer_announces_position_learnt_from_other_writer(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    """Two ``caches`` writers; only w2 writes. w1 learns w2's IDs, stores and announces its
    own (higher) position, so the reader's linear position keeps up with w2."""
    cluster = await cluster_factory(
        transport,
        stream_writers={"caches": ["w1", "w2"], "events": ["w1"]},
        instances=tcp_instances("w1", "w2", "reader"),
    )
    w1 = await cluster.start("w1")
    w2 = await cluster.start("w2")
    reader = await cluster.start("reader")
    before = w1.broadcaster.stored_token("caches")
    await write_invalidations(w2, 8)
    target = w2.broadcaster.stored_token("caches")
    generator = reader.engine.streams.generator("caches")
    await wait_for(lambda: generator.get_linear_position() >= target, what="linear position")
    assert w1.broadcaster.stored_token("caches") > before
    assert reader.follower.processed("caches", "w1") == w1.broadcaster.stored_token("caches")
    # w1 wrote nothing: its announced position covers no rows.
    assert await db_cache_rows(w1, "w1") == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_events_from_two_writers_reach_reader(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    cluster = await cluster_factory(
        transport,
        stream_writers={"events": ["w1", "w2"]},
        instances=tcp_instances("w1", "w2", "reader"),
    )
    w1 = await cluster.start("w1")
    w2 = await cluster.start("w2")
    reader = await cluster.start("reader")
    recorder = Recorder(reader)
    server = cluster.config.server_name
    alice = f"@alice:{server}"
    room1, _ = await w1.engine.creator.create_room(alice, name="one")
    room2, _ = await w2.engine.creator.create_room(alice, name="two")
    for i in range(5):
        await w1.engine.creator.create_event(room1, alice, "m.room.message", {"body": str(i)})
        await w2.engine.creator.create_event(room2, alice, "m.room.message", {"body": str(i)})
    await wait_for(caught_up(reader, w1, "events"))
    await wait_for(caught_up(reader, w2, "events"))
    rows = await w1.engine.db.run_interaction(
        lambda txn: txn.query("SELECT event_id, instance_name FROM events ORDER BY stream_ordering")
    )
    seen = [(row[1][0], w) for s, w, _, row in recorder.rows if s == "events" and row[0] == "ev"]
    assert sorted(seen) == sorted((r[0], r[1]) for r in rows)
    # Each writer learns the other's IDs and announces its own position past them, so the
    # reader's linear position comes to cover every fact it processed.
    events = reader.engine.streams.generator("events")
    latest = max(token for _, _, token, _ in recorder.rows)
    await wait_for(lambda: events.get_linear_position() >= latest, what="linear position")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_typing_rows_and_gap_fetch_over_http(
    cluster_factory: ClusterFactory, transport: str
) -> None:
    """The in-memory typing stream: live rows, and missed rows fetched from the writer's
    HTTP endpoint after a reconnect."""
    cluster = await cluster_factory(
        transport,
        stream_writers={"typing": ["w1"], "events": ["w1"]},
        instances=tcp_instances("w1", "reader", http=True),
    )
    writer = await cluster.start("w1")
    reader = await cluster.start("reader")
    recorder = Recorder(reader)
    await wait_for(lambda: reader.follower.processed("typing", "w1") is not None)
    writer.append_typing("!a:x", ["@u:x"])
    await wait_for(lambda: reader.follower.processed("typing", "w1") == 1)
    if transport == "tcp":
        client = reader.clients[0]
        # Stop the client for good, write while away, then follow again from scratch.
        await client.stop()
        for i in range(3):
            writer.append_typing(f"!r{i}:x", [f"@u{i}:x"])
        reader.clients.clear()
        await cluster.stop("reader")
        # A fresh reader has no typing position: it starts at the writer's.
        reader = await cluster.start("reader")
        recorder = Recorder(reader)
        await wait_for(lambda: reader.follower.processed("typing", "w1") == 4)
        assert recorder.rows == []
        # Now a real gap: pause the session by dropping the connection mid-way.
        client = reader.clients[0]
        made = client.connections_made
        client.disconnect()
        writer.append_typing("!b:x", ["@v:x"])
        writer.append_typing("!c:x", [])
        await wait_for(lambda: client.connections_made > made)
    else:
        assert reader.redis is not None
        subs = reader.redis.subscriptions
        await reader.redis.disconnect()
        writer.append_typing("!b:x", ["@v:x"])
        writer.append_typing("!c:x", [])
        await wait_for(lambda: reader.redis.subscriptions > subs)  # type: ignore[union-attr]
    final = writer.memory["typing"].token
    await wait_for(lambda: reader.follower.processed("typing", "w1") == final)
    typed = [(t, list(r)) for s, _, t, r in recorder.rows if s == "typing"]
    assert typed[-2:] == [(final - 1, ["!b:x", ["@v:x"]]), (final, ["!c:x", []])]
    assert len({t for t, _ in typed}) == len(typed)


async def test_cache_invalidator_applies_locally_and_remotely(
    cluster_factory: ClusterFactory,
) -> None:
    _cluster, writer, reader = await caches_writer_and_reader(cluster_factory, "tcp")
    for node in (writer, reader):
        users = node.caches.register("get_user")
        users.set(("@a:x",), 1)
        users.set(("@b:x",), 2)
        rooms = node.caches.register("get_rooms")
        rooms.set(("@a:x", "join"), ["!r"])
    invalidator = CacheInvalidator(writer.engine.streams, writer.caches, "w1")
    token = await invalidator.invalidate("get_user", ["@a:x"])
    await wait_for(lambda: reader.follower.processed("caches", "w1") == token)
    token = await invalidator.invalidate("get_rooms", None)
    await wait_for(lambda: reader.follower.processed("caches", "w1") == token)
    for node in (writer, reader):
        users = node.caches.get("get_user")
        rooms = node.caches.get("get_rooms")
        assert users is not None and rooms is not None
        assert ("@a:x",) not in users and users.get(("@b:x",)) == 2
        assert len(rooms) == 0
