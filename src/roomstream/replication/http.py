"""The internal HTTP API between roomstream processes (aiohttp), and its client.

Routes, under ``/_roomstream/replication``:

- ``GET /health``: liveness and this process's replication status (JSON);
- ``GET /streams/{stream}/updates?writer=&from=&upto=&limit=``: rows of an in-memory
  stream (typing) that this instance writes, with the ``get_updates`` contract; a reader
  that fell behind fetches them here;
- ``POST /rooms/{room_id}/send_event`` with ``{"sender", "type", "content", "state_key"?}``:
  create and persist an event. The instance that owns the room (:mod:`sharding`) persists
  it; any other instance forwards the request once to the owner;
- ``POST /create_room`` with ``{"creator", "name"?}``: create a room on this instance.

Errors are Matrix-style JSON bodies ``{"errcode": ..., "error": ...}``. When a shared
secret is configured every request must carry ``Authorization: Bearer <secret>`` (compared
in constant time). The listener binds to the instance's host, loopback by default;
configuration validation refuses a non-loopback host without a secret.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from roomstream.config import Config
from roomstream.errors import Codes, MatrixError
from roomstream.replication.sharding import writer_for_room
from roomstream.streams import STREAMS, InMemoryStream, StreamTooOldError

__all__ = ["PREFIX", "InternalHttpClient", "InternalHttpServer", "StreamTooOldHttpError"]

logger = logging.getLogger(__name__)

PREFIX = "/_roomstream/replication"
#: errcode for "the writer no longer holds those rows".
STREAM_TOO_OLD = "IO.ROOMSTREAM.STREAM_TOO_OLD"
#: errcode for "this instance does not own the room" (after one forward).
WRONG_WRITER = "IO.ROOMSTREAM.WRONG_WRITER"
FORWARDED_HEADER = "X-Roomstream-Forwarded"
MAX_BODY = 64 * 1024
MAX_LIMIT = 10_000


class StreamTooOldHttpError(StreamTooOldError):
    """The writer answered that it no longer holds the rows asked for."""


def _error(status: int, errcode: str, message: str) -> web.Response:
    return web.json_response({"errcode": errcode, "error": message}, status=status)


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


SendEvent = Callable[[str, str, str, dict[str, Any], str | None], Awaitable[dict[str, Any]]]
CreateRoom = Callable[[str, str | None], Awaitable[str]]


class InternalHttpServer:
    """Serves the routes above for one instance.

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
    ) -> None:
        self.config = config
        self._memory = dict(memory_streams or {})
        self._send_event = send_event
        self._create_room = create_room
        self._status = status
        self._client = client
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port: int | None = None
        self.app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY)
        self.app.router.add_get(PREFIX + "/health", self._health)
        self.app.router.add_get(PREFIX + "/streams/{stream}/updates", self._updates)
        self.app.router.add_post(PREFIX + "/rooms/{room_id}/send_event", self._send)
        self.app.router.add_post(PREFIX + "/create_room", self._create)

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        instance = self.config.instance()
        host = host or instance.host
        port = instance.http_port if port is None else port
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port or 0)
        await self._site.start()
        server = self._site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return int(self.port or 0)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- plumbing -----------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        secret = self.config.replication.shared_secret
        if secret is not None:
            header = request.headers.get("Authorization", "")
            token = header[7:] if header.startswith("Bearer ") else ""
            if not hmac.compare_digest(token.encode(), secret.encode()):
                return _error(401, Codes.UNAUTHORIZED, "missing or wrong bearer token")
        try:
            return await handler(request)
        except MatrixError as exc:
            return _error(exc.http_status, exc.errcode, exc.message)
        except web.HTTPException as exc:
            if exc.status == 413:
                return _error(413, Codes.TOO_LARGE, "request body too large")
            if exc.status == 404:
                return _error(404, Codes.UNRECOGNIZED, "unrecognized request")
            if exc.status == 405:
                return _error(405, Codes.UNRECOGNIZED, "method not allowed")
            raise

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MatrixError(400, Codes.NOT_JSON, f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise MatrixError(400, Codes.BAD_JSON, "body must be a JSON object")
        return body

    # -- routes -------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        doc: dict[str, Any] = {"instance": self.config.instance_name, "status": "ok"}
        if self._status is not None:
            doc.update(self._status())
        return web.json_response(doc, dumps=lambda v: orjson.dumps(v).decode())

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
            return _error(410, STREAM_TOO_OLD, str(exc))
        body = {"updates": [[t, r] for t, r in updates], "upto": new_upto, "limited": limited}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _send(self, request: web.Request) -> web.Response:
        room_id = request.match_info["room_id"]
        if not room_id.startswith("!") or len(room_id) < 2 or len(room_id) > 255:
            raise MatrixError(400, Codes.INVALID_PARAM, f"not a room ID: {room_id!r}")
        body = await self._json_body(request)
        sender, event_type = body.get("sender"), body.get("type")
        content, state_key = body.get("content", {}), body.get("state_key")
        if not isinstance(sender, str) or not isinstance(event_type, str):
            raise MatrixError(400, Codes.MISSING_PARAM, "sender and type (strings) are required")
        if not isinstance(content, dict):
            raise MatrixError(400, Codes.BAD_JSON, "content must be an object")
        if state_key is not None and not isinstance(state_key, str):
            raise MatrixError(400, Codes.BAD_JSON, "state_key must be a string")
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        if owner != self.config.instance_name or self._send_event is None:
            if request.headers.get(FORWARDED_HEADER) or self._client is None:
                raise MatrixError(421, WRONG_WRITER, f"{room_id} is written by {owner}")
            result = await self._client.send_event(
                room_id, sender, event_type, content, state_key, forwarded=True
            )
            return web.json_response(result)
        result = await self._send_event(room_id, sender, event_type, content, state_key)
        return web.json_response(result)

    async def _create(self, request: web.Request) -> web.Response:
        if self._create_room is None:
            raise MatrixError(400, Codes.UNRECOGNIZED, "this instance does not write events")
        body = await self._json_body(request)
        creator, name = body.get("creator"), body.get("name")
        if not isinstance(creator, str) or (name is not None and not isinstance(name, str)):
            raise MatrixError(400, Codes.MISSING_PARAM, "creator (a string) is required")
        room_id = await self._create_room(creator, name)
        return web.json_response({"room_id": room_id})


class InternalHttpClient:
    """Calls other instances' internal HTTP APIs (with the bearer token if configured)."""

    def __init__(self, config: Config, *, timeout: float = 30.0) -> None:
        self.config = config
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        secret = self.config.replication.shared_secret
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    def base_url(self, instance_name: str) -> str:
        instance = self.config.instances.get(instance_name)
        if instance is None or instance.http_port is None:
            raise LookupError(f"instance {instance_name} has no http_port configured")
        host = instance.host if ":" not in instance.host else f"[{instance.host}]"
        return f"http://{host}:{instance.http_port}{PREFIX}"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, method: str, url: str, *, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        all_headers = self._headers() | (headers or {})
        data = None if body is None else orjson.dumps(body)
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        async with self.session.request(method, url, data=data, headers=all_headers) as resp:
            raw = await resp.read()
            try:
                payload = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                payload = None
            if resp.status >= 400:
                if isinstance(payload, dict) and "errcode" in payload:
                    if payload["errcode"] == STREAM_TOO_OLD:
                        raise StreamTooOldHttpError(str(payload.get("error")))
                    raise MatrixError(resp.status, payload["errcode"], str(payload.get("error")))
                raise MatrixError(resp.status, Codes.UNKNOWN, f"HTTP {resp.status} from {url}")
            return payload

    async def send_event(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: dict[str, Any],
        state_key: str | None = None,
        *,
        forwarded: bool = False,
    ) -> dict[str, Any]:
        """Hand the event to the writer that owns the room; returns its JSON answer."""
        owner = writer_for_room(room_id, self.config.writers_of("events"))
        body: dict[str, Any] = {"sender": sender, "type": event_type, "content": content}
        if state_key is not None:
            body["state_key"] = state_key
        headers = {FORWARDED_HEADER: "1"} if forwarded else None
        url = f"{self.base_url(owner)}/rooms/{room_id}/send_event"
        result = await self._call("POST", url, body=body, headers=headers)
        assert isinstance(result, dict)
        return result

    async def create_room(self, instance_name: str, creator: str, name: str | None = None) -> str:
        result = await self._call(
            "POST",
            f"{self.base_url(instance_name)}/create_room",
            body={"creator": creator, "name": name},
        )
        return str(result["room_id"])

    async def get_updates(
        self, instance_name: str, stream_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[tuple[int, Any]], int, bool]:
        """An in-memory stream's rows from its writer (``get_updates`` contract)."""
        url = (
            f"{self.base_url(instance_name)}/streams/{stream_name}/updates"
            f"?writer={instance_name}&from={from_token}&upto={upto_token}&limit={limit}"
        )
        result = await self._call("GET", url)
        updates = [(int(t), r) for t, r in result["updates"]]
        return updates, int(result["upto"]), bool(result["limited"])

    async def health(self, instance_name: str) -> dict[str, Any]:
        result = await self._call("GET", f"{self.base_url(instance_name)}/health")
        assert isinstance(result, dict)
        return result
