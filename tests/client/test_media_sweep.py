"""The orphan media sweep (``MediaRepository.sweep``) on both engines: expired
asynchronous-upload reservations are deleted, blobs no media or thumbnail row names are
removed once out of the grace period, staging leftovers too; what rows name stays
served; and an upload of the same content racing the sweep keeps its content."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roomstream.media import LocalBlobStore
from roomstream.media.repository import MediaRepository, SweepResult
from roomstream.storage import DatabaseConfig
from tests.support.homeserver import Homeserver
from tests.support.media import (
    download,
    image_bytes,
    media_path,
    media_server,
    thumbnail,
    thumbnail_rows,
    upload_ok,
)

HOUR = 3600.0


@pytest.fixture
async def hs(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Homeserver]:
    # No periodic sweep: the tests run it themselves, with the time they choose.
    async with media_server(db_config, tmp_path, sweep_interval=None) as server:
        yield server


def store_of(hs: Homeserver) -> LocalBlobStore:
    store = hs.process.media.store
    assert isinstance(store, LocalBlobStore)
    return store


async def put_without_row(store: LocalBlobStore, data: bytes) -> str:
    """Content stored with no row naming it: an upload whose commit never happened."""
    spooled = store.staging / f"upload-test-{len(data)}-{data[:4].hex()}"
    spooled.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    await store.put(spooled, digest)
    return digest


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look last written ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


async def pending_rows(hs: Homeserver) -> set[str]:
    rows = await hs.engine.db.run_interaction(
        "test_pending", lambda t: t.query("SELECT media_id FROM media WHERE upload_ts IS NULL")
    )
    return {str(r[0]) for r in rows}


async def test_the_sweep_removes_what_nothing_names(hs: Homeserver) -> None:
    alice = await hs.register("alice")
    media: MediaRepository = hs.process.media
    store = store_of(hs)
    # A reservation made two days ago (expired) and one made now.
    real = media.clock
    media.clock = lambda: real() - 2 * 86_400
    expired = (await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token))["content_uri"]
    media.clock = real
    fresh = (await hs.ok("POST", "/_matrix/media/v1/create", token=alice.token))["content_uri"]
    # Named content: a file, and an image with its default thumbnails.
    text = await upload_ok(hs, alice, b"named content", "text/plain")
    image = await upload_ok(hs, alice, image_bytes((640, 480), "PNG"), "image/png")
    await media.idle()
    assert await thumbnail_rows(hs, media_path(image).split("/")[1]) > 0
    orphan = await put_without_row(store, b"nobody names this")
    young_orphan = await put_without_row(store, b"nobody names this yet")
    leftover = store.staging / "upload-died-midway"
    leftover.write_bytes(b"half an upload")
    for path in (store.root / "content").rglob("*"):
        if path.is_file() and path.name != young_orphan:
            age(path, 2 * HOUR)
    age(leftover, 2 * HOUR)

    result = await media.sweep(time.time())

    assert result == SweepResult(expired_reservations=1, orphan_blobs=1, staged_files=1)
    assert not store.path_of(orphan).exists()
    assert store.path_of(young_orphan).exists()  # within the grace: maybe not orphaned yet
    assert not leftover.exists()
    assert await pending_rows(hs) == {media_path(fresh).split("/")[1]}
    assert media_path(expired).split("/")[1] not in await pending_rows(hs)
    # What rows name is still served, thumbnails included.
    assert await download(hs, alice, text) == b"named content"
    status, _, _ = await thumbnail(hs, alice, image, "width=32&height=32&method=scale")
    assert status == 200
    # Nothing more to do: a second sweep removes nothing.
    assert await media.sweep(time.time()) == SweepResult(0, 0, 0)
    # Once the grace has passed, the young orphan goes too.
    assert (await media.sweep(time.time() + 2 * HOUR)).orphan_blobs == 1
    assert not store.path_of(young_orphan).exists()


async def test_an_upload_racing_the_sweep_keeps_its_content(hs: Homeserver) -> None:
    """The race: the sweep finds a blob unreferenced and old; before it removes it, an
    upload of the same bytes finds the blob stored (so stores no copy) and commits its
    row. The upload's put refreshed the blob, so the removal keeps it."""
    alice = await hs.register("alice")
    media: MediaRepository = hs.process.media
    store = store_of(hs)
    data = b"the same bytes, uploaded again"
    digest = await put_without_row(store, data)
    age(store.path_of(digest), 2 * HOUR)
    uploaded: list[str] = []
    remove = store.remove_unless_put_since

    async def upload_first(found: str, cutoff: float) -> bool:
        uploaded.append(await upload_ok(hs, alice, data, "text/plain"))
        return await remove(found, cutoff)

    store.remove_unless_put_since = upload_first  # type: ignore[method-assign]
    try:
        result = await media.sweep(time.time())
    finally:
        del store.remove_unless_put_since
    assert result.orphan_blobs == 0 and len(uploaded) == 1
    assert store.path_of(digest).exists()
    assert await download(hs, alice, uploaded[0]) == data


async def test_a_put_after_the_removal_stores_the_content_again(tmp_path: Path) -> None:
    """The other order: the sweep removed the blob first; the upload then finds none and
    stores its own copy (its spool is not dropped)."""
    store = LocalBlobStore(tmp_path)
    digest = await put_without_row(store, b"content")
    age(store.path_of(digest), 2 * HOUR)
    assert await store.remove_unless_put_since(digest, time.time() - HOUR)
    assert not store.path_of(digest).exists()
    # A second removal (another process's sweep) finds nothing to do.
    assert not await store.remove_unless_put_since(digest, time.time() - HOUR)
    await put_without_row(store, b"content")
    assert store.path_of(digest).read_bytes() == b"content"
    assert list(store.staging.iterdir()) == []


async def test_a_refreshed_blob_is_put_back(tmp_path: Path) -> None:
    """A put of stored content refreshes it: then it is not swept, judged after the
    move that makes the removal atomic (and put back where it was)."""
    store = LocalBlobStore(tmp_path)
    digest = await put_without_row(store, b"content")
    age(store.path_of(digest), 2 * HOUR)
    cutoff = time.time() - HOUR
    assert await store.unput_since(cutoff) == [digest]
    await put_without_row(store, b"content")  # refreshes: the spool is dropped
    assert await store.unput_since(cutoff) == []
    assert not await store.remove_unless_put_since(digest, cutoff)
    assert store.path_of(digest).read_bytes() == b"content"
    assert list(store.staging.iterdir()) == []
