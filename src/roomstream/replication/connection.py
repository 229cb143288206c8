"""One end of a TCP replication connection, as a state machine without I/O.

The caller owns the socket and the clock. It feeds received bytes to
``receive_data``, writes out whatever ``data_to_send`` returns, calls ``tick`` no
later than ``next_deadline()``, and closes the socket once ``must_close`` is true
(after flushing ``data_to_send``, which then holds the ``ERROR`` line). Nothing here
reads a clock: every time is an explicit ``now`` in seconds from a clock of the
caller's choosing (monotonic recommended).

Behaviour follows Synapse's TCP protocol:

- start-up: the server sends ``SERVER <name>`` then ``PING``; the client sends
  ``NAME <name>``, ``PING`` and ``REPLICATE``, and checks the name in the server's
  ``SERVER`` against the one it expects;
- keep-alive: a ``PING`` goes out whenever nothing was sent for ``ping_interval``;
- time-out: only once the peer has sent a ``PING`` (so someone typing into netcat is
  never timed out), the connection fails if nothing arrives for ``timeout``;
- any protocol violation by the peer ends this connection only: the reason goes out in
  an ``ERROR`` line and ``must_close`` becomes true. Other connections of the caller
  are unaffected since the state is all per instance.
"""

from __future__ import annotations

from enum import StrEnum

from roomstream.replication.commands import (
    ALL_COMMAND_NAMES,
    CLIENT_COMMANDS,
    DEFAULT_MAX_LINE_LENGTH,
    SERVER_COMMANDS,
    Command,
    ErrorCommand,
    NameCommand,
    PingCommand,
    ProtocolError,
    ReplicateCommand,
    ServerCommand,
    Side,
    _parse_text,
    may_send,
    serialize,
)

__all__ = [
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_TIMEOUT",
    "ConnectionState",
    "ReplicationConnection",
]

#: Seconds without sending anything after which a PING goes out (Synapse: 5 s).
DEFAULT_PING_INTERVAL = 5.0
#: Seconds of silence from a peer that has pinged before it is timed out. The protocol
#: document says 15 s; current Synapse waits 25 s. Configurable for that reason.
DEFAULT_TIMEOUT = 15.0


class ConnectionState(StrEnum):
    NEW = "new"  # start() not called yet
    OPEN = "open"
    CLOSED = "closed"  # by an error, close() or connection_lost(); nothing more in or out


