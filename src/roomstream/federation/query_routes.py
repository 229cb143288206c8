"""Handlers of the federation queries (:mod:`roomstream.federation.queries`): each
authenticates the request (``authenticate``: the ``X-Matrix`` check, given the body it
signed), parses it, calls :class:`~roomstream.federation.queries.FederationQueries` and
answers JSON (media: ``multipart/mixed``). Errors are the named errors the library
raises, answered by the listener's one error middleware.

Paths, under ``/_matrix/federation``: ``GET /v1/query/profile``, ``GET
/v1/query/directory``, ``GET|POST /v1/publicRooms``, ``GET /v1/user/devices/{userId}``,
``POST /v1/user/keys/query``, ``POST /v1/user/keys/claim``, ``GET
/v1/hierarchy/{roomId}``, ``GET /v1/media/download/{mediaId}``, ``GET
/v1/media/thumbnail/{mediaId}``.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from roomstream.client.directory import MAX_ROOMS_LIMIT
from roomstream.client.request import (
    optional,
    path_value,
    query_bool,
    query_int,
    room_id_in_path,
)
from roomstream.errors import BadJsonError, BadRequestError, InvalidParamError, MissingParamError
from roomstream.federation.auth import Authenticate
from roomstream.federation.queries import FederationQueries, MediaAnswer
from roomstream.httpbase import json_response, parse_json_object
from roomstream.media.repository import DEFAULT_TIMEOUT_MS, MAX_THUMBNAIL_SIDE

__all__ = ["FEDERATION_PREFIX", "install_query_routes"]

FEDERATION_PREFIX = "/_matrix/federation"
#: Checks a request's ``X-Matrix`` authorization over its body; the origin's name.
#: Longest search term or ``since`` token accepted (the client API's bound).
MAX_TERM_LENGTH = 1000
#: Longest a media request may wait for an asynchronous upload (Synapse's bound).
MAX_MEDIA_TIMEOUT_MS = 5 * 60 * 1000


async def _body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except ConnectionResetError:
        raise BadRequestError("the server went away") from None


def _json(raw: bytes) -> dict[str, Any]:
    return {} if not raw.strip() else parse_json_object(raw, "content")


def _query_string(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if not value:
        raise MissingParamError(f"missing {name}")
    if len(value) > MAX_TERM_LENGTH:
        raise InvalidParamError(f"{name} is too long")
    return value


def _string_lists(value: Any, what: str) -> dict[str, list[str]]:
    """``{user: [device, ...] | null}`` of a keys query (null: every device)."""
    if not isinstance(value, dict):
        raise BadJsonError(f"{what} must be an object")
    result: dict[str, list[str]] = {}
    for user_id, devices in value.items():
        if devices is None:
            devices = []
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise BadJsonError(f"{what}: the devices of a user must be a list of strings")
        result[user_id] = devices
    return result


def _claims(value: Any) -> dict[str, dict[str, str]]:
    if not isinstance(value, dict):
        raise BadJsonError("one_time_keys must be an object")
    result: dict[str, dict[str, str]] = {}
    for user_id, devices in value.items():
        if not isinstance(devices, dict) or not all(isinstance(a, str) for a in devices.values()):
            raise BadJsonError("one_time_keys: each user maps devices to an algorithm")
        result[user_id] = dict(devices)
    return result


async def _media_answer(request: web.Request, answer: MediaAnswer) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": answer.content_type})
    response.content_length = answer.length
    await response.prepare(request)
    # The head in one write: Synapse's parser of this answer takes each part header's
    # value whole from one read (a head cut mid-value by small writes fails there).
    await response.write(answer.head())
    async for chunk in answer.download.blob.chunks():
        await response.write(chunk)
    await response.write(answer.tail())
    await response.write_eof()
    return response


def install_query_routes(
    app: web.Application, queries: FederationQueries, authenticate: Authenticate
) -> None:
    """Add the query handlers to ``app`` (the federation listener's)."""

    async def profile(request: web.Request) -> web.Response:
        await authenticate(request, None)
        field = request.query.get("field") or None
        answer = await queries.profile(_query_string(request, "user_id"), field)
        return json_response(answer)

    async def directory(request: web.Request) -> web.Response:
        await authenticate(request, None)
        return json_response(await queries.directory(_query_string(request, "room_alias")))

    async def public_rooms_get(request: web.Request) -> web.Response:
        await authenticate(request, None)
        limit = query_int(request, "limit", MAX_ROOMS_LIMIT, low=0)
        since = request.query.get("since") or None
        if since is not None and len(since) > MAX_TERM_LENGTH:
            raise InvalidParamError("since is too long")
        page = await queries.public_rooms(limit, since, None)
        return json_response(page.to_json())

    async def public_rooms_post(request: web.Request) -> web.Response:
        raw = await _body(request)
        await authenticate(request, raw)
        body = _json(raw)
        limit = optional(body, "limit", int)
        if limit is not None and limit < 0:
            raise InvalidParamError("limit must not be negative")
        since = optional(body, "since", str)
        filter_def = optional(body, "filter", dict, {})
        term = optional(filter_def, "generic_search_term", str)
        for name, value in (("since", since), ("generic_search_term", term)):
            if value is not None and len(value) > MAX_TERM_LENGTH:
                raise InvalidParamError(f"{name} is too long")
        optional(body, "include_all_networks", bool)
        optional(body, "third_party_instance_id", str)
        page = await queries.public_rooms(limit, since or None, term)
        return json_response(page.to_json())

    async def user_devices(request: web.Request) -> web.Response:
        await authenticate(request, None)
        return json_response(await queries.user_devices(path_value(request, "user_id")))

    async def keys_query(request: web.Request) -> web.Response:
        raw = await _body(request)
        await authenticate(request, raw)
        body = _json(raw)
        wanted = _string_lists(body.get("device_keys", {}), "device_keys")
        return json_response(await queries.query_keys(wanted))

    async def keys_claim(request: web.Request) -> web.Response:
        raw = await _body(request)
        await authenticate(request, raw)
        body = _json(raw)
        return json_response(await queries.claim_keys(_claims(body.get("one_time_keys", {}))))

    async def hierarchy(request: web.Request) -> web.Response:
        origin = await authenticate(request, None)
        answer = await queries.hierarchy(
            origin, room_id_in_path(request), query_bool(request, "suggested_only")
        )
        return json_response(answer)

    def _timeout(request: web.Request) -> int:
        return query_int(request, "timeout_ms", DEFAULT_TIMEOUT_MS, high=MAX_MEDIA_TIMEOUT_MS)

    async def media_download(request: web.Request) -> web.StreamResponse:
        await authenticate(request, None)
        answer = await queries.media_download(
            path_value(request, "media_id"), _timeout(request), uuid.uuid4().hex
        )
        return await _media_answer(request, answer)

    async def media_thumbnail(request: web.Request) -> web.StreamResponse:
        await authenticate(request, None)
        sides = []
        for side in ("width", "height"):
            if not request.query.get(side):
                raise MissingParamError(f"missing {side}")
            sides.append(query_int(request, side, 0, low=1, high=MAX_THUMBNAIL_SIDE))
        answer = await queries.media_thumbnail(
            path_value(request, "media_id"),
            sides[0],
            sides[1],
            request.query.get("method", "scale"),
            query_bool(request, "animated"),
            _timeout(request),
            uuid.uuid4().hex,
        )
        return await _media_answer(request, answer)

    v1 = f"{FEDERATION_PREFIX}/v1"
    app.router.add_get(f"{v1}/query/profile", profile)
    app.router.add_get(f"{v1}/query/directory", directory)
    app.router.add_get(f"{v1}/publicRooms", public_rooms_get)
    app.router.add_post(f"{v1}/publicRooms", public_rooms_post)
    app.router.add_get(f"{v1}/user/devices/{{user_id}}", user_devices)
    app.router.add_post(f"{v1}/user/keys/query", keys_query)
    app.router.add_post(f"{v1}/user/keys/claim", keys_claim)
    app.router.add_get(f"{v1}/hierarchy/{{room_id}}", hierarchy)
    app.router.add_get(f"{v1}/media/download/{{media_id}}", media_download)
    app.router.add_get(f"{v1}/media/thumbnail/{{media_id}}", media_thumbnail)
