"""The media repository through the API on both engines: uploads and downloads (bytes and
headers), one file for identical content, asynchronous uploads, thumbnails (dimensions
read back with Pillow), animated images, the limits (size, quota, pixels), authentication
on the v1 endpoints, the frozen legacy endpoints, and bad input answered, never 500."""

from __future__ import annotations

import asyncio
import io
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from PIL import Image

from roomstream.media.safety import CONTENT_SECURITY_POLICY
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import SERVER_NAME, Homeserver
from tests.support.media import (
    LEGACY,
    V1,
    download,
    get,
    image_bytes,
    media_path,
    media_server,
    thumbnail,
    thumbnail_rows,
    upload,
    upload_ok,
)


@pytest.fixture
async def hs(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    async with media_server(db_config, tmp_path) as server:
        yield server


def gif_bytes(size: tuple[int, int], frames: int) -> bytes:
    colours = ["red", "green", "blue", "yellow", "white"]
    images = [Image.new("RGB", size, colours[i % len(colours)]) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:], duration=50, loop=0)
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def error(body: bytes) -> tuple[str, str]:
    decoded = orjson.loads(body)
    return decoded["errcode"], decoded["error"]


def content_files(hs: Homeserver) -> list[Path]:
    return sorted(p for p in (Path(hs.config.media_store()) / "content").rglob("*") if p.is_file())


# -- upload and download -------------------------------------------------------------------


async def test_round_trip_bytes_and_headers(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    data = b"hello \xe2\x9c\x93 media\n" * 1000
    uri = await upload_ok(hs, alice, data, "text/plain", filename="notes.txt")
    status, body, headers = await get(hs, f"{V1}/download/{media_path(uri)}", alice.token)
    assert status == 200
    assert body == data
    assert headers["Content-Type"] == "text/plain; charset=UTF-8"
    assert headers["Content-Disposition"] == "inline; filename=notes.txt"
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert CONTENT_SECURITY_POLICY.startswith("sandbox; default-src 'none'; script-src 'none';")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Length"] == str(len(data))
    assert headers["Access-Control-Allow-Origin"] == "*"
    # The name in the path replaces the uploaded one; names that are not a token are
    # percent-encoded.
    _, _, named = await get(hs, f"{V1}/download/{media_path(uri)}/other.txt", alice.token)
    assert named["Content-Disposition"] == "inline; filename=other.txt"
    uri2 = await upload_ok(hs, alice, b"x", "text/plain", filename="r\u00e9sum\u00e9 v1;.txt")
    _, _, encoded = await get(hs, f"{V1}/download/{media_path(uri2)}", alice.token)
    assert encoded["Content-Disposition"] == (
        "inline; filename*=utf-8''r%C3%A9sum%C3%A9%20v1%3B.txt"
    )
    # Another user downloads it too (media is not per-user).
    bob = await hs.register("bob")
    assert await download(hs, bob, uri) == data


@pytest.mark.parametrize(
    ("content_type", "disposition"),
    [
        ("text/html", "attachment"),
        ("image/svg+xml", "attachment"),
        ("application/javascript", "attachment"),
        ("application/octet-stream", "attachment"),
        ("image/png", "inline"),
        ("video/mp4", "inline"),
        ("IMAGE/PNG; foo=bar", "inline"),
    ],
)
async def test_only_safe_types_are_inline(
    hs: Homeserver, content_type: str, disposition: str
) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, b"<script>alert(1)</script>", content_type)
    status, body, headers = await get(hs, f"{V1}/download/{media_path(uri)}", alice.token)
    assert status == 200 and body == b"<script>alert(1)</script>"
    assert headers["Content-Disposition"] == disposition
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert headers["X-Content-Type-Options"] == "nosniff"


