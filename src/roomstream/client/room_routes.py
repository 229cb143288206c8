"""Handlers for creating rooms, membership, sending, state, redactions and aliases."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.request import (
    json_response,
    optional,
    path_value,
    read_json,
    required,
    room_id_in_path,
)
from roomstream.client.rooms import CreateRoomRequest, RoomService
from roomstream.client.server import Route, authenticate
from roomstream.errors import NotFoundError

__all__ = ["room_routes"]


def _join_content(body: dict[str, Any]) -> dict[str, Any]:
    """A join request's body: its keys go into the join event (``reason`` must be a
    string; ``third_party_signed``, for third-party invites, which are not supported,
    is not content)."""
    optional(body, "reason", str)
    return {k: v for k, v in body.items() if k != "third_party_signed"}


def room_routes(accounts: Accounts, rooms: RoomService) -> list[Route]:
    async def create_room(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        room_id = await rooms.create_room(requester, CreateRoomRequest.parse(body))
        return json_response({"room_id": room_id})

    async def join_any(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        target = path_value(request, "room")
        # Servers to join through when this one is not in the room: `via` (v1.12) and the
        # older `server_name`, as Synapse takes both.
        via = [*request.query.getall("via", ()), *request.query.getall("server_name", ())]
        room_id = await rooms.join(requester, target, _join_content(body), via=via)
        return json_response({"room_id": room_id})

    async def knock(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        via = [*request.query.getall("via", ()), *request.query.getall("server_name", ())]
        room_id = await rooms.knock(
            requester, path_value(request, "room"), optional(body, "reason", str), via
        )
        return json_response({"room_id": room_id})

    async def join_room(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        room_id = await rooms.join(requester, room_id_in_path(request), _join_content(body))
        return json_response({"room_id": room_id})

    async def leave(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        await read_json(request)
        await rooms.leave(requester, room_id_in_path(request))
        return json_response({})

    async def forget(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        await rooms.forget(requester, room_id_in_path(request))
        return json_response({})

    async def membership(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        await rooms.change_membership(
            requester,
            room_id_in_path(request),
            request.match_info["action"],
            required(body, "user_id", str),
            optional(body, "reason", str),
        )
        return json_response({})

    async def send(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        content = await read_json(request)
        event_id = await rooms.send_event(
            requester,
            room_id_in_path(request),
            path_value(request, "event_type"),
            content,
            path_value(request, "txn_id"),
        )
        return json_response({"event_id": event_id})

    async def put_state(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        content = await read_json(request)
        event_id = await rooms.set_state(
            requester,
            room_id_in_path(request),
            path_value(request, "event_type"),
            path_value(request, "state_key"),
            content,
        )
        return json_response({"event_id": event_id})

    async def get_state_entry(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        content = await rooms.readable_state_entry(
            requester,
            room_id_in_path(request),
            path_value(request, "event_type"),
            path_value(request, "state_key"),
        )
        if content is None:
            raise NotFoundError("no such state event")
        return json_response(content)

    async def redact(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        event_id = await rooms.redact(
            requester,
            room_id_in_path(request),
            path_value(request, "event_id"),
            optional(body, "reason", str),
            path_value(request, "txn_id"),
        )
        return json_response({"event_id": event_id})

    async def put_alias(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        await rooms.create_alias(
            requester, path_value(request, "alias"), required(body, "room_id", str)
        )
        return json_response({})

    async def get_alias(request: web.Request) -> web.Response:
        room_id = await rooms.get_alias(path_value(request, "alias"))
        return json_response({"room_id": room_id, "servers": [rooms.server_name]})

    async def delete_alias(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user = await accounts.store.get_user(requester.user_id)
        is_admin = user is not None and user.admin
        await rooms.delete_alias(requester, path_value(request, "alias"), is_admin=is_admin)
        return json_response({})

    async def joined_rooms(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        return json_response({"joined_rooms": await rooms.joined_rooms(requester)})

    async def joined_members(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        joined = await rooms.joined_members(requester, room_id_in_path(request))
        return json_response({"joined": joined})

    state_path = "/rooms/{room_id}/state/{event_type}"
    routes: list[Route] = [
        Route("POST", "/createRoom", create_room),
        Route("POST", "/join/{room}", join_any),
        Route("POST", "/rooms/{room_id}/join", join_room),
        Route("POST", "/knock/{room}", knock),
        Route("POST", "/rooms/{room_id}/leave", leave),
        Route("POST", "/rooms/{room_id}/forget", forget),
        Route("POST", "/rooms/{room_id}/{action:(?:invite|kick|ban|unban)}", membership),
        Route("PUT", "/rooms/{room_id}/send/{event_type}/{txn_id}", send),
        Route("PUT", state_path, put_state),
        Route("PUT", state_path + "/{state_key:.*}", put_state),
        Route("GET", state_path, get_state_entry),
        Route("GET", state_path + "/{state_key:.*}", get_state_entry),
        Route("PUT", "/rooms/{room_id}/redact/{event_id}/{txn_id}", redact),
        Route("PUT", "/directory/room/{alias}", put_alias),
        Route("GET", "/directory/room/{alias}", get_alias),
        Route("DELETE", "/directory/room/{alias}", delete_alias),
        Route("GET", "/joined_rooms", joined_rooms),
        Route("GET", "/rooms/{room_id}/joined_members", joined_members),
    ]
    return routes
