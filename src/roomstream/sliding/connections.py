"""Per-connection memory of what was sent, bounded (no I/O).

A connection is (user, device, ``conn_id``). Each response creates a :class:`Snapshot`
of what the client will know once it has that response, under a new ``pos``. A request
names the snapshot it starts from; the snapshots before it are then dropped (the client
has confirmed it processed that response), so a connection holds at most the confirmed
snapshot and the ones answered from it (retries with the same ``pos`` are safe).

Bounds: connections idle longer than ``idle_seconds`` are forgotten, at most
``max_connections`` are kept (least recently used go first), at most
``max_per_device`` per device, and a connection that tracks more than
``max_tracked`` room state entries is dropped; a forgotten connection's ``pos`` then
answers ``M_UNKNOWN_POS`` and the client starts again (as the proposal allows).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roomstream.errors import UnknownPosError

__all__ = ["Connection", "ConnectionStore", "RoomSent", "Snapshot", "unknown_pos"]


def unknown_pos(
    message: str = "unknown or expired pos; start a new connection",
) -> UnknownPosError:
    return UnknownPosError(message)


@dataclass(frozen=True, slots=True)
class RoomSent:
    """What the client was told of one room."""

    membership: str
    #: The largest timeline limit the room was sent with (0: no timeline yet).
    timeline_limit: int
    #: (type, state_key) -> event ID of the required state sent (None: sent as removed).
    state: dict[tuple[str, str], str | None]
    #: name, avatar, heroes, counts, is_dm, bump_stamp as last sent.
    fields: dict[str, Any]
    #: The required_state asked for when last sent (a wider one resends what it adds).
    config_key: Any = None
    #: The room's recency when last sent (news while it was outside every range makes
    #: it come back whole).
    activity: int = 0


@dataclass(slots=True)
class Snapshot:
    """What the client knows after the response that returned this snapshot's ``pos``."""

    #: Opaque positions of the streams the response covered (set by the handler).
    positions: dict[str, Any]
    rooms: dict[str, RoomSent] = field(default_factory=dict)
    list_counts: dict[str, int] = field(default_factory=dict)
    #: The user's room list as of this response (the handler's, opaque here).
    entries: Any = None

    def tracked(self) -> int:
        listed = len(self.entries) if isinstance(self.entries, list) else 0
        return listed + sum(1 + len(r.state) for r in self.rooms.values())


@dataclass(slots=True)
class Connection:
    nonce: str
    next_seq: int = 1
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    last_used: float = 0.0


ConnKey = tuple[str, str, str]


class ConnectionStore:
    def __init__(
        self,
        *,
        max_connections: int = 10_000,
        max_per_device: int = 10,
        idle_seconds: float = 3600.0,
        max_tracked: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_device = max_per_device
        self.idle_seconds = idle_seconds
        self.max_tracked = max_tracked
        self._clock = clock
        self._connections: OrderedDict[ConnKey, Connection] = OrderedDict()

    def __len__(self) -> int:
        return len(self._connections)

    def _expire(self) -> None:
        cutoff = self._clock() - self.idle_seconds
        while self._connections:
            key, oldest = next(iter(self._connections.items()))
            if oldest.last_used >= cutoff and len(self._connections) <= self.max_connections:
                break
            del self._connections[key]

    def start(self, key: ConnKey) -> tuple[Connection, Snapshot | None]:
        """A new connection under ``key`` (replacing any), with no snapshot."""
        self._connections.pop(key, None)
        same_device = [k for k in self._connections if k[:2] == key[:2]]
        for old in same_device[: max(0, len(same_device) - self.max_per_device + 1)]:
            del self._connections[old]
        connection = Connection(secrets.token_hex(4), last_used=self._clock())
        self._connections[key] = connection
        self._expire()
        return connection, None

    def resume(self, key: ConnKey, pos: str) -> tuple[Connection, Snapshot]:
        """The connection and the snapshot ``pos`` names; ``M_UNKNOWN_POS`` if either
        is gone (or never existed). Drops the snapshots before it."""
        self._expire()
        connection = self._connections.get(key)
        nonce, _, seq_text = pos.partition("_")
        if connection is None or connection.nonce != nonce or not seq_text.isdigit():
            raise unknown_pos()
        seq = int(seq_text)
        snapshot = connection.snapshots.get(seq)
        if snapshot is None:
            raise unknown_pos()
        for old in [s for s in connection.snapshots if s < seq]:
            del connection.snapshots[old]
        connection.last_used = self._clock()
        self._connections.move_to_end(key)
        return connection, snapshot

    def commit(self, key: ConnKey, connection: Connection, snapshot: Snapshot) -> str:
        """Store the snapshot a response leaves the client with; its ``pos``."""
        if snapshot.tracked() > self.max_tracked:
            # Too much to remember: the client will start again from scratch.
            self._connections.pop(key, None)
            return f"{connection.nonce}_0"
        seq = connection.next_seq
        connection.next_seq += 1
        connection.snapshots[seq] = snapshot
        # A client retrying one pos many times leaves several answers; keep a few.
        while len(connection.snapshots) > 4:
            del connection.snapshots[min(connection.snapshots)]
        connection.last_used = self._clock()
        if self._connections.get(key) is connection:
            self._connections.move_to_end(key)
        return f"{connection.nonce}_{seq}"
