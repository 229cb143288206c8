"""The TCP transport against raw sockets: start-up, bad input, congestion, auth, time-outs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from roomstream.caches import stream_invalidation_txn
from roomstream.replication.follower import StreamFollower
from roomstream.replication.tcp import ReplicationClient, ReplicationServer, TcpSettings
from roomstream.replication.worker import ReplicationNode
from tests.support.replication import (
    WAIT,
    Cluster,
    ClusterFactory,
    Raw,
    caught_up,
    connect_to,
    tcp_instances,
    write_invalidations,
)
from tests.support.wait import wait_for


@pytest.fixture
def engine_name() -> str:
    """These tests exercise the transport; one database engine is enough."""
    return "sqlite"


@pytest.fixture
async def writer(
    cluster_factory: ClusterFactory,
) -> AsyncIterator[ReplicationNode]:
    cluster: Cluster = await cluster_factory(
        "tcp",
        stream_writers={"caches": ["w1"], "events": ["w1"]},
        instances=tcp_instances("w1", "reader"),
    )
    yield await cluster.start("w1")


#: How long a test waits for a line it expects: generous, since it only bounds how long a
#: failing test takes; a passing one never waits for it.


async def _read_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sends on ``sock`` until EOF (each read bounded by ``WAIT``),
    and whether the connection ended with a reset rather than EOF."""
    loop = asyncio.get_running_loop()
    data = b""
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), WAIT):
            data += chunk
    except ConnectionResetError:
        return data, True
    return data, False


async def server_for(writer: ReplicationNode, **settings: object) -> ReplicationServer:
    server = ReplicationServer(
        writer.config.server_name, writer.broadcaster, TcpSettings(**settings)
    )  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    return server


async def test_netcat_session(writer: ReplicationNode) -> None:
    server = await server_for(writer, ping_interval=0.05, timeout=0.2)
    try:
        raw = await Raw.connect(server.port)
        assert await raw.line() == f"SERVER {writer.config.server_name}"
        assert (await raw.line()).startswith("PING ")
        await raw.send(b"NAME human\r\nREPLICATE\n")
        position = await raw.until("POSITION caches")
        token = writer.broadcaster.stored_token("caches")
        assert position == f"POSITION caches w1 {token} {token}"
        await write_invalidations(writer, 2)
        rdata = await raw.until("RDATA caches w1 ")
        assert rdata.endswith(",1]") and '"cache0_0"' in rdata
        # Never pinged: never timed out, even after many time-out periods (keep-alives flow).
        pings = 0
        while pings < 10:
            if (await raw.line()).startswith("PING "):
                pings += 1
        assert server.connection_count == 1
        raw.close()
    finally:
        await server.close()


async def test_ping_arms_the_timeout(writer: ReplicationNode) -> None:
    server = await server_for(writer, ping_interval=0.05, timeout=0.3)
    try:
        raw = await Raw.connect(server.port)
        await raw.send(b"PING 1\n")
        assert await raw.until("ERROR ") == "ERROR ping timeout"
        await raw.eof()
        await wait_for(lambda: server.connection_count == 0)
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"FOO bar\n", "ERROR failed to parse line"),
        (b"POSITION caches w1 x 3\n", "ERROR failed to parse line"),
        (b"RDATA caches w1 1 []\n", "ERROR invalid command"),
        (b"NAME \xff\xfe\n", "ERROR failed to parse line"),
        (b"PING " + b"x" * 20000, "ERROR line length exceeded"),
    ],
    ids=["unknown", "malformed", "wrong-direction", "bad-utf8", "too-long"],
)
async def test_bad_input_closes_only_that_connection(
    writer: ReplicationNode, payload: bytes, error: str
) -> None:
    server = writer.server
    assert server is not None
    good = await connect_to(writer)
    await good.send(b"NAME good\nREPLICATE\n")
    await good.until("POSITION caches")
    bad = [await connect_to(writer) for _ in range(3)]
    for raw in bad:
        await raw.send(payload)
        line = await raw.until("ERROR ")
        assert line.startswith(error), line
        await raw.eof()
    await write_invalidations(writer, 3)
    for _ in range(3):
        await good.until("RDATA caches w1")
    await wait_for(lambda: server.connection_count == 1, what="bad clients gone")
    good.close()


