"""Handlers for relations: ``GET /rooms/{id}/relations/{eventId}[/{relType}[/{eventType}]]``
and ``GET /rooms/{id}/threads``; and :func:`bundle_aggregations`, which puts the server-side
aggregations (``unsigned["m.relations"]``) on events the other reads serve. What a user
may see is the read path's (:mod:`roomstream.reading.relations`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from aiohttp import web

from roomstream.accounts import Accounts, Requester
from roomstream.client.ignored import IgnoredUsers, hide_ignored
from roomstream.client.request import (
    json_response,
    path_value,
    query_bool,
    query_int,
    room_id_in_path,
)
from roomstream.client.server import Route, authenticate
from roomstream.errors import InvalidParamError
from roomstream.reading import MAX_LIMIT, RoomReader, parse_pagination_token
from roomstream.reading.format import ClientEvent
from roomstream.reading.relations import attach_bundles
from roomstream.reading.tokens import PaginationToken, RoomPosition

__all__ = ["bundle_aggregations", "relations_routes"]


def _token(raw: str | None, name: str) -> PaginationToken | None:
    if raw is None or raw == "":
        return None
    if len(raw) > 1000:
        raise InvalidParamError(f"{name} is too long")
    return parse_pagination_token(raw)


async def bundle_aggregations(
    reader: RoomReader,
    user_id: str,
    device_id: str | None,
    events: Sequence[ClientEvent],
    ignored: frozenset[str] = frozenset(),
) -> None:
    """Add ``unsigned["m.relations"]`` to those of ``events`` that have visible
    ``m.thread``/``m.reference`` relations from users ``user_id`` does not ignore (in
    place; each gets a new ``unsigned`` dict, so cached formats are never touched).
    One transaction: reads that can, fold this into their own (``/messages``)."""
    if not events:
        return
    found = await reader.relation_aggregations(
        user_id, events, device_id=device_id, ignored=ignored
    )
    attach_bundles(events, found)


def relations_routes(
    accounts: Accounts, reader: RoomReader, ignored_users: IgnoredUsers | None = None
) -> list[Route]:
    async def ignored_by(requester: Requester) -> frozenset[str]:
        if ignored_users is None:
            return frozenset()
        return await ignored_users.of(requester.user_id)

    async def relations(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        direction = request.query.get("dir", "b")
        if direction not in ("b", "f"):
            raise InvalidParamError("dir must be b or f")
        dir_value: Literal["b", "f"] = "b" if direction == "b" else "f"
        # Synapse's default page (5) and its clamp to the largest page.
        limit = min(query_int(request, "limit", 5, low=0), MAX_LIMIT) or 1
        from_raw = request.query.get("from")
        ignored = await ignored_by(requester)
        chunk = await reader.relations(
            requester.user_id,
            room_id_in_path(request),
            path_value(request, "event_id"),
            rel_type=path_value(request, "rel_type") or None,
            event_type=path_value(request, "event_type") or None,
            direction=dir_value,
            from_token=_token(from_raw, "from"),
            to_token=_token(request.query.get("to"), "to"),
            limit=limit,
            recurse=query_bool(request, "recurse"),
            device_id=requester.device_id,
            aggregate=True,
            ignored=ignored,
        )
        events = hide_ignored(chunk.events, ignored)
        attach_bundles(events, chunk.aggregations)
        body: dict[str, Any] = {"chunk": events}
        if chunk.next_batch is not None:
            body["next_batch"] = chunk.next_batch.to_string()
        if from_raw:
            body["prev_batch"] = from_raw
        if chunk.recursion_depth is not None:
            body["recursion_depth"] = chunk.recursion_depth
        return json_response(body)

    async def threads(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        include = request.query.get("include", "all")
        if include not in ("all", "participated"):
            raise InvalidParamError("include must be all or participated")
        include_value: Literal["all", "participated"] = (
            "all" if include == "all" else "participated"
        )
        limit = min(query_int(request, "limit", 5, low=0), MAX_LIMIT) or 1
        from_token = _token(request.query.get("from"), "from")
        if from_token is not None and not isinstance(from_token, RoomPosition):
            raise InvalidParamError("from is not a threads token")
        ignored = await ignored_by(requester)
        chunk = await reader.threads(
            requester.user_id,
            room_id_in_path(request),
            include=include_value,
            from_token=from_token,
            limit=limit,
            device_id=requester.device_id,
            aggregate=True,
            ignored=ignored,
        )
        events = hide_ignored(chunk.events, ignored)
        attach_bundles(events, chunk.aggregations)
        body: dict[str, Any] = {"chunk": events}
        if chunk.next_batch is not None:
            body["next_batch"] = chunk.next_batch.to_string()
        return json_response(body)

    base = "/rooms/{room_id}/relations/{event_id}"
    return [
        Route("GET", base, relations),
        Route("GET", base + "/{rel_type}", relations),
        Route("GET", base + "/{rel_type}/{event_type}", relations),
        Route("GET", "/rooms/{room_id}/threads", threads),
    ]