async def test_identical_uploads_share_one_file(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    data = bytes(range(256)) * 400
    first = await upload_ok(hs, alice, data, "application/octet-stream", filename="a.bin")
    second = await upload_ok(hs, bob, data, "application/x-other", filename="b.bin")
    assert first != second
    files = content_files(hs)
    assert len(files) == 1 and files[0].read_bytes() == data
    assert await download(hs, alice, first) == data
    _, _, headers = await get(hs, f"{V1}/download/{media_path(second)}", alice.token)
    assert headers["Content-Type"] == "application/x-other"
    assert headers["Content-Disposition"] == "attachment; filename=b.bin"
    await upload_ok(hs, alice, data + b"!", "application/octet-stream")
    assert len(content_files(hs)) == 2
    # Nothing is left behind in the staging directory.
    assert list((Path(hs.config.media_store()) / "staging").iterdir()) == []


async def test_media_ids_are_long_and_random(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    ids = {media_path(await upload_ok(hs, alice, b"same", "text/plain")) for _ in range(20)}
    assert len(ids) == 20
    for media in ids:
        media_id = media.split("/", 1)[1]
        assert len(media_id) == 24 and media_id.isalpha()


async def test_chunked_upload_without_length(hs: Homeserver) -> None:
    alice = await hs.register("alice")

    async def body() -> AsyncIterator[bytes]:
        for i in range(50):
            yield bytes([i]) * 10_000

    async with hs.session.post(
        hs.server.make_url(f"{LEGACY}/upload"),
        data=body(),
        headers={"Authorization": f"Bearer {alice.token}", "Content-Type": "image/x-raw"},
    ) as resp:
        assert resp.status == 200
        uri = (await resp.json())["content_uri"]
    assert await download(hs, alice, uri) == b"".join(bytes([i]) * 10_000 for i in range(50))


# -- asynchronous uploads ------------------------------------------------------------------


async def test_async_upload(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    created = await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token)
    uri = created["content_uri"]
    assert uri.startswith(f"mxc://{SERVER_NAME}/")
    assert created["unused_expires_at"] > 0
    path = media_path(uri)
    status, body, _ = await get(hs, f"{V1}/download/{path}?timeout_ms=0", alice.token)
    assert (status, error(body)[0]) == (504, "M_NOT_YET_UPLOADED")

    put = f"/_matrix/media/v3/upload/{path}?filename=late.txt"
    status, result = await hs.call(
        "PUT", put, raw=b"nope", token=bob.token, headers={"Content-Type": "text/plain"}
    )
    assert (status, result["errcode"]) == (403, "M_FORBIDDEN")

    # A download waiting for the content gets it once it arrives.
    waiting = asyncio.create_task(get(hs, f"{V1}/download/{path}?timeout_ms=30000", bob.token))
    await hs.ok(
        "PUT", put, raw=b"late content", token=alice.token, headers={"Content-Type": "text/plain"}
    )
    status, body, headers = await asyncio.wait_for(waiting, 30)
    assert (status, body) == (200, b"late content")
    assert headers["Content-Disposition"] == "inline; filename=late.txt"

    status, result = await hs.call(
        "PUT", put, raw=b"again", token=alice.token, headers={"Content-Type": "text/plain"}
    )
    assert (status, result["errcode"]) == (409, "M_CANNOT_OVERWRITE_MEDIA")
    assert await download(hs, alice, uri) == b"late content"

    for bad in (f"{SERVER_NAME}/NoSuchMediaIdHere", f"other.example/{path.split('/')[1]}"):
        status, result = await hs.call(
            "PUT", f"/_matrix/media/v3/upload/{bad}", raw=b"x", token=alice.token
        )
        assert (status, result["errcode"]) == (404, "M_NOT_FOUND"), bad


async def test_pending_media_ids_are_limited_and_expire(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    media = hs.process.media
    now = [1_700_000_000.0]
    media.clock = lambda: now[0]
    uris = [
        (await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token))["content_uri"]
        for _ in range(5)
    ]
    status, result = await hs.call("POST", "/_matrix/media/v1/create", token=alice.token)
    assert (status, result["errcode"]) == (429, "M_LIMIT_EXCEEDED")
    assert result["retry_after_ms"] == 86_400_000
    # Another user has a limit of their own.
    bob = await hs.register("bob")
    await hs.ok("POST", "/_matrix/media/v1/create", token=bob.token)
    # A day later the unused IDs expired: 404, and they no longer count.
    now[0] += 86_400
    put = f"/_matrix/media/v3/upload/{media_path(uris[0])}"
    status, result = await hs.call("PUT", put, raw=b"x", token=alice.token)
    assert (status, result["errcode"]) == (404, "M_NOT_FOUND")
    status, body, _ = await get(hs, f"{V1}/download/{media_path(uris[1])}", alice.token)
    assert (status, error(body)[0]) == (404, "M_NOT_FOUND")
    await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token)


# -- thumbnails ----------------------------------------------------------------------------


async def test_thumbnails_sizes_and_cache(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, image_bytes((1000, 500), "PNG"), "image/png")
    media_id = uri.rsplit("/", 1)[1]
    # Made after the upload: 32x32 and 96x96 crop, 320x160, 640x320 and 800x400 scale.
    await hs.process.media.idle()
    assert await thumbnail_rows(hs, media_id) == 5
    expected = {
        "width=32&height=32&method=crop": (32, 32),
        "width=96&height=96&method=crop": (96, 96),
        "width=320&height=240&method=scale": (320, 160),
        "width=800&height=600&method=scale": (800, 400),
        # Larger cached ones serve smaller requests of the same shape.
        "width=300&height=200&method=scale": (320, 160),
        "width=20&height=20&method=crop": (32, 32),
        # Never upscaled: the original's size at most.
        "width=4000&height=4000&method=scale": (1000, 500),
        "width=2000&height=2000&method=crop": (500, 500),
    }
    for query, size in expected.items():
        status, body, headers = await thumbnail(hs, alice, uri, query)
        assert status == 200, (query, body[:200])
        assert headers["Content-Type"] == "image/png"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        image = opened(body)
        assert (image.format, image.size) == ("PNG", size), query
    rows = await thumbnail_rows(hs, media_id)
    assert rows == 7  # 1000x500 scale and 500x500 crop were made on demand
    # Another size on demand, once: asked again, it comes from the cache.
    for _ in range(2):
        status, body, _ = await thumbnail(hs, alice, uri, "width=50&height=40&method=crop")
        assert (status, opened(body).size) == (200, (50, 40))
    assert await thumbnail_rows(hs, media_id) == rows + 1
    # method defaults to scale.
    status, body, _ = await thumbnail(hs, alice, uri, "width=640&height=480")
    assert (status, opened(body).size) == (200, (640, 320))


async def test_jpeg_thumbnails_are_jpeg(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, image_bytes((1600, 1200), "JPEG", "blue"), "image/jpeg")
    status, body, headers = await thumbnail(hs, alice, uri, "width=640&height=480&method=scale")
    assert status == 200 and headers["Content-Type"] == "image/jpeg"
    image = opened(body)
    assert (image.format, image.size) == ("JPEG", (640, 480))
    r, g, b = image.convert("RGB").getpixel((320, 240))  # type: ignore[misc]
    assert b > 200 and r < 50 and g < 50


async def test_exif_orientation_is_applied(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 400x200, displayed rotated: 200x400
    out = io.BytesIO()
    Image.new("RGB", (400, 200), "green").save(out, "JPEG", exif=exif.tobytes())
    uri = await upload_ok(hs, alice, out.getvalue(), "image/jpeg")
    status, body, _ = await thumbnail(hs, alice, uri, "width=120&height=240&method=scale")
    assert (status, opened(body).size) == (200, (120, 240))
    status, body, _ = await thumbnail(hs, alice, uri, "width=60&height=30&method=crop")
    assert (status, opened(body).size) == (200, (60, 30))


async def test_animated_images(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, gif_bytes((120, 80), 3), "image/gif")
    status, body, headers = await thumbnail(hs, alice, uri, "width=96&height=96&method=crop")
    assert (status, headers["Content-Type"]) == (200, "image/png")
    still = opened(body)
    assert (still.format, still.size, getattr(still, "n_frames", 1)) == ("PNG", (80, 80), 1)
    for query in (
        "width=96&height=96&method=crop&animated=true",
        "width=60&height=40&animated=true",
    ):
        status, body, headers = await thumbnail(hs, alice, uri, query)
        assert (status, headers["Content-Type"]) == (200, "image/webp"), body[:200]
        moving = opened(body)
        assert moving.format == "WEBP" and moving.n_frames == 3  # type: ignore[attr-defined]
    assert opened(body).size == (60, 40)
    # A still image asked for animated is still.
    png = await upload_ok(hs, alice, image_bytes((100, 100), "PNG"), "image/png")
    query = "width=32&height=32&method=crop&animated=true"
    status, body, headers = await thumbnail(hs, alice, png, query)
    assert (status, headers["Content-Type"], opened(body).size) == (200, "image/png", (32, 32))


async def test_what_cannot_be_thumbnailed(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    text = await upload_ok(hs, alice, b"just text", "text/plain")
    status, body, _ = await thumbnail(hs, alice, text, "width=32&height=32")
    assert (status, error(body)[0]) == (400, "M_UNKNOWN")
    fake = await upload_ok(hs, alice, b"\x89PNG not really", "image/png")
    status, body, _ = await thumbnail(hs, alice, fake, "width=32&height=32")
    assert (status, error(body)[0]) == (400, "M_UNKNOWN")
    png = await upload_ok(hs, alice, image_bytes((10, 10), "PNG"), "image/png")
    for query, code in (
        ("height=32", "M_MISSING_PARAM"),
        ("width=32", "M_MISSING_PARAM"),
        ("width=0&height=32", "M_INVALID_PARAM"),
        ("width=-5&height=32", "M_INVALID_PARAM"),
        ("width=abc&height=32", "M_INVALID_PARAM"),
        ("width=32&height=99999999", "M_INVALID_PARAM"),
        ("width=32&height=32&method=stretch", "M_INVALID_PARAM"),
        ("width=32&height=32&animated=maybe", "M_INVALID_PARAM"),
    ):
        status, body, _ = await thumbnail(hs, alice, png, query)
        assert (status, error(body)[0]) == (400, code), query


# -- limits --------------------------------------------------------------------------------


async def test_upload_size_limit(db_config: DatabaseConfig, tmp_path: Path) -> None:
    async with media_server(db_config, tmp_path, max_upload_size=10_000) as hs:
        alice = await hs.register("alice")
        assert await hs.ok("GET", f"{V1}/config", token=alice.token) == {"m.upload.size": 10_000}
        assert await hs.ok("GET", f"{LEGACY}/config", token=alice.token) == {
            "m.upload.size": 10_000
        }
        await upload_ok(hs, alice, b"x" * 10_000, "text/plain")
        status, result = await upload(hs, alice, b"x" * 10_001, "text/plain")
        assert (status, result["errcode"]) == (413, "M_TOO_LARGE")

        # Without a Content-Length: refused as the bytes pass the limit.
        async def body() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"y" * 1000

        async with hs.session.post(
            hs.server.make_url(f"{LEGACY}/upload"),
            data=body(),
            headers={"Authorization": f"Bearer {alice.token}"},
        ) as resp:
            assert resp.status == 413
            assert (await resp.json())["errcode"] == "M_TOO_LARGE"
        assert list((Path(hs.config.media_store()) / "staging").iterdir()) == []
        assert len(content_files(hs)) == 1


async def test_user_quota(db_config: DatabaseConfig, tmp_path: Path) -> None:
    async with media_server(db_config, tmp_path, user_quota=3000, user_quota_period=3600) as hs:
        alice = await hs.register("alice")
        bob = await hs.register("bob")
        now = [1_700_000_000.0]
        hs.process.media.clock = lambda: now[0]
        await upload_ok(hs, alice, b"a" * 1500, "text/plain")
        await upload_ok(hs, alice, b"b" * 1500, "text/plain")
        status, result = await upload(hs, alice, b"c", "text/plain")
        assert (status, result["errcode"]) == (400, "M_RESOURCE_LIMIT_EXCEEDED")
        # Asynchronous uploads count too.
        created = await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token)
        status, result = await hs.call(
            "PUT",
            f"/_matrix/media/v3/upload/{media_path(created['content_uri'])}",
            raw=b"c",
            token=alice.token,
        )
        assert (status, result["errcode"]) == (400, "M_RESOURCE_LIMIT_EXCEEDED")
        await upload_ok(hs, bob, b"d" * 3000, "text/plain")
        # The period rolls on: room again.
        now[0] += 3601
        await upload_ok(hs, alice, b"e" * 3000, "text/plain")


async def test_user_quota_holds_for_uploads_at_once(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with media_server(db_config, tmp_path, user_quota=5000) as hs:
        alice = await hs.register("alice")
        results = await asyncio.gather(
            *(upload(hs, alice, bytes([i]) * 1000, "text/plain") for i in range(10))
        )
        statuses = sorted(status for status, _ in results)
        assert statuses == [200] * 5 + [400] * 5


def png_bomb(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (grey), a few hundred bytes long."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (width + 1) * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


async def test_decompression_bombs_are_not_thumbnailed(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with media_server(db_config, tmp_path, max_image_pixels=250_000) as hs:
        alice = await hs.register("alice")
        for data in (png_bomb(30_000, 30_000), image_bytes((600, 600), "PNG")):
            uri = await upload_ok(hs, alice, data, "image/png")
            await hs.process.media.idle()
            assert await thumbnail_rows(hs, uri.rsplit("/", 1)[1]) == 0
            status, body, _ = await thumbnail(hs, alice, uri, "width=32&height=32&method=crop")
            assert (status, error(body)[0]) == (413, "M_TOO_LARGE")
            # The content itself is still there to download.
            assert await download(hs, alice, uri) == data
        uri = await upload_ok(hs, alice, image_bytes((500, 500), "PNG"), "image/png")
        status, body, _ = await thumbnail(hs, alice, uri, "width=32&height=32&method=crop")
        assert (status, opened(body).size) == (200, (32, 32))


# -- authentication, legacy endpoints, other servers --------------------------------------


async def test_v1_endpoints_need_a_token(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, image_bytes((64, 64), "PNG"), "image/png")
    for path in (
        f"{V1}/download/{media_path(uri)}",
        f"{V1}/download/{media_path(uri)}/name.png",
        f"{V1}/thumbnail/{media_path(uri)}?width=32&height=32",
        f"{V1}/config",
        f"{LEGACY}/config",
    ):
        status, body, _ = await get(hs, path)
        assert (status, error(body)[0]) == (401, "M_MISSING_TOKEN"), path
        status, body, _ = await get(hs, path, "not-a-token")
        assert (status, error(body)[0]) == (401, "M_UNKNOWN_TOKEN"), path
    status, result = await hs.call("POST", f"{LEGACY}/upload", raw=b"x")
    assert (status, result["errcode"]) == (401, "M_MISSING_TOKEN")
    status, result = await hs.call("POST", "/_matrix/media/v1/create")
    assert (status, result["errcode"]) == (401, "M_MISSING_TOKEN")


async def test_legacy_endpoints_are_frozen(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    uri = await upload_ok(hs, alice, image_bytes((64, 64), "PNG"), "image/png")
    for prefix in ("/_matrix/media/v3", "/_matrix/media/r0", "/_matrix/media/v1"):
        for token in (None, alice.token):
            status, body, _ = await get(hs, f"{prefix}/download/{media_path(uri)}", token)
            assert (status, error(body)[0]) == (404, "M_NOT_FOUND")
            status, body, _ = await thumbnail(hs, None, uri, "width=32&height=32", prefix)
            assert (status, error(body)[0]) == (404, "M_NOT_FOUND")
    # Uploads through r0 and v1 paths work as v3.
    status, result = await hs.call("POST", "/_matrix/media/r0/upload", raw=b"r0", token=alice.token)
    assert status == 200 and await download(hs, alice, result["content_uri"]) == b"r0"


async def test_legacy_endpoints_serve_when_not_frozen(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with media_server(db_config, tmp_path, enable_authenticated_media=False) as hs:
        alice = await hs.register("alice")
        data = image_bytes((64, 64), "PNG")
        uri = await upload_ok(hs, alice, data, "image/png", filename="a.png")
        status, body, headers = await get(hs, f"{LEGACY}/download/{media_path(uri)}")
        assert (status, body) == (200, data)
        assert headers["Content-Disposition"] == "inline; filename=a.png"
        assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert headers["X-Content-Type-Options"] == "nosniff"
        query = "width=32&height=32&method=crop"
        status, body, _ = await thumbnail(hs, None, uri, query, LEGACY)
        assert (status, opened(body).size) == (200, (32, 32))
        # Authenticated endpoints serve it too.
        assert await download(hs, alice, uri) == data


async def test_other_servers_and_bad_names(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    for path, expected in (
        (f"{V1}/download/matrix.org/SomeMediaId", (404, "M_NOT_FOUND")),
        (f"{V1}/thumbnail/matrix.org/SomeMediaId?width=32&height=32", (404, "M_NOT_FOUND")),
        (f"{V1}/download/{SERVER_NAME}/NoSuchMedia", (404, "M_NOT_FOUND")),
        (f"{V1}/download/{SERVER_NAME}/not%20an%20id", (404, "M_NOT_FOUND")),
        (f"{V1}/download/bad%20server/SomeMediaId", (400, "M_INVALID_PARAM")),
        (f"{V1}/preview_url?url=https://example.org", (404, "M_UNRECOGNIZED")),
        (f"{LEGACY}/preview_url?url=https://example.org", (404, "M_UNRECOGNIZED")),
    ):
        status, body, _ = await get(hs, path, alice.token)
        assert (status, error(body)[0]) == expected, path
    _, message = error((await get(hs, f"{V1}/preview_url?url=x", alice.token))[1])
    assert "URL previews are disabled" in message


async def test_bad_upload_headers(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    for headers, query in (
        ({"Content-Type": "notatype"}, ""),
        ({"Content-Type": "x" * 300 + "/y"}, ""),
        ({"Content-Type": "text/plain"}, "?filename=" + "n" * 1100),
        ({"Content-Type": "text/plain"}, "?filename=a%00b"),
    ):
        status, result = await hs.call(
            "POST", f"{LEGACY}/upload{query}", raw=b"x", token=alice.token, headers=headers
        )
        assert (status, result["errcode"]) == (400, "M_INVALID_PARAM"), (headers, query[:30])
    # No Content-Type at all: stored as application/octet-stream.
    async with hs.session.post(
        hs.server.make_url(f"{LEGACY}/upload"),
        data=b"raw",
        headers={"Authorization": f"Bearer {alice.token}", "Content-Type": ""},
    ) as resp:
        uri = (await resp.json())["content_uri"]
    _, body, headers = await get(hs, f"{V1}/download/{media_path(uri)}", alice.token)
    assert (body, headers["Content-Type"]) == (b"raw", "application/octet-stream")