async def test_congested_client_is_dropped_others_keep_up(writer: ReplicationNode) -> None:
    server = await server_for(writer, max_outbound_lines=50, socket_buffer=4096)
    follower_calls: list[int] = []

    class Callbacks:
        def process(self, stream: str, w: str, token: int, rows: list[object]) -> None:
            follower_calls.append(token)

        def advanced(self, stream: str, w: str, token: int) -> None:
            pass

    follower = StreamFollower(
        Callbacks(), ["caches"], {("caches", "w1"): writer.broadcaster.stored_token("caches")}
    )

    async def fetch(
        stream: str, w: str, frm: int, upto: int, limit: int
    ) -> tuple[list[tuple[int, object]], int, bool]:
        return await writer.engine.streams.get_updates(stream, w, frm, upto, limit)

    good = ReplicationClient(
        "127.0.0.1",
        server.port,
        client_name="good",
        expected_server_name=writer.config.server_name,
        follower=follower,
        fetch=fetch,
    )
    good.start()
    try:
        # A client that never reads: a bare socket (asyncio streams would read ahead).
        loop = asyncio.get_running_loop()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        slow.setblocking(False)
        await loop.sock_connect(slow, ("127.0.0.1", server.port))
        await loop.sock_sendall(slow, b"NAME slow\nREPLICATE\n")
        assert good.positioned is not None
        await asyncio.wait_for(good.positioned, WAIT)
        await write_invalidations(writer, 400, rows_per_fact=2)
        await wait_for(lambda: server.congestion_drops == 1, what="congestion drop")
        await wait_for(
            lambda: follower.processed("caches", "w1") == writer.broadcaster.stored_token("caches")
        )
        assert len(follower_calls) == 400 and follower_calls == sorted(follower_calls)
        assert good.connections_made == 1  # the healthy client was never disturbed
        assert server.connection_count == 1
        # The slow client gets what was already in flight, then the ERROR (or a reset when
        # the server had to discard its buffer): never the whole stream.
        data, reset = await _read_until_closed(slow)
        slow.close()
        assert reset or data.count(b"\nRDATA ") < 800
        if data.endswith(b"\n") and b"ERROR" in data:
            assert data.endswith(b"ERROR congestion: more than 50 lines queued\n")
    finally:
        await good.stop()
        await server.close()


async def test_shared_secret_authentication(writer: ReplicationNode) -> None:
    # The authentication time-out only on a server of its own: a short one there, and
    # clients that do answer never race it (a stalled machine could make them miss 1 s).
    server = await server_for(writer, shared_secret="s3cret", timeout=60.0)
    quick = await server_for(writer, shared_secret="s3cret", timeout=0.2)
    try:
        anonymous = await Raw.connect(server.port)
        await anonymous.send(b"NAME x\n")
        assert await anonymous.line() == "ERROR authentication required: send AUTH <secret> first"
        await anonymous.eof()
        wrong = await Raw.connect(server.port)
        await wrong.send(b"AUTH guess\n")
        assert await wrong.line() == "ERROR authentication failed"
        await wrong.eof()
        silent = await Raw.connect(quick.port)  # says nothing: dropped after the timeout
        assert await silent.line() == "ERROR authentication timeout"
        right = await Raw.connect(server.port)
        await right.send(b"AUTH s3cret\nREPLICATE\n")
        assert await right.line() == f"SERVER {writer.config.server_name}"
        await right.until("POSITION caches")
        assert (server.auth_failures, quick.auth_failures) == (2, 1)
        right.close()
        # The client speaks it too.
        follower = StreamFollower(_NoCallbacks(), ["caches"])
        client = ReplicationClient(
            "127.0.0.1",
            server.port,
            client_name="reader",
            expected_server_name=writer.config.server_name,
            follower=follower,
            fetch=_no_fetch,
            settings=TcpSettings(shared_secret="s3cret"),
        )
        client.start()
        await wait_for(lambda: follower.processed("caches", "w1") is not None)
        await client.stop()
    finally:
        await server.close()
        await quick.close()
    # A server without a secret (only tests build one: a node always has a secret)
    # ignores a leading AUTH line.
    plain = await server_for(writer)
    try:
        raw = await Raw.connect(plain.port)
        await raw.send(b"AUTH whatever\nREPLICATE\n")
        await raw.until("POSITION caches")
        raw.close()
    finally:
        await plain.close()


class _NoCallbacks:
    def process(self, stream: str, w: str, token: int, rows: list[object]) -> None:
        pass

    def advanced(self, stream: str, w: str, token: int) -> None:
        pass


