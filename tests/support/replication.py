"""The configuration of in-process replication nodes on the test's database, over each
transport."""

from __future__ import annotations

import asyncio
import io
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from roomstream.caches import stream_invalidation_txn
from roomstream.config import Config, parse_config
from roomstream.homeserver import Homeserver, open_room_engine
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.worker import ReplicationNode
from roomstream.storage import DatabaseConfig, Transaction
from roomstream.streams import STREAMS
from tests.support.ports import free_port

#: How long a raw connection waits for the server to answer.
WAIT = 30.0

TRANSPORTS = ("tcp", "redis")


def make_config(
    db_config: DatabaseConfig,
    tmp_path: Path,
    transport: str,
    *,
    stream_writers: dict[str, list[str]],
    instances: dict[str, dict[str, Any]],
    replication: dict[str, Any] | None = None,
) -> Config:
    database = {k: v for k, v in asdict(db_config).items() if k != "options"}
    return parse_config(
        {
            "server_name": f"hs-{uuid.uuid4().hex[:10]}.test",  # one Redis channel per test
            "data_dir": str(tmp_path / "data"),
            "database": database,
            "stream_writers": stream_writers,
            "instances": instances,
            "replication": {"transport": transport, **(replication or {})},
        }
    )


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

        node.follower.callbacks = RecordingCallbacks(process, node.advanced)


class RecordingCallbacks:
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
                "invalidate_many", _invalidate_many_txn, stream_id, node.instance_name, names
            )


async def db_cache_rows(node: ReplicationNode, writer: str) -> list[tuple[int, list[Any]]]:
    rows = await node.engine.db.run_interaction(
        "test_query",
        lambda txn: txn.query(
            "SELECT stream_id, cache_func, keys, invalidation_ts FROM cache_invalidations"
            " WHERE instance_name = ? ORDER BY stream_id, cache_func",
            (writer,),
        ),
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


class Raw:
    """A hand-driven client socket, like ``nc``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, rcvbuf: int | None = None) -> Raw:
        if rcvbuf is None:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            return cls(r, w)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        r, w = await asyncio.open_connection(sock=sock)
        return cls(r, w)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def line(self, wait: float = WAIT) -> str:
        raw = await asyncio.wait_for(self.reader.readline(), wait)
        return raw.decode().rstrip("\n")

    async def until(self, prefix: str, wait: float = WAIT) -> str:
        """Read lines until one starts with ``prefix``; returns it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            line = await self.line(max(0.01, deadline - loop.time()))
            if line.startswith(prefix):
                return line
            if not line and self.reader.at_eof():
                raise AssertionError(f"EOF before {prefix!r}")

    async def eof(self, wait: float = WAIT) -> None:
        """Everything until the server closes the connection."""
        await asyncio.wait_for(self.reader.read(), wait)

    def close(self) -> None:
        self.writer.close()


async def connect_to(node: ReplicationNode) -> Raw:
    """A plain connection to the node's own replication port, past the deployment's secret
    (always required there: configured, or generated in the data directory)."""
    assert node.server is not None and node.settings.shared_secret is not None
    raw = await Raw.connect(node.server.port)
    await raw.send(f"AUTH {node.settings.shared_secret}\n".encode())
    return raw
