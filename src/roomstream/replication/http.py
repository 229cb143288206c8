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
to (``/client/...``, served when the process composes a :class:`ClientWrites`). The
receiving instance must write that stream itself (else 421, never a second hop); the
forwarding process has already authenticated the user and checked membership:

- ``POST /client/create_room`` with ``{"creator", "request"}``: a whole ``createRoom``
  request body, created by this events writer exactly as a local one;
- ``POST /client/send`` with ``{"room_id", "user_id", "device_id", "txn_id", "type",
  "content", "redacts"?}``: a client's idempotent send (``PUT /send``, ``/redact``) on
  the writer that owns the room, which alone decides whether the transaction ID was
  used already (so concurrent retries through different processes get one event);
- ``POST /client/end_sessions`` with ``{"user_id", "device_id"?}``: log a device out (all
  of the user's without ``device_id``) on the writer of the ``caches`` stream, which
  streams the token-cache invalidation with the deletion;
- ``POST /client/account_data`` with ``{"user_id", "room_id"?, "type", "content"}``;
- ``POST /client/receipt`` with ``{"room_id", "receipt_type", "user_id", "event_id",
  "thread_id"?}``;
- ``POST /client/to_device`` with ``{"sender", "type", "messages"}``;
- ``POST /client/typing`` with ``{"room_id", "user_id", "typing", "timeout"}``.

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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web

from roomstream import exactjson
from roomstream.config import Config
from roomstream.errors import Codes, MatrixError, ServiceUnavailableError
from roomstream.httpbase import (
    bearer_auth_middleware,
    error_response,
    exact_json_content_type,
    json_response,
    matrix_error_middleware,
    parse_json_object,
    read_json,
)
from roomstream.listener import HttpListener
from roomstream.metrics import CONTENT_TYPE_LATEST, http_metrics_middleware
from roomstream.replication.endpoints import _field, _identifier_field, _is_identifier
from roomstream.replication.secret import effective_shared_secret
from roomstream.replication.sharding import writer_for_room
from roomstream.streams import STREAMS, InMemoryStream, StreamTooOldError

__all__ = [
    "PREFIX",
    "ClientWrites",
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
#: errcode for "the writer no longer holds those rows".
STREAM_TOO_OLD = "IO.ROOMSTREAM.STREAM_TOO_OLD"
#: errcode for "this instance does not own the room" (after one forward).
WRONG_WRITER = "IO.ROOMSTREAM.WRONG_WRITER"
FORWARDED_HEADER = "X-Roomstream-Forwarded"
MAX_BODY = 64 * 1024
MAX_LIMIT = 10_000
#: What a 503 tells the caller to wait before retrying, in milliseconds.
RETRY_AFTER_MS = 1000


class StreamTooOldHttpError(StreamTooOldError):
    """The writer answered that it no longer holds the rows asked for."""


def _int_param(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise MatrixError(400, Codes.MISSING_PARAM, f"missing query parameter {name}")
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isascii() or not digits.isdigit() or len(raw) > 20:
        raise MatrixError(400, Codes.INVALID_PARAM, f"{name} must be an integer")
    return int(raw)


SendEvent = Callable[
    [str, str, str, dict[str, Any], str | None, str | None], Awaitable[dict[str, Any]]
]
CreateRoom = Callable[[str, str | None], Awaitable[str]]


class ClientWrites(Protocol):
    """The Client-Server API writes another process forwards to this one (performed
    here, locally; the caller has authenticated the user and checked membership)."""

    async def create_room(self, creator: str, request: dict[str, Any]) -> str: ...

    async def send_once(
        self,
        room_id: str,
        user_id: str,
        device_id: str,
        txn_id: str,
        event_type: str,
        content: dict[str, Any],
        redacts: str | None,
    ) -> str: ...

    async def end_sessions(self, user_id: str, device_id: str | None) -> None: ...

    async def put_account_data(
        self, user_id: str, room_id: str | None, data_type: str, content: dict[str, Any]
    ) -> None: ...

    async def put_receipt(
        self, room_id: str, receipt_type: str, user_id: str, event_id: str, thread_id: str | None
    ) -> None: ...

    async def send_to_device(
        self,
        sender: str,
        event_type: str,
        messages: dict[str, dict[str, Any]],
        transaction: tuple[str, str] | None = None,
    ) -> None: ...

    async def set_typing(
        self, room_id: str, user_id: str, typing: bool, timeout_ms: int
    ) -> None: ...


class InternalHttpServer(HttpListener):
    """Serves the routes above for one instance, on its ``internal_port``, to callers
    that present the deployment's secret.

    ``send_event`` / ``create_room`` persist locally (None: this instance is no events
    writer); ``status`` supplies the health document's extra fields.
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
        client_writes: ClientWrites | None = None,
    ) -> None:
        self.config = config
        self._memory = dict(memory_streams or {})
        self._send_event = send_event
        self._create_room = create_room
        self._status = status
        self._client = client
        self._client_writes = client_writes
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
        forwarded = PREFIX + "/client"
        self.app.router.add_post(forwarded + "/create_room", self._client_create_room)
        self.app.router.add_post(forwarded + "/send", self._client_send)
        self.app.router.add_post(forwarded + "/end_sessions", self._client_end_sessions)
        self.app.router.add_post(forwarded + "/account_data", self._client_account_data)
        self.app.router.add_post(forwarded + "/receipt", self._client_receipt)
        self.app.router.add_post(forwarded + "/to_device", self._client_to_device)
        self.app.router.add_post(forwarded + "/typing", self._client_typing)

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
            raise MatrixError(404, Codes.NOT_FOUND, f"unknown stream {stream_name}")
        memory = self._memory.get(stream_name)
        if memory is None:
            raise MatrixError(
                404, Codes.NOT_FOUND, f"{self.config.instance_name} holds no {stream_name} rows"
            )
        writer = request.query.get("writer", self.config.instance_name)
        if writer != self.config.instance_name:
            raise MatrixError(400, Codes.INVALID_PARAM, f"this is {self.config.instance_name}")
        from_token = _int_param(request, "from")
        upto = _int_param(request, "upto", memory.token)
        limit = _int_param(request, "limit", 1000)
        if not 1 <= limit <= MAX_LIMIT:
            raise MatrixError(400, Codes.INVALID_PARAM, f"limit must be in 1..{MAX_LIMIT}")
        try:
            updates, new_upto, limited = memory.get_updates(from_token, upto, limit)
        except StreamTooOldError as exc:
            raise MatrixError(410, STREAM_TOO_OLD, str(exc)) from None
        body = {"updates": [[t, r] for t, r in updates], "upto": new_upto, "limited": limited}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _send(self, request: web.Request) -> web.Response:
        room_id = request.match_info["room_id"]
        if not room_id.startswith("!") or not _is_identifier(room_id):
            raise MatrixError(400, Codes.INVALID_PARAM, f"not a room ID: {room_id[:300]!r}")
        body = await read_json(request)
        sender, event_type = body.get("sender"), body.get("type")
        content, state_key = body.get("content", {}), body.get("state_key")
        if not isinstance(sender, str) or not isinstance(event_type, str):
            raise MatrixError(400, Codes.MISSING_PARAM, "sender and type (strings) are required")
        if not _is_identifier(sender) or not _is_identifier(event_type):
            raise MatrixError(400, Codes.INVALID_PARAM, "sender and type must be printable IDs")
        if not isinstance(content, dict):
            raise MatrixError(400, Codes.BAD_JSON, "content must be an object")
        if state_key is not None and not isinstance(state_key, str):
            raise MatrixError(400, Codes.BAD_JSON, "state_key must be a string")
        if state_key is not None and "\x00" in state_key:
            raise MatrixError(400, Codes.INVALID_PARAM, "state_key must not contain NUL")
        redacts = _identifier_field(body, "redacts", sigil="$", optional=True)
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        if owner != self.config.instance_name or self._send_event is None:
            if request.headers.get(FORWARDED_HEADER) or self._client is None:
                raise MatrixError(421, WRONG_WRITER, f"{room_id} is written by {owner}")
            result = await self._client.send_event(
                room_id, sender, event_type, content, state_key, redacts=redacts, forwarded=True
            )
            return json_response(result)
        result = await self._send_event(room_id, sender, event_type, content, state_key, redacts)
        return json_response(result)

    async def _create(self, request: web.Request) -> web.Response:
        if self._create_room is None:
            raise MatrixError(400, Codes.UNRECOGNIZED, "this instance does not write events")
        body = await read_json(request)
        creator, name = body.get("creator"), body.get("name")
        if not isinstance(creator, str) or (name is not None and not isinstance(name, str)):
            raise MatrixError(400, Codes.MISSING_PARAM, "creator (a string) is required")
        room_id = await self._create_room(creator, name)
        return json_response({"room_id": room_id})

    def _writes_for(self, stream_name: str) -> ClientWrites:
        """The local writes, if this instance writes ``stream_name`` (421 otherwise: the
        caller's configuration disagrees; no second hop)."""
        writers = self.config.writers_of(stream_name)
        if self._client_writes is None or self.config.instance_name not in writers:
            raise MatrixError(
                421,
                WRONG_WRITER,
                f"{self.config.instance_name} does not write {stream_name}"
                f" (its writers: {', '.join(writers)})",
            )
        return self._client_writes

    async def _client_create_room(self, request: web.Request) -> web.Response:
        writes = self._writes_for("events")
        body = await read_json(request)
        creator = _identifier_field(body, "creator", sigil="@")
        room_id = await writes.create_room(creator, _field(body, "request", dict))
        return json_response({"room_id": room_id})

    async def _client_send(self, request: web.Request) -> web.Response:
        writes = self._writes_for("events")
        body = await read_json(request)
        room_id = _identifier_field(body, "room_id", sigil="!")
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        if owner != self.config.instance_name:
            raise MatrixError(421, WRONG_WRITER, f"{room_id} is written by {owner}")
        event_id = await writes.send_once(
            room_id,
            _identifier_field(body, "user_id", sigil="@"),
            _field(body, "device_id", str),
            _field(body, "txn_id", str),
            _identifier_field(body, "type"),
            _field(body, "content", dict),
            _identifier_field(body, "redacts", sigil="$", optional=True),
        )
        return json_response({"event_id": event_id})

    async def _client_end_sessions(self, request: web.Request) -> web.Response:
        writes = self._writes_for("caches")
        body = await read_json(request)
        await writes.end_sessions(
            _identifier_field(body, "user_id", sigil="@"),
            _field(body, "device_id", str, optional=True),
        )
        return json_response({})

    async def _client_account_data(self, request: web.Request) -> web.Response:
        writes = self._writes_for("account_data")
        body = await read_json(request)
        await writes.put_account_data(
            _identifier_field(body, "user_id", sigil="@"),
            _identifier_field(body, "room_id", sigil="!", optional=True),
            _identifier_field(body, "type"),
            _field(body, "content", dict),
        )
        return json_response({})

    async def _client_receipt(self, request: web.Request) -> web.Response:
        writes = self._writes_for("receipts")
        body = await read_json(request)
        await writes.put_receipt(
            _identifier_field(body, "room_id", sigil="!"),
            _identifier_field(body, "receipt_type"),
            _identifier_field(body, "user_id", sigil="@"),
            _identifier_field(body, "event_id"),
            _identifier_field(body, "thread_id", optional=True),
        )
        return json_response({})

    async def _client_to_device(self, request: web.Request) -> web.Response:
        writes = self._writes_for("to_device")
        body = await read_json(request)
        messages = _field(body, "messages", dict)
        for user_id, by_device in messages.items():
            if not _is_identifier(user_id) or not isinstance(by_device, dict):
                raise MatrixError(400, Codes.BAD_JSON, "messages: user -> device -> object")
            for device_id, content in by_device.items():
                if not _is_identifier(device_id) or not isinstance(content, dict):
                    raise MatrixError(400, Codes.BAD_JSON, "messages: user -> device -> object")
        transaction = None
        if body.get("txn_id") is not None:
            transaction = (
                _field(body, "sender_device", str),
                _field(body, "txn_id", str),
            )
        await writes.send_to_device(
            _identifier_field(body, "sender", sigil="@"),
            _identifier_field(body, "type"),
            messages,
            transaction,
        )
        return json_response({})

    async def _client_typing(self, request: web.Request) -> web.Response:
        writes = self._writes_for("typing")
        body = await read_json(request)
        timeout = _field(body, "timeout", int)
        if not 0 <= timeout <= 2**53:
            raise MatrixError(400, Codes.INVALID_PARAM, "timeout must be a non-negative integer")
        await writes.set_typing(
            _identifier_field(body, "room_id", sigil="!"),
            _identifier_field(body, "user_id", sigil="@"),
            _field(body, "typing", bool),
            timeout,
        )
        return json_response({})


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
            if payload["errcode"] == STREAM_TOO_OLD:
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

    # -- Client-Server API writes, on the instance that writes their stream ------------

    async def client_create_room(
        self, instance_name: str, creator: str, request: dict[str, Any]
    ) -> str:
        """A whole ``createRoom`` request, carried out by the events writer
        ``instance_name``; the new room's ID."""
        body = {"creator": creator, "request": request}
        result = await self._call(instance_name, "POST", "/client/create_room", body=body)
        return str(result["room_id"])

    async def client_send_once(
        self,
        instance_name: str,
        room_id: str,
        user_id: str,
        device_id: str,
        txn_id: str,
        event_type: str,
        content: dict[str, Any],
        redacts: str | None,
    ) -> str:
        """A client's idempotent send, carried out by the room's owner; its event ID."""
        body: dict[str, Any] = {
            "room_id": room_id,
            "user_id": user_id,
            "device_id": device_id,
            "txn_id": txn_id,
            "type": event_type,
            "content": content,
        }
        if redacts is not None:
            body["redacts"] = redacts
        result = await self._call(instance_name, "POST", "/client/send", body=body)
        assert isinstance(result, dict)
        return str(result["event_id"])

    async def client_end_sessions(
        self, instance_name: str, user_id: str, device_id: str | None
    ) -> None:
        body = {"user_id": user_id, "device_id": device_id}
        await self._call(instance_name, "POST", "/client/end_sessions", body=body)

    async def client_put_account_data(
        self,
        instance_name: str,
        user_id: str,
        room_id: str | None,
        data_type: str,
        content: dict[str, Any],
    ) -> None:
        body = {"user_id": user_id, "room_id": room_id, "type": data_type, "content": content}
        await self._call(instance_name, "POST", "/client/account_data", body=body)

    async def client_put_receipt(
        self,
        instance_name: str,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        thread_id: str | None,
    ) -> None:
        body = {
            "room_id": room_id,
            "receipt_type": receipt_type,
            "user_id": user_id,
            "event_id": event_id,
            "thread_id": thread_id,
        }
        await self._call(instance_name, "POST", "/client/receipt", body=body)

    async def client_send_to_device(
        self,
        instance_name: str,
        sender: str,
        event_type: str,
        messages: dict[str, dict[str, Any]],
        transaction: tuple[str, str] | None = None,
    ) -> None:
        body: dict[str, Any] = {"sender": sender, "type": event_type, "messages": messages}
        if transaction is not None:
            body["sender_device"], body["txn_id"] = transaction
        await self._call(instance_name, "POST", "/client/to_device", body=body)

    async def client_set_typing(
        self, instance_name: str, room_id: str, user_id: str, typing: bool, timeout_ms: int
    ) -> None:
        body = {"room_id": room_id, "user_id": user_id, "typing": typing, "timeout": timeout_ms}
        await self._call(instance_name, "POST", "/client/typing", body=body)

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
