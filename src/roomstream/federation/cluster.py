"""Federation in a deployment of several processes: what a room's events writer does.

A room's events are persisted by one events writer (:func:`~roomstream.replication.
sharding.writer_for_room`), the process whose persister holds the room (its forward
extremities, its current state, its lock). The federation listener runs in one process
(``federation.instance``), which may not be that writer: what it receives about a room
that changes it (a transaction's PDUs, the membership handshakes, an invite) is carried
out by the room's writer, over the internal API (:data:`~roomstream.replication.endpoints.
FEDERATION_ROOM`, behind the deployment's shared secret), and the answer passed back as
received. Read-only queries (``/state``, ``/backfill``, ...) are answered by the listener
from the shared database.

The joining side likewise: a client's join of a room of other servers is carried out by
the writer the room ID hashes to (:data:`~roomstream.replication.endpoints.REMOTE_JOIN`),
which stores the room's state and the join as it would for a room it created.

:class:`RoomOwners` is the one place that decides; with one process (or no internal API)
everything is done here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roomstream.client.writes import forwarded_call
from roomstream.config import Config
from roomstream.replication import endpoints as ep
from roomstream.replication.http import InternalHttpClient
from roomstream.replication.sharding import writer_for_room

__all__ = ["FORWARDED_TIMEOUT", "RoomOwners"]

#: Seconds a call to a room's writer may take: what it carries out may fetch from other
#: servers (a gap's events, a joined room's state), each request under the federation
#: client's own timeout. Longer than the internal client's default (30 s) for that.
FORWARDED_TIMEOUT = 180.0


class RoomOwners:
    """Which process carries out federation's writes to a room, and the calls to it."""

    def __init__(self, config: Config, http_client: InternalHttpClient | None) -> None:
        self.config = config
        self.http_client = http_client

    def remote_owner(self, room_id: str) -> str | None:
        """The events writer of ``room_id`` when it is another process; None: this one
        (it writes the room, or there is no internal API to reach another)."""
        if self.http_client is None:
            return None
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        return None if owner == self.config.instance_name else owner

    async def room_request(
        self, owner: str, room_id: str, origin: str, op: str, args: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Have ``owner`` carry out ``op`` of ``origin`` about ``room_id``; its answer.
        An unreachable owner is 503 ``M_UNAVAILABLE`` (the remote server retries); the
        owner's own errors pass through with their status and errcode."""
        assert self.http_client is not None
        call = ep.FederationRoomCall(room_id, origin, op, dict(args))
        return await forwarded_call(
            owner,
            self.http_client.call(ep.FEDERATION_ROOM, owner, call, seconds=FORWARDED_TIMEOUT),
        )

    async def remote_join(
        self,
        owner: str,
        user_id: str,
        room_id: str,
        servers: Sequence[str],
        content: Mapping[str, Any],
    ) -> None:
        """Have ``owner`` join ``user_id`` to a room of other servers."""
        assert self.http_client is not None
        call = ep.RemoteJoinCall(room_id, user_id, list(servers), dict(content))
        await forwarded_call(
            owner, self.http_client.call(ep.REMOTE_JOIN, owner, call, seconds=FORWARDED_TIMEOUT)
        )
