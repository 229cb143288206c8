"""The Client-Server API on an aiohttp application: routes, errors, CORS, authentication.

:class:`ClientApi` adds its routes and one middleware to an application (in roomstream, the
instance's HTTP listener, beside the internal API). The middleware adds CORS to every
response under ``/_matrix`` and ``/.well-known`` (errors and 404s included: a browser
reads none of them without it) and answers ``OPTIONS`` (preflights) there; failures
become Matrix errors in the one error middleware of roomstream's HTTP servers
(:func:`roomstream.replication.http.matrix_error_middleware`): a ``MatrixError`` becomes
its status and ``errcode``; unknown paths are 404 and known paths with another method
405, both ``M_UNRECOGNIZED``; anything unexpected is logged and answered 500
``M_UNKNOWN`` (never an HTML page).

Guests: :func:`authenticate` refuses a guest's token (403 ``M_GUEST_ACCESS_FORBIDDEN``)
on every route but those :data:`~roomstream.client.guests.GUEST_ROUTES` lists.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from roomstream.accounts import Accounts, Requester
from roomstream.accounts.client_ips import ClientIps
from roomstream.client.guests import GUEST_ROUTES
from roomstream.client.request import access_token, json_response
from roomstream.errors import GuestAccessForbiddenError
from roomstream.httpbase import exact_json_content_type, matrix_error_middleware

__all__ = ["MATRIX_PREFIX", "REQUESTER_KEY", "ClientApi", "Handler", "Route"]

logger = logging.getLogger(__name__)

MATRIX_PREFIX = "/_matrix"
WELL_KNOWN_PREFIX = "/.well-known/"
CLIENT_PREFIX = "/_matrix/client"
#: Path versions served for every endpoint (clients mix r0, v3 and v1 paths).
VERSION_PATTERN = "{api_version:(?:r0|v3|v1|unstable)}"

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, HEAD, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "X-Requested-With, Content-Type, Authorization, Date",
    "Access-Control-Expose-Headers": "Synapse-Trace-Id, Server",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Where :func:`authenticate` leaves the request's :class:`Requester` (for the client IPs).
REQUESTER_KEY = web.RequestKey("roomstream.requester", Requester)
#: Set on requests to a route guests may use (:data:`GUEST_ROUTES`).
GUESTS_ALLOWED_KEY = web.RequestKey("roomstream.guests_allowed", bool)


@dataclass(frozen=True)
class Route:
    method: str
    #: Path after ``/_matrix/client/{version}`` (or the full path when ``absolute``).
    path: str
    handler: Handler
    absolute: bool = False


class ClientApi:
    """Installs the client routes of ``route_groups`` on an application."""

    def __init__(
        self, accounts: Accounts, routes: Sequence[Route], client_ips: ClientIps | None = None
    ) -> None:
        self.accounts = accounts
        self.routes = list(routes)
        self.client_ips = client_ips

    def install(self, app: web.Application) -> None:
        app.middlewares.append(matrix_errors)
        if self.client_ips is not None:
            app.middlewares.append(_client_ip_recorder(self.client_ips))
        if exact_json_content_type not in app.on_response_prepare:
            app.on_response_prepare.append(exact_json_content_type)
        for route in self.routes:
            path = (
                route.path if route.absolute else f"{CLIENT_PREFIX}/{VERSION_PATTERN}{route.path}"
            )
            handler = route.handler
            if (route.method, route.path) in GUEST_ROUTES:
                handler = _open_to_guests(handler)
            app.router.add_route(route.method, path, handler)


def _open_to_guests(handler: Handler) -> Handler:
    async def open_to_guests(request: web.Request) -> web.StreamResponse:
        request[GUESTS_ALLOWED_KEY] = True
        return await handler(request)

    return open_to_guests


async def authenticate(accounts: Accounts, request: web.Request) -> Requester:
    """The request's :class:`Requester`; a guest's only on the routes guests may use
    (403 ``M_GUEST_ACCESS_FORBIDDEN`` elsewhere, as Synapse)."""
    requester = await accounts.authenticate(access_token(request))
    request[REQUESTER_KEY] = requester
    if requester.is_guest and not request.get(GUESTS_ALLOWED_KEY, False):
        raise GuestAccessForbiddenError("guest access not allowed")
    return requester


def _client_ip_recorder(client_ips: ClientIps) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware reporting each authenticated request's device, address and user
    agent to ``client_ips`` (whatever the answer). The address is the peer's: behind a
    reverse proxy, the proxy's (``X-Forwarded-For`` is not trusted)."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            requester = request.get(REQUESTER_KEY)
            if isinstance(requester, Requester):
                client_ips.record(
                    requester.user_id,
                    requester.device_id,
                    request.remote or "",
                    request.headers.get("User-Agent", ""),
                )

    return record


@web.middleware
async def matrix_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CORS for everything under ``/_matrix`` and ``/.well-known`` (preflights answered
    here), errors mapped by the one error middleware
    (:func:`roomstream.replication.http.matrix_error_middleware`) so that error answers,
    404s included, carry the CORS headers too."""
    if not request.path.startswith((MATRIX_PREFIX, WELL_KNOWN_PREFIX)):
        return await handler(request)
    if request.method == "OPTIONS":
        response: web.StreamResponse = json_response({})
    else:
        response = await matrix_error_middleware(request, handler)
    if not response.prepared:
        response.headers.update(CORS_HEADERS)
    return response
