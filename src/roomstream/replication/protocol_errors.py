"""Matrix JSON for the errors aiohttp answers before any roomstream code runs.

aiohttp's HTTP parser refuses some requests itself (a request line or header longer than
8,190 bytes, raw non-ASCII bytes in the path or a header, too many headers, not HTTP at
all) and answers them from ``RequestHandler.handle_error`` with a plain-text ``400``,
outside every middleware. Clients expect Matrix JSON from every answer, so
:class:`JsonErrorAppRunner` serves an application with a request handler whose
``handle_error`` keeps aiohttp's status, logging and connection handling (the
connection is closed after the answer) and only replaces the body:

- ``LineTooLong`` (request line or a header over the limit) -> ``M_TOO_LARGE``;
- any other parser refusal -> ``M_UNRECOGNIZED``;
- a 5xx (a handler failing outside the error middleware, a handler timeout) ->
  ``M_UNKNOWN``.

aiohttp has no public hook for this: the runner overrides ``AppRunner._make_server`` and
builds the same :class:`aiohttp.web.Server` with a :class:`RequestHandler` subclass.
``tests/client/test_protocol_errors_json.py`` pins the behaviour, so an aiohttp
upgrade that changes those internals fails there.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from roomstream.errors import Codes, MatrixError

__all__ = ["JsonErrorAppRunner", "protocol_error"]


def protocol_error(status: int, exc: BaseException | None) -> MatrixError:
    """The Matrix error for aiohttp's own refusal ``status`` caused by ``exc``."""
    if status >= 500:
        return MatrixError(status, Codes.UNKNOWN, "internal error")
    if isinstance(exc, LineTooLong):
        return MatrixError(status, Codes.TOO_LARGE, "request line or header too long")
    if isinstance(exc, HttpProcessingError):
        return MatrixError(status, Codes.UNRECOGNIZED, "malformed HTTP request")
    return MatrixError(status, Codes.UNRECOGNIZED, "bad request")


class _JsonErrorRequestHandler(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own handling first: it logs, and raises if a response has started.
        super().handle_error(request, status, exc, message)
        error = protocol_error(status, exc)
        answer = web.Response(
            body=orjson.dumps(error.to_json()), status=status, content_type="application/json"
        )
        answer.force_close()
        return answer


class _JsonErrorServer(web.Server):
    """aiohttp's low-level server, its connections handled by the handler above."""

    def __call__(self) -> RequestHandler:
        return _JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser refusals with Matrix JSON."""

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # the app's startup, as AppRunner does it
        kwargs: dict[str, Any] = dict(plain._kwargs)
        return _JsonErrorServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **kwargs,
        )
