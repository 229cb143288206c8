"""An aiohttp listener that bounds what one connection may cost the server.

:class:`GuardedAppRunner` is ``web.AppRunner`` whose connections are served by
:class:`GuardedRequestHandler`, which adds to aiohttp's own limits (a request line or a
header field over 8,190 bytes, 128 header fields, the application's body size):

- **per-address cap**: a connection from an address that already holds
  ``max_connections_per_address`` open connections is closed as soon as it is accepted,
  before anything is read from it; the others are unaffected;
- **header timeout**: once the first byte of a request has arrived, its request line and
  headers must be complete within ``header_timeout`` seconds, or the connection is closed
  (a slowloris client dribbling headers);
- **body timeout**: a request whose headers declare a body must deliver all of it within
  ``body_timeout`` seconds of its headers (``upload_timeout`` for media uploads, under
  ``/_matrix/media/``), or the connection is closed (the handler waiting for it sees the
  connection lost);
- **idle timeout**: a connection with no request in flight is closed after
  ``idle_timeout`` seconds (aiohttp's keep-alive timeout; it also bounds a connection
  that never sends a byte);
- **Matrix JSON for aiohttp's own refusals**: the parser answers some requests itself
  (a request line or header over 8,190 bytes, raw non-ASCII bytes in the path or a header
  name, too many headers, not HTTP), outside every middleware, with a plain-text 400;
  here the status and the connection's closing stay aiohttp's and the body becomes a
  Matrix error (:func:`protocol_error`): ``LineTooLong`` is ``M_TOO_LARGE``, any other
  parser refusal ``M_UNRECOGNIZED``, a 5xx ``M_UNKNOWN``. aiohttp has no public hook for
  this (``_make_server`` and ``handle_error`` are overridden);
  ``tests/client/test_protocol_errors_json.py`` pins it, so an aiohttp upgrade that
  changes those internals fails there;
- **compact parse errors**: aiohttp's parser puts the whole offending line, as ``repr``
  of up to 256 KiB received at once, in the error's message (about 1 MB of text), the
  400 answer repeats it, and the exception's traceback holds the received chunk in a
  reference cycle that only the cyclic garbage collector frees. Garbage on the port
  therefore cost about 1.5 MB per connection, freed late or never returned to the
  system. Here the message is cut to :data:`MAX_ERROR_MESSAGE` characters, the traceback
  dropped (no cycle: freed by reference counting when the connection ends), and nothing
  more is parsed on a connection once a request on it has failed to parse.

Invariant: a connection holds at most one parser error, whose message is at most
:data:`MAX_ERROR_MESSAGE` characters; every timer is cancelled when its connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest

from roomstream.config import HttpConfig
from roomstream.errors import Codes, MatrixError

__all__ = [
    "MAX_ERROR_MESSAGE",
    "ClientProtocolErrorFilter",
    "GuardedAppRunner",
    "GuardedRequestHandler",
    "GuardedServer",
    "HttpListener",
    "protocol_error",
    "quiet_client_protocol_errors",
]

#: Seconds a stopping listener lets requests in flight finish before cancelling them.
#: aiohttp's default is 60 s, and a ``/sync`` long poll waits up to its timeout: a
#: process told to stop would otherwise hang on its idle clients' polls. Cancelled polls
#: lose nothing (a client retries from the token it has).
SHUTDOWN_GRACE = 2.0
#: Requests under this path are media uploads (HttpConfig.upload_timeout for their body).
UPLOAD_PATH_PREFIX = "/_matrix/media/"
#: Characters of a parser error's message kept (the rest is the received garbage).
MAX_ERROR_MESSAGE = 200


def protocol_error(status: int, exc: BaseException | None) -> MatrixError:
    """The Matrix error for aiohttp's own refusal ``status`` caused by ``exc``."""
    if status >= 500:
        return MatrixError(status, Codes.UNKNOWN, "internal error")
    if isinstance(exc, LineTooLong):
        return MatrixError(status, Codes.TOO_LARGE, "request line or header too long")
    if isinstance(exc, HttpProcessingError):
        return MatrixError(status, Codes.UNRECOGNIZED, "malformed HTTP request")
    return MatrixError(status, Codes.UNRECOGNIZED, "bad request")


