"""Handlers for ``GET /profile/{userId}`` and ``GET/PUT/DELETE /profile/{userId}/{field}``
(``displayname``, ``avatar_url``); the rules are :class:`~roomstream.client.profiles.
ProfileService`'s."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.accounts.profiles import PROFILE_FIELDS
from roomstream.client.profiles import ProfileService
from roomstream.client.request import json_response, read_json, required
from roomstream.client.server import Handler, Route, authenticate
from roomstream.errors import NotFoundError

__all__ = ["profile_routes"]


def profile_routes(accounts: Accounts, profiles: ProfileService) -> list[Route]:
    async def authenticate_if_sent(request: web.Request) -> None:
        # Profiles are public (Synapse's default, require_auth_for_profile_requests:
        # false); a token that is sent must still be valid.
        if "Authorization" in request.headers or "access_token" in request.query:
            await authenticate(accounts, request)

    async def get_profile(request: web.Request) -> web.Response:
        await authenticate_if_sent(request)
        profile = await profiles.get_profile(request.match_info["user_id"])
        body = profile.to_json()
        if not body:  # nothing set: as Synapse answers
            raise NotFoundError("profile not found")
        return json_response(body)

    def field_routes(field: str) -> list[Route]:
        async def get_field(request: web.Request) -> web.Response:
            await authenticate_if_sent(request)
            profile = await profiles.get_profile(request.match_info["user_id"])
            return json_response({field: profile.get(field)})

        async def put_field(request: web.Request) -> web.Response:
            requester = await authenticate(accounts, request)
            value = required(await read_json(request), field, str)
            await profiles.set_field(requester, request.match_info["user_id"], field, value)
            return json_response({})

        async def delete_field(request: web.Request) -> web.Response:
            requester = await authenticate(accounts, request)
            await profiles.set_field(requester, request.match_info["user_id"], field, "")
            return json_response({})

        path = f"/profile/{{user_id}}/{field}"
        handlers: list[tuple[str, Handler]] = [
            ("GET", get_field),
            ("PUT", put_field),
            ("DELETE", delete_field),
        ]
        return [Route(method, path, handler) for method, handler in handlers]

    return [
        Route("GET", "/profile/{user_id}", get_profile),
        *(route for field in PROFILE_FIELDS for route in field_routes(field)),
    ]
