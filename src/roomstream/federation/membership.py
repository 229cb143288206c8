"""Which servers are in a room, from the room's current state (Synapse's
``is_host_in_room`` and ``get_current_hosts_in_room``).

A server is *in* a room when at least one of its users' ``m.room.member`` events in the
room's current state (``current_state_events``, read-only here) has membership ``join``.
Invites, knocks and leaves do not count: the origin of an EDU about a room must have a
joined user there, as Synapse checks before accepting typing and receipts.

The ``*_txn`` functions (the room store's, :mod:`roomstream.rooms.store`, which the
Client-Server API asks too) run inside a caller's transaction; :class:`RoomServers` wraps
them in named ones. Reused by the inbound room side (``/send`` PDUs' origin checks,
``/backfill``'s server visibility) as well as by EDUs and queries.
"""

from __future__ import annotations

from roomstream.rooms.store import hosts_in_room_txn, is_host_in_room_txn, server_of
from roomstream.storage import Database

__all__ = [
    "RoomServers",
    "hosts_in_room_txn",
    "is_host_in_room_txn",
    "server_of",
]


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