class ReplicationConnection:
    """Protocol state of one replication connection, seen from ``side``.

    Invariants:

    - output only ever grows by whole lines, each produced by ``serialize``;
    - once ``state`` is CLOSED no command is accepted or produced, except that the
      ``ERROR`` line queued on the way to CLOSED is still returned by ``data_to_send``;
    - ``next_deadline()`` is None exactly when there is nothing left to time.
    """

    __slots__ = (
        "_buffer",
        "_error",
        "_expected_server_name",
        "_inbound",
        "_last_received",
        "_last_sent",
        "_local_name",
        "_max_line_length",
        "_outbox",
        "_peer_name",
        "_permissive",
        "_ping_interval",
        "_received_ping",
        "_side",
        "_state",
        "_timeout",
    )

    def __init__(
        self,
        side: Side,
        local_name: str,
        *,
        expected_server_name: str | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        permissive: bool = False,
    ) -> None:
        """``local_name`` is the server name (server side) or the client's name (client).

        ``expected_server_name`` (client only): the ``SERVER`` name the client insists
        on; None accepts any. ``permissive`` accepts every known command from the peer
        and lets this side send any, as on Synapse's Redis transport.
        """
        if ping_interval <= 0 or timeout <= 0:
            raise ValueError("ping_interval and timeout must be positive")
        if side is Side.SERVER and expected_server_name is not None:
            raise ValueError("expected_server_name only applies to a client")
        self._side = side
        self._local_name = local_name
        self._expected_server_name = expected_server_name
        self._ping_interval = ping_interval
        self._timeout = timeout
        self._max_line_length = max_line_length
        self._permissive = permissive
        if permissive:
            self._inbound = ALL_COMMAND_NAMES
        else:
            self._inbound = SERVER_COMMANDS if side is Side.CLIENT else CLIENT_COMMANDS
        self._state = ConnectionState.NEW
        self._buffer = bytearray()
        self._outbox: list[bytes] = []
        self._last_sent = 0.0
        self._last_received = 0.0
        self._received_ping = False
        self._error: str | None = None
        self._peer_name: str | None = None

    @classmethod
    def server(
        cls,
        server_name: str,
        *,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        permissive: bool = False,
    ) -> ReplicationConnection:
        """The server end; sends ``SERVER server_name`` on start."""
        return cls(
            Side.SERVER,
            server_name,
            ping_interval=ping_interval,
            timeout=timeout,
            max_line_length=max_line_length,
            permissive=permissive,
        )

    @classmethod
    def client(
        cls,
        client_name: str,
        expected_server_name: str | None,
        *,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        permissive: bool = False,
    ) -> ReplicationConnection:
        """The client end; sends ``NAME client_name`` on start and checks the server."""
        return cls(
            Side.CLIENT,
            client_name,
            expected_server_name=expected_server_name,
            ping_interval=ping_interval,
            timeout=timeout,
            max_line_length=max_line_length,
            permissive=permissive,
        )

    # -- state -------------------------------------------------------------------------

    @property
    def side(self) -> Side:
        return self._side

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def must_close(self) -> bool:
        """True once the caller should flush ``data_to_send()`` and close the socket."""
        return self._state is ConnectionState.CLOSED

    @property
    def error(self) -> str | None:
        """Why this end failed the connection (the text of the ERROR it sent), if it did."""
        return self._error

    @property
    def peer_name(self) -> str | None:
        """The client's NAME (server side) or the server's SERVER name (client side)."""
        return self._peer_name

    @property
    def received_ping(self) -> bool:
        """Whether the peer has pinged, which arms the receive time-out."""
        return self._received_ping

    # -- output ------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Open the connection: queue the start-up lines. Call once, on connect."""
        if self._state is not ConnectionState.NEW:
            raise RuntimeError(f"start() on a connection that is {self._state}")
        self._state = ConnectionState.OPEN
        self._last_received = now
        if self._side is Side.SERVER:
            self._queue(ServerCommand(self._local_name), now)
            self._queue(self._ping(now), now)
        else:
            self._queue(NameCommand(self._local_name), now)
            self._queue(self._ping(now), now)
            self._queue(ReplicateCommand(), now)

    def send(self, cmd: Command, now: float) -> bool:
        """Queue ``cmd``; False (and nothing queued) if the connection is not open.

        Raises ``ValueError`` if this side may not send that command, or if
        ``serialize`` refuses it (bad field, line too long): both are caller bugs.
        """
        if self._state is not ConnectionState.OPEN:
            return False
        if not may_send(self._side, cmd.NAME, permissive=self._permissive):
            raise ValueError(f"a {self._side} may not send {cmd.NAME}")
        self._queue(cmd, now)
        return True

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call (possibly b"")."""
        if not self._outbox:
            return b""
        data = b"".join(self._outbox)
        self._outbox.clear()
        return data

    def close(self, now: float, reason: str | None = None) -> None:
        """Close from this end, queuing ``ERROR reason`` first if a reason is given."""
        if self._state is ConnectionState.CLOSED:
            return
        if reason is not None and self._state is ConnectionState.OPEN:
            self._queue(ErrorCommand(ProtocolError(reason).reason), now)
        self._state = ConnectionState.CLOSED

    def connection_lost(self) -> None:
        """The transport is gone: stop everything, drop queued output."""
        self._state = ConnectionState.CLOSED
        self._outbox.clear()
        self._buffer.clear()

    # -- input -------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[Command]:
        """Consume received bytes; return the complete commands they finish, in order.

        Partial lines are kept for the next call; blank lines are skipped; a trailing
        CR is dropped (telnet). On the first bad line processing stops: the commands
        before it are still returned, ``must_close`` becomes true and the ERROR line is
        queued. Every command is returned, PING and ERROR included; the SERVER name check
        and the PING bookkeeping are done here.
        """
        if self._state is not ConnectionState.OPEN:
            return []
        buffer = self._buffer
        buffer += data
        if b"\n" not in data:
            # No line ended: just make sure the partial one stays within bounds.
            if len(buffer) > self._max_line_length:
                self._fail("line length exceeded", now)
            return []
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        max_length = self._max_line_length
        inbound = self._inbound
        commands: list[Command] = []
        append = commands.append
        for line in lines:
            if len(line) > max_length:
                self._fail("line length exceeded", now)
                return commands
            if not line or line[-1] == 13 or line.isspace():
                # Rare shapes: blank (skipped) or CR-terminated (telnet).
                if not line or line.isspace():
                    continue
                del line[-1]
            try:
                cmd = _parse_text(line.decode())
            except UnicodeDecodeError:
                self._fail("failed to parse line: line is not valid UTF-8", now)
                return commands
            except ProtocolError as e:
                self._fail(f"failed to parse line: {e.reason}", now)
                return commands
            name = cmd.NAME
            if name not in inbound:
                self._fail(f"invalid command: a {self._peer_side} may not send {name}", now)
                return commands
            self._last_received = now
            if name == "RDATA":
                append(cmd)
                continue
            if name == "PING":
                self._received_ping = True
            elif name == "SERVER" and self._side is Side.CLIENT:
                assert isinstance(cmd, ServerCommand)
                self._peer_name = cmd.server_name
                expected = self._expected_server_name
                if expected is not None and cmd.server_name != expected:
                    self._fail(f"wrong remote: expected {expected!r}, got {cmd.server_name!r}", now)
                    return commands
            elif name == "NAME" and self._side is Side.SERVER:
                assert isinstance(cmd, NameCommand)
                self._peer_name = cmd.client_name
            append(cmd)
        if len(self._buffer) > max_length:
            self._fail("line length exceeded", now)
        return commands

    # -- time --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called, or None if no timer is running."""
        if self._state is not ConnectionState.OPEN:
            return None
        deadline = self._last_sent + self._ping_interval
        if self._received_ping:
            deadline = min(deadline, self._last_received + self._timeout)
        return deadline

    def tick(self, now: float) -> None:
        """Run the timers: time the peer out, or queue a PING if we have been quiet.

        Safe to call at any time; it only acts on deadlines that have passed.
        """
        if self._state is not ConnectionState.OPEN:
            return
        if self._received_ping and now - self._last_received >= self._timeout:
            self._fail("ping timeout", now)
            return
        if now - self._last_sent >= self._ping_interval:
            self._queue(self._ping(now), now)

    # -- internals ---------------------------------------------------------------------

    @property
    def _peer_side(self) -> Side:
        return Side.CLIENT if self._side is Side.SERVER else Side.SERVER

    def _ping(self, now: float) -> PingCommand:
        # Synapse puts its wall clock in ms here; the payload is informative only.
        return PingCommand(str(int(now * 1000)))

    def _queue(self, cmd: Command, now: float) -> None:
        self._outbox.append(serialize(cmd, max_line_length=self._max_line_length))
        self._last_sent = now

    def _fail(self, reason: str, now: float) -> None:
        reason = ProtocolError(reason).reason  # one line, bounded length
        self._error = reason
        # Not checked against our own (possibly small) max_line_length: the reason is
        # bounded to a few hundred characters, far below any peer's limit.
        self._outbox.append(serialize(ErrorCommand(reason)))
        self._last_sent = now
        self._state = ConnectionState.CLOSED
        self._buffer = bytearray()