async def _no_fetch(
    s: str, w: str, f: int, u: int, limit: int
) -> tuple[list[tuple[int, object]], int, bool]:
    return [], u, False


async def test_wrong_server_name_is_refused_and_retried(writer: ReplicationNode) -> None:
    server = writer.server
    assert server is not None
    follower = StreamFollower(_NoCallbacks(), ["caches"])
    client = ReplicationClient(
        "127.0.0.1",
        server.port,
        client_name="reader",
        expected_server_name="someone.else",
        follower=follower,
        fetch=_no_fetch,
        settings=replace(writer.settings, backoff_initial=0.01, backoff_max=0.05),
    )
    client.start()
    try:
        await wait_for(lambda: client.connections_made >= 3, what="retries")
        assert client.last_local_error is not None
        assert client.last_local_error.startswith("wrong remote")
        assert follower.processed("caches", "w1") is None
    finally:
        await client.stop()


def test_backoff_is_exponential_capped_and_jittered() -> None:
    follower = StreamFollower(_NoCallbacks(), [])
    client = ReplicationClient(
        "127.0.0.1",
        1,
        client_name="c",
        expected_server_name=None,
        follower=follower,
        fetch=_no_fetch,
        settings=TcpSettings(backoff_initial=0.1, backoff_max=2.0),
    )
    for failures, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (30, 2.0)]:
        delays = {client.backoff_delay(failures) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered


async def test_client_reconnects_after_server_restart(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(
        "tcp",
        stream_writers={"caches": ["w1"], "events": ["w1"]},
        instances=tcp_instances("w1", "reader"),
    )
    writer = await cluster.start("w1")
    reader = await cluster.start("reader")
    await write_invalidations(writer, 3)
    await wait_for(caught_up(reader, writer, "caches"))
    client = reader.clients[0]
    made = client.connections_made
    await cluster.stop("w1")
    writer = await cluster.start("w1")  # same port; the client keeps retrying until then
    await write_invalidations(writer, 4)
    await wait_for(lambda: client.connections_made > made, what="reconnect")
    await wait_for(caught_up(reader, writer, "caches"))


async def test_reader_that_never_reads_costs_bounded_memory(writer: ReplicationNode) -> None:
    """Long lines, few of them: the line bound alone (10,000) would let ~20 MB queue up in
    this process; the byte bound drops the reader after about ``bound`` bytes."""
    bound = 256 * 1024
    row_bytes = 2_000
    server = await server_for(writer, max_outbound_bytes=bound, socket_buffer=4096)
    generator = writer.engine.streams.generator("caches")
    loop = asyncio.get_running_loop()
    slow = socket.socket()  # a bare socket that never reads (asyncio streams read ahead)
    try:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        slow.setblocking(False)
        await loop.sock_connect(slow, ("127.0.0.1", server.port))
        await loop.sock_sendall(slow, b"NAME slow\nREPLICATE\n")
        await wait_for(lambda: server.connection_count == 1, what="connected")
        written = 0
        # Up to ~20 MB of rows, one fact at a time; stop as soon as the reader is dropped.
        while server.congestion_drops == 0 and written < 10_000:
            async with generator.reserve() as stream_id:
                await writer.engine.db.run_interaction(
                    "stream_invalidation",
                    stream_invalidation_txn,
                    stream_id,
                    "w1",
                    "big",
                    ["x" * row_bytes, written],
                    1,
                )
            written += 1
            await asyncio.sleep(0)  # let the sender run (each fact is sent as it commits)
        await wait_for(lambda: server.congestion_drops == 1, what="congestion drop")
        assert server.connection_count == 0
        # What this process held for the reader never went far past the bound: at most
        # the one page being written when it was crossed (here a page is a few rows).
        assert server.peak_queued_bytes <= bound + 50 * row_bytes, server.peak_queued_bytes
        assert written * row_bytes < 4 * bound  # dropped early, not after ~20 MB
        data, reset = await _read_until_closed(slow)
        # The connection ended (the ERROR line, when the kernel buffers had room for it,
        # then EOF or a reset as the discarded buffer is aborted), short of the stream.
        assert reset or data.count(b"\nRDATA ") < written
        if b"\nERROR " in data:
            assert data.endswith(f"ERROR congestion: more than {bound} bytes queued\n".encode())
    finally:
        slow.close()
        await server.close()
