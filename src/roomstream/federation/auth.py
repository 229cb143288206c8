"""Inbound federation request authentication (the ``Authenticate`` of the routes).

A request is accepted from ``origin`` only if every ``Authorization: X-Matrix`` header it
carries parses (:func:`~roomstream.federation.xmatrix.parse`), names the same origin and
either no destination or this server, and carries a signature that verifies with the
origin's key of that ID valid now (fetched through the keyring when not known), over
the method, the request target exactly as received (``request.raw_path``: path and query),
the origin, this server's name and the JSON body (absent for an empty one). Anything else
is :class:`~roomstream.errors.FederationUnauthorizedError` (401 ``M_UNAUTHORIZED``); a
body that is not JSON is 400 ``M_NOT_JSON``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from roomstream.errors import FederationUnauthorizedError, NotJsonError
from roomstream.federation import xmatrix
from roomstream.federation.keyring import Keyring

__all__ = ["Authenticate", "make_authenticator"]

Authenticate = Callable[[web.Request, bytes | None], Awaitable[str]]
"""Checks a request's X-Matrix authorization (with its raw body); the origin server."""


def make_authenticator(
    server_name: str, keyring: Keyring, clock: Callable[[], float] = time.time
) -> Authenticate:
    """The :data:`Authenticate` of this server (``server_name``), keys from ``keyring``."""

    async def authenticate(request: web.Request, body: bytes | None) -> str:
        headers = [
            h
            for h in request.headers.getall("Authorization", [])
            if h[: len(xmatrix.SCHEME)].lower() == xmatrix.SCHEME.lower()
        ]
        if not headers:
            raise FederationUnauthorizedError("missing X-Matrix authorization")
        content = None
        if body is not None and body.strip():
            try:
                content = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise NotJsonError(f"content not JSON: {exc}") from None
        origin: str | None = None
        now_ms = int(clock() * 1000)
        for header in headers:
            try:
                auth = xmatrix.parse(header)
            except xmatrix.MalformedXMatrixError as exc:
                raise FederationUnauthorizedError(
                    f"malformed X-Matrix authorization: {exc}"
                ) from None
            if origin is not None and auth.origin != origin:
                raise FederationUnauthorizedError("X-Matrix authorizations of different origins")
            origin = auth.origin
            if auth.destination is not None and auth.destination != server_name:
                raise FederationUnauthorizedError(
                    f"request for {auth.destination!r}, this is {server_name!r}"
                )
            key = await keyring.verify_key_at(auth.origin, auth.key_id, now_ms)
            if key is None:
                raise FederationUnauthorizedError(
                    f"no key {auth.key_id} of {auth.origin} valid now is known or could be fetched"
                )
            if not xmatrix.verify_request(
                auth, request.method, request.raw_path, server_name, content, key
            ):
                raise FederationUnauthorizedError(
                    f"the signature of {auth.origin} ({auth.key_id}) does not verify"
                )
        assert origin is not None
        return origin

    return authenticate