def _compact(error: _ErrInfo) -> _ErrInfo:
    """``error`` without its traceback (which holds the received chunk in a cycle) and
    with its message cut to :data:`MAX_ERROR_MESSAGE` characters."""
    exc = error.exc
    exc.__traceback__ = None
    exc.__context__ = None
    message = error.message[:MAX_ERROR_MESSAGE]
    if isinstance(exc, HttpProcessingError):
        exc.message = exc.message[:MAX_ERROR_MESSAGE]
        exc.args = (exc.message,)
    return _ErrInfo(status=error.status, exc=exc, message=message)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with the limits of :class:`HttpConfig` (module doc)."""

    def __init__(self, manager: GuardedServer, *, limits: HttpConfig, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._guard = manager
        self._address: str | None = None
        self._refused = False
        self._parse_failed = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None

    # -- connection life ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if not self._guard.admit(address):
            # Refused before aiohttp knows of it: connection_lost must not report it.
            self._refused = True
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            return
        self._address = address
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._cancel_timers()
        self._body = None
        if self._address is not None:
            self._guard.release(self._address)
            self._address = None
        super().connection_lost(exc)

    # -- reading ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._parse_failed:
            return  # the connection closes after its 400; parsing more only costs memory
        count = self._request_count
        queued = len(self._messages)
        super().data_received(data)
        if len(self._messages) > queued and isinstance(self._messages[-1][0], _ErrInfo):
            self._parse_failed = True
            error, payload = self._messages.pop()
            assert isinstance(error, _ErrInfo)
            self._messages.append((_compact(error), payload))
            self._cancel_timers()
            return
        if self._body is not None and self._body.is_eof():
            self._cancel_body_timer()
        if self._request_count != count:
            # Headers of (at least) one request complete. Bytes of a further request in
            # the same chunk are bounded by the idle timeout, not the header timeout.
            self._cancel_header_timer()
            self._cancel_body_timer()
            if len(self._messages) > queued:
                message, payload = self._messages[-1]
                if isinstance(payload, StreamReader) and not payload.is_eof():
                    self._body = payload
                    self._body_timer = self._loop.call_later(
                        self._body_timeout(message), self._timed_out
                    )
        elif data and self._body_timer is None and self._header_timer is None:
            self._header_timer = self._loop.call_later(self._limits.header_timeout, self._timed_out)

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

    def _body_timeout(self, message: Any) -> float:
        """Seconds the body of ``message`` may take: media uploads (streamed to disk, up
        to the media section's size limit) have ``upload_timeout``, others
        ``body_timeout``."""
        path = getattr(message, "path", "")
        if isinstance(path, str) and path.startswith(UPLOAD_PATH_PREFIX):
            return self._limits.upload_timeout
        return self._limits.body_timeout

    def _timed_out(self) -> None:
        self._header_timer = self._body_timer = None
        self.force_close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()


class GuardedServer(web.Server):
    """aiohttp's protocol factory, making :class:`GuardedRequestHandler` connections and
    counting them per client address."""

    def __init__(self, *args: Any, limits: HttpConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        #: Open connections per client address (an address with none is absent).
        self.per_address: Counter[str] = Counter()

    def admit(self, address: str | None) -> bool:
        """Count a new connection from ``address``; False (and not counted) when the
        address is at its cap. A connection without an address (a Unix socket) is
        always admitted and not counted."""
        if address is None:
            return True
        if self.per_address[address] >= self.limits.max_connections_per_address:
            return False
        self.per_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.per_address[address] -= 1
        if self.per_address[address] <= 0:
            del self.per_address[address]

    def __call__(self) -> GuardedRequestHandler:
        return GuardedRequestHandler(self, limits=self.limits, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` serving ``app`` through :class:`GuardedServer` with ``limits``
    (``idle_timeout`` is aiohttp's keep-alive timeout)."""

    def __init__(self, app: web.Application, limits: HttpConfig, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", limits.idle_timeout)
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return GuardedServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            limits=self._limits,
            **plain._kwargs,
        )


class ClientProtocolErrorFilter(logging.Filter):
    """Drops aiohttp's log records for requests its HTTP parser refused (a bad method,
    a malformed request line or header): aiohttp has already answered them ``400``, before
    any roomstream code ran, so a traceback per garbage request would only let one bad
    client flood the log. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


_PROTOCOL_ERROR_FILTER = ClientProtocolErrorFilter()


def quiet_client_protocol_errors() -> None:
    """Install :class:`ClientProtocolErrorFilter` on aiohttp's server logger (idempotent)."""
    server_logger = logging.getLogger("aiohttp.server")
    if _PROTOCOL_ERROR_FILTER not in server_logger.filters:
        server_logger.addFilter(_PROTOCOL_ERROR_FILTER)


class HttpListener:
    """One aiohttp application on one TCP port (``start``: 0 picks a free one), with the
    connection limits of ``limits`` (timeouts, a per-address cap) and aiohttp's own
    refusals answered as Matrix JSON (above); over TLS when given an ``ssl_context``."""

    def __init__(
        self, app: web.Application, limits: HttpConfig, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.app = app
        self.limits = limits
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the port actually bound."""
        quiet_client_protocol_errors()
        self._runner = GuardedAppRunner(
            self.app, self.limits, access_log=None, shutdown_timeout=SHUTDOWN_GRACE
        )
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, ssl_context=self.ssl_context)
        await self._site.start()
        server = self._site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
