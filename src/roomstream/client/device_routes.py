"""Handlers for device management: ``/devices``, ``/devices/{deviceId}``,
``/delete_devices``. Deleting a device ends its sessions (tokens), forgets its keys and
drops its to-device queue (as every logout does); it needs the user's password
(user-interactive auth)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.accounts.client_ips import ClientIps, Connection
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.e2e import E2eKeys
from roomstream.errors import InvalidParamError, NotFoundError

__all__ = ["device_routes"]

#: Longest device display name accepted.
MAX_DISPLAY_NAME = 1000


def _device_json(
    user_id: str, device_id: str, name: str | None, seen: list[Connection]
) -> dict[str, Any]:
    # The last_seen fields are optional in the spec but always present (null when never
    # seen) as Synapse sends them: clients such as matrix-nio require them.
    last = seen[0] if seen else None
    return {
        "user_id": user_id,
        "device_id": device_id,
        "display_name": name,
        "last_seen_ip": None if last is None else last.ip,
        "last_seen_ts": None if last is None else last.last_seen,
    }


def device_routes(accounts: Accounts, keys: E2eKeys, client_ips: ClientIps) -> list[Route]:
    store = accounts.store

    async def delete(user_id: str, device_ids: list[str], auth: dict[str, Any] | None) -> None:
        await accounts.require_password_auth(user_id, auth)
        # Keys and to-device queues go through Accounts.devices_deleted_listeners.
        for device_id in device_ids:
            await accounts.end_sessions(user_id, device_id)

    async def list_devices(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        devices = await store.get_devices(requester.user_id)
        seen = await client_ips.connections(requester.user_id)
        return json_response(
            {
                "devices": [
                    _device_json(requester.user_id, d, n, seen.get(d, [])) for d, n in devices
                ]
            }
        )

    async def get_device(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        found = await store.get_device(requester.user_id, request.match_info["device_id"])
        if found is None:
            raise NotFoundError("no such device")
        seen = await client_ips.connections(requester.user_id)
        device_id, name = found
        return json_response(
            _device_json(requester.user_id, device_id, name, seen.get(device_id, []))
        )

    async def put_device(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        device_id = request.match_info["device_id"]
        name = optional(body, "display_name", str)
        if name is None:
            if await store.get_device(requester.user_id, device_id) is None:
                raise NotFoundError("no such device")
            return json_response({})
        if len(name) > MAX_DISPLAY_NAME:
            raise InvalidParamError("display_name is too long")
        if not await store.rename_device(requester.user_id, device_id, name):
            raise NotFoundError("no such device")
        await keys.device_renamed(requester.user_id)
        return json_response({})

    async def delete_device(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        device_id = request.match_info["device_id"]
        body = await read_json(request) if request.can_read_body else {}
        if await store.get_device(requester.user_id, device_id) is None:
            raise NotFoundError("no such device")
        await delete(requester.user_id, [device_id], optional(body, "auth", dict))
        return json_response({})

    async def delete_devices(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        device_ids = required(body, "devices", list)
        if not all(isinstance(d, str) for d in device_ids):
            raise InvalidParamError("devices must be a list of device IDs")
        await delete(requester.user_id, sorted(set(device_ids)), optional(body, "auth", dict))
        return json_response({})

    return [
        Route("GET", "/devices", list_devices),
        Route("GET", "/devices/{device_id}", get_device),
        Route("PUT", "/devices/{device_id}", put_device),
        Route("DELETE", "/devices/{device_id}", delete_device),
        Route("POST", "/delete_devices", delete_devices),
    ]
