"""Handlers for versions, capabilities, registration, login, logout and whoami."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts, LoginResult
from roomstream.client.request import json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.errors import (
    BadRequestError,
    InvalidParamError,
    MissingParamError,
)
from roomstream.events.room_versions import DEFAULT_ROOM_VERSION, KNOWN_ROOM_VERSIONS

__all__ = ["SUPPORTED_VERSIONS", "account_routes"]

#: Spec versions whose endpoints roomstream serves, bar the parts docs/client_api.md lists
#: as deliberately absent (federation). "v1.11" stands for authenticated media (that
#: version's change, served by media_routes.py): clients such as Hydrogen switch to the
#: /_matrix/client/v1/media endpoints only when /versions lists exactly "v1.11", and the
#: legacy endpoints they use otherwise are frozen (enable_authenticated_media), so without
#: it their images do not load. v1.7 to v1.10 are not claimed here.
SUPPORTED_VERSIONS = ["r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6", "v1.11"]


def _login_body(result: LoginResult, server_name: str) -> dict[str, Any]:
    body: dict[str, Any] = {"user_id": result.user_id, "home_server": server_name}
    if result.access_token is not None:
        body["access_token"] = result.access_token
        body["device_id"] = result.device_id
    return body


def account_routes(accounts: Accounts) -> list[Route]:
    server_name = accounts.server_name

    async def versions(request: web.Request) -> web.Response:
        return json_response(
            {
                "versions": SUPPORTED_VERSIONS,
                # Simplified sliding sync (MSC4186), served by client/sliding_sync.py.
                # Authenticated media (MSC3916), the flag Synapse sets for it.
                "unstable_features": {
                    "org.matrix.simplified_msc3575": True,
                    "org.matrix.msc3916.stable": True,
                },
            }
        )

    async def capabilities(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response(
            {
                "capabilities": {
                    "m.room_versions": {
                        "default": DEFAULT_ROOM_VERSION.identifier,
                        "available": {v: "stable" for v in KNOWN_ROOM_VERSIONS},
                    },
                    "m.change_password": {"enabled": True},
                    "m.set_displayname": {"enabled": True},
                    "m.set_avatar_url": {"enabled": True},
                    "m.3pid_changes": {"enabled": False},
                }
            }
        )

    async def login_flows(request: web.Request) -> web.Response:
        return json_response({"flows": [{"type": "m.login.password"}]})

    async def login(request: web.Request) -> web.Response:
        body = await read_json(request)
        if required(body, "type", str) != "m.login.password":
            raise BadRequestError("only m.login.password is supported")
        identifier = optional(body, "identifier", dict)
        if identifier is not None:
            if optional(identifier, "type", str) != "m.id.user":
                raise BadRequestError("only m.id.user identifiers are supported")
            user = required(identifier, "user", str)
        else:
            user = required(body, "user", str)  # the deprecated top-level form
        result = await accounts.login_with_password(
            user,
            required(body, "password", str),
            device_id=optional(body, "device_id", str),
            display_name=optional(body, "initial_device_display_name", str),
        )
        return json_response(_login_body(result, server_name))

    async def register(request: web.Request) -> web.Response:
        body = await read_json(request)
        kind = request.query.get("kind", "user")
        if kind not in ("user", "guest"):
            raise InvalidParamError("kind must be user or guest")
        result = await accounts.register(
            optional(body, "username", str),
            optional(body, "password", str),
            auth=optional(body, "auth", dict),
            device_id=optional(body, "device_id", str),
            display_name=optional(body, "initial_device_display_name", str),
            inhibit_login=optional(body, "inhibit_login", bool, False),
            guest=kind == "guest",
            guest_access_token=optional(body, "guest_access_token", str),
        )
        return json_response(_login_body(result, server_name))

    async def register_available(request: web.Request) -> web.Response:
        username = request.query.get("username")
        if not username:
            raise MissingParamError("missing username")
        return json_response({"available": await accounts.is_available(username)})

    async def logout(request: web.Request) -> web.Response:
        await accounts.logout(await authenticate(accounts, request))
        return json_response({})

    async def logout_all(request: web.Request) -> web.Response:
        await accounts.logout_all(await authenticate(accounts, request))
        return json_response({})

    async def whoami(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        return json_response(
            {
                "user_id": requester.user_id,
                "device_id": requester.device_id,
                "is_guest": requester.is_guest,
            }
        )

    return [
        Route("GET", "/_matrix/client/versions", versions, absolute=True),
        Route("GET", "/capabilities", capabilities),
        Route("GET", "/login", login_flows),
        Route("POST", "/login", login),
        Route("POST", "/register", register),
        Route("GET", "/register/available", register_available),
        Route("POST", "/logout", logout),
        Route("POST", "/logout/all", logout_all),
        Route("GET", "/account/whoami", whoami),
    ]
