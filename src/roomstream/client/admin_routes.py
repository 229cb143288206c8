"""``GET /admin/whois/{userId}``: where a user's devices were seen from (server admins,
or the user themself, as Synapse allows). The records are
:class:`~roomstream.accounts.client_ips.ClientIps`'."""

from __future__ import annotations

from aiohttp import web

from roomstream.accounts import Accounts, parse_user_id
from roomstream.accounts.client_ips import ClientIps
from roomstream.client.request import json_response
from roomstream.client.server import Route, authenticate
from roomstream.errors import ForbiddenError, InvalidParamError

__all__ = ["admin_routes"]


def admin_routes(accounts: Accounts, client_ips: ClientIps) -> list[Route]:
    async def whois(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        user_id = request.match_info["user_id"]
        _, server = parse_user_id(user_id)
        if user_id != requester.user_id:
            record = await accounts.store.get_user(requester.user_id)
            if record is None or not record.admin:
                raise ForbiddenError("You are not a server admin")
        if server != accounts.server_name:
            raise InvalidParamError("Can only whois a local user")
        devices = await client_ips.connections(user_id)
        body = {
            "user_id": user_id,
            "devices": {
                device_id: {
                    "sessions": [
                        {
                            "connections": [
                                {"ip": c.ip, "last_seen": c.last_seen, "user_agent": c.user_agent}
                                for c in connections
                            ]
                        }
                    ]
                }
                for device_id, connections in sorted(devices.items())
            },
        }
        return json_response(body)

    return [Route("GET", "/admin/whois/{user_id}", whois)]
