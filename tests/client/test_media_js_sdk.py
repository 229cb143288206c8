"""matrix-js-sdk and the media repository against a real ``roomstream run`` process, on
SQLite and PostgreSQL: one user uploads an image and sends it to a room; the other
receives it through sync and downloads it and a thumbnail through the authenticated
endpoints. The bytes and the thumbnail's dimensions are checked here, with Pillow."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_uploads_and_downloads_an_image(
    running_server: RunningServer, tmp_path: Path
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    picture = io.BytesIO()
    Image.new("RGB", (640, 400), "orange").save(picture, "PNG")
    image_path = tmp_path / "picture.png"
    image_path.write_bytes(picture.getvalue())
    out = tmp_path / "out"
    out.mkdir()
    report = await run_script("media.mjs", running_server.url, str(image_path), str(out))
    assert report["mxc"].startswith(f"mxc://{running_server.server_name}/")
    assert report["received_url"] == report["mxc"]
    assert "/_matrix/client/v1/media/download/" in report["download_url"]
    assert (out / "download.bin").read_bytes() == picture.getvalue()
    assert report["download_type"] == "image/png"
    assert report["download_disposition"] == "inline; filename=picture.png"
    assert report["thumbnail_type"] == "image/png"
    thumbnail = Image.open(out / "thumbnail.bin")
    assert (thumbnail.format, thumbnail.size) == ("PNG", (96, 96))
    assert thumbnail.convert("RGB").getpixel((48, 48)) == (255, 165, 0)
