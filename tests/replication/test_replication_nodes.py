"""Writers and readers as in-process nodes on one database, over real TCP and real Redis.

Every node is a full :class:`ReplicationNode` (its own ``Database`` connection pool, stream
generators, follower and transport), so two nodes are two processes' worth of objects.
Tests that make sense on both transports are parametrised over ``tcp`` and ``redis``.
"""

from __future__ import annotations

import pytest

from roomstream.caches import CacheInvalidator
from tests.support.replication import (
    TRANSPORTS,
    ClusterFactory,
    Recorder,
    assert_exactly_once_in_order,
    caches_writer_and_reader,
    caught_up,
    db_cache_rows,
    tcp_instances,
    write_invalidations,
)
from tests.support.wait import wait_for

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
        "test_query",
        lambda txn: txn.query(
            "SELECT event_id, instance_name FROM events ORDER BY stream_ordering"
        ),
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
