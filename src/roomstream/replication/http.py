"""The internal HTTP API between roomstream processes (aiohttp), and its client.

It has a listener of its own, ``internal_port`` (127.0.0.1:9093 by default), apart from
the Client-Server API's ``http_port`` (both assembled by :mod:`roomstream.homeserver`):
the client listener serves nothing under ``/_roomstream`` (404 ``M_UNRECOGNIZED``), so a
reverse proxy in front of it never exposes the internal API.

Routes, under ``/_roomstream/replication``:

- ``GET /health``: liveness and this process's replication status (JSON);
- ``GET /streams/{stream}/updates?writer=&from=&upto=&limit=``: rows of an in-memory
  stream (typing) that this instance writes, with the ``get_updates`` contract; a reader
  that fell behind fetches them here;
- ``POST /rooms/{room_id}/send_event`` with ``{"sender", "type", "content", "state_key"?,
  "redacts"?}``: create and persist an event (``redacts``: the redacted event of an
  ``m.room.redaction``, top-level in room version 10, moved into the content from 11 by
  the owner's event builder). The instance that owns the room (:mod:`sharding`) persists
  it; any other instance forwards the request once to the owner;
- ``POST /create_room`` with ``{"creator", "name"?}``: create a room on this instance.

Client-Server API writes forwarded by a process that does not write the stream they go
to: ``POST /client/<name>``, one per :class:`~roomstream.replication.endpoints.
InternalEndpoint` in :data:`~roomstream.replication.endpoints.CLIENT_WRITES` (which
defines each one's body, answer and stream: ``create_room``, ``send``, ``end_sessions``,
``account_data``, ``receipt``, ``to_device``, ``typing``), served when the process binds
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
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web

from roomstream import exactjson
from roomstream.config import Config
from roomstream.errors import (
    BadJsonError,
    Codes,
    InvalidParamError,
    MatrixError,
    MissingParamError,
    NotFoundError,
    ServiceUnavailableError,
    StreamRowsGoneError,
    UnrecognizedRequestError,
    WrongWriterError,
)
from roomstream.grammar import is_opaque_id, is_room_id_to_look_up, is_user_id
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
    BoundEndpoint,
    InternalEndpoint,
    read_identifier,
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
MAX_LIMIT = 10_000
#: What a 503 tells the caller to wait before retrying, in milliseconds.
RETRY_AFTER_MS = 1000


Req = TypeVar("Req")
Resp = TypeVar("Resp")


class StreamTooOldHttpError(StreamTooOldError):
    """The writer answered that it no longer holds the rows asked for."""


def _int_param(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise MissingParamError(f"missing query parameter {name}")
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isascii() or not digits.isdigit() or len(raw) > 20:
        raise InvalidParamError(f"{name} must be an integer")
    return int(raw)


SendEvent = Callable[
    [str, str, str, dict[str, Any], str | None, str | None], Awaitable[dict[str, Any]]
]
CreateRoom = Callable[[str, str | None], Awaitable[str]]


class InternalHttpServer(HttpListener):
    """Serves the routes above for one instance, on its ``internal_port``, to callers
    that present the deployment's secret.

    ``send_event`` / ``create_room`` persist locally (None: this instance is no events
    writer); ``status`` supplies the health document's extra fields; ``client_writes``
    binds handlers to the endpoints of :data:`CLIENT_WRITES` (an unbound one answers 421).
    """

    def __init__(
        self,
        config: Config,
        *,
        memory_streams: Mapping[str, InMemoryStream] | None = None,
        send_event: SendEvent | None = None,
        create_room: CreateRoom | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
        client: InternalHttpClient | None = None,
        metrics: Callable[[], bytes] | None = None,
        client_writes: Iterable[BoundEndpoint[Any, Any]] = (),
    ) -> None:
        self.config = config
        self._memory = dict(memory_streams or {})
        self._send_event = send_event
        self._create_room = create_room
        self._status = status
        self._client = client
        self._client_writes = {bound.endpoint: bound for bound in client_writes}
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
        self.app.router.add_get(PREFIX + "/health", self._health)
        self.app.router.add_get(PREFIX + "/streams/{stream}/updates", self._updates)
        self.app.router.add_post(PREFIX + "/rooms/{room_id}/send_event", self._send)
        self.app.router.add_post(PREFIX + "/create_room", self._create)
        for endpoint in CLIENT_WRITES:
            self.app.router.add_post(PREFIX + endpoint.path, self._client_write_route(endpoint))

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen on the instance's host and ``internal_port`` (or those given)."""
        instance = self.config.instance()
        port = instance.internal_port if port is None else port
        return await super().start(host or instance.host, port or 0)

    # -- plumbing -----------------------------------------------------------------------

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

    async def _health(self, request: web.Request) -> web.Response:
        doc: dict[str, Any] = {"instance": self.config.instance_name, "status": "ok"}
        if self._status is not None:
            doc.update(self._status())
        return json_response(doc)

    async def _updates(self, request: web.Request) -> web.Response:
        stream_name = request.match_info["stream"]
        if stream_name not in STREAMS:
            raise NotFoundError(f"unknown stream {stream_name}")
        memory = self._memory.get(stream_name)
        if memory is None:
            raise NotFoundError(f"{self.config.instance_name} holds no {stream_name} rows")
        writer = request.query.get("writer", self.config.instance_name)
        if writer != self.config.instance_name:
            raise InvalidParamError(f"this is {self.config.instance_name}")
        from_token = _int_param(request, "from")
        upto = _int_param(request, "upto", memory.token)
        limit = _int_param(request, "limit", 1000)
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidParamError(f"limit must be in 1..{MAX_LIMIT}")
        try:
            updates, new_upto, limited = memory.get_updates(from_token, upto, limit)
        except StreamTooOldError as exc:
            raise StreamRowsGoneError(str(exc)) from None
        body = {"updates": [[t, r] for t, r in updates], "upto": new_upto, "limited": limited}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _send(self, request: web.Request) -> web.Response:
        room_id = request.match_info["room_id"]
        if not is_room_id_to_look_up(room_id) or not is_opaque_id(room_id):
            raise InvalidParamError(f"not a room ID: {room_id[:300]!r}")
        body = await read_json(request)
        sender, event_type = body.get("sender"), body.get("type")
        content, state_key = body.get("content", {}), body.get("state_key")
        if not isinstance(sender, str) or not isinstance(event_type, str):
            raise MissingParamError("sender and type (strings) are required")
        if not is_user_id(sender) or not is_opaque_id(event_type):
            raise InvalidParamError("sender and type must be printable IDs")
        if not isinstance(content, dict):
            raise BadJsonError("content must be an object")
        if state_key is not None and not isinstance(state_key, str):
            raise BadJsonError("state_key must be a string")
        if state_key is not None and "\x00" in state_key:
            raise InvalidParamError("state_key must not contain NUL")
        redacts = read_identifier(body, "redacts", sigil="$", optional=True)
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        if owner != self.config.instance_name or self._send_event is None:
            if request.headers.get(FORWARDED_HEADER) or self._client is None:
                raise WrongWriterError(f"{room_id} is written by {owner}")
            result = await self._client.send_event(
                room_id, sender, event_type, content, state_key, redacts=redacts, forwarded=True
            )
            return json_response(result)
        result = await self._send_event(room_id, sender, event_type, content, state_key, redacts)
        return json_response(result)

    async def _create(self, request: web.Request) -> web.Response:
        if self._create_room is None:
            raise UnrecognizedRequestError("this instance does not write events")
        body = await read_json(request)
        creator, name = body.get("creator"), body.get("name")
        if not isinstance(creator, str) or (name is not None and not isinstance(name, str)):
            raise MissingParamError("creator (a string) is required")
        room_id = await self._create_room(creator, name)
        return json_response({"room_id": room_id})

    def _client_write_route(
        self, endpoint: InternalEndpoint[Any, Any]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The route of one forwarded write: this instance must write its stream and
        have it bound (else 421: the caller's configuration disagrees; no second hop)."""

        async def route(request: web.Request) -> web.Response:
            bound = self._client_writes.get(endpoint)
            writers = self.config.writers_of(endpoint.stream)
            if bound is None or self.config.instance_name not in writers:
                raise WrongWriterError(
                    f"{self.config.instance_name} does not write {endpoint.stream}"
                    f" (its writers: {', '.join(writers)})",
                )
            call = endpoint.parse(await read_json(request))
            if endpoint.room_owned:
                owner = writer_for_room(call.room_id, writers)
                if owner != self.config.instance_name:
                    raise WrongWriterError(f"{call.room_id} is written by {owner}")
            return json_response(endpoint.encode_answer(await bound.handler(call)))

        return route


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
    ) -> Any:
        """One request to ``instance_name``; its JSON answer, or the error as a MatrixError.

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
            async with self.session.request(method, url, data=data, headers=all_headers) as resp:
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

    async def send_event(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        state_key: str | None = None,
        *,
        redacts: str | None = None,
        forwarded: bool = False,
    ) -> dict[str, Any]:
        """Hand the event to the writer that owns the room; returns its JSON answer."""
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        body: dict[str, Any] = {"sender": sender, "type": event_type, "content": content}
        if state_key is not None:
            body["state_key"] = state_key
        if redacts is not None:
            body["redacts"] = redacts
        headers = {FORWARDED_HEADER: "1"} if forwarded else None
        path = f"/rooms/{quote(room_id, safe='')}/send_event"
        result = await self._call(owner, "POST", path, body=body, headers=headers)
        assert isinstance(result, dict)
        return result

    async def create_room(self, instance_name: str, creator: str, name: str | None = None) -> str:
        result = await self._call(
            instance_name, "POST", "/create_room", body={"creator": creator, "name": name}
        )
        return str(result["room_id"])

    async def call(
        self, endpoint: InternalEndpoint[Req, Resp], instance_name: str, request: Req
    ) -> Resp:
        """Have ``instance_name`` (a writer of the endpoint's stream) carry out a
        forwarded Client-Server API write; its answer."""
        body = endpoint.encode(request)
        return endpoint.decode_answer(
            await self._call(instance_name, "POST", endpoint.path, body=body)
        )

    async def get_updates(
        self, instance_name: str, stream_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[tuple[int, Any]], int, bool]:
        """An in-memory stream's rows from its writer (``get_updates`` contract)."""
        path = (
            f"/streams/{stream_name}/updates"
            f"?writer={instance_name}&from={from_token}&upto={upto_token}&limit={limit}"
        )
        result = await self._call(instance_name, "GET", path)
        updates = [(int(t), r) for t, r in result["updates"]]
        return updates, int(result["upto"]), bool(result["limited"])

    async def health(self, instance_name: str) -> dict[str, Any]:
        result = await self._call(instance_name, "GET", "/health")
        assert isinstance(result, dict)
        return result
