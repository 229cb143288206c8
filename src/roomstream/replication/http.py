"""The internal HTTP API between roomstream processes (aiohttp), and its client.

It has a listener of its own, ``internal_port`` (127.0.0.1:9093 by default), apart from
the Client-Server API's ``http_port`` (both assembled by :mod:`roomstream.homeserver`):
the client listener serves nothing under ``/_roomstream`` (404 ``M_UNRECOGNIZED``), so a
reverse proxy in front of it never exposes the internal API.

Routes, under ``/_roomstream/replication``, each declared once as an
:class:`~roomstream.replication.endpoints.InternalEndpoint` (its path, request fields,
answer and stream; :data:`~roomstream.replication.endpoints.INSTANCE_ENDPOINTS` and
:data:`~roomstream.replication.endpoints.CLIENT_WRITES`), registered here from the
declarations and called by :meth:`InternalHttpClient.call`:

- ``GET /health``: liveness and this process's replication status (JSON);
- ``GET /streams/{stream}/updates?writer=&from=&upto=&limit=``: rows of an in-memory
  stream (typing) that this instance writes, with the ``get_updates`` contract; a reader
  that fell behind fetches them here;
- ``POST /rooms/{room_id}/send_event`` with ``{"sender", "type", "content", "state_key"?,
  "redacts"?}``: create and persist an event. The instance that owns the room
  (:mod:`sharding`) persists it; any other instance forwards the request once to the
  owner;
- ``POST /create_room`` with ``{"creator", "name"?}``: create a room on this instance.

Client-Server API writes forwarded by a process that does not write the stream they go
to: ``POST /client/<name>``, one per endpoint of :data:`~roomstream.replication.endpoints.
CLIENT_WRITES` (``create_room``, ``send``, ``end_sessions``, ``account_data``,
``receipt``, ``to_device``, ``typing``, ``e2e_keys``), served when the process binds
handlers to them (:mod:`roomstream.client.forwarded`). The receiving instance must write
that stream itself (else 421, never a second hop); the forwarding process has already
authenticated the user and checked membership.

And ``GET /metrics`` (no prefix): Prometheus metrics (:mod:`roomstream.metrics`), on this
listener too (operational, like ``/health``).

Errors are Matrix-style JSON bodies ``{"errcode": ..., "error": ...}``, produced in one
place, :func:`matrix_error_middleware`, which any aiohttp application of roomstream can
reuse: handlers raise :class:`~roomstream.errors.MatrixError` and never build error
responses themselves (requests aiohttp's parser refuses before any handler runs are
answered as JSON by :mod:`roomstream.listener`, the listener's runner).
Invariant: no request is ever answered with a bare (non-JSON) error,
and no input makes a handler answer 500; an unreachable process answers 503
``M_UNAVAILABLE`` with ``retry_after_ms``, logged once per outage. Every request must
carry ``Authorization: Bearer <secret>`` (compared in constant time; 401 ``M_UNAUTHORIZED``
otherwise), the secret being the configured ``replication.shared_secret`` or the one
generated in the data directory (:mod:`roomstream.replication.secret`): there is no
unauthenticated mode. The listener binds to the instance's host, loopback by default;
configuration validation refuses a non-loopback host without a configured secret.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

from roomstream import exactjson
from roomstream.config import Config
from roomstream.errors import (
    Codes,
    InvalidParamError,
    MatrixError,
    NotFoundError,
    ServiceUnavailableError,
    StreamRowsGoneError,
    WrongWriterError,
)
from roomstream.httpbase import (
    bearer_auth_middleware,
    error_response,
    exact_json_content_type,
    http_metrics_middleware,
    json_response,
    matrix_error_middleware,
    parse_json_object,
    read_json,
)
from roomstream.listener import HttpListener
from roomstream.metrics import CONTENT_TYPE_LATEST
from roomstream.replication.endpoints import (
    CLIENT_WRITES,
    HEALTH,
    INSTANCE_ENDPOINTS,
    STREAM_UPDATES,
    BoundEndpoint,
    HealthCall,
    InternalEndpoint,
    StreamUpdatesCall,
)
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.sharding import writer_for_room
from roomstream.streams import STREAMS, InMemoryStream, StreamTooOldError

__all__ = [
    "PREFIX",
    "HttpListener",
    "InternalHttpClient",
    "InternalHttpServer",
    "StreamTooOldHttpError",
    "bearer_auth_middleware",
    "error_response",
    "exact_json_content_type",
    "matrix_error_middleware",
    "parse_json_object",
    "read_json",
]

logger = logging.getLogger(__name__)

PREFIX = "/_roomstream/replication"
FORWARDED_HEADER = "X-Roomstream-Forwarded"
MAX_BODY = 64 * 1024
#: What a 503 tells the caller to wait before retrying, in milliseconds.
RETRY_AFTER_MS = 1000


Req = TypeVar("Req")
Resp = TypeVar("Resp")


class StreamTooOldHttpError(StreamTooOldError):
    """The writer answered that it no longer holds the rows asked for."""


class InternalHttpServer(HttpListener):
    """Serves the routes above for one instance, on its ``internal_port``, to callers
    that present the deployment's secret.

    Every route comes from its endpoint's declaration. ``bindings``: the handlers the
    composing process binds (the events writes of an events writer, the forwarded
    client writes); an endpoint with none answers its ``unserved`` error (or, for
    ``send_event``, is forwarded to the room's owner). ``/health`` and ``/updates`` are
    bound here: ``status`` supplies the health document's extra fields,
    ``memory_streams`` the in-memory streams this instance writes.
    """

    def __init__(
        self,
        config: Config,
        *,
        memory_streams: Mapping[str, InMemoryStream] | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
        client: InternalHttpClient | None = None,
        metrics: Callable[[], bytes] | None = None,
        bindings: Iterable[BoundEndpoint[Any, Any]] = (),
    ) -> None:
        self.config = config
        self._memory = dict(memory_streams or {})
        self._status = status
        self._client = client
        own: list[BoundEndpoint[Any, Any]] = [
            HEALTH.bind(self._health),
            STREAM_UPDATES.bind(self._updates, check=self._holds),
        ]
        self._bindings = {bound.endpoint: bound for bound in (*own, *bindings)}
        super().__init__(
            web.Application(
                middlewares=[
                    http_metrics_middleware,
                    matrix_error_middleware,
                    bearer_auth_middleware(effective_shared_secret(config)),
                ],
                client_max_size=MAX_BODY,
            ),
            config.http,
        )
        self.app.on_response_prepare.append(exact_json_content_type)
        if metrics is not None:
            self.app.router.add_get("/metrics", self._metrics_route(metrics))
        for endpoint in (*INSTANCE_ENDPOINTS, *CLIENT_WRITES):
            route = self._route(endpoint)
            if endpoint.method == "GET":
                self.app.router.add_get(PREFIX + endpoint.path, route)  # and HEAD
            else:
                self.app.router.add_post(PREFIX + endpoint.path, route)

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen on the instance's host and ``internal_port`` (or those given)."""
        instance = self.config.instance()
        port = instance.internal_port if port is None else port
        return await super().start(host or instance.host, port or 0)

    # -- routes -------------------------------------------------------------------------

    @staticmethod
    def _metrics_route(
        render: Callable[[], bytes],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def metrics(request: web.Request) -> web.Response:
            response = web.Response(body=render())
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        return metrics

    def _route(
        self, endpoint: InternalEndpoint[Any, Any]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The route of one endpoint. Checked in the order the hand-written routes of
        earlier releases checked (so a request keeps its answer): the path parameters;
        whether this instance serves it (it writes the stream and has it bound, else the
        endpoint's ``unserved`` error; the binding's own ``check``), before the body or
        query is read; the request; then, for a room-owned one, whether this instance
        owns the room (else 421, or one forward to the owner where the endpoint
        ``forwards``: never a second hop)."""
        me = self.config.instance_name

        async def route(request: web.Request) -> web.Response:
            bound = self._bindings.get(endpoint)
            path = endpoint.read_path(request.match_info)
            if not endpoint.forwards:
                writers = self.config.writers_of(endpoint.stream) if endpoint.stream else ()
                if bound is None or (endpoint.stream and me not in writers):
                    raise endpoint.unserved(
                        f"{me} does not write {endpoint.stream}"
                        f" (its writers: {', '.join(writers)})",
                    )
            if bound is not None and bound.check is not None:
                bound.check(path)
            values = await read_json(request) if endpoint.method == "POST" else request.query
            call = endpoint.parse(values, request.match_info)
            if endpoint.room_owned:
                assert endpoint.stream is not None, endpoint
                owner = writer_for_room(call.room_id, self.config.writers_of(endpoint.stream))
                if owner != me or bound is None:
                    if (
                        not endpoint.forwards
                        or request.headers.get(FORWARDED_HEADER)
                        or self._client is None
                    ):
                        raise WrongWriterError(f"{call.room_id} is written by {owner}")
                    result = await self._client.call(endpoint, owner, call, forwarded=True)
                    return json_response(endpoint.encode_answer(result))
            assert bound is not None
            return json_response(endpoint.encode_answer(await bound.handler(call)))

        return route

    async def _health(self, call: HealthCall) -> dict[str, Any]:
        doc: dict[str, Any] = {"instance": self.config.instance_name, "status": "ok"}
        if self._status is not None:
            doc.update(self._status())
        return doc

    def _holds(self, path: Mapping[str, Any]) -> None:
        """404 unless ``path["stream"]`` is an in-memory stream this instance writes."""
        stream_name = path["stream"]
        if stream_name not in STREAMS:
            raise NotFoundError(f"unknown stream {stream_name}")
        if stream_name not in self._memory:
            raise NotFoundError(f"{self.config.instance_name} holds no {stream_name} rows")

    async def _updates(self, call: StreamUpdatesCall) -> dict[str, Any]:
        memory = self._memory[call.stream]  # checked by _holds
        if call.writer is not None and call.writer != self.config.instance_name:
            raise InvalidParamError(f"this is {self.config.instance_name}")
        upto = memory.token if call.upto is None else call.upto
        try:
            updates, new_upto, limited = memory.get_updates(call.from_token, upto, call.limit)
        except StreamTooOldError as exc:
            raise StreamRowsGoneError(str(exc)) from None
        return {"updates": [[t, r] for t, r in updates], "upto": new_upto, "limited": limited}


class InternalHttpClient:
    """Calls other instances' internal HTTP APIs, with the deployment's secret as the
    bearer token."""

    def __init__(self, config: Config, *, timeout: float = 30.0) -> None:
        self.config = config
        self._secret = effective_shared_secret(config)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._unreachable: set[str] = set()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._secret}"}

    def base_url(self, instance_name: str) -> str:
        """Where ``instance_name`` serves the internal API (its ``internal_port``)."""
        instance = self.config.instances.get(instance_name)
        if instance is None or instance.internal_port is None:
            raise LookupError(f"instance {instance_name} has no internal_port configured")
        host = instance.host if ":" not in instance.host else f"[{instance.host}]"
        return f"http://{host}:{instance.internal_port}{PREFIX}"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self,
        instance_name: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        seconds: float | None = None,
    ) -> Any:
        """One request to ``instance_name``; its JSON answer, or the error as a MatrixError.
        ``seconds``: this request's time limit, if not the client's.

        An instance that cannot be reached (refused, reset, timed out) becomes a 503
        ``ServiceUnavailableError``; that is logged once when the outage starts and once
        when it ends, not per request. An answer of 5xx from the instance becomes 502, so
        a forwarding instance never answers 500 for another one.
        """
        url = self.base_url(instance_name) + path
        all_headers = self._headers() | (headers or {})
        data = None if body is None else orjson.dumps(body)
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        try:
            async with self.session.request(
                method,
                url,
                data=data,
                headers=all_headers,
                timeout=self._timeout if seconds is None else aiohttp.ClientTimeout(total=seconds),
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            if instance_name not in self._unreachable:
                self._unreachable.add(instance_name)
                logger.warning(
                    "instance %s is unreachable (%s); answering 503 until it is back",
                    instance_name,
                    type(exc).__name__ if not str(exc) else exc,
                )
            raise ServiceUnavailableError(
                f"{instance_name} is unreachable", retry_after_ms=RETRY_AFTER_MS
            ) from None
        if instance_name in self._unreachable:
            self._unreachable.discard(instance_name)
            logger.info("instance %s is reachable again", instance_name)
        try:
            payload = exactjson.loads(raw) if raw else None  # stream rows: integers exact
        except (ValueError, RecursionError):
            payload = None
        if status < 400:
            return payload
        if status == 503 and isinstance(payload, dict) and "errcode" in payload:
            retry = payload.get("retry_after_ms")
            raise ServiceUnavailableError(
                str(payload.get("error")),
                retry_after_ms=retry if isinstance(retry, int) else RETRY_AFTER_MS,
            )
        if status >= 500:
            status = 502
        if isinstance(payload, dict) and "errcode" in payload:
            if payload["errcode"] == Codes.STREAM_TOO_OLD:
                raise StreamTooOldHttpError(str(payload.get("error")))
            raise MatrixError(status, str(payload["errcode"]), str(payload.get("error")))
        raise MatrixError(status, Codes.UNKNOWN, f"HTTP {resp.status} from {instance_name}")

    @property
    def unreachable(self) -> frozenset[str]:
        """Instances whose last request failed to reach them (an ongoing outage)."""
        return frozenset(self._unreachable)

    async def call(
        self,
        endpoint: InternalEndpoint[Req, Resp],
        instance_name: str,
        request: Req,
        *,
        forwarded: bool = False,
        seconds: float | None = None,
    ) -> Resp:
        """Have ``instance_name`` serve ``request`` (for an endpoint with a stream, a
        writer of it; for a room-owned one, the room's owner: :meth:`room_owner`); its
        answer. ``forwarded``: this is the one forward of a request another process
        received (the owner must not forward it again). ``seconds``: this call's time
        limit, if not the client's (a long one: a federation join the writer carries out)."""
        headers = {FORWARDED_HEADER: "1"} if forwarded else None
        payload = await self._call(
            instance_name,
            endpoint.method,
            endpoint.url(request),
            body=endpoint.encode(request),
            headers=headers,
            seconds=seconds,
        )
        return endpoint.decode_answer(payload)

    def room_owner(self, room_id: str) -> str:
        """The events writer that owns ``room_id`` (where ``send_event`` goes)."""
        return writer_for_room(room_id, self.config.writers_of("events"))
