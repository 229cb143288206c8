"""``GET``/``PUT /presence/{userId}/status`` (answers as Synapse's
``PresenceStatusRestServlet``): anyone may read the presence of a user they share a room
with (and their own; 403 otherwise); only the user sets theirs."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts
from roomstream.client.presence import PRESENCE_STATES
from roomstream.client.presence_service import PresenceService
from roomstream.client.request import json_response, read_json, required
from roomstream.client.server import Route, authenticate
from roomstream.errors import BadJsonError, ForbiddenError, InvalidParamError
from roomstream.grammar import is_user_id

__all__ = ["MAX_STATUS_MSG_LENGTH", "presence_routes"]

#: Longest status message kept (characters); longer is 400 (Synapse has no bound; one
#: is needed so a row stays a sane replication line).
MAX_STATUS_MSG_LENGTH = 2048


def _user_in_path(request: web.Request) -> str:
    user_id = request.match_info["user_id"]
    if not is_user_id(user_id):
        raise InvalidParamError(f"not a user ID: {user_id[:300]!r}")
    return user_id


def presence_routes(accounts: Accounts, presence: PresenceService) -> list[Route]:
    async def get_status(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _user_in_path(request)
        return json_response(await presence.status(requester.user_id, user_id))

    async def put_status(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = _user_in_path(request)
        if user_id != requester.user_id:
            raise ForbiddenError("Can only set your own presence state")
        body = await read_json(request)
        state = required(body, "presence", str)
        if state not in PRESENCE_STATES:
            raise InvalidParamError("presence must be online, unavailable or offline")
        status_msg = body.get("status_msg")
        if status_msg is not None and not isinstance(status_msg, str):
            raise BadJsonError("status_msg must be a string.")
        if status_msg is not None and len(status_msg) > MAX_STATUS_MSG_LENGTH:
            raise InvalidParamError(f"status_msg is longer than {MAX_STATUS_MSG_LENGTH}")
        unknown = sorted(set(body) - {"presence", "status_msg"})
        if unknown:
            raise BadJsonError(f"Unable to parse state: unknown keys {unknown[:5]}")
        await presence.set_status(user_id, requester.device_id, state, status_msg or None)
        return json_response({})

    return [
        Route("GET", "/presence/{user_id}/status", get_status),
        Route("PUT", "/presence/{user_id}/status", put_status),
    ]
