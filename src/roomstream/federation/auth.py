"""Inbound federation request authentication (the ``Authenticate`` of the routes).

A request is accepted from ``origin`` only if every ``Authorization: X-Matrix`` header it
carries parses (:func:`~roomstream.federation.xmatrix.parse`), names the same origin and
either no destination or this server, and carries a signature that verifies with the
origin's key of that ID valid now (fetched through the keyring when not known), over
the method, the request target exactly as received (``request.raw_path``: path and query),
the origin, this server's name and the JSON body (absent for an empty one). Anything else
is :class:`~roomstream.errors.FederationUnauthorizedError` (401 ``M_UNAUTHORIZED``); a
body that is not JSON is 400 ``M_NOT_JSON``.

Per-origin rate limit (:class:`OriginRateLimiter`, a token bucket per origin with the time
passed in): counted only once a request is authenticated, so that nobody can spend
another server's allowance by forging its name; a request over the limit is 429
``M_LIMIT_EXCEEDED`` with ``retry_after_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from roomstream.errors import FederationUnauthorizedError, LimitExceededError, NotJsonError
from roomstream.federation import xmatrix
from roomstream.federation.keyring import Keyring

__all__ = ["Authenticate", "OriginRateLimiter", "make_authenticator"]

Authenticate = Callable[[web.Request, bytes | None], Awaitable[str]]
"""Checks a request's X-Matrix authorization (with its raw body); the origin server."""


class OriginRateLimiter:
    """A token bucket per origin: ``burst`` requests at once, refilled at ``per_second``.

    Invariants: an origin's tokens stay in [0, burst]; over any interval of length ``t``
    an origin gets at most ``burst + per_second * t`` requests through. Buckets that are
    full again are forgotten once more than :attr:`MAX_TRACKED` origins are tracked."""

    MAX_TRACKED = 10_000

    def __init__(self, per_second: float, burst: int) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("a rate limit needs per_second > 0 and burst >= 1")
        self.per_second = per_second
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}  # origin -> (tokens, at)

    def _tokens(self, origin: str, now: float) -> float:
        tokens, at = self._buckets.get(origin, (float(self.burst), now))
        return min(float(self.burst), tokens + max(0.0, now - at) * self.per_second)

    def take(self, origin: str, now: float) -> float | None:
        """Spend one request of ``origin`` at ``now`` (seconds): None if allowed, else the
        seconds until one would be."""
        tokens = self._tokens(origin, now)
        if tokens < 1.0:
            self._buckets[origin] = (tokens, now)
            return (1.0 - tokens) / self.per_second
        self._buckets[origin] = (tokens - 1.0, now)
        if len(self._buckets) > self.MAX_TRACKED:
            full = [o for o in self._buckets if self._tokens(o, now) >= self.burst]
            for idle in full:
                del self._buckets[idle]
        return None


def make_authenticator(
    server_name: str,
    keyring: Keyring,
    clock: Callable[[], float] = time.time,
    *,
    limiter: OriginRateLimiter | None = None,
) -> Authenticate:
    """The :data:`Authenticate` of this server (``server_name``), keys from ``keyring``,
    each origin held to ``limiter`` (none: no limit)."""

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
        if limiter is not None:
            wait = limiter.take(origin, clock())
            if wait is not None:
                raise LimitExceededError(
                    f"too many requests from {origin}", retry_after_ms=int(wait * 1000) + 1
                )
        return origin

    return authenticate
