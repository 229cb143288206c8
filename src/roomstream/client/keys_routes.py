"""Handlers for end-to-end encryption keys: ``/keys/upload``, ``/keys/query``,
``/keys/claim``, ``/keys/changes``, cross-signing uploads (thin: the rules are in
:mod:`roomstream.e2e`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.remote_keys import KeysWithRemote
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.client.sync import SyncToken
from roomstream.e2e import E2eKeys
from roomstream.errors import InvalidParamError, MissingParamError

__all__ = ["keys_routes"]

#: Devices that one ``/keys/query`` or ``/keys/claim`` may name in all.
MAX_DEVICES_PER_REQUEST = 10_000


def _user_map(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = required(body, name, dict)
    if not all(isinstance(k, str) and k.startswith("@") for k in value):
        raise InvalidParamError(f"{name} must map user IDs")
    return value


def _query_wanted(body: dict[str, Any]) -> dict[str, list[str]]:
    wanted: dict[str, list[str]] = {}
    total = 0
    for user_id, devices in _user_map(body, "device_keys").items():
        if devices is None:
            devices = []
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise InvalidParamError("device_keys values must be lists")
        total += max(1, len(devices))
        wanted[user_id] = devices
    if total > MAX_DEVICES_PER_REQUEST:
        raise InvalidParamError("too many devices in one query")
    return wanted


def _claim_wanted(body: dict[str, Any]) -> dict[str, dict[str, str]]:
    wanted = _user_map(body, "one_time_keys")
    total = 0
    for devices in wanted.values():
        if not isinstance(devices, dict) or not all(isinstance(a, str) for a in devices.values()):
            raise InvalidParamError("one_time_keys: device -> algorithm")
        total += len(devices)
    if total > MAX_DEVICES_PER_REQUEST:
        raise InvalidParamError("too many devices in one claim")
    return wanted


def _changes_token(request: web.Request, name: str) -> tuple[int | None, int]:
    """(the ``device_lists`` part, the events part's lowest writer position) of a sync
    token in the query; the first None for a token from before that part existed."""
    raw = request.query.get(name)
    if not raw:
        raise MissingParamError(f"missing {name}")
    token = SyncToken.parse(raw)
    lists = token.position("device_lists") if raw.count("_") >= 5 else None
    return lists, token.events.minimum


def keys_routes(accounts: Accounts, keys: E2eKeys, everyones: KeysWithRemote) -> list[Route]:
    """``everyones``: ``/keys/query`` and ``/keys/claim`` of users on any server."""

    async def upload(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        fallback = body.get("fallback_keys", body.get("org.matrix.msc2732.fallback_keys"))
        counts = await keys.upload(
            requester.user_id,
            requester.device_id,
            body.get("device_keys"),
            body.get("one_time_keys"),
            fallback,
        )
        return json_response({"one_time_key_counts": counts})

    async def query(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        wanted = _query_wanted(await read_json(request))
        return json_response(await everyones.query(requester.user_id, wanted))

    async def claim(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response(await everyones.claim(_claim_wanted(await read_json(request))))

    async def changes(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        since, events_from = _changes_token(request, "from")
        upto, events_to = _changes_token(request, "to")
        # A token without the stream's part: from its beginning / up to now. Membership
        # moves between the tokens' events positions bring users in (changed) or out (left).
        changed, left = await keys.changed_since(
            requester.user_id,
            since or 0,
            keys.position() if upto is None else upto,
            membership_range=(events_from, max(events_from, events_to)),
        )
        return json_response({"changed": sorted(changed), "left": sorted(left)})

    async def device_signing_upload(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        await keys.upload_cross_signing(requester.user_id, body, optional(body, "auth", dict))
        return json_response({})

    async def signatures_upload(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        return json_response(await keys.upload_signatures(requester.user_id, body))

    return [
        Route("POST", "/keys/upload", upload),
        Route("POST", "/keys/upload/{device_id}", upload),  # r0's deprecated form
        Route("POST", "/keys/query", query),
        Route("POST", "/keys/claim", claim),
        Route("GET", "/keys/changes", changes),
        Route("POST", "/keys/device_signing/upload", device_signing_upload),
        Route("POST", "/keys/signatures/upload", signatures_upload),
    ]
