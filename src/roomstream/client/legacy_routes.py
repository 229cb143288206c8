"""Handlers for the deprecated endpoints Synapse still serves: ``POST /send/{type}``
without a transaction ID, ``GET /rooms/{id}/aliases``, the room and global
``initialSync``, and the old event stream ``/events`` (services:
:class:`~roomstream.client.legacy.LegacyReads`, :class:`~roomstream.client.rooms.RoomService`)."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.legacy import LegacyReads, clamp_limit
from roomstream.client.request import (
    json_response,
    path_value,
    query_bool,
    query_int,
    read_json,
    room_id_in_path,
)
from roomstream.client.rooms import RoomService
from roomstream.client.server import Route, authenticate
from roomstream.client.sync import SyncToken
from roomstream.errors import InvalidParamError, NotFoundError
from roomstream.grammar import is_room_id_to_look_up
from roomstream.reading import EventsToken, RoomReader

__all__ = ["legacy_routes"]

#: Default events per room of the room and global ``initialSync`` (as Synapse).
DEFAULT_INITIAL_SYNC_LIMIT = 10
#: Default events per room of one ``/events`` answer.
DEFAULT_EVENTS_LIMIT = 100


def _events_token(raw: str | None) -> EventsToken | None:
    """``from`` of ``/events``: an events token (``end`` of ``initialSync`` or of an
    earlier ``/events``), or a ``/sync`` token (its events part)."""
    if raw is None or raw == "":
        return None
    if len(raw) > 1000:
        raise InvalidParamError("token too long")
    return SyncToken.parse(raw).events if "_" in raw else EventsToken.parse(raw)


def legacy_routes(
    accounts: Accounts, rooms: RoomService, reader: RoomReader, legacy: LegacyReads
) -> list[Route]:
    async def send_untracked(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        content = await read_json(request)
        event_id = await rooms.send_untracked(
            requester, room_id_in_path(request), path_value(request, "event_type"), content
        )
        return json_response({"event_id": event_id})

    async def room_aliases(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        aliases = await legacy.room_aliases(requester, room_id_in_path(request))
        return json_response({"aliases": aliases})

    async def room_initial_sync(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        limit = query_int(request, "limit", DEFAULT_INITIAL_SYNC_LIMIT, high=10_000)
        body = await legacy.room_initial_sync(
            requester, room_id_in_path(request), clamp_limit(limit)
        )
        return json_response(body)

    async def initial_sync(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        limit = query_int(request, "limit", DEFAULT_INITIAL_SYNC_LIMIT, high=10_000)
        archived = query_bool(request, "archived")
        return json_response(await legacy.initial_sync(requester, clamp_limit(limit), archived))

    async def events(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        since = _events_token(request.query.get("from"))
        timeout_ms = query_int(request, "timeout", 30_000)
        limit = clamp_limit(query_int(request, "limit", DEFAULT_EVENTS_LIMIT, high=10_000))
        room_id = request.query.get("room_id")
        if room_id is not None and not is_room_id_to_look_up(room_id):
            raise InvalidParamError("room_id must be a room ID")
        return json_response(await legacy.events(requester, since, timeout_ms, limit, room_id))

    async def get_event(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        event = await reader.get_event(
            requester.user_id, path_value(request, "event_id"), device_id=requester.device_id
        )
        if event is None:
            raise NotFoundError("event not found")
        return json_response(event)

    return [
        Route("POST", "/rooms/{room_id}/send/{event_type}", send_untracked),
        Route("GET", "/rooms/{room_id}/aliases", room_aliases),
        Route("GET", "/rooms/{room_id}/initialSync", room_initial_sync),
        Route("GET", "/initialSync", initial_sync),
        Route("GET", "/events", events),
        Route("GET", "/events/{event_id}", get_event),
    ]
