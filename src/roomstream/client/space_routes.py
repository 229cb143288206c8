"""Handlers for spaces, upgrades, reports and timestamp lookups (issue 21 §4):
``GET /rooms/{id}/hierarchy``, ``POST /rooms/{id}/upgrade``, ``POST
/rooms/{id}/report[/{eventId}]``, ``GET /rooms/{id}/timestamp_to_event``."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.reports import Reports
from roomstream.client.request import (
    json_response,
    optional,
    query_bool,
    query_int,
    read_json,
    required,
    room_id_in_path,
)
from roomstream.client.server import Route, authenticate
from roomstream.client.spaces import HierarchyRequest, SpaceHierarchy
from roomstream.client.upgrades import RoomUpgrades
from roomstream.errors import InvalidParamError, MissingParamError
from roomstream.events.room_versions import room_version
from roomstream.grammar import MAX_ID_BYTES, utf8_length
from roomstream.reading import RoomReader

__all__ = ["space_routes"]


def _optional_int(request: web.Request, name: str, low: int) -> int | None:
    if request.query.get(name, "") == "":
        return None
    return query_int(request, name, 0, low=low)


def space_routes(
    accounts: Accounts,
    hierarchy: SpaceHierarchy,
    upgrades: RoomUpgrades,
    reports: Reports,
    reader: RoomReader,
) -> list[Route]:
    async def get_hierarchy(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        parsed = HierarchyRequest(
            room_id=room_id_in_path(request),
            suggested_only=query_bool(request, "suggested_only"),
            max_depth=_optional_int(request, "max_depth", 0),
            limit=_optional_int(request, "limit", 1),
            from_token=request.query.get("from"),
        )
        return json_response(await hierarchy.hierarchy(requester.user_id, parsed))

    async def upgrade(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        version = room_version(required(body, "new_version", str))
        new_room_id = await upgrades.upgrade(requester, room_id_in_path(request), version)
        return json_response({"replacement_room": new_room_id})

    async def report_event(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        event_id = request.match_info["event_id"]
        if utf8_length(event_id) > MAX_ID_BYTES:
            raise InvalidParamError("event_id is too long")
        await reports.report_event(
            requester.user_id,
            room_id_in_path(request),
            event_id,
            optional(body, "reason", str),
            optional(body, "score", int),
        )
        return json_response({})

    async def report_room(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        reason = required(body, "reason", str)
        await reports.report_room(requester.user_id, room_id_in_path(request), reason)
        return json_response({})

    async def timestamp_to_event(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id = room_id_in_path(request)
        if request.query.get("ts", "") == "":
            raise MissingParamError("missing ts")
        timestamp = query_int(request, "ts", 0)
        direction = request.query.get("dir")
        if direction is None:
            raise MissingParamError("missing dir")
        if direction not in ("f", "b"):
            raise InvalidParamError("dir must be f or b")
        found = await reader.event_at_timestamp(
            requester.user_id, room_id, timestamp, direction == "f"
        )
        return json_response(
            {"event_id": found.event_id, "origin_server_ts": found.origin_server_ts}
        )

    return [
        Route("GET", "/rooms/{room_id}/hierarchy", get_hierarchy),
        Route("POST", "/rooms/{room_id}/upgrade", upgrade),
        Route("POST", "/rooms/{room_id}/report/{event_id}", report_event),
        Route("POST", "/rooms/{room_id}/report", report_room),
        Route("GET", "/rooms/{room_id}/timestamp_to_event", timestamp_to_event),
    ]
