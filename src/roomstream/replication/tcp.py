"""Replication over TCP: an asyncio server for writers, a reconnecting client for readers.

Both ends wrap the I/O-free :class:`~roomstream.replication.connection.ReplicationConnection`:
the transport feeds it bytes and ``loop.time()``, writes what it returns, and runs its
timers (a PING after 5 s of silence; a peer that has pinged is dropped after
``timeout`` seconds without a command).

Topology: every writer instance runs a :class:`ReplicationServer`; a reader runs one
:class:`ReplicationClient` per writer instance of the streams it follows.

Server invariants:

- what is queued in this process for one connection (the asyncio transport's write
  buffer, not the kernel's socket buffer) stays within ``max_outbound_lines`` lines and
  ``max_outbound_bytes`` bytes, give or take the one page being written; past either the
  connection is closed with ``ERROR congestion ...`` and its buffer discarded, so a
  reader that never reads costs bounded memory and does not hold back the others;
- a row whose line is over the 16 KiB limit is announced by ``POSITION`` instead, so the
  reader fetches it (:func:`~roomstream.replication.writer.send_all`);
- bad input on one connection (unknown command, malformed or over-long line, a command the
  client may not send, a wrong secret) ends that connection only, after an ``ERROR``.

Replay (the older protocol revision, a roomstream extension to the current one): a client
that sends ``REPLICATE <stream_name> <token>`` (``ALL`` for every stream this instance
writes; ``NOW`` for "from the current position") gets every row of that stream after the
token, then ``POSITION s me p p`` when it has caught up to ``p``, then the live rows; from
the first such command on, the connection carries only the streams asked for. Invariant:
each row after the token is sent exactly once and in token order. The replay reads pages
from the database while live pages of that stream are withheld from the connection; it
joins the live feed at exactly the position the live sender has reached (checked with no
``await`` in between), and drops live rows at or below the client's token. Replay pages
wait for the write buffer to drain, so a replay is not itself a congestion.

Authentication (a roomstream extension, off unless ``shared_secret`` is set): the client's
first line is ``AUTH <secret>``; the server compares it in constant time and says nothing
(not even ``SERVER``) before it matches. A server without a secret ignores a leading
``AUTH`` line, so a client configured with one still connects.

Client invariants: a connection's commands are handled strictly in order; while a gap is
being fetched, reading pauses (TCP back-pressure), so nothing is buffered without bound.
The client reconnects after any loss with jittered exponential back-off, capped, and every
new connection starts a new follower session (REPLICATE, POSITION, catch-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
import socket
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from roomstream.errors import MatrixError
from roomstream.replication.commands import (
    DEFAULT_MAX_LINE_LENGTH,
    Command,
    ErrorCommand,
    PositionCommand,
    RdataCommand,
    ReplicateStreamCommand,
)
from roomstream.replication.connection import (
    DEFAULT_PING_INTERVAL,
    DEFAULT_TIMEOUT,
    ReplicationConnection,
)
from roomstream.replication.follower import FetchUpdates, FollowerSession, StreamFollower, fill_gap
from roomstream.replication.writer import StreamBroadcaster, send_all, updates_to_commands
from roomstream.streams import StreamTooOldError

__all__ = ["ReplicationClient", "ReplicationServer", "TcpSettings"]

logger = logging.getLogger(__name__)

#: Longest ``AUTH`` line accepted before the connection is refused.
MAX_AUTH_LINE = 1024
#: Rows per database read when replaying a stream (``REPLICATE <stream> <token>``); small
#: enough that a page of the longest lines stays far below ``max_outbound_bytes``.
REPLAY_PAGE_ROWS = 100


@dataclass(frozen=True)
class TcpSettings:
    """Knobs shared by both ends (defaults from the protocol document)."""

    ping_interval: float = DEFAULT_PING_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    max_outbound_lines: int = 10_000
    #: Bytes queued in this process for one connection before it is dropped (congestion).
    max_outbound_bytes: int = 8 * 1024 * 1024
    shared_secret: str | None = None
    max_line_length: int = DEFAULT_MAX_LINE_LENGTH
    #: Seconds a closing connection may take to flush its ERROR before it is aborted.
    close_grace: float = 2.0
    #: Socket buffer size to request (SO_SNDBUF on the server, SO_RCVBUF on the client);
    #: None leaves the kernel's default. Tests use it to make congestion quick.
    socket_buffer: int | None = None
    backoff_initial: float = 0.1
    backoff_max: float = 5.0


class _Timer:
    """Calls ``tick`` at the connection's next deadline, re-arming after each call."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._when: float | None = None

    def arm(self, when: float | None) -> None:
        if when is None:
            self.cancel()
            return
        if self._when is not None and self._when <= when:
            return  # already due no later; firing early is harmless (tick re-checks)
        self.cancel()
        self._when = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._when = None
        self._callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._when = None


