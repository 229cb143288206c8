"""Media repository helpers of the media tests: a homeserver with media
configured, image bytes, and the upload, download and thumbnail calls."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from PIL import Image

from roomstream.config import MediaConfig
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import SERVER_NAME, Homeserver, User, make_config, serve_homeserver

LEGACY = "/_matrix/media/v3"
V1 = "/_matrix/client/v1/media"


@asynccontextmanager
async def media_server(
    db_config: DatabaseConfig, tmp_path: Path, **media: Any
) -> AsyncIterator[Homeserver]:
    """The client API (as the ``homeserver`` fixture) with ``media`` settings."""
    config = make_config(db_config, tmp_path, media=MediaConfig(**media))
    async with serve_homeserver(config) as server:
        yield server


async def upload(
    hs: Homeserver,
    user: User,
    data: bytes,
    content_type: str = "application/octet-stream",
    filename: str | None = None,
) -> tuple[int, Any]:
    path = f"{LEGACY}/upload" + (f"?filename={quote(filename)}" if filename else "")
    return await hs.call(
        "POST", path, raw=data, token=user.token, headers={"Content-Type": content_type}
    )


async def upload_ok(hs: Homeserver, user: User, data: bytes, content_type: str, **kw: Any) -> str:
    status, body = await upload(hs, user, data, content_type, **kw)
    assert status == 200, body
    uri = body["content_uri"]
    assert uri.startswith(f"mxc://{SERVER_NAME}/")
    return str(uri)


def media_path(uri: str) -> str:
    return uri.removeprefix("mxc://")


async def get(
    hs: Homeserver, path: str, token: str | None = None
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with hs.session.get(hs.server.make_url(path), headers=headers) as resp:
        return resp.status, await resp.read(), dict(resp.headers)


async def download(hs: Homeserver, user: User, uri: str, suffix: str = "") -> bytes:
    status, body, _ = await get(hs, f"{V1}/download/{media_path(uri)}{suffix}", user.token)
    assert status == 200, body[:300]
    return body


async def thumbnail(
    hs: Homeserver, user: User | None, uri: str, query: str, prefix: str = V1
) -> tuple[int, bytes, dict[str, str]]:
    return await get(
        hs, f"{prefix}/thumbnail/{media_path(uri)}?{query}", user.token if user else None
    )


def image_bytes(size: tuple[int, int], fmt: str, color: str = "red", mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, color).save(out, fmt)
    return out.getvalue()


async def thumbnail_rows(hs: Homeserver, media_id: str) -> int:
    row = await hs.engine.db.run_interaction(
        "test_thumbnail_rows",
        lambda t: t.query_one(
            "SELECT COUNT(*) FROM media_thumbnails WHERE media_id = ?", (media_id,)
        ),
    )
    return int(row[0])
