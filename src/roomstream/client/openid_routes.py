"""OpenID: ``POST /user/{userId}/openid/request_token`` (a token a third party can check
with us) and the server-side ``GET /_matrix/federation/v1/openid/userinfo``
(:class:`~roomstream.accounts.openid.OpenIdTokens`).

The userinfo endpoint is a federation endpoint (Synapse serves it on its federation
resource); roomstream has no federation listener yet, so it is served here, on the
client listener, at its federation path.
"""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.accounts.openid import OpenIdTokens
from roomstream.client.request import json_response, read_json
from roomstream.client.server import Route, authenticate
from roomstream.errors import (
    ForbiddenError,
    MissingTokenError,
    UnknownTokenError,
)

__all__ = ["USERINFO_PATH", "openid_routes"]

USERINFO_PATH = "/_matrix/federation/v1/openid/userinfo"
#: Longer tokens than this were never issued (ours are 43 characters).
MAX_TOKEN_LENGTH = 256


def openid_routes(accounts: Accounts, openid: OpenIdTokens) -> list[Route]:
    async def request_token(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        await read_json(request)
        if request.match_info["user_id"] != requester.user_id:
            raise ForbiddenError("Cannot request tokens for other users")
        token = await openid.issue(requester.user_id)
        return json_response(
            {
                "access_token": token.access_token,
                "token_type": "Bearer",
                "matrix_server_name": accounts.server_name,
                "expires_in": token.expires_in_s,
            }
        )

    async def userinfo(request: web.Request) -> web.Response:
        token = request.query.get("access_token")
        if not token:
            raise MissingTokenError("Missing access token")
        user_id = await openid.user_for(token) if len(token) <= MAX_TOKEN_LENGTH else None
        if user_id is None:
            raise UnknownTokenError("Access token unknown or expired")
        return json_response({"sub": user_id})

    return [
        Route("POST", "/user/{user_id}/openid/request_token", request_token),
        Route("GET", USERINFO_PATH, userinfo, absolute=True),
    ]