class _LineAccounting:
    """How many lines written to a transport are still in its write buffer."""

    def __init__(self) -> None:
        self._chunks: deque[tuple[int, int]] = deque()  # (end offset, lines)
        self._written = 0
        self._lines = 0

    def wrote(self, nbytes: int, lines: int) -> None:
        self._written += nbytes
        self._chunks.append((self._written, lines))
        self._lines += lines

    def queued_lines(self, buffered_bytes: int) -> int:
        flushed = self._written - buffered_bytes
        chunks = self._chunks
        while chunks and chunks[0][0] <= flushed:
            self._lines -= chunks.popleft()[1]
        return self._lines


# ---------------------------------------------------------------------------------------
# Server


class _ServerProtocol(asyncio.Protocol):
    """One client connection of a :class:`ReplicationServer`; also an ``Outbound``."""

    def __init__(self, server: ReplicationServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        s = server.settings
        self.conn = ReplicationConnection.server(
            server.server_name,
            ping_interval=s.ping_interval,
            timeout=s.timeout,
            max_line_length=s.max_line_length,
        )
        self._transport: asyncio.Transport | None = None
        self._timer = _Timer(self._loop, self._on_timer)
        self._accounting = _LineAccounting()
        self._authenticated = s.shared_secret is None
        self._first_line = True
        self._pre_auth = bytearray()
        self._abort_handle: asyncio.TimerHandle | None = None
        self.peer: str = "?"
        self.closed = False
        #: None: every stream is sent live (the current protocol). Otherwise the streams
        #: this client replicates (legacy REPLICATE) that are live, with the token at or
        #: below which live rows are dropped; streams still replaying are absent.
        self._live: dict[str, int] | None = None
        self._replays: dict[str, asyncio.Task[None]] = {}
        self._writable = asyncio.Event()
        self._writable.set()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        buffer = self._server.settings.socket_buffer
        sock = transport.get_extra_info("socket")
        if buffer is not None and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        # The transport buffers whatever we write (the congestion check bounds it); its
        # pause/resume_writing calls only tell replays when to wait for the peer.
        high = max(1, self._server.settings.max_outbound_bytes // 4)
        transport.set_write_buffer_limits(high=high, low=high // 2)
        self._server._connections.add(self)
        if self._authenticated:
            self._start()
        else:
            self._timer.arm(self._loop.time() + self._server.settings.timeout)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self._authenticated or self._first_line:
            data = self._pre_start(data)
            if not data or self.closed:
                return
        now = self._loop.time()
        commands = self.conn.receive_data(data, now)
        for cmd in commands:
            self._handle(cmd, now)
        self._flush()
        if self.conn.must_close:
            if self.conn.error:
                logger.info("replication client %s: %s", self.peer, self.conn.error)
            self._close()
            return
        self._timer.arm(self.conn.next_deadline())

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        for task in self._replays.values():
            task.cancel()
        self.conn.connection_lost()
        self._timer.cancel()
        if self._abort_handle is not None:
            self._abort_handle.cancel()
        self._server._connections.discard(self)
        self._server.broadcaster.remove_outbound(self)

    # -- start-up and authentication ----------------------------------------------------

    def _pre_start(self, data: bytes) -> bytes:
        """Handle the optional ``AUTH`` first line; returns the bytes left for the codec."""
        buf = self._pre_auth
        buf += data
        newline = buf.find(b"\n")
        if not self._authenticated:
            if newline < 0:
                if len(buf) > MAX_AUTH_LINE:
                    self._refuse("line length exceeded")
                return b""
            line = bytes(buf[:newline]).rstrip(b"\r")
            rest = bytes(buf[newline + 1 :])
            buf.clear()
            secret = self._server.settings.shared_secret
            assert secret is not None
            if not line.startswith(b"AUTH "):
                self._refuse("authentication required: send AUTH <secret> first")
                return b""
            if not hmac.compare_digest(line[5:], secret.encode()):
                self._refuse("authentication failed")
                return b""
            self._authenticated = True
            self._first_line = False
            self._timer.cancel()
            self._start()
            return rest
        # No secret configured: skip a leading AUTH line from a client that has one.
        if newline < 0 and len(buf) < 5 and bytes(buf) == b"AUTH "[: len(buf)]:
            return b""
        if buf.startswith(b"AUTH "):
            if newline < 0:
                if len(buf) > MAX_AUTH_LINE:
                    self._refuse("line length exceeded")
                return b""
            rest = bytes(buf[newline + 1 :])
        else:
            rest = bytes(buf)
        buf.clear()
        self._first_line = False
        return rest

    def _refuse(self, reason: str) -> None:
        logger.warning("replication client %s refused: %s", self.peer, reason)
        self._server.auth_failures += 1
        if self._transport is not None:
            self._transport.write(f"ERROR {reason}\n".encode())
        self._close()

    def _start(self) -> None:
        self.conn.start(self._loop.time())
        self._server.broadcaster.add_outbound(self)
        self._flush()
        self._timer.arm(self.conn.next_deadline())

    # -- commands -----------------------------------------------------------------------

    def _handle(self, cmd: Command, now: float) -> None:
        name = cmd.NAME
        if type(cmd) is ReplicateStreamCommand:
            self._replicate_stream(cmd, now)
        elif name == "REPLICATE":
            for position in self._server.broadcaster.positions():
                self.conn.send(position, now)
        elif name == "ERROR":
            assert isinstance(cmd, ErrorCommand)
            logger.warning("replication client %s sent ERROR %s", self.peer, cmd.message)
        elif name not in ("PING", "NAME"):
            callback = self._server.on_command
            if callback is not None:
                callback(cmd)

    # -- replay (REPLICATE <stream> <token>) ---------------------------------------------

    def _replicate_stream(self, cmd: ReplicateStreamCommand, now: float) -> None:
        broadcaster = self._server.broadcaster
        written = broadcaster.stream_names
        if cmd.stream_name == "ALL":
            names = written
        elif cmd.stream_name in written:
            names = [cmd.stream_name]
        else:
            served = ", ".join(written) or "none"
            self.conn.close(
                now, f"unknown stream {cmd.stream_name!r}: this instance writes {served}"
            )
            return
        if self._live is None:
            self._live = {}  # from now on: only the streams asked for
        for name in names:
            self._live.pop(name, None)
            previous = self._replays.pop(name, None)
            if previous is not None:
                previous.cancel()
            self._replays[name] = self._loop.create_task(
                self._replay(name, cmd.token), name=f"replication-replay-{name}-{self.peer}"
            )

    async def _replay(self, name: str, token: int | None) -> None:
        broadcaster = self._server.broadcaster
        me = broadcaster.instance_name
        from_token = broadcaster.last_sent(name) if token is None else token
        try:
            while not self.closed:
                target = broadcaster.last_sent(name)
                if from_token >= target:
                    break
                updates, new_upto, _ = await broadcaster.fetch_page(
                    name, from_token, target, REPLAY_PAGE_ROWS
                )
                if self.is_closed():  # (a method: mypy would keep the loop's narrowing)
                    return
                new_upto = min(new_upto, target)
                self._send(updates_to_commands(name, me, updates, from_token, new_upto))
                from_token = new_upto
                await self._writable.wait()
        except StreamTooOldError:
            self._fail(f"{name} rows after {from_token} are gone; ask from NOW")
            return
        except Exception:
            logger.exception("replaying %s to %s failed", name, self.peer)
            self._fail(f"replaying {name} failed")
            return
        finally:
            if self._replays.get(name) is asyncio.current_task():
                del self._replays[name]
        if self.closed or self._live is None:
            return
        # No await since the loop's check: the live sender is at last_sent and its next
        # page starts there, so joining now skips and repeats nothing.
        position = broadcaster.last_sent(name)
        self._live[name] = from_token
        self._send([PositionCommand(name, me, position, position)])

    def is_closed(self) -> bool:
        return self.closed

    def _fail(self, reason: str) -> None:
        if not self.closed:
            self.conn.close(self._loop.time(), reason)
            self._flush()
            self._close()

    def _live_only(self, commands: Sequence[Command]) -> Sequence[Command]:
        """The part of a live page this client should get (legacy REPLICATE mode)."""
        assert self._live is not None
        first = commands[0] if commands else None
        if type(first) is RdataCommand or type(first) is PositionCommand:
            floor = self._live.get(first.stream_name)
        else:
            floor = None
        if floor is None:
            return ()  # not asked for, or still replaying (the replay covers it)
        out: list[Command] = []
        batch: list[Command] = []
        for cmd in commands:
            if type(cmd) is RdataCommand:
                if cmd.token is None:
                    batch.append(cmd)
                    continue
                if cmd.token > floor:
                    out.extend(batch)
                    out.append(cmd)
                batch = []
            elif type(cmd) is PositionCommand and cmd.new_token > floor:
                out.append(cmd)
        return out

    # -- Outbound -----------------------------------------------------------------------

    def send_commands(self, commands: Sequence[Command]) -> None:
        if self.closed:
            return
        if self._live is not None:
            commands = self._live_only(commands)
            if not commands:
                return
        self._send(commands)

    def _send(self, commands: Sequence[Command]) -> None:
        if self.closed:
            return
        now = self._loop.time()
        send = self.conn.send
        send_all(commands, lambda cmd: send(cmd, now))
        self._flush(len(commands))

    async def drain(self) -> None:
        return None

    # -- internals ----------------------------------------------------------------------

    def _flush(self, lines: int = 1) -> None:
        transport = self._transport
        data = self.conn.data_to_send()
        if not data or transport is None or self.closed:
            return
        transport.write(data)
        accounting = self._accounting
        accounting.wrote(len(data), lines)
        settings = self._server.settings
        queued_bytes = transport.get_write_buffer_size()
        queued = accounting.queued_lines(queued_bytes)
        server = self._server
        if queued_bytes > server.peak_queued_bytes:
            server.peak_queued_bytes = queued_bytes
        if queued > settings.max_outbound_lines:
            reason = f"congestion: more than {settings.max_outbound_lines} lines queued"
        elif queued_bytes > settings.max_outbound_bytes:
            reason = f"congestion: more than {settings.max_outbound_bytes} bytes queued"
        else:
            return
        server.congestion_drops += 1
        logger.warning(
            "replication client %s (%s) %s (%d lines, %d bytes); dropping it",
            self.peer,
            self.conn.peer_name,
            reason,
            queued,
            queued_bytes,
        )
        self.conn.close(self._loop.time(), reason)
        transport.write(self.conn.data_to_send())
        self._close(abort=True)

    def _on_timer(self) -> None:
        if self.closed:
            return
        now = self._loop.time()
        if not self._authenticated:
            self._refuse("authentication timeout")
            return
        self.conn.tick(now)
        self._flush()
        if self.conn.must_close:
            logger.info("replication client %s: %s", self.peer, self.conn.error)
            self._close()
            return
        self._timer.arm(self.conn.next_deadline())

    def _close(self, *, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._writable.set()
        for task in self._replays.values():
            if task is not asyncio.current_task():
                task.cancel()
        self._timer.cancel()
        self._server.broadcaster.remove_outbound(self)
        transport = self._transport
        if transport is None:
            return
        if abort:
            # The peer is not reading; waiting for the buffer to drain would hold memory.
            transport.abort()
            return
        transport.close()
        self._abort_handle = self._loop.call_later(
            self._server.settings.close_grace, transport.abort
        )

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


class ReplicationServer:
    """Serves this instance's streams to every client that connects.

    ``on_command`` receives the client commands other than NAME, PING, REPLICATE and
    ERROR (USER_SYNC, FEDERATION_ACK, ...), for the application to act on.
    """

    def __init__(
        self,
        server_name: str,
        broadcaster: StreamBroadcaster,
        settings: TcpSettings | None = None,
        *,
        on_command: Callable[[Command], None] | None = None,
    ) -> None:
        self.server_name = server_name
        self.broadcaster = broadcaster
        self.settings = settings or TcpSettings()
        self.on_command = on_command
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerProtocol] = set()
        self.congestion_drops = 0
        self.auth_failures = 0
        #: Most bytes ever queued in this process for one connection (for tests, metrics).
        self.peak_queued_bytes = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerProtocol(self), host, port)
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def client_names(self) -> list[str | None]:
        return [c.conn.peer_name for c in self._connections]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()


# ---------------------------------------------------------------------------------------
# Client


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: ReplicationClient) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()
        s = client.settings
        self.conn = ReplicationConnection.client(
            client.client_name,
            client.expected_server_name,
            ping_interval=s.ping_interval,
            timeout=s.timeout,
            max_line_length=s.max_line_length,
        )
        self.session: FollowerSession = client.follower.new_session()
        self._transport: asyncio.Transport | None = None
        self._timer = _Timer(self._loop, self._on_timer)
        self._backlog: deque[Command] = deque()
        self._task: asyncio.Task[None] | None = None
        self.lost = self._loop.create_future()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        secret = self._client.settings.shared_secret
        if secret is not None:
            transport.write(f"AUTH {secret}\n".encode())
        self.conn.start(self._loop.time())
        self._flush()
        self._timer.arm(self.conn.next_deadline())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        commands = self.conn.receive_data(data, self._loop.time())
        if commands:
            if self._backlog or self._task is not None:
                self._backlog.extend(commands)
            else:
                self._run_commands(commands)
        self._flush()
        if self.conn.must_close:
            if self.conn.error:
                logger.warning("replication server %s: %s", self._client.address, self.conn.error)
                self._client.last_local_error = self.conn.error
            self._close()
            return
        self._timer.arm(self.conn.next_deadline())

    def _run_commands(self, commands: Sequence[Command] | deque[Command]) -> None:
        session = self.session
        client = self._client
        it = iter(commands)
        for cmd in it:
            cls = type(cmd)
            if cls is RdataCommand:
                session.on_rdata(cmd)  # type: ignore[arg-type]
                continue
            if cls is PositionCommand:
                gap = session.on_position(cmd)  # type: ignore[arg-type]
                if client.positioned is not None and not client.positioned.done():
                    client.positioned.set_result(None)
                client._backoff_reset()
                if gap is not None:
                    self._backlog.extend(it)
                    self._pause_for(fill_gap(session, gap, client.fetch, limit=client.fetch_limit))
                    return
                continue
            self._other(cmd)
        client.after_batch()

    def _pause_for(self, work: object) -> None:
        assert self._transport is not None
        self._transport.pause_reading()
        self._task = asyncio.ensure_future(self._continue(work))  # type: ignore[arg-type]

    async def _continue(self, work: asyncio.Future[None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except MatrixError as exc:
            # The writer's HTTP API said no or is down (503): expected, no traceback.
            logger.warning(
                "replication: catching up from %s failed (%s); reconnecting",
                self._client.address,
                exc,
            )
            self._close()
            return
        except Exception:
            logger.exception("replication: catching up from %s failed", self._client.address)
            self._close()
            return
        self._task = None
        if self.closed:
            return
        backlog = self._backlog
        while backlog and self._task is None and not self.closed:
            pending = list(backlog)
            backlog.clear()
            self._run_commands(pending)
        if self._task is None and self._transport is not None and not self.closed:
            self._transport.resume_reading()

    def _other(self, cmd: Command) -> None:
        name = cmd.NAME
        if name == "SERVER":
            self._client.connected.set()
        elif name == "ERROR":
            assert isinstance(cmd, ErrorCommand)
            logger.warning("replication server %s sent ERROR %s", self._client.address, cmd.message)
            self._client.last_remote_error = cmd.message
        elif name != "PING" and self._client.on_command is not None:
            self._client.on_command(cmd)

    def send(self, cmd: Command) -> bool:
        ok = self.conn.send(cmd, self._loop.time())
        self._flush()
        return ok

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _on_timer(self) -> None:
        if self.closed:
            return
        self.conn.tick(self._loop.time())
        self._flush()
        if self.conn.must_close:
            logger.warning("replication server %s: %s", self._client.address, self.conn.error)
            self._client.last_local_error = self.conn.error
            self._close()
            return
        self._timer.arm(self.conn.next_deadline())

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.session.closed = True
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()
        self.conn.connection_lost()
        if not self.lost.done():
            self.lost.set_result(None)


class ReplicationClient:
    """Follows one writer instance over TCP, reconnecting for as long as it runs.

    ``fetch`` reads rows the connection missed (``get_updates`` from the database for
    table streams, the writer's HTTP endpoint for in-memory ones). ``after_batch`` runs
    after each batch of received commands was applied (e.g. to flush a record file).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_name: str,
        expected_server_name: str | None,
        follower: StreamFollower,
        fetch: FetchUpdates,
        settings: TcpSettings | None = None,
        on_command: Callable[[Command], None] | None = None,
        after_batch: Callable[[], None] | None = None,
        fetch_limit: int = 1000,
    ) -> None:
        self.host = host
        self.port = port
        self.client_name = client_name
        self.expected_server_name = expected_server_name
        self.follower = follower
        self.fetch = fetch
        self.settings = settings or TcpSettings()
        self.on_command = on_command
        self._after_batch = after_batch
        self.fetch_limit = fetch_limit
        self.connected = asyncio.Event()
        self.positioned: asyncio.Future[None] | None = None
        self.connections_made = 0
        self.last_remote_error: str | None = None
        self.last_local_error: str | None = None
        self._protocol: _ClientProtocol | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._stopping = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def stopping(self) -> bool:
        return self._stopping

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"replication-client-{self.address}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._protocol is not None:
            self._protocol._close()

    def send(self, cmd: Command) -> bool:
        """Send a client command (USER_SYNC, ...) on the current connection, if any."""
        protocol = self._protocol
        return protocol is not None and not protocol.closed and protocol.send(cmd)

    def live(self, stream_name: str, writer: str) -> bool:
        """Rows of ``(stream, writer)`` arrive as written: the current connection is up
        (the server said ``SERVER``, nothing has closed it since) and its follower session
        is live (:meth:`~roomstream.replication.follower.FollowerSession.is_live`)."""
        protocol = self._protocol
        return (
            self.connected.is_set()
            and protocol is not None
            and not protocol.closed
            and protocol.session.is_live(stream_name, writer)
        )

    def disconnect(self) -> None:
        """Drop the current connection (it reconnects); for tests and operators."""
        if self._protocol is not None:
            self._protocol._close()

    def after_batch(self) -> None:
        if self._after_batch is not None:
            self._after_batch()

    def _backoff_reset(self) -> None:
        self._failures = 0

    def backoff_delay(self, failures: int) -> float:
        """Delay before reconnect attempt number ``failures`` (1-based): exponential,
        capped at ``backoff_max``, scaled by a random factor in [0.5, 1]."""
        s = self.settings
        base = min(s.backoff_max, s.backoff_initial * (2 ** max(0, failures - 1)))
        return float(base * random.uniform(0.5, 1.0))

    async def _connect(self) -> _ClientProtocol:
        loop = asyncio.get_running_loop()
        buffer = self.settings.socket_buffer
        if buffer is None:
            _, protocol = await loop.create_connection(
                lambda: _ClientProtocol(self), self.host, self.port
            )
            return protocol
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        _, protocol = await loop.create_connection(lambda: _ClientProtocol(self), sock=sock)
        return protocol

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            try:
                self.positioned = loop.create_future()
                protocol = await self._connect()
            except OSError as exc:
                self._failures += 1
                delay = self.backoff_delay(self._failures)
                logger.info(
                    "replication: cannot reach %s (%s); retry in %.2fs", self.address, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            self._protocol = protocol
            self.connections_made += 1
            try:
                await protocol.lost
            finally:
                protocol._close()
                self.connected.clear()
            if self.stopping:
                return
            self._failures += 1
            delay = self.backoff_delay(self._failures)
            logger.info("replication: lost %s; reconnecting in %.2fs", self.address, delay)
            await asyncio.sleep(delay)
