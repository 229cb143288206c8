"""What the Client-Server API needs from other homeservers, as an interface.

The client layer never imports :mod:`roomstream.federation` (it sits above this one):
the process assembly gives :class:`~roomstream.client.rooms.RoomService` an implementation
(``roomstream.federation.remote_rooms.RemoteRoomsClient``), or none on a server without
federation, where a room or alias this server does not know answers 404 as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["RemoteRooms", "servers_to_try"]


class RemoteRooms(Protocol):
    async def resolve_alias(self, alias: str) -> tuple[str, list[str]]:
        """The room ID an alias of another server names, and servers in that room
        (``/query/directory``); ``NotFoundError`` if that server does not know it."""
        ...

    async def join(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """Join a local user to a room this server is not in, through the first of
        ``servers`` that lets it (``make_join`` / ``send_join``); the room's state arrives
        with the join. Errors name what the last server said."""
        ...

    async def leave(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """Leave (or reject the invite to) a room this server is not in
        (``make_leave`` / ``send_leave``)."""
        ...

    async def knock(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """Knock on a room this server is not in (``make_knock`` / ``send_knock``)."""
        ...


def servers_to_try(own_server: str, room_id: str, *given: Sequence[str] | None) -> list[str]:
    """Servers to ask about a room, in order, each once, never this one: those given
    (``via`` / ``server_name``, an alias's servers, an inviter's server), then the server
    part of the room ID where it has one (room versions before 12), as Synapse does."""
    seen: dict[str, None] = {}
    for servers in given:
        for server in servers or ():
            seen.setdefault(server, None)
    _, sep, domain = room_id.partition(":")
    if sep and domain:
        seen.setdefault(domain, None)
    seen.pop(own_server, None)
    return list(seen)
