"""HTTP routes of the inbound room federation (``/_matrix/federation/v1|v2/...``).

Thin: authenticate the origin (the injected ``authenticate``, fedtransport's X-Matrix
check), parse the path, query and body, call :class:`FederationServer`, answer JSON.
Errors are named errors, mapped once by :mod:`roomstream.httpbase`'s middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from roomstream.errors import InvalidParamError, MissingParamError
from roomstream.federation.server import FederationServer
from roomstream.httpbase import json_response, parse_json_object

Authenticate = Callable[[web.Request, bytes | None], Awaitable[str]]
"""Checks a request's ``X-Matrix`` authorization; returns the origin server's name."""

V1 = "/_matrix/federation/v1"
V2 = "/_matrix/federation/v2"


def install_room_routes(
    app: web.Application, server: FederationServer, authenticate: Authenticate
) -> None:
    """Register the room side's routes on ``app`` (whose middlewares map errors)."""

    async def origin_and_body(request: web.Request) -> tuple[str, dict[str, Any]]:
        raw = await request.read() if request.can_read_body else None
        origin = await authenticate(request, raw or None)
        body = parse_json_object(raw, "content") if raw and raw.strip() else {}
        return origin, body

    async def origin_only(request: web.Request) -> str:
        return await authenticate(request, None)

    def path(request: web.Request, name: str) -> str:
        return request.match_info[name]

    def event_id_query(request: web.Request) -> str:
        event_id = request.query.get("event_id")
        if not event_id:
            raise MissingParamError("'event_id' is required")
        return event_id

    def versions(request: web.Request) -> list[str]:
        return request.query.getall("ver", [])

    async def send(request: web.Request) -> web.Response:
        origin, body = await origin_and_body(request)
        answer = await server.on_send_transaction(origin, path(request, "txn_id"), body)
        return json_response(answer)

    async def state(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        room_id = path(request, "room_id")
        return json_response(await server.on_state(origin, room_id, event_id_query(request)))

    async def state_ids(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        room_id = path(request, "room_id")
        return json_response(await server.on_state_ids(origin, room_id, event_id_query(request)))

    async def event(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        return json_response(await server.on_event(origin, path(request, "event_id")))

    async def event_auth(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        answer = await server.on_event_auth(
            origin, path(request, "room_id"), path(request, "event_id")
        )
        return json_response(answer)

    async def backfill(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        from_ids = request.query.getall("v", [])
        try:
            limit = int(request.query.get("limit", "10"))
        except ValueError:
            raise InvalidParamError("'limit' must be an integer") from None
        answer = await server.on_backfill(origin, path(request, "room_id"), from_ids, limit)
        return json_response(answer)

    async def get_missing_events(request: web.Request) -> web.Response:
        origin, body = await origin_and_body(request)
        answer = await server.on_get_missing_events(origin, path(request, "room_id"), body)
        return json_response(answer)

    async def make_join(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        answer = await server.on_make_join(
            origin, path(request, "room_id"), path(request, "user_id"), versions(request)
        )
        return json_response(answer)

    async def make_leave(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        answer = await server.on_make_leave(
            origin, path(request, "room_id"), path(request, "user_id")
        )
        return json_response(answer)

    async def make_knock(request: web.Request) -> web.Response:
        origin = await origin_only(request)
        answer = await server.on_make_knock(
            origin, path(request, "room_id"), path(request, "user_id"), versions(request)
        )
        return json_response(answer)

    def signed_membership(
        handle: Callable[[str, str, str, Any], Awaitable[Any]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A route giving a membership event signed after a ``make_*`` to ``handle``
        (``send_join``, ``send_leave``, ``send_knock``, ``invite``)."""

        async def route(request: web.Request) -> web.Response:
            origin, body = await origin_and_body(request)
            room_id, event_id = path(request, "room_id"), path(request, "event_id")
            return json_response(await handle(origin, room_id, event_id, body))

        return route

    send_join = signed_membership(server.on_send_join)
    send_leave = signed_membership(server.on_send_leave)
    send_knock = signed_membership(server.on_send_knock)
    invite = signed_membership(server.on_invite)

    app.router.add_put(V1 + "/send/{txn_id}", send)
    app.router.add_get(V1 + "/state/{room_id}", state)
    app.router.add_get(V1 + "/state_ids/{room_id}", state_ids)
    app.router.add_get(V1 + "/event/{event_id}", event)
    app.router.add_get(V1 + "/event_auth/{room_id}/{event_id}", event_auth)
    app.router.add_get(V1 + "/backfill/{room_id}", backfill)
    app.router.add_post(V1 + "/get_missing_events/{room_id}", get_missing_events)
    app.router.add_get(V1 + "/make_join/{room_id}/{user_id}", make_join)
    app.router.add_get(V1 + "/make_leave/{room_id}/{user_id}", make_leave)
    app.router.add_get(V1 + "/make_knock/{room_id}/{user_id}", make_knock)
    app.router.add_put(V2 + "/send_join/{room_id}/{event_id}", send_join)
    app.router.add_put(V2 + "/send_leave/{room_id}/{event_id}", send_leave)
    app.router.add_put(V1 + "/send_knock/{room_id}/{event_id}", send_knock)
    app.router.add_put(V2 + "/invite/{room_id}/{event_id}", invite)
