"""Handlers for ``POST /user_directory/search`` and ``GET/POST /publicRooms`` (reads of the
Spark views through :class:`~roomstream.client.directory.DirectoryReader`)."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.directory import MAX_ROOMS_LIMIT, DirectoryReader
from roomstream.client.request import json_response, optional, query_int, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.errors import InvalidParamError

__all__ = ["directory_routes"]

MAX_TERM_LENGTH = 1000


def _limit(value: int | None, default: int | None) -> int | None:
    if value is None:
        return default
    if value < 0:
        raise InvalidParamError("limit must not be negative")
    return value


def _check_server(server: str | None, server_name: str) -> None:
    if server is not None and server != server_name:
        raise InvalidParamError(f"server {server[:300]!r}: federation is not supported")


def directory_routes(
    accounts: Accounts, directory: DirectoryReader, server_name: str
) -> list[Route]:
    async def search_users(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        term = required(body, "search_term", str)
        if len(term) > MAX_TERM_LENGTH:
            raise InvalidParamError("search_term is too long")
        limit = _limit(optional(body, "limit", int), 10)
        found = await directory.search_users(requester.user_id, term, limit or 0)
        return json_response({"results": found.results, "limited": found.limited})

    async def public_rooms_get(request: web.Request) -> web.Response:
        # The spec lets anyone read the local room list (as Synapse does by default);
        # a token that is sent must still be valid.
        if "Authorization" in request.headers or "access_token" in request.query:
            await authenticate(accounts, request)
        _check_server(request.query.get("server"), server_name)
        limit = query_int(request, "limit", MAX_ROOMS_LIMIT, low=0)
        page = await directory.public_rooms(limit, request.query.get("since") or None, None)
        return json_response(page.to_json())

    async def public_rooms_post(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        body = await read_json(request)
        _check_server(request.query.get("server"), server_name)
        limit = _limit(optional(body, "limit", int), None)
        since = optional(body, "since", str)
        if since is not None and len(since) > MAX_TERM_LENGTH:
            raise InvalidParamError("since is too long")
        filter_def = optional(body, "filter", dict, {})
        term = optional(filter_def, "generic_search_term", str)
        if term is not None and len(term) > MAX_TERM_LENGTH:
            raise InvalidParamError("generic_search_term is too long")
        optional(body, "include_all_networks", bool)
        optional(body, "third_party_instance_id", str)
        page = await directory.public_rooms(limit, since or None, term)
        return json_response(page.to_json())

    return [
        Route("POST", "/user_directory/search", search_users),
        Route("GET", "/publicRooms", public_rooms_get),
        Route("POST", "/publicRooms", public_rooms_post),
    ]
