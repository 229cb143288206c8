"""What both HTTP APIs share: Matrix JSON in and out, errors mapped in one place, bearer
authentication.

roomstream serves two HTTP APIs, the Matrix Client-Server API (:mod:`roomstream.client`)
and the internal API between its processes (:mod:`roomstream.replication.http`); this
module is below both, so neither reaches into the other for its plumbing:

- :func:`matrix_error_middleware`: the one place that turns exceptions into answers.
  Library code raises :class:`~roomstream.errors.MatrixError` (or a named subclass);
  handlers never build error answers themselves. Invariant: no request is answered with
  a bare (non-JSON) error, and an unexpected exception is logged and answered 500
  ``M_UNKNOWN`` as JSON;
- :func:`read_json` / :func:`parse_json_object`: request bodies (and JSON in query
  parameters) as JSON objects, nesting bounded at parse time;
- :func:`json_response` and :func:`exact_json_content_type`: answers say
  ``Content-Type: application/json`` exactly;
- :func:`bearer_auth_middleware`: a shared secret in ``Authorization: Bearer``, compared
  in constant time.

The listeners themselves (connection limits, aiohttp's own refusals as JSON) are
:mod:`roomstream.listener`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from roomstream import exactjson
from roomstream.errors import (
    BadJsonError,
    BadRequestError,
    Codes,
    InternalServerError,
    MatrixError,
    NotJsonError,
    UnauthorizedError,
)
from roomstream.events.canonical import MAX_NESTING_DEPTH
from roomstream.metrics import HTTP_REQUESTS

__all__ = [
    "JSON_CONTENT_TYPE",
    "Handler",
    "bearer_auth_middleware",
    "error_response",
    "exact_json_content_type",
    "http_metrics_middleware",
    "json_response",
    "matrix_error_middleware",
    "parse_json_object",
    "read_json",
]

logger = logging.getLogger(__name__)


def json_response(body: Any, status: int = 200) -> web.Response:
    """``body`` as a JSON answer (``Content-Type: application/json``)."""
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON_CONTENT_TYPE)


def error_response(exc: MatrixError) -> web.Response:
    """The JSON answer for ``exc``, with ``Retry-After`` when it says when to retry."""
    headers = None
    if exc.retry_after_ms is not None:
        headers = {"Retry-After": str(max(1, -(-exc.retry_after_ms // 1000)))}
    return web.Response(
        body=orjson.dumps(exc.to_json()),
        status=exc.http_status,
        headers=headers,
        content_type=JSON_CONTENT_TYPE,
    )


#: The Content-Type of every JSON answer, exactly (Synapse's; some clients compare it).
JSON_CONTENT_TYPE = "application/json"


async def exact_json_content_type(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: a JSON answer says ``application/json`` and nothing
    more. aiohttp adds ``; charset=utf-8`` to any text body (``web.json_response``);
    JSON is UTF-8 by definition (RFC 8259), so the parameter says nothing, and clients
    that compare the header exactly reject it. One hook, so no answer can escape it."""
    if response.content_type == JSON_CONTENT_TYPE and response.charset is not None:
        response.headers["Content-Type"] = JSON_CONTENT_TYPE


#: aiohttp's own refusals (routing, body size), as Matrix errors.
_HTTP_EXCEPTION_CODES = {
    404: (Codes.UNRECOGNIZED, "unrecognized request"),
    405: (Codes.UNRECOGNIZED, "method not allowed"),
    413: (Codes.TOO_LARGE, "request body too large"),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, for every roomstream HTTP API; an empty body is
    ``{}`` (clients send none for some POSTs). Refusals are 400 ``M_NOT_JSON`` or
    ``M_BAD_JSON`` (not an object, or nested too deep: :func:`parse_json_object`)."""
    try:
        raw = await request.read()
    except ConnectionResetError:
        raise BadRequestError("the client went away") from None
    if not raw.strip():
        return {}
    return parse_json_object(raw, "content")


def parse_json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    """``raw`` as a JSON object (a body, or JSON in a query parameter: ``what``).

    Nesting is bounded here, once, for everything a request may carry (the bound of event
    content, :data:`~roomstream.events.canonical.MAX_NESTING_DEPTH`): orjson decodes 1,024
    levels but encodes only 255, so deeper data accepted would fail whenever it is
    served again."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise NotJsonError(f"{what} not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadJsonError(f"the {what} must be a JSON object")
    if exactjson.nested_deeper_than(body, MAX_NESTING_DEPTH):
        raise BadJsonError(f"{what} nested deeper than {MAX_NESTING_DEPTH} levels")
    return body


@web.middleware
async def matrix_error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place that turns exceptions into HTTP answers (Matrix JSON errors).

    ``MatrixError`` -> its status and errcode; aiohttp's HTTP errors (no route, wrong
    method, body too large, ...) -> the same status with a Matrix errcode; anything else
    is a bug: logged with its traceback and answered 500 ``M_UNKNOWN``, still as JSON.
    Put it outermost but for middlewares that only observe (metrics), so that every
    other middleware's errors are mapped too.
    """
    try:
        return await handler(request)
    except MatrixError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        errcode, message = _HTTP_EXCEPTION_CODES.get(exc.status, (Codes.UNKNOWN, exc.reason))
        return error_response(MatrixError(exc.status, errcode, message))
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("internal error answering %s %s", request.method, request.path)
        return error_response(InternalServerError("internal error"))


def bearer_auth_middleware(secret: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse (401 ``M_UNAUTHORIZED``) every request without ``Authorization: Bearer
    <secret>``, compared in constant time. An empty secret would let anyone in: refused."""
    if not secret:
        raise ValueError("the internal API needs a non-empty secret")
    expected = secret.encode()

    @web.middleware
    async def bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(errors="surrogateescape"), expected):
            raise UnauthorizedError("missing or wrong bearer token")
        return await handler(request)

    return bearer_auth


def _route(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.http_exception is None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def http_metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Count every request by route template and the status it was answered with.

    Put it first (outermost), so it sees what the inner middlewares turned errors into.
    """
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUESTS.labels(method, _route(request), str(status)).inc()


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
