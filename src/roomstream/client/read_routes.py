"""Handlers for the reads: ``/sync``, ``/messages``, ``/context``, ``/members``,
``/event``, ``/state``. Visibility and pagination are the read path's
(:class:`~roomstream.reading.RoomReader`); these parse requests and shape responses."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from roomstream.accounts import Accounts, Requester
from roomstream.client.filtering import (
    EMPTY_ROOM_EVENT_FILTER,
    SyncFilter,
    parse_room_event_filter,
    parse_sync_filter,
)
from roomstream.client.ignored import IgnoredUsers, hide_ignored
from roomstream.client.presence_service import PresenceService
from roomstream.client.relations_routes import bundle_aggregations
from roomstream.client.remote_history import RemoteHistory, fetch_older_history
from roomstream.client.request import json_response, query_bool, query_int
from roomstream.client.rooms import RoomService
from roomstream.client.server import Route, authenticate
from roomstream.client.store import ClientStore
from roomstream.client.sync import SyncHandler, SyncRequest, SyncToken
from roomstream.errors import ForbiddenError, InvalidParamError, NotFoundError
from roomstream.httpbase import parse_json_object
from roomstream.reading import MAX_LIMIT, RoomReader, parse_pagination_token
from roomstream.reading.relations import attach_bundles
from roomstream.reading.results import PaginationChunk
from roomstream.reading.tokens import PaginationToken

__all__ = ["read_routes"]


async def load_filter(store: ClientStore, requester: Requester, raw: str | None) -> SyncFilter:
    """A ``/sync`` filter given inline (JSON) or by the ID of an uploaded one (an
    unknown ID is ``400 M_INVALID_PARAM``, as Synapse answers)."""
    if raw is None or raw == "":
        return SyncFilter()
    if raw.startswith("{"):
        return parse_sync_filter(_inline_json(raw))
    if not raw.isascii() or not raw.isdigit() or len(raw) > 17:
        raise InvalidParamError("filter must be JSON or a filter ID")
    found = await store.get_filter(requester.user_id, int(raw))
    if found is None:
        raise InvalidParamError(f"no filter {raw}")
    return parse_sync_filter(found)


def _inline_json(raw: str) -> dict[str, Any]:
    return parse_json_object(raw, "filter")


def _token(raw: str | None) -> PaginationToken | None:
    if raw is None or raw == "":
        return None
    if len(raw) > 1000:
        raise InvalidParamError("token too long")
    if "_" in raw:  # a sync token: its events part
        return SyncToken.parse(raw).events
    return parse_pagination_token(raw)


def read_routes(
    accounts: Accounts,
    rooms: RoomService,
    store: ClientStore,
    reader: RoomReader,
    sync_handler: SyncHandler,
    ignored_users: IgnoredUsers | None = None,
    *,
    presence: PresenceService | None = None,
    remote_history: RemoteHistory | None = None,
) -> list[Route]:
    """``remote_history``: where a backwards ``/messages`` page that comes back short
    (the start of what this server holds) gets older history (federation's backfill);
    None: the page ends there."""

    async def ignored_by(requester: Requester) -> frozenset[str]:
        if ignored_users is None:
            return frozenset()
        return await ignored_users.of(requester.user_id)

    async def sync(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        since_raw = request.query.get("since")
        sync_filter = await load_filter(store, requester, request.query.get("filter"))
        set_presence = request.query.get("set_presence", "online")
        if set_presence not in ("online", "offline", "unavailable"):
            raise InvalidParamError("set_presence: online|offline|unavailable")
        sync_request = SyncRequest(
            since=SyncToken.parse(since_raw) if since_raw else None,
            timeout_ms=query_int(request, "timeout", 0),
            full_state=query_bool(request, "full_state"),
            filter=sync_filter,
        )
        if presence is None:
            return json_response(await sync_handler.sync(requester, sync_request))
        # The device counts as syncing (and online, or as set_presence says) while
        # the request lasts, as in Synapse.
        async with presence.syncing(requester.user_id, requester.device_id, set_presence):
            body = await sync_handler.sync(requester, sync_request)
        return json_response(body)

    async def messages(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id = request.match_info["room_id"]
        direction = request.query.get("dir", "b")
        if direction not in ("b", "f"):
            raise InvalidParamError("dir must be b or f")
        raw_filter = request.query.get("filter")
        event_filter = (
            EMPTY_ROOM_EVENT_FILTER
            if not raw_filter
            else parse_room_event_filter(_inline_json(raw_filter))
        )
        limit = query_int(request, "limit", event_filter.limit or 10, low=0, high=10_000)
        limit = max(1, min(limit, MAX_LIMIT))
        from_token = _token(request.query.get("from"))
        dir_value: Literal["b", "f"] = "b" if direction == "b" else "f"
        ignored = await ignored_by(requester)
        to_token = _token(request.query.get("to"))

        async def page() -> PaginationChunk:
            return await reader.paginate(
                requester.user_id,
                room_id,
                from_token,
                direction=dir_value,
                limit=limit,
                to_token=to_token,
                device_id=requester.device_id,
                # 403 for a user who never joined, is banned or only invited, unless the
                # room is world_readable now, and for an unknown room (as Synapse).
                check_access=True,
                # The aggregations in the page's own transaction (one round trip).
                aggregate=True,
                ignored=ignored,
            )

        chunk = await page()
        if (
            dir_value == "b"
            and to_token is None
            and remote_history is not None
            and len(chunk.events) < limit
            and await fetch_older_history(remote_history, room_id, limit)
        ):
            # The page reached the start of what this server held, and another server
            # gave older events: the same page again, through the visibility records.
            chunk = await page()
        if chunk.departed and await store.forgotten_rooms(requester.user_id, [room_id]):
            raise ForbiddenError(f"user {requester.user_id} forgot room {room_id}")
        # Filtered after reading (see docs/client_api.md): a page may hold fewer than
        # `limit` events, and `end` still continues after every event read.
        events = hide_ignored(chunk.events, ignored)
        if not event_filter.allows_all:
            events = [e for e in events if event_filter.matches(e)]
        attach_bundles(events, chunk.aggregations)
        body: dict[str, Any] = {"chunk": events, "start": chunk.start.to_string()}
        if chunk.end is not None:
            body["end"] = chunk.end.to_string()
        if event_filter.lazy_load_members and events:
            # The senders' member events in the state after the page's first event.
            body["state"] = await reader.members(
                requester.user_id,
                room_id,
                at=str(events[0]["event_id"]),
                users={str(e.get("sender")) for e in events},
            )
        return json_response(body)

    async def context(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        limit = min(query_int(request, "limit", 10), MAX_LIMIT)
        ignored = await ignored_by(requester)
        found = await reader.context(
            requester.user_id,
            request.match_info["room_id"],
            request.match_info["event_id"],
            before=limit // 2,
            after=limit - limit // 2,
            device_id=requester.device_id,
            aggregate=True,
            ignored=ignored,
        )
        if not hide_ignored([found.event], ignored):
            # Hidden from this user as an event they may not see (Synapse: 403).
            raise ForbiddenError("you may not see that event")
        before = hide_ignored(found.events_before, ignored)
        after = hide_ignored(found.events_after, ignored)
        attach_bundles([found.event, *before, *after], found.aggregations)
        return json_response(
            {
                "event": found.event,
                "events_before": before,
                "events_after": after,
                "start": found.start.to_string(),
                "end": found.end.to_string(),
                "state": found.state,
            }
        )

    async def members(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        at = _token(request.query.get("at"))
        membership = request.query.getall("membership", None)
        not_membership = request.query.getall("not_membership", None)
        chunk = await reader.members(
            requester.user_id,
            request.match_info["room_id"],
            at=at,
            membership=membership,
            not_membership=not_membership,
        )
        return json_response({"chunk": chunk})

    async def get_event(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        event = await reader.get_event(
            requester.user_id, request.match_info["event_id"], device_id=requester.device_id
        )
        if event is None or event.get("room_id") != request.match_info["room_id"]:
            raise NotFoundError("event not found")
        await bundle_aggregations(
            reader, requester.user_id, requester.device_id, [event], await ignored_by(requester)
        )
        return json_response(event)

    async def full_state(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await rooms.current_state_json(requester, request.match_info["room_id"])
        return web.Response(body=body, content_type="application/json")

    return [
        Route("GET", "/sync", sync),
        Route("GET", "/rooms/{room_id}/messages", messages),
        Route("GET", "/rooms/{room_id}/context/{event_id}", context),
        Route("GET", "/rooms/{room_id}/members", members),
        Route("GET", "/rooms/{room_id}/event/{event_id}", get_event),
        Route("GET", "/rooms/{room_id}/state", full_state),
    ]
