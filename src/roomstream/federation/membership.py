"""Which servers are in a room, from the room's current state (Synapse's
``is_host_in_room`` and ``get_current_hosts_in_room``).

A server is *in* a room when at least one of its users' ``m.room.member`` events in the
room's current state (``current_state_events``, read-only here) has membership ``join``.
Invites, knocks and leaves do not count: the origin of an EDU about a room must have a
joined user there, as Synapse checks before accepting typing and receipts.

The ``*_txn`` functions run inside a caller's transaction; :class:`RoomServers` wraps
them in named ones. Reused by the inbound room side (``/send`` PDUs' origin checks,
``/backfill``'s server visibility) as well as by EDUs and queries.
"""

from __future__ import annotations

from roomstream.storage import Database, Transaction

__all__ = [
    "RoomServers",
    "hosts_in_room_txn",
    "is_host_in_room_txn",
    "server_of",
]


def server_of(user_id: str) -> str:
    """The server part of a Matrix user ID (``@local:server``; empty when malformed)."""
    if not user_id.startswith("@"):
        return ""
    _, sep, server = user_id.partition(":")
    return server if sep else ""


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def is_host_in_room_txn(txn: Transaction, room_id: str, server_name: str) -> bool:
    """Whether a user of ``server_name`` is joined to ``room_id`` now."""
    if not server_name:
        return False
    # LIKE narrows the rows; the exact test is Python's: SQLite's LIKE ignores ASCII
    # case, and "%:example.org" also matches a user of "other:example.org".
    rows = txn.query(
        "SELECT state_key FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'join'"
        " AND state_key LIKE ? ESCAPE '\\'",
        (room_id, "%:" + _like_escape(server_name)),
    )
    return any(server_of(str(row[0])) == server_name for row in rows)


def hosts_in_room_txn(txn: Transaction, room_id: str) -> list[str]:
    """The servers with a user joined to ``room_id`` now, sorted (empty: unknown room,
    or nobody joined)."""
    rows = txn.query(
        "SELECT state_key FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'join'",
        (room_id,),
    )
    return sorted({server for row in rows if (server := server_of(str(row[0])))})


class RoomServers:
    """The two questions on a database, each one named transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def is_host_in_room(self, room_id: str, server_name: str) -> bool:
        return await self.db.run_interaction(
            "is_host_in_room", is_host_in_room_txn, room_id, server_name
        )

    async def hosts_in_room(self, room_id: str) -> list[str]:
        return await self.db.run_interaction("hosts_in_room", hosts_in_room_txn, room_id)
