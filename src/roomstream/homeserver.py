"""The homeserver process, assembled in one place.

Everything a roomstream process runs is put together here, from the bottom up:

- the room engine (:func:`open_room_engine`) with the participants that record in its
  transactions (the read side's visibility records), and the background work started
  for it (rebuilding visibility records an upgrade left pending);
- replication (:class:`~roomstream.replication.worker.ReplicationNode`: transports,
  follower, broadcaster);
- the Client-Server API (:class:`~roomstream.client.ClientProcess`), told of replicated
  facts as one of replication's listeners;
- the listeners (:class:`Homeserver`): the internal API on ``internal_port`` (behind the
  deployment's secret), the Client-Server API on ``http_port``, the Server-Server API
  over TLS on ``federation.port`` (in the ``federation.instance``), whose routes come
  from :func:`federation_route_installers`;
- federation's transport (:class:`FederationTransport`: the outbound client, the keyring
  that also feeds the room engine's key store, the inbound authenticator) in every
  process of a deployment with federation on; what changes a room (PDUs received, the
  membership handshakes, joins of other servers' rooms) is carried out by the room's
  events writer (:class:`~roomstream.federation.cluster.RoomOwners`), whose internal API
  serves it (:meth:`Homeserver.federation_bindings`);
- the views streaming job beside the server (:class:`ViewsJob`).

Lower layers receive what they need through their constructors; none of them reaches up.
:func:`run_instance` runs one configured instance until it is told to stop; ``roomstream
run`` (:mod:`roomstream.cli`) is the command line for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console

from roomstream import metrics
from roomstream.client import ClientProcess, build_client_api
from roomstream.config import Config, ConfigError, HttpConfig
from roomstream.federation.auth import Authenticate, OriginRateLimiter, make_authenticator
from roomstream.federation.backfill import FederationBackfill
from roomstream.federation.client import FederationClient
from roomstream.federation.cluster import RoomOwners
from roomstream.federation.edus import FederationEdus
from roomstream.federation.key_routes import install_key_routes
from roomstream.federation.keyring import Keyring, OldSigningKey
from roomstream.federation.listener import RouteInstaller, federation_listener
from roomstream.federation.queries import FederationQueries
from roomstream.federation.query_routes import install_query_routes
from roomstream.federation.remote_keys import RemoteKeysClient
from roomstream.federation.remote_rooms import RemoteRoomsClient
from roomstream.federation.room_routes import install_room_routes
from roomstream.federation.sender import FederationSender
from roomstream.federation.server import FederationServer
from roomstream.httpbase import http_metrics_middleware, matrix_error_middleware
from roomstream.listener import HttpListener
from roomstream.lru import configure_sizes
from roomstream.reading import read_side_participants
from roomstream.reading.backfill import run_pending_in_background
from roomstream.reading.index_backfill import (
    run_pending_in_background as index_pending_in_background,
)
from roomstream.replication import endpoints as ep
from roomstream.replication.endpoints import BoundEndpoint
from roomstream.replication.http import MAX_BODY, InternalHttpServer
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.worker import READY_WAIT, ReplicationNode, start_listener
from roomstream.rooms.engine import RoomEngine

__all__ = [
    "FederationTransport",
    "Homeserver",
    "ViewsJob",
    "federation_route_installers",
    "open_room_engine",
    "run_instance",
]

logger = logging.getLogger(__name__)


def _log_rebuild_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "background rebuild %s failed (it carries on at the next start, or run"
            " `roomstream migrate`)",
            task.get_name(),
            exc_info=task.exception(),
        )


async def open_room_engine(config: Config) -> RoomEngine:
    """The configured room engine, wired to the read side.

    Events it persists get their visibility records and relations and search index rows
    in the same transaction, and rooms persisted before those records existed (or loaded
    by the bulk import, for the search index) are rebuilt in the background, in bounded
    transactions, while the process serves (``engine.background``; cancelled by
    ``engine.close()``, and carried on at the next start).

    The configured cache sizes (``caches.sizes``) apply from here on, to every cache of
    the process (sizes are per process, as the caches are).
    """
    configure_sizes(config.caches.sizes)
    engine = await RoomEngine.open(config, participants=read_side_participants())
    try:
        rebuilds: list[asyncio.Task[Any] | None] = [
            await run_pending_in_background(engine.db),
            await index_pending_in_background(engine.db),
        ]
    except BaseException:
        await engine.close()
        raise
    for rebuild in rebuilds:
        if rebuild is not None:
            rebuild.add_done_callback(_log_rebuild_failure)
            engine.background.append(rebuild)
    return engine


def client_listener(install: Callable[[web.Application], None], limits: HttpConfig) -> HttpListener:
    """The Client-Server API's listener (``http_port``): what ``install`` adds (routes
    under ``/_matrix`` and ``/.well-known``) and nothing else, so every internal path
    answers 404 ``M_UNRECOGNIZED`` there."""
    app = web.Application(
        middlewares=[http_metrics_middleware, matrix_error_middleware],
        client_max_size=MAX_BODY,
    )
    install(app)
    return HttpListener(app, limits)


class FederationTransport:
    """Federation's transport for one process: the outbound :attr:`client`, the
    :attr:`keyring` (installed as the room engine's key fetcher, so received events'
    signatures are checked with keys fetched from their servers), and the inbound
    :attr:`authenticate`."""

    def __init__(self, config: Config, engine: RoomEngine) -> None:
        federation = config.federation
        signing_key = engine.creator.signing_key
        self.client = FederationClient(config.server_name, signing_key, federation)
        self.keyring = Keyring(
            engine.keys,
            config.server_name,
            signing_key,
            self.client.request,
            trusted_key_servers=federation.trusted_key_servers,
            old_signing_keys=[
                OldSigningKey(kid, old["key"], old["expired_ts"])
                for kid, old in federation.old_signing_keys.items()
            ],
            key_validity_ms=int(federation.key_validity_period * 1000),
        )
        engine.keys.fetcher = self.keyring.fetch
        self.authenticate: Authenticate = make_authenticator(
            config.server_name,
            self.keyring,
            limiter=OriginRateLimiter(
                federation.rate_limit_per_second, federation.rate_limit_burst
            ),
        )

    async def close(self) -> None:
        await self.client.close()


def federation_route_installers(
    transport: FederationTransport,
    server: FederationServer | None = None,
    queries: FederationQueries | None = None,
) -> list[RouteInstaller]:
    """What the federation listener serves: the key routes always; the room side
    (``/send``, the event and state queries, the membership handshakes) with ``server``;
    the queries of users, aliases, keys, the directory and media with ``queries``."""
    installers: list[RouteInstaller] = [lambda app: install_key_routes(app, transport.keyring)]
    if server is not None:
        installers.append(lambda app: install_room_routes(app, server, transport.authenticate))
    if queries is not None:
        installers.append(lambda app: install_query_routes(app, queries, transport.authenticate))
    return installers


class Homeserver:
    """One roomstream process for ``config``'s instance, over an opened ``engine``.

    ``start`` brings up replication, then the Client-Server API (when the instance has an
    ``http_port`` or an ``internal_port``: the latter serves the client writes other
    processes forward to this one), then the internal listener and the client listener;
    ``stop`` takes them down in the reverse order. The engine stays the caller's.
    """

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
        self.replication = ReplicationNode(
            config, engine, record_path=record_path, socket_buffer=socket_buffer
        )
        #: The Client-Server API (None without http_port and internal_port).
        self.client: ClientProcess | None = None
        #: The internal API's listener (None without internal_port).
        self.internal: InternalHttpServer | None = None
        #: The Client-Server API's listener (None without http_port).
        self.client_http: HttpListener | None = None
        #: Federation's transport (None unless federation.port is set).
        self.federation: FederationTransport | None = None
        #: The federation listener (in federation.instance only).
        self.federation_http: HttpListener | None = None
        #: The room side of the Server-Server API (None without federation).
        self.federation_server: FederationServer | None = None
        #: The federation sender (on the federation_sender_instances only).
        self.federation_sender: FederationSender | None = None
        #: Joins of other servers' rooms (None without federation).
        self.remote_rooms: RemoteRoomsClient | None = None

    async def start(self) -> None:
        config = self.config
        me = config.instance()
        node = self.replication
        await node.start()
        federation = config.federation
        remote_rooms: RemoteRoomsClient | None = None
        remote_history: FederationBackfill | None = None
        if federation.port is not None:
            self.federation = transport = FederationTransport(config, self.engine)
            self.remote_rooms = remote_rooms = RemoteRoomsClient(
                self.engine,
                self.engine.creator.signing_key,
                transport.client,
                owners=RoomOwners(config, node.http_client),
            )
            # Invites of other servers' users reach their server before they are stored.
            self.engine.creator.remote_invite = remote_rooms.invite
            # Backwards /messages pages past the start of a room's stored history.
            remote_history = FederationBackfill(self.engine, transport.client)
        if me.http_port is not None or me.internal_port is not None:
            self.client = build_client_api(
                config,
                self.engine,
                node.http_client,
                typing_stream=node.memory.get("typing"),
                announce=node.broadcaster.notify,
                invalidations_live=lambda: node.stream_live("caches"),
                send_command=node.send_command,
                stream_live=node.stream_live,
                remote_rooms=remote_rooms,
                remote_keys=None
                if self.federation is None
                else RemoteKeysClient(self.federation.client),
                remote_history=remote_history,
            )
            node.listeners.append(self.client)
            presence_writer = self.client.presence.writer
            if presence_writer is not None:
                node.command_listeners.append(presence_writer.on_command)
            await self.client.start()
        if self.federation is not None:
            await self._start_federation(self.federation)
        if me.internal_port is not None:
            forwarded = self.client.forwarded.bindings() if self.client is not None else []
            self.internal = internal = InternalHttpServer(
                config,
                memory_streams=node.memory,
                status=node.status,
                client=node.http_client,
                metrics=lambda: metrics.render(node.metrics_registry),
                bindings=[*node.event_writes(), *forwarded, *self.federation_bindings()],
            )
            port = await start_listener(config, "internal_port", me.internal_port, internal.start)
            logger.info("internal HTTP listening on %s:%d", me.host, port)
        if me.http_port is not None and self.client is not None:
            self.client_http = client_http = client_listener(self.client.api.install, config.http)
            http_port = me.http_port
            port = await start_listener(
                config, "http_port", http_port, lambda: client_http.start(me.host, http_port)
            )
            logger.info("client API listening on %s:%d", me.host, port)
        if self.federation is not None and federation.port is not None:
            transport = self.federation
            if config.instance_name == federation.instance:
                queries = None
                if self.client is not None:
                    queries = FederationQueries.for_client_process(self.client, self.engine)
                self.federation_http = listener = federation_listener(
                    federation_route_installers(transport, self.federation_server, queries),
                    federation,
                    config.http,
                )
                try:
                    port = await listener.start(federation.bind_host, federation.port)
                except OSError as exc:
                    where = f"{federation.bind_host}:{federation.port}"
                    raise ConfigError(f"federation.port: cannot listen on {where}: {exc}") from None
                logger.info("federation listening on %s:%d (TLS)", federation.bind_host, port)

    async def _start_federation(self, transport: FederationTransport) -> None:
        """The room side of the Server-Server API (with the EDUs into the Client-Server
        API's services) and, on a sender instance, the federation sender."""
        config, engine, node = self.config, self.engine, self.replication
        edus = None
        self.federation_server = server = FederationServer(
            engine, client=transport.client, owners=RoomOwners(config, node.http_client)
        )
        if self.client is not None:
            edus = FederationEdus.for_client_process(
                self.client, engine, server_allowed=server.acl_allows
            )
            server.edus = edus
        if config.instance_name in config.federation_sender_instances:
            self.federation_sender = sender = FederationSender(
                engine, config, transport.client, send_command=node.send_command
            )
            node.listeners.append(sender)
            node.command_listeners.append(sender.on_command)
            if self.client is not None:
                me = config.instance_name
                self.client.typing_row_listeners.append(
                    lambda token, rows: sender.on_replicated_rows("typing", me, token, rows)
                )
            await sender.start()

    def federation_bindings(self) -> list[BoundEndpoint[Any, Any]]:
        """Federation's room requests and joins that other processes of the deployment
        hand to this one: on an events writer with federation on (else none, and they
        are answered 421)."""
        config = self.config
        server, remote_rooms = self.federation_server, self.remote_rooms
        if server is None or remote_rooms is None:
            return []
        if config.instance_name not in config.writers_of("events"):
            return []

        async def remote_join(call: ep.RemoteJoinCall) -> None:
            await remote_rooms.join_here(call.user_id, call.room_id, call.servers, call.content)

        return [ep.FEDERATION_ROOM.bind(server.on_forwarded), ep.REMOTE_JOIN.bind(remote_join)]

    async def stop(self) -> None:
        """Stop listening, then the federation sender, then replication (which stores and
        announces the local positions), then the Client-Server API's services."""
        if self.federation_http is not None:
            await self.federation_http.close()
        if self.federation_sender is not None:
            await self.federation_sender.stop()
        if self.federation is not None:
            await self.federation.close()
        if self.client_http is not None:
            await self.client_http.close()
        if self.internal is not None:
            await self.internal.close()
        if self.client is not None:
            # Before replication stops: a relay says CLEAR_USER_SYNC on its way out.
            self.client.presence.close()
        await self.replication.stop()
        if self.client is not None:
            with contextlib.suppress(Exception):  # logged by flush; the times are a nicety
                await self.client.client_ips.flush()
            self.client.close()


async def _announce_ready(server: Homeserver, console: Console) -> None:
    """Say "ready" once replication is up; if it is not within ``READY_WAIT`` seconds,
    say it is degraded and why (and "ready" later, when it comes up)."""
    config = server.config
    node = server.replication
    try:
        await asyncio.wait_for(node.replicating(), READY_WAIT)
    except TimeoutError:
        problems = "; ".join(node.replication_problems())
        console.print(
            f"roomstream instance {config.instance_name} started, replication degraded: "
            f"{problems} (retrying; see /health)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        await node.replicating()
    console.print(
        f"roomstream instance {config.instance_name} ready "
        f"(transport {config.replication.transport}, "
        f"replication port {node.server.port if node.server else '-'}, "
        f"http port {server.client_http.port if server.client_http else '-'}, "
        f"internal port {server.internal.port if server.internal else '-'})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


async def run_instance(
    config: Config,
    console: Console,
    *,
    record_path: str | None = None,
    socket_buffer: int | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run ``config.instance_name`` until SIGTERM/SIGINT (or ``stop`` is set); exit code."""
    if record_path:
        Path(record_path).parent.mkdir(parents=True, exist_ok=True)
    # The database first: one that does not exist is the one line an operator sees.
    engine = await open_room_engine(config)
    try:
        effective_shared_secret(config)  # an unusable secret file: one configuration error
    except BaseException:
        await engine.close()
        raise
    server = Homeserver(config, engine, record_path=record_path, socket_buffer=socket_buffer)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    announcer: asyncio.Task[None] | None = None
    try:
        await server.start()
        announcer = asyncio.create_task(_announce_ready(server, console))
        await stop.wait()
    finally:
        if announcer is not None:
            announcer.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        await server.stop()
        await engine.close()
    return 0


class ViewsJob:
    """The views streaming job (``roomstream views --follow``) in a child process beside
    the server, against the same database: it keeps the tables behind ``/publicRooms`` and
    ``/user_directory/search`` current (staleness: its 1 s trigger plus a batch's time).

    A child process, not a thread: Spark's JVM and its failures stay out of the server.
    If the job cannot start or dies, the server keeps serving (the directory as last
    written) and one WARNING line says so, naming the job's log file.
    """

    def __init__(self, command: Sequence[str], log_path: Path) -> None:
        self.command = list(command)
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self.stop_timeout = 30.0

    @classmethod
    def for_config(cls, config: Config, config_path: str | None) -> ViewsJob:
        where = ["-c", config_path] if config_path else []
        return cls(
            [sys.executable, "-m", "roomstream.cli", *where, "views", "--follow"],
            Path(config.data_dir) / "views-job.log",
        )

    async def start(self) -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self.process = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # stopped by us, not by the terminal's Ctrl-C
                )
        except OSError as exc:
            logger.warning(
                "views job not started (%s): /publicRooms and /user_directory/search will"
                " not be updated",
                exc,
            )
            return
        logger.info("views job started (pid %d, log %s)", self.process.pid, self.log_path)
        self._watcher = asyncio.create_task(self._watch(self.process))

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._stopping:
            logger.warning(
                "views job exited with code %s: /publicRooms and /user_directory/search are"
                " no longer updated (the server keeps serving; see %s)",
                code,
                self.log_path,
            )

    async def stop(self) -> None:
        """Terminate the job and wait for it (its JVM exits with it); kill it if it has not
        exited after :attr:`stop_timeout` seconds. Stopping it anywhere is safe: its sink
        is exactly-once, and the next start continues from the checkpoint."""
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._watcher is not None:
            await self._watcher
