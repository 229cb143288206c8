"""Handlers for the media repository (rules in :mod:`roomstream.media`):

- authenticated media: ``GET /_matrix/client/v1/media/config``,
  ``/download/{serverName}/{mediaId}[/{fileName}]``, ``/thumbnail/{serverName}/{mediaId}``;
- uploads: ``POST /_matrix/media/{r0,v1,v3}/upload``, and asynchronous ones:
  ``POST /_matrix/media/v1/create`` then ``PUT /_matrix/media/v3/upload/{serverName}/{mediaId}``;
- the legacy unauthenticated ``GET /_matrix/media/{r0,v1,v3}/download|thumbnail/...``,
  frozen as Synapse freezes them (media uploaded with authenticated media on: 404), and
  ``/_matrix/media/{r0,v1,v3}/config``;
- ``preview_url`` (both prefixes): ``404 M_UNRECOGNIZED``, URL previews are disabled (no
  outbound fetching).

Upload bodies are streamed from the connection to the store, a chunk at a time: the
listener's small body limit (``client_max_size``) applies to bodies read whole, not here;
the media section's ``max_upload_size`` does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from roomstream.accounts import Accounts
from roomstream.client.request import json_response, query_bool, query_int
from roomstream.client.server import Handler, Route, authenticate
from roomstream.errors import BadRequestError, EndpointDisabledError, MissingParamError
from roomstream.media import Download, MediaRepository
from roomstream.media.repository import CHUNK, DEFAULT_TIMEOUT_MS, MAX_THUMBNAIL_SIDE
from roomstream.media.safety import download_headers

__all__ = ["media_routes"]

AUTHENTICATED = "/_matrix/client/v1/media"
LEGACY = "/_matrix/media/{api_version:(?:r0|v3|v1)}"


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    """The request body in chunks; a client that goes away mid-upload is a 400."""
    try:
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk
    except (ConnectionError, HttpProcessingError) as exc:
        raise BadRequestError(f"the upload did not arrive whole: {exc}") from None


def _answer(download: Download) -> web.StreamResponse:
    headers = download_headers(download.media_type, download.name)
    blob = download.blob
    if blob.path is not None:
        # sendfile from the store's file (aiohttp also answers Range requests).
        return web.FileResponse(blob.path, headers=headers)
    return _Streamed(download, headers)


class _Streamed(web.StreamResponse):
    """An answer read from a store without local files, chunk by chunk."""

    def __init__(self, download: Download, headers: dict[str, str]) -> None:
        super().__init__(headers=headers)
        self.content_length = download.blob.size
        self.download = download


async def _send(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    if isinstance(response, _Streamed):
        await response.prepare(request)
        async for chunk in response.download.blob.chunks():
            await response.write(chunk)
        await response.write_eof()
    return response


def _required_int(request: web.Request, name: str) -> int:
    if not request.query.get(name):
        raise MissingParamError(f"missing {name}")
    return query_int(request, name, 0, low=1, high=MAX_THUMBNAIL_SIDE)


def media_routes(accounts: Accounts, media: MediaRepository) -> list[Route]:
    async def config(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        return json_response(media.limits())

    async def preview_url(request: web.Request) -> web.Response:
        await authenticate(accounts, request)
        raise EndpointDisabledError("URL previews are disabled on this server")

    async def upload(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        uri = await media.upload(
            requester.user_id,
            _body(request),
            media_type=request.headers.get("Content-Type"),
            upload_name=request.query.get("filename"),
            declared_length=request.content_length,
        )
        return json_response({"content_uri": uri})

    async def create(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        uri, expires_at = await media.create(requester.user_id)
        return json_response({"content_uri": uri, "unused_expires_at": expires_at})

    async def upload_to(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        await media.upload_to(
            requester.user_id,
            request.match_info["server_name"],
            request.match_info["media_id"],
            _body(request),
            media_type=request.headers.get("Content-Type"),
            upload_name=request.query.get("filename"),
            declared_length=request.content_length,
        )
        return json_response({})

    def download(*, authenticated: bool) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if authenticated:
                await authenticate(accounts, request)
            found = await media.download(
                request.match_info["server_name"],
                request.match_info["media_id"],
                name=request.match_info.get("file_name"),
                authenticated=authenticated,
                timeout_ms=query_int(request, "timeout_ms", DEFAULT_TIMEOUT_MS),
            )
            return await _send(request, _answer(found))

        return handler

    def thumbnail(*, authenticated: bool) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if authenticated:
                await authenticate(accounts, request)
            found = await media.thumbnail(
                request.match_info["server_name"],
                request.match_info["media_id"],
                _required_int(request, "width"),
                _required_int(request, "height"),
                request.query.get("method", "scale"),
                animated=query_bool(request, "animated"),
                authenticated=authenticated,
                timeout_ms=query_int(request, "timeout_ms", DEFAULT_TIMEOUT_MS),
            )
            return await _send(request, _answer(found))

        return handler

    where = "/{server_name}/{media_id}"
    routes = [
        Route("POST", f"{LEGACY}/upload", upload, absolute=True),
        Route("POST", "/_matrix/media/v1/create", create, absolute=True),
        Route("PUT", f"/_matrix/media/v3/upload{where}", upload_to, absolute=True),
    ]
    # The same reads under the authenticated prefix and the frozen legacy one.
    for prefix, authenticated in ((AUTHENTICATED, True), (LEGACY, False)):
        routes += [
            Route("GET", f"{prefix}/config", config, absolute=True),
            Route("GET", f"{prefix}/preview_url", preview_url, absolute=True),
            Route(
                "GET",
                f"{prefix}/download{where}",
                download(authenticated=authenticated),
                absolute=True,
            ),
            Route(
                "GET",
                f"{prefix}/download{where}/{{file_name}}",
                download(authenticated=authenticated),
                absolute=True,
            ),
            Route(
                "GET",
                f"{prefix}/thumbnail{where}",
                thumbnail(authenticated=authenticated),
                absolute=True,
            ),
        ]
    return routes
