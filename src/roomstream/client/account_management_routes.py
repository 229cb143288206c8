"""Handlers for account management and the start-up calls clients make: the client
``.well-known``, ``/account/password``, ``/account/deactivate``, ``/account/3pid/...``,
``/voip/turnServer`` and ``/thirdparty/...``.

3PIDs (email addresses, phone numbers) and identity servers are not supported: the 3PID
endpoints answer as Synapse answers them with no email or SMS sending and no identity
server configured, so clients show "not supported" rather than log errors. The same for
TURN (``{}``) and third-party networks (no application services: nothing).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.account_management import AccountManagement
from roomstream.client.request import access_token, json_response, optional, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.errors import (
    BadJsonError,
    BadRequestError,
    InvalidParamError,
    MissingParamError,
    NotFoundError,
    ThreepidAuthFailedError,
    ThreepidMediumNotSupportedError,
)

__all__ = ["account_management_routes"]

#: Longest password accepted as ``new_password`` (as at registration, and Synapse).
MAX_PASSWORD_LENGTH = 512
_MEDIA = ("email", "msisdn")


def _threepid(body: dict[str, Any]) -> None:
    """A 3PID named in a body (``medium``, ``address``; ``id_server`` optional), checked
    as Synapse's body model does (400 for what is missing or malformed)."""
    required(body, "address", str)
    if required(body, "medium", str) not in _MEDIA:
        raise InvalidParamError("medium must be email or msisdn")
    optional(body, "id_server", str)


def account_management_routes(
    accounts: Accounts, management: AccountManagement, base_url: str
) -> list[Route]:
    """``base_url``: the Client-Server API's public URL (``Config.client_base_url``)."""

    async def well_known_client(request: web.Request) -> web.Response:
        return json_response({"m.homeserver": {"base_url": base_url}})

    async def change_password(request: web.Request) -> web.Response:
        body = await read_json(request)
        new_password = optional(body, "new_password", str)
        logout_devices = optional(body, "logout_devices", bool, True)
        auth = optional(body, "auth", dict)
        requester = await authenticate(accounts, request)
        token = access_token(request)
        assert token is not None  # authenticate found it
        await accounts.change_password(
            requester, token, new_password, auth, logout_devices=logout_devices
        )
        return json_response({})

    async def deactivate(request: web.Request) -> web.Response:
        body = await read_json(request)
        auth = optional(body, "auth", dict)
        optional(body, "id_server", str)
        optional(body, "erase", bool)
        requester = await authenticate(accounts, request)
        await accounts.require_password_auth(requester.user_id, auth)
        await management.deactivate(requester)
        # No identity server was ever told of the account's 3PIDs (there are none).
        return json_response({"id_server_unbind_result": "no-support"})

    async def threepids(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response({"threepids": []})

    async def threepid_add_deprecated(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        body = await read_json(request)
        creds = body.get("three_pid_creds") or body.get("threePidCreds")
        if creds is None:
            raise MissingParamError("missing three_pid_creds")
        if not isinstance(creds, dict):
            raise BadJsonError("three_pid_creds must be an object")
        required(creds, "client_secret", str)
        required(creds, "sid", str)
        raise ThreepidAuthFailedError("no validated 3pid session found")

    async def threepid_add(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        required(body, "client_secret", str)
        required(body, "sid", str)
        await accounts.require_password_auth(requester.user_id, optional(body, "auth", dict))
        raise ThreepidAuthFailedError("no validated 3pid session found")

    async def threepid_bind(request: web.Request) -> web.Response:
        body = await read_json(request)
        for name in ("client_secret", "id_access_token", "id_server", "sid"):
            required(body, name, str)
        await authenticate(accounts, request)
        # Synapse would ask the identity server; roomstream talks to none.
        raise ThreepidAuthFailedError(
            "no validated 3pid session found: identity servers are not supported"
        )

    async def threepid_unbind(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        _threepid(await read_json(request))
        return json_response({"id_server_unbind_result": "no-support"})

    async def threepid_delete(request: web.Request) -> web.Response:
        body = await read_json(request)
        _threepid(body)
        await authenticate(accounts, request)
        return json_response({"id_server_unbind_result": "no-support"})

    async def threepid_email_token(request: web.Request) -> web.Response:
        await read_json(request)
        raise ThreepidMediumNotSupportedError(
            "adding an email to your account is disabled on this server"
        )

    async def threepid_msisdn_token(request: web.Request) -> web.Response:
        await read_json(request)
        raise ThreepidMediumNotSupportedError(
            "adding phone numbers to user account is not supported by this homeserver"
        )

    async def password_email_token(request: web.Request) -> web.Response:
        await read_json(request)
        raise BadRequestError("email-based password resets have been disabled on this server")

    async def turn_server(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response({})  # no TURN server configured, as Synapse answers then

    async def protocols(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response({})  # no application services, so no third-party networks

    async def protocol(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        raise NotFoundError("unknown protocol")

    async def thirdparty_lookup(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response([])

    return [
        Route("GET", "/.well-known/matrix/client", well_known_client, absolute=True),
        Route("POST", "/account/password", change_password),
        Route("POST", "/account/deactivate", deactivate),
        Route("GET", "/account/3pid", threepids),
        Route("POST", "/account/3pid", threepid_add_deprecated),
        Route("POST", "/account/3pid/add", threepid_add),
        Route("POST", "/account/3pid/bind", threepid_bind),
        Route("POST", "/account/3pid/unbind", threepid_unbind),
        Route("POST", "/account/3pid/delete", threepid_delete),
        Route("POST", "/account/3pid/email/requestToken", threepid_email_token),
        Route("POST", "/account/3pid/msisdn/requestToken", threepid_msisdn_token),
        Route("POST", "/account/password/email/requestToken", password_email_token),
        Route("GET", "/voip/turnServer", turn_server),
        Route("GET", "/thirdparty/protocols", protocols),
        Route("GET", "/thirdparty/protocol/{protocol}", protocol),
        Route("GET", "/thirdparty/user", thirdparty_lookup),
        Route("GET", "/thirdparty/user/{protocol}", thirdparty_lookup),
        Route("GET", "/thirdparty/location", thirdparty_lookup),
        Route("GET", "/thirdparty/location/{protocol}", thirdparty_lookup),
    ]
