"""Handlers for server-side key backup: ``/room_keys/version[/{version}]`` and
``/room_keys/keys[/{roomId}[/{sessionId}]]`` (rules in :mod:`roomstream.e2e.backup`)."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.e2e.backup import (
    KeyBackup,
    parse_rooms,
    parse_session,
    parse_sessions,
    sessions_json,
)
from roomstream.errors import NotFoundError

__all__ = ["backup_routes"]


def backup_routes(accounts: Accounts, backup: KeyBackup) -> list[Route]:
    async def create_version(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        algorithm = required(body, "algorithm", str)
        auth_data = required(body, "auth_data", dict)
        version = await backup.create_version(requester.user_id, algorithm, auth_data)
        return json_response({"version": version})

    async def get_version(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        version = request.match_info.get("version")
        return json_response(await backup.get_version(requester.user_id, version))

    async def update_version(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        await backup.update_version(
            requester.user_id,
            request.match_info["version"],
            required(body, "algorithm", str),
            required(body, "auth_data", dict),
            optional(body, "version", str),
        )
        return json_response({})

    async def delete_version(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        await backup.delete_version(requester.user_id, request.match_info["version"])
        return json_response({})

    def where(request: web.Request) -> tuple[str | None, str | None]:
        return request.match_info.get("room_id"), request.match_info.get("session_id")

    async def put_keys(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        room_id, session_id = where(request)
        if room_id is None:
            uploads = parse_rooms(body)
        elif session_id is None:
            uploads = parse_sessions(room_id, body)
        else:
            uploads = [(room_id, session_id, *parse_session(body))]
        version = request.query.get("version")
        return json_response(await backup.put_keys(requester.user_id, version, uploads))

    async def get_keys(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id, session_id = where(request)
        stored = await backup.get_keys(
            requester.user_id, request.query.get("version"), room_id, session_id
        )
        if session_id is not None:
            if not stored:
                raise NotFoundError("no such session in the backup")
            return json_response(stored[0][2])
        rooms = sessions_json(stored)
        if room_id is not None:
            return json_response(rooms["rooms"].get(room_id, {"sessions": {}}))
        return json_response(rooms)

    async def delete_keys(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        room_id, session_id = where(request)
        result = await backup.delete_keys(
            requester.user_id, request.query.get("version"), room_id, session_id
        )
        return json_response(result)

    routes = [
        Route("POST", "/room_keys/version", create_version),
        Route("GET", "/room_keys/version", get_version),
        Route("GET", "/room_keys/version/{version}", get_version),
        Route("PUT", "/room_keys/version/{version}", update_version),
        Route("DELETE", "/room_keys/version/{version}", delete_version),
    ]
    for path in (
        "/room_keys/keys",
        "/room_keys/keys/{room_id}",
        "/room_keys/keys/{room_id}/{session_id}",
    ):
        routes += [
            Route("PUT", path, put_keys),
            Route("GET", path, get_keys),
            Route("DELETE", path, delete_keys),
        ]
    return routes
