"""Joining rooms of other servers for local users: the joining side of the handshakes.

``make_join`` asks a resident server for a join event template; this server fills it in
(its user's content, the time), hashes and signs it, and ``send_join`` (v2) gives it to
that server, which answers with the room's state before the join and its auth chain.
Those are stored as outliers and the join event with that state (see
:meth:`roomstream.rooms.persist.EventPersister.persist_events`), through the receive
path: every event's signatures, hashes and auth rules are checked as for any received
event. From then on this server is in the room: the federation sender sends its users'
events there, and events arriving by ``/send`` build on the join.

Servers are tried in order (``via``, an alias's servers, an inviter's, the room ID's);
a server's refusal (4xx) is remembered and the next one tried, as Synapse does; if none
succeeds the last refusal is passed on, or :class:`RemoteServerError` when none answered.

In a deployment of several processes the join is carried out by the events writer the
room ID hashes to (``owners``, :mod:`roomstream.federation.cluster`): that process holds
the room from then on, as the writer of a room it created would.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson
from signedjson.types import SigningKey

from roomstream.errors import (
    BadEventError,
    EventSignatureError,
    ForbiddenError,
    MatrixError,
    NotFoundError,
    RemoteServerError,
)
from roomstream.events.format import build_event_dict, finalise_local_event, parse_pdu
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion, room_version
from roomstream.events.types import EventTypes
from roomstream.federation.cluster import RoomOwners
from roomstream.grammar import is_room_id_to_look_up, is_server_name
from roomstream.rooms.engine import RoomEngine

__all__ = ["FederationRequester", "RemoteRoomsClient"]

logger = logging.getLogger(__name__)


class FederationRequester(Protocol):
    """The outbound request this module needs (``FederationClient.request``)."""

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
    ) -> Any: ...


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class RemoteRoomsClient:
    """:class:`roomstream.client.remote_rooms.RemoteRooms` over federation."""

    def __init__(
        self,
        engine: RoomEngine,
        signing_key: SigningKey,
        client: FederationRequester,
        *,
        clock: Callable[[], float] = time.time,
        owners: RoomOwners | None = None,
    ) -> None:
        self.engine = engine
        self.owners = owners
        self.server_name = engine.server_name
        self.signing_key = signing_key
        self.client = client
        self.clock = clock

    # -- aliases -----------------------------------------------------------------------

    async def resolve_alias(self, alias: str) -> tuple[str, list[str]]:
        server = alias.partition(":")[2]
        answer = await self.client.request(
            "GET", server, "/_matrix/federation/v1/query/directory", query={"room_alias": alias}
        )
        room_id = answer.get("room_id") if isinstance(answer, dict) else None
        if not isinstance(room_id, str) or not is_room_id_to_look_up(room_id):
            raise RemoteServerError(f"{server} answered no room ID for {alias}")
        servers = answer.get("servers")
        listed = (
            [s for s in servers if isinstance(s, str) and is_server_name(s)]
            if isinstance(servers, list)
            else []
        )
        # The alias's own server first: it answered, so it is up.
        return room_id, [server, *(s for s in listed if s != server)]

    # -- joins -------------------------------------------------------------------------

    async def join(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        owner = None if self.owners is None else self.owners.remote_owner(room_id)
        if owner is not None:
            assert self.owners is not None
            await self.owners.remote_join(owner, user_id, room_id, servers, content)
            return
        await self.join_here(user_id, room_id, servers, content)

    async def join_here(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """:meth:`join` carried out by this process (the room's events writer)."""
        last: Exception | None = None
        for server in servers:
            try:
                await self._join_through(server, user_id, room_id, content)
                return
            except MatrixError as exc:
                last = _client_error(server, exc)
                logger.info("join of %s through %s failed: %s", room_id, server, exc)
            except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                last = RemoteServerError(f"{server}: {exc}")
                logger.info("join of %s through %s failed: %s", room_id, server, exc)
        if last is None:
            raise NotFoundError(f"no server to join {room_id} through")
        raise last

    # -- invites -----------------------------------------------------------------------

    async def invite(self, event: Event, invite_room_state: list[dict[str, Any]]) -> Event:
        """Give an invite to the invitee's server (``/invite`` v2) and return the event as
        it came back, signed by that server too (the creator's ``remote_invite``): the
        same event (its ID covers everything but signatures), with a valid signature of
        that server (the proof the room's other servers get that it heard of it)."""
        server = str(event.state_key).partition(":")[2]
        answer = await self.client.request(
            "PUT",
            server,
            f"/_matrix/federation/v2/invite/{_quote(event.room_id)}/{_quote(event.event_id)}",
            content={
                "event": event.data,
                "room_version": event.room_version.identifier,
                "invite_room_state": invite_room_state,
            },
        )
        signed = answer.get("event") if isinstance(answer, dict) else None
        if not isinstance(signed, dict):
            raise RemoteServerError(f"{server} answered the invite without the event")
        returned = parse_pdu(orjson.dumps(signed), event.room_version)
        if returned.event_id != event.event_id:
            raise RemoteServerError(f"{server} answered the invite with another event")
        try:
            await self.engine.check_signatures([returned], also={returned.event_id: server})
        except EventSignatureError as exc:
            raise RemoteServerError(
                f"{server} did not sign the invite of its user: {exc}"
            ) from None
        return returned

    async def leave(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """Leave a room this server is not in (reject an invite, withdraw a knock):
        ``make_leave`` / ``send_leave`` v2 through the first server that lets it, then the
        leave is stored as the user's out-of-band membership (what the user's /sync shows;
        the room's own servers have it as a room event)."""
        await self._membership_through(servers, user_id, room_id, "leave", content)

    async def knock(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        """Knock on a room this server is not in: ``make_knock`` / ``send_knock``; the
        knock is stored as the user's out-of-band membership."""
        await self._membership_through(servers, user_id, room_id, "knock", content)

    async def _membership_through(
        self,
        servers: Sequence[str],
        user_id: str,
        room_id: str,
        membership: str,
        content: Mapping[str, Any],
    ) -> None:
        last: Exception | None = None
        for server in servers:
            try:
                await self._out_of_band_through(server, user_id, room_id, membership, content)
                return
            except MatrixError as exc:
                last = _client_error(server, exc)
            except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                last = RemoteServerError(f"{server}: {exc}")
            logger.info("%s of %s through %s failed: %s", membership, room_id, server, last)
        if last is None:
            raise NotFoundError(f"no server to {membership} {room_id} through")
        raise last

    async def _out_of_band_through(
        self,
        server: str,
        user_id: str,
        room_id: str,
        membership: str,
        content: Mapping[str, Any],
    ) -> None:
        path = f"{_quote(room_id)}/{_quote(user_id)}"
        query = {"ver": list(KNOWN_ROOM_VERSIONS)} if membership == "knock" else None
        answer = await self.client.request(
            "GET", server, f"/_matrix/federation/v1/make_{membership}/{path}", query=query
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("event"), dict):
            raise RemoteServerError(f"{server} answered make_{membership} without an event")
        version = room_version(answer.get("room_version", "1"))
        event = self._member_event(answer["event"], version, user_id, room_id, membership, content)
        # send_knock has only v1; send_leave's v2 answers {} (v1 a [200, {}] pair).
        api = "v1" if membership == "knock" else "v2"
        await self.client.request(
            "PUT",
            server,
            f"/_matrix/federation/{api}/send_{membership}/{_quote(room_id)}/{_quote(event.event_id)}",
            content=event.data,
        )
        await self.engine.receive_out_of_band_membership(event.raw, version)

    async def _join_through(
        self, server: str, user_id: str, room_id: str, content: Mapping[str, Any]
    ) -> None:
        answer = await self.client.request(
            "GET",
            server,
            f"/_matrix/federation/v1/make_join/{_quote(room_id)}/{_quote(user_id)}",
            query={"ver": list(KNOWN_ROOM_VERSIONS)},
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("event"), dict):
            raise RemoteServerError(f"{server} answered make_join without an event")
        version = room_version(answer.get("room_version", "1"))
        event = self._member_event(answer["event"], version, user_id, room_id, "join", content)
        sent = await self.client.request(
            "PUT",
            server,
            f"/_matrix/federation/v2/send_join/{_quote(room_id)}/{_quote(event.event_id)}",
            content=event.data,
        )
        if not isinstance(sent, dict):
            raise RemoteServerError(f"{server} answered send_join with no object")
        await self._store_join(server, room_id, version, event, sent)

    def _member_event(
        self,
        template: Mapping[str, Any],
        version: RoomVersion,
        user_id: str,
        room_id: str,
        membership: str,
        content: Mapping[str, Any],
    ) -> Event:
        """Our membership event from a resident server's template: its DAG position and
        server-set keys (e.g. ``join_authorised_via_users_server``), our content."""
        if (
            template.get("type") != EventTypes.MEMBER
            or template.get("state_key") != user_id
            or template.get("sender") != user_id
            or template.get("room_id") != room_id
        ):
            raise RemoteServerError(f"make_{membership} answered a template for someone else")
        given = template.get("content")
        event_content = {**(given if isinstance(given, dict) else {}), **content}
        event_content["membership"] = membership
        prev = template.get("prev_events")
        auth = template.get("auth_events")
        depth = template.get("depth")
        if not isinstance(prev, list) or not isinstance(auth, list) or not isinstance(depth, int):
            raise RemoteServerError(f"make_{membership} answered a template without its place")
        data = build_event_dict(
            version,
            event_type=EventTypes.MEMBER,
            sender=user_id,
            content=event_content,
            prev_events=prev,
            auth_events=auth,
            depth=depth,
            room_id=room_id,
            state_key=user_id,
            origin_server_ts=int(self.clock() * 1000),
        )
        return finalise_local_event(data, version, self.server_name, self.signing_key)

    async def _store_join(
        self,
        server: str,
        room_id: str,
        version: RoomVersion,
        event: Event,
        answer: Mapping[str, Any],
    ) -> None:
        """Store the state and auth chain ``send_join`` answered, then the join."""
        state_pdus = answer.get("state")
        chain_pdus = answer.get("auth_chain")
        if not isinstance(state_pdus, list) or not isinstance(chain_pdus, list):
            raise RemoteServerError(f"{server} answered send_join without state or auth chain")
        join = event
        countersigned = answer.get("event")
        if isinstance(countersigned, dict):
            # A restricted join: the resident server added its signature. It must be our
            # event, with nothing else changed.
            other = parse_pdu(orjson.dumps(countersigned), version)
            if other.event_id != event.event_id:
                raise RemoteServerError(f"{server} answered send_join with another event")
            join = other
        raws: dict[str, bytes] = {}
        state: dict[StateKey, str] = {}
        for pdu in [*chain_pdus, *state_pdus]:
            if not isinstance(pdu, dict):
                raise RemoteServerError(f"{server} answered send_join with a PDU not an object")
            raw = orjson.dumps(pdu)
            parsed = parse_pdu(raw, version)
            if parsed.room_id != room_id:
                raise RemoteServerError(f"{server} answered an event of another room")
            raws[parsed.event_id] = raw
        for pdu in state_pdus:
            parsed = parse_pdu(orjson.dumps(pdu), version)
            if parsed.state_key is None:
                raise RemoteServerError(f"{server} answered a non-state event as state")
            state[(parsed.type, parsed.state_key)] = parsed.event_id
        if (EventTypes.CREATE, "") not in state:
            raise RemoteServerError(f"{server} answered a room state without its create event")
        raws.pop(join.event_id, None)
        await self.engine.receive_pdus(list(raws.values()), outliers=True)
        [outcome] = await self.engine.receive_pdus(
            [join.raw], state_before={join.event_id: [state]}
        )
        if outcome.rejected_reason is not None:
            raise ForbiddenError(
                f"the join was refused by the room's rules: {outcome.rejected_reason}"
            )


def _client_error(server: str, exc: MatrixError) -> MatrixError:
    """What the local client is told of ``exc``: a server's refusal (400, 403, 404) as it
    gave it; anything else (a bad answer; a 401 meant for this server's signature, which
    a client would take for its own token) as :class:`RemoteServerError`."""
    if exc.http_status in (400, 403, 404) and not isinstance(exc, BadEventError):
        return exc
    return RemoteServerError(f"{server}: {exc.message}")
