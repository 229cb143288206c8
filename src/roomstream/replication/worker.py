"""Replication for one roomstream process: writer, reader, or both.

:class:`ReplicationNode` holds the replication side of the configured instance (the
process itself is assembled by :mod:`roomstream.homeserver`):

- a :class:`~roomstream.replication.writer.StreamBroadcaster` for the streams it writes;
- a :class:`~roomstream.replication.follower.StreamFollower` over every stream, for the
  writers other than itself; processing a row applies cache invalidations (``caches``),
  hands it to the registered :class:`ReplicatedDataListener` objects (the Client-Server
  API's notifier and caches) and optionally appends it to a record file; the ID
  generators advance as facts are processed, and an idle writer that learns of others'
  positions stores and announces its own;
- the transport from the configuration: TCP (a server when it writes anything and has a
  ``replication_port``; a client per other writer instance with one) or Redis;
- what the internal HTTP API needs of it (health, in-memory stream updates, sending an
  event and creating a room on an events writer), and the client of other processes'
  internal APIs (:attr:`ReplicationNode.http_client`).

The record file (``--record``) holds one JSON object per line, in processing order:
``{"start": {stream: {writer: token}}}`` first, then ``{"stream", "writer", "token",
"row"}`` for every processed row and ``{"stream", "linear"}`` whenever a stream's linear
position moved. It exists so end-to-end tests can check exactly-once, in-order
processing against the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any, Protocol

import orjson

from roomstream import metrics
from roomstream.caches import STATE_CACHE_GROUP, CacheGroup, CacheRegistry
from roomstream.config import Config, ConfigError
from roomstream.replication import endpoints as ep
from roomstream.replication.commands import Command
from roomstream.replication.endpoints import BoundEndpoint
from roomstream.replication.follower import StreamFollower
from roomstream.replication.http import InternalHttpClient, StreamTooOldHttpError
from roomstream.replication.redis_transport import RedisReplication
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.tcp import ReplicationClient, ReplicationServer, TcpSettings
from roomstream.replication.writer import StreamBroadcaster
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.streams import STREAMS, InMemoryStream
from roomstream.streams.registry import Update

__all__ = ["ReplicatedDataListener", "ReplicationNode", "start_listener"]

logger = logging.getLogger(__name__)

#: Seconds the process waits for replication before saying it is degraded.
READY_WAIT = 5.0
#: Seconds between checks of the replication links (for the WARNING on an outage).
HEALTH_CHECK_INTERVAL = 1.0


class _Recorder:
    """Appends processed facts to a JSON-lines file (see the module docstring)."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[bytes] | None = open(path, "ab") if path else None  # noqa: SIM115

    def write(self, doc: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(orjson.dumps(doc) + b"\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None


class ReplicatedDataListener(Protocol):
    """Told of every fact replication processes from another writer (in order, once)."""

    def on_replicated_rows(
        self, stream_name: str, writer: str, token: int, rows: Sequence[Any]
    ) -> None: ...

    def on_replicated_position(self, stream_name: str, writer: str, position: int) -> None: ...


async def start_listener(
    config: Config, key: str, port: int, start: Callable[[], Awaitable[int]]
) -> int:
    """Start a listener; a port that cannot be bound is a configuration error naming the
    key ``instances.<instance>.<key>`` (one line, instead of a traceback)."""
    try:
        return await start()
    except OSError as exc:
        host = config.instance().host
        where = f"instances.{config.instance_name}.{key}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{where}: port {port} on {host} is already in use") from None
        raise ConfigError(f"{where}: cannot listen on {host}:{port}: {exc.strerror}") from None


class ReplicationNode:
    """Replication for one instance of ``config`` (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        engine: RoomEngine,
        *,
        record_path: str | None = None,
        socket_buffer: int | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.instance_name = config.instance_name
        streams = engine.streams
        self.memory: dict[str, InMemoryStream] = {
            name: InMemoryStream(name)
            for name, stream in STREAMS.items()
            if stream.in_memory and self.instance_name in config.writers_of(name)
        }
        self.broadcaster = StreamBroadcaster(streams, self.instance_name, self.memory)
        self.caches = CacheRegistry()
        self.caches.define_group(CacheGroup(STATE_CACHE_GROUP))
        self._recorder = _Recorder(record_path)
        self._linear: dict[str, int] = {}
        self._storing: dict[str, asyncio.Task[None]] = {}
        self._store_again: set[str] = set()
        start: dict[tuple[str, str], int] = {}
        for name in streams.names:
            generator = streams.generator(name)
            for writer in generator.writers:
                if writer != self.instance_name:
                    start[(name, writer)] = streams.current_token(name, writer)
            self._linear[name] = generator.get_linear_position()
        self.follower = StreamFollower(
            self,
            list(STREAMS),
            start,
            instance_name=self.instance_name,
            in_memory=[n for n, s in STREAMS.items() if s.in_memory],
        )
        self._recorder.write({"start": self.follower.positions()})
        self.http_client = InternalHttpClient(config)
        self.settings = TcpSettings(
            timeout=config.replication.ping_timeout,
            max_outbound_lines=config.replication.max_outbound_lines,
            max_outbound_bytes=config.replication.max_outbound_bytes,
            shared_secret=effective_shared_secret(config),
            socket_buffer=socket_buffer,
        )
        self.server: ReplicationServer | None = None
        self.clients: list[ReplicationClient] = []
        #: The TCP client following each writer instance (one per instance followed).
        self._client_of: dict[str, ReplicationClient] = {}
        self.redis: RedisReplication | None = None
        #: Told of every replicated row and position (see :class:`ReplicatedDataListener`).
        self.listeners: list[ReplicatedDataListener] = []
        #: Told of every other command a peer sends (USER_SYNC, CLEAR_USER_SYNC, ...).
        self.command_listeners: list[Callable[[Command], None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        #: The Prometheus registry of this instance (served on the internal listener).
        self.metrics_registry = metrics.instance_registry(self)

    # -- FollowerCallbacks --------------------------------------------------------------

    def process(self, stream_name: str, writer: str, token: int, rows: list[Any]) -> None:
        if stream_name == "caches":
            for row in rows:
                self.caches.apply_row(row)
        for listener in self.listeners:
            listener.on_replicated_rows(stream_name, writer, token, rows)
        recorder = self._recorder
        if recorder._file is not None:
            for row in rows:
                recorder.write(
                    {"stream": stream_name, "writer": writer, "token": token, "row": row}
                )

    def advanced(self, stream_name: str, writer: str, token: int) -> None:
        for listener in self.listeners:
            listener.on_replicated_position(stream_name, writer, token)
        streams = self.engine.streams
        if stream_name not in streams:
            return
        generator = streams.generator(stream_name)
        if writer not in generator.writers:
            return
        generator.advance(writer, -token if STREAMS[stream_name].negative else token)
        linear = generator.get_linear_position()
        if linear != self._linear.get(stream_name):
            self._linear[stream_name] = linear
            self._recorder.write({"stream": stream_name, "linear": linear})
        if generator.is_writer():
            self._schedule_store(stream_name)

    def _schedule_store(self, stream_name: str) -> None:
        """Store (and so announce) the local position, coalescing concurrent requests."""
        if stream_name in self._storing:
            self._store_again.add(stream_name)
            return
        self._storing[stream_name] = asyncio.create_task(self._store(stream_name))

    async def _store(self, stream_name: str) -> None:
        generator = self.engine.streams.generator(stream_name)
        try:
            while True:
                self._store_again.discard(stream_name)
                await generator.store_local_position()
                if stream_name not in self._store_again:
                    break
        except Exception:
            logger.exception("storing the position of %s failed", stream_name)
        finally:
            del self._storing[stream_name]

    # -- fetching missed rows -----------------------------------------------------------

    async def fetch(
        self, stream_name: str, writer: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[Update], int, bool]:
        if STREAMS[stream_name].in_memory:
            try:
                call = ep.StreamUpdatesCall(
                    stream=stream_name,
                    writer=writer,
                    from_token=from_token,
                    upto=upto_token,
                    limit=limit,
                )
                result = await self.http_client.call(ep.STREAM_UPDATES, writer, call)
                updates = [(int(t), r) for t, r in result["updates"]]
                return updates, int(result["upto"]), bool(result["limited"])
            except StreamTooOldHttpError:
                # In-memory rows are ephemeral: skip to the writer's position.
                logger.warning("%s rows of %s before %s are gone", stream_name, writer, upto_token)
                self.follower.resets += 1
                return [], upto_token, False
        return await self.engine.streams.get_updates(
            stream_name, writer, from_token, upto_token, limit
        )

    # -- lifecycle ----------------------------------------------------------------------

    def _followed_writer_instances(self) -> list[str]:
        names: set[str] = set()
        for stream_name, stream in STREAMS.items():
            writers = self.config.stream_writers.get(stream_name) or stream.default_writers
            names.update(writers)
        names.discard(self.instance_name)
        return sorted(names)

    async def start(self) -> None:
        config = self.config
        me = config.instance()
        self.broadcaster.start()
        if config.replication.transport == "redis":
            self.redis = RedisReplication(
                server_name=config.server_name,
                instance_name=self.instance_name,
                host=config.redis.host,
                port=config.redis.port,
                db=config.redis.db,
                follower=self.follower,
                fetch=self.fetch,
                broadcaster=self.broadcaster,
                max_outbound_lines=config.replication.max_outbound_lines,
                after_batch=self._recorder.flush,
                on_command=self._on_command,
            )
            await self.redis.start()
        else:
            replication_port = me.replication_port
            if self.broadcaster.stream_names and replication_port is not None:
                self.server = server = ReplicationServer(
                    config.server_name, self.broadcaster, self.settings, on_command=self._on_command
                )
                port = await start_listener(
                    config,
                    "replication_port",
                    replication_port,
                    lambda: server.start(me.host, replication_port),
                )
                logger.info("replication listening on %s:%d", me.host, port)
            for name in self._followed_writer_instances():
                instance = config.instances.get(name)
                if instance is None or not instance.replication_port:
                    logger.info("not following %s: no replication_port configured", name)
                    continue
                client = ReplicationClient(
                    instance.host,
                    instance.replication_port,
                    client_name=self.instance_name,
                    expected_server_name=config.server_name,
                    follower=self.follower,
                    fetch=self.fetch,
                    settings=self.settings,
                    after_batch=self._recorder.flush,
                )
                client.start()
                self.clients.append(client)
                self._client_of[name] = client
        self._flusher = asyncio.create_task(self._flush_loop())
        self._watcher = asyncio.create_task(self._watch_replication())

    def _on_command(self, cmd: Command) -> None:
        for listener in self.command_listeners:
            try:
                listener(cmd)
            except Exception:
                logger.exception("handling replication command %s failed", cmd.NAME)

    def send_command(self, cmd: Command, instance: str) -> bool:
        """Send a client command (USER_SYNC, ...) towards ``instance``: on the TCP
        connection following it, or on the Redis channel (every process hears it).
        False when there is no way to send it now (it is not queued)."""
        if self.redis is not None:
            self.redis.send(cmd)
            return True
        client = self._client_of.get(instance)
        return client is not None and client.send(cmd)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self._recorder.flush()

    async def stop(self) -> None:
        """Store (and so announce) the local positions, then stop everything."""
        try:
            await self.engine.streams.flush()
        except Exception:
            logger.exception("storing positions at shutdown failed")
        for task in (self._flusher, self._watcher):
            if task is not None:
                task.cancel()
        for client in self.clients:
            await client.stop()
        if self.redis is not None:
            await self.redis.stop()
        if self.server is not None:
            await self.server.close()
        await self.broadcaster.stop()
        await self.http_client.close()
        for task in list(self._storing.values()):
            with contextlib.suppress(Exception):
                await task
        self._recorder.close()

    # -- HTTP actions -------------------------------------------------------------------

    def event_writes(self) -> list[BoundEndpoint[Any, Any]]:
        """The internal API's events writes, served here (on an events writer: else
        none, and ``send_event`` is forwarded to the room's owner)."""
        if self.instance_name not in self.config.writers_of("events"):
            return []
        return [
            ep.SEND_EVENT.bind(self.send_event_locally),
            ep.CREATE_NAMED_ROOM.bind(self.create_room_locally),
        ]

    async def send_event_locally(self, call: ep.SendEventCall) -> dict[str, Any]:
        created = await self.engine.creator.create_event(
            call.room_id,
            call.sender,
            call.type,
            call.content,
            state_key=call.state_key,
            redacts=call.redacts,
        )
        return {"event_id": created.event.event_id, "stream_ordering": created.stream_ordering}

    async def create_room_locally(self, call: ep.CreateNamedRoomCall) -> str:
        room_id, _ = await self.engine.creator.create_room(
            call.creator, preset=RoomPreset.PUBLIC_CHAT, name=call.name
        )
        return room_id

    def append_typing(self, room_id: str, user_ids: list[str]) -> int:
        """Record who is typing (this instance must write ``typing``); returns the token."""
        token = self.memory["typing"].append([(room_id, user_ids)])
        self.broadcaster.notify("typing")
        return token

    def stream_live(self, stream_name: str) -> bool:
        """Whether every other writer's facts of ``stream_name`` reach this process as
        they are written: the link carrying each is live (the transports'
        ``live``, defined once by
        :meth:`~roomstream.replication.follower.FollowerSession.is_live`). A writer with
        no link (not followed) is never live."""
        for writer in self.engine.streams.generator(stream_name).writers:
            if writer == self.instance_name:
                continue
            if self.redis is not None:
                if not self.redis.live(stream_name, writer):
                    return False
                continue
            client = self._client_of.get(writer)
            if client is None or not client.live(stream_name, writer):
                return False
        return True

    def replication_problems(self) -> list[str]:
        """Why replication is degraded right now: one line per link that is down (known
        the moment a transport sees the connection fail, not after a ping timeout)."""
        problems = []
        if self.redis is not None:
            redis = self.config.redis
            if not self.redis.subscribed.is_set():
                problems.append(f"not subscribed to redis at {redis.host}:{redis.port}")
            if self.redis.publish_failing:
                problems.append(f"cannot publish to redis at {redis.host}:{redis.port}")
        for client in self.clients:
            if not client.connected.is_set():
                problems.append(f"not connected to the replication server at {client.address}")
        return problems

    async def replicating(self) -> None:
        """Return once every replication link is up (at that moment)."""
        while self.replication_problems():
            waits = [c.connected.wait() for c in self.clients]
            if self.redis is not None:
                waits.append(self.redis.subscribed.wait())
            await asyncio.gather(*waits)

    async def _watch_replication(self) -> None:
        """Log at WARNING when a link goes down (once per outage), INFO when it is back.

        Links still coming up at start-up get ``READY_WAIT`` seconds before they count."""
        reported: set[str] = set()
        await asyncio.sleep(READY_WAIT)
        while True:
            problems = set(self.replication_problems())
            for problem in sorted(problems - reported):
                logger.warning("replication degraded: %s", problem)
            for problem in sorted(reported - problems):
                logger.info("replication restored: no longer %s", problem.removeprefix("not "))
            reported = problems
            await asyncio.sleep(HEALTH_CHECK_INTERVAL)

    def metrics_snapshot(self) -> metrics.InstanceSnapshot:
        streams = self.engine.streams
        return metrics.InstanceSnapshot(
            instance=self.instance_name,
            positions={n: streams.generator(n).get_positions() for n in streams.names},
            linear={n: streams.generator(n).get_linear_position() for n in streams.names},
            connections={
                "server": self.server.connection_count if self.server is not None else 0,
                "client": sum(c.connected.is_set() for c in self.clients),
                "redis": int(self.redis is not None and self.redis.subscribed.is_set()),
            },
            lag=self.follower.lag(),
        )

    def status(self) -> dict[str, Any]:
        streams = self.engine.streams
        problems = self.replication_problems()
        return {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "positions": self.follower.positions(),
            "linear": {n: streams.generator(n).get_linear_position() for n in streams.names},
            "written": {n: self.broadcaster.stored_token(n) for n in self.broadcaster.stream_names},
            # Positions reached locally, stored or not (stores may run in the background):
            # "written" catches up with them once the stores are done.
            "local": {
                n: streams.current_token(n, self.instance_name)
                for n in streams.names
                if streams.generator(n).is_writer()
            },
            "sent": {n: self.broadcaster.last_sent(n) for n in self.broadcaster.stream_names},
            "connections": {
                "clients": [
                    {
                        "address": c.address,
                        "connected": c.connected.is_set(),
                        "made": c.connections_made,
                    }
                    for c in self.clients
                ],
                "server": None
                if self.server is None
                else {
                    "clients": self.server.connection_count,
                    "congestion_drops": self.server.congestion_drops,
                },
                "redis_subscriptions": None if self.redis is None else self.redis.subscriptions,
            },
        }
