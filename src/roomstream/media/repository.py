"""The media repository: uploads, asynchronous uploads, downloads and thumbnails of this
server's media, over a blob store (:mod:`~roomstream.media.blobs`) and the ``media`` /
``media_thumbnails`` tables (:mod:`~roomstream.media.metadata`).

What it promises, whatever the HTTP layer above does:

- a media ID is 24 random letters from :mod:`secrets` (about 137 bits: unguessable);
- an upload is refused as it arrives once over ``max_upload_size`` (413), never held in
  memory beyond one chunk, and counted against the uploader's quota (bytes per rolling
  period) in the transaction that records it, under a per-user lock, so two uploads at
  once cannot both pass a quota that only one fits;
- an asynchronous upload's media ID is given content at most once: by its creator,
  before it expires; a second upload is 409 ``M_CANNOT_OVERWRITE_MEDIA``;
- an image's default thumbnails are made after its upload is answered, on a worker
  thread; a thumbnail is never served before it is complete and recorded;
- a download of a pending media ID waits up to its ``timeout_ms`` for the content (woken
  at once by an upload on this process, else it looks every :data:`PENDING_POLL` s);
- media uploaded while ``enable_authenticated_media`` is on is never served to a
  request that did not authenticate (the legacy endpoints): 404, as Synapse;
- other servers' media is 404 (no federation);
- content no row names any more is removed by :meth:`MediaRepository.sweep` (run every
  ``media.sweep_interval`` seconds), never while an upload of the same content may still
  commit a row naming it (see :mod:`~roomstream.media.blobs`), and expired
  asynchronous-upload reservations are deleted by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import string
import time
from collections.abc import AsyncIterable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from roomstream.config import MediaConfig
from roomstream.errors import (
    BadRequestError,
    CannotOverwriteMediaError,
    ContentTooLargeError,
    ForbiddenError,
    InvalidParamError,
    LimitExceededError,
    NotFoundError,
    NotYetUploadedError,
    ResourceLimitExceededError,
)
from roomstream.grammar import is_server_name
from roomstream.media import metadata
from roomstream.media.blobs import Blob, BlobStore, Spool
from roomstream.media.metadata import Content, MediaRow, ThumbnailRow
from roomstream.media.safety import check_media_type, check_upload_name
from roomstream.media.thumbnails import (
    DEFAULT_SIZES,
    ImageInfo,
    Method,
    NotAnImage,
    TooManyPixels,
    probe,
    render,
    target_size,
)
from roomstream.storage import Database, Transaction

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "Download",
    "MediaRepository",
    "SweepResult",
    "is_media_id",
]

logger = logging.getLogger(__name__)

#: How long a download waits for a pending upload by default, and at most (Synapse's).
DEFAULT_TIMEOUT_MS = 20_000
MAX_TIMEOUT_MS = 60_000
#: Seconds between looks at a pending media ID uploaded to by another process.
PENDING_POLL = 0.5
MEDIA_ID_LENGTH = 24
_MEDIA_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
#: The content types thumbnails are made of (Synapse's THUMBNAIL_SUPPORTED_MEDIA_FORMAT_MAP).
THUMBNAIL_TYPES = frozenset({"image/jpeg", "image/jpg", "image/png", "image/gif", "image/webp"})
#: Largest width or height a thumbnail may be asked for (bigger is refused, 400).
MAX_THUMBNAIL_SIDE = 10_000
#: Upload chunks read at a time.
CHUNK = 64 * 1024
#: Candidate blobs checked against the rows per statement by the sweep.
_SWEEP_BATCH = 500


def is_media_id(value: str) -> bool:
    """Whether ``value`` can be a media ID (the spec's ``[A-Za-z0-9_-]+``)."""
    return 0 < len(value) <= 255 and all(c in _MEDIA_ID_CHARS for c in value)


def new_media_id() -> str:
    return "".join(secrets.choice(string.ascii_letters) for _ in range(MEDIA_ID_LENGTH))


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one :meth:`MediaRepository.sweep` removed."""

    #: Asynchronous-upload reservations deleted (expired without content).
    expired_reservations: int
    #: Blobs deleted (no media or thumbnail row named them, not put within the grace).
    orphan_blobs: int
    #: Spooled files deleted from staging (uploads that died mid-way).
    staged_files: int


@dataclass(frozen=True, slots=True)
class Download:
    """Content to answer with."""

    blob: Blob
    media_type: str
    #: The name for ``Content-Disposition`` (None: none).
    name: str | None


class MediaRepository:
    def __init__(
        self,
        db: Database,
        server_name: str,
        config: MediaConfig,
        store: BlobStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.server_name = server_name
        self.config = config
        self.store = store
        self.clock = clock
        #: Media IDs being uploaded to on this process (a second PUT at once is a 409).
        self._uploading: set[str] = set()
        #: Downloads waiting for a pending media ID, woken when it is uploaded here.
        self._waiters: dict[str, asyncio.Event] = {}
        #: Thumbnails being made on this process, so that one request makes each.
        self._making: dict[tuple[str, str, int, int, bool], asyncio.Lock] = {}
        #: The default thumbnails of uploads, being made after the upload was answered.
        self._pregenerating: dict[str, asyncio.Task[None]] = {}
        #: The periodic sweep (:meth:`start_sweeping`), if running.
        self._sweeper: asyncio.Task[None] | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def limits(self) -> dict[str, int]:
        """``GET /media/config``."""
        return {"m.upload.size": self.config.max_upload_size}

    def mxc(self, media_id: str) -> str:
        return f"mxc://{self.server_name}/{media_id}"

    # -- uploads ---------------------------------------------------------------------------

    async def upload(
        self,
        user_id: str,
        chunks: AsyncIterable[bytes],
        *,
        media_type: str | None,
        upload_name: str | None,
        declared_length: int | None,
    ) -> str:
        """Store an upload as a new media ID; its ``mxc://`` URI."""
        media_type = check_media_type(media_type)
        upload_name = check_upload_name(upload_name)
        await self._check_size(user_id, declared_length)
        media_id = new_media_id()
        content = await self._receive(chunks, media_type, upload_name)
        now = self._now_ms()
        authenticated = self.config.enable_authenticated_media

        def record(t: Transaction) -> None:
            self._check_quota_txn(t, user_id, content.media_length, now)
            metadata.insert_media_txn(
                t, media_id, user_id, now, content, authenticated=authenticated
            )

        await self.db.run_interaction("media_upload", record)
        self._pregenerate(media_id, content)
        return self.mxc(media_id)

    async def create(self, user_id: str) -> tuple[str, int]:
        """A media ID to upload to later: (its URI, when it expires unused, in ms)."""
        now = self._now_ms()
        expiry_ms = int(self.config.unused_expiration_time * 1000)
        media_id = new_media_id()
        limit = self.config.max_pending_uploads
        authenticated = self.config.enable_authenticated_media

        def create(t: Transaction) -> None:
            t.lock_exclusively(f"media_user:{user_id}")
            pending, oldest = metadata.count_pending_txn(t, user_id, now - expiry_ms)
            if pending >= limit:
                retry = (oldest or now) + expiry_ms - now
                raise LimitExceededError(
                    f"{pending} media IDs await their upload (at most {limit})",
                    retry_after_ms=retry,
                )
            metadata.insert_pending_txn(t, media_id, user_id, now, authenticated=authenticated)

        await self.db.run_interaction("media_create", create)
        return self.mxc(media_id), now + expiry_ms

    async def upload_to(
        self,
        user_id: str,
        server_name: str,
        media_id: str,
        chunks: AsyncIterable[bytes],
        *,
        media_type: str | None,
        upload_name: str | None,
        declared_length: int | None,
    ) -> None:
        """Give a media ID from :meth:`create` its content (rules: the module docstring)."""
        self._check_server_name(server_name)
        if server_name != self.server_name or not is_media_id(media_id):
            raise NotFoundError("no such media ID on this server")
        media_type = check_media_type(media_type)
        upload_name = check_upload_name(upload_name)
        if media_id in self._uploading:
            raise CannotOverwriteMediaError("this media ID is being uploaded to")
        self._uploading.add(media_id)
        try:
            self._check_pending(await self._row(media_id), user_id)
            await self._check_size(user_id, declared_length)
            content = await self._receive(chunks, media_type, upload_name)
            now = self._now_ms()

            def complete(t: Transaction) -> None:
                # Read again: another process may have completed it meanwhile.
                self._check_pending(metadata.get_media_txn(t, media_id), user_id)
                self._check_quota_txn(t, user_id, content.media_length, now)
                if not metadata.complete_pending_txn(t, media_id, user_id, now, content):
                    raise CannotOverwriteMediaError("this media ID already has content")

            await self.db.run_interaction("media_upload_to", complete)
        finally:
            self._uploading.discard(media_id)
        waiter = self._waiters.pop(media_id, None)
        if waiter is not None:
            waiter.set()
        self._pregenerate(media_id, content)

    def _check_pending(self, row: MediaRow | None, user_id: str) -> None:
        if row is None:
            raise NotFoundError("no such media ID")
        if row.user_id != user_id:
            raise ForbiddenError("only the creator of a media ID may upload to it")
        if row.upload_ts is not None:
            raise CannotOverwriteMediaError("this media ID already has content")
        if self._expired(row):
            raise NotFoundError("this media ID has expired")

    def _expired(self, row: MediaRow) -> bool:
        expiry_ms = int(self.config.unused_expiration_time * 1000)
        return row.upload_ts is None and row.created_ts + expiry_ms <= self._now_ms()

    async def _check_size(self, user_id: str, declared: int | None) -> None:
        """Refuse early what the declared length already shows is too much."""
        if declared is None:
            return
        if declared > self.config.max_upload_size:
            raise ContentTooLargeError(
                f"upload of {declared} bytes is over the limit ({self.config.max_upload_size})"
            )
        if self.config.user_quota is not None:
            now = self._now_ms()
            await self.db.run_interaction(
                "media_quota", self._check_quota_txn, user_id, declared, now, lock=False
            )

    def _check_quota_txn(
        self, t: Transaction, user_id: str, length: int, now: int, *, lock: bool = True
    ) -> None:
        quota = self.config.user_quota
        if quota is None:
            return
        if lock:
            t.lock_exclusively(f"media_user:{user_id}")
        since = now - int(self.config.user_quota_period * 1000)
        used = metadata.uploaded_bytes_since_txn(t, user_id, since)
        if used + length > quota:
            raise ResourceLimitExceededError(
                f"media upload limit exceeded: {used} of {quota} bytes used in the period,"
                f" this upload is {length}"
            )

    async def _receive(
        self, chunks: AsyncIterable[bytes], media_type: str, upload_name: str | None
    ) -> Content:
        """Spool the upload, read what it is (if an image), and put it in the store."""
        with ExitStack() as stack:
            spool = stack.enter_context(Spool(self.store.staging, self.config.max_upload_size))
            async for chunk in chunks:
                spool.write(chunk)
            digest = spool.finish()
            info = None
            if _bare(media_type) in THUMBNAIL_TYPES:
                info = await asyncio.to_thread(
                    _probe_or_none, spool.path, self.config.max_image_pixels
                )
            await self.store.put(spool.path, digest)
            spool.keep()
        return Content(
            media_type,
            upload_name,
            spool.size,
            digest,
            None if info is None else info.width,
            None if info is None else info.height,
            False if info is None else info.animated,
        )

    # -- downloads -------------------------------------------------------------------------

    def _check_server_name(self, server_name: str) -> None:
        if not is_server_name(server_name):
            raise InvalidParamError(f"not a server name: {server_name[:300]!r}")

    async def _row(self, media_id: str) -> MediaRow | None:
        return await self.db.run_interaction("media_get", metadata.get_media_txn, media_id)

    async def _uploaded(
        self, server_name: str, media_id: str, *, authenticated: bool, timeout_ms: int
    ) -> MediaRow:
        """The media row once it has content (waiting up to ``timeout_ms``)."""
        self._check_server_name(server_name)
        if server_name != self.server_name:
            raise NotFoundError("media of other servers is not available here (no federation)")
        if not is_media_id(media_id):
            raise NotFoundError("no such media")
        deadline = time.monotonic() + min(max(timeout_ms, 0), MAX_TIMEOUT_MS) / 1000
        while True:
            row = await self._row(media_id)
            if row is None or self._expired(row):
                raise NotFoundError("no such media")
            if row.authenticated and not authenticated and self.config.enable_authenticated_media:
                # Synapse's freeze: uploaded with authenticated media on, so served only
                # to requests that authenticate.
                raise NotFoundError("no such media (use the authenticated endpoints)")
            if row.upload_ts is not None:
                return row
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotYetUploadedError("the media has not been uploaded yet")
            waiter = self._waiters.setdefault(media_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), min(left, PENDING_POLL))

    async def download(
        self,
        server_name: str,
        media_id: str,
        *,
        name: str | None = None,
        authenticated: bool,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> Download:
        """The content of ``mxc://server_name/media_id`` (named ``name`` if given, else
        as uploaded)."""
        name = check_upload_name(name)
        row = await self._uploaded(
            server_name, media_id, authenticated=authenticated, timeout_ms=timeout_ms
        )
        assert row.content_hash is not None and row.media_type is not None
        blob = await self.store.get(row.content_hash)
        if blob is None:
            logger.error("media %s: content %s missing from the store", media_id, row.content_hash)
            raise NotFoundError("the media's content is missing")
        return Download(blob, row.media_type, name or row.upload_name)

    async def thumbnail(
        self,
        server_name: str,
        media_id: str,
        width: int,
        height: int,
        method: str,
        *,
        animated: bool = False,
        authenticated: bool,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> Download:
        """A thumbnail of about ``width`` x ``height`` (never smaller unless the original
        is): one cached if it fits, else made now and cached."""
        if method not in ("crop", "scale"):
            raise InvalidParamError("method must be crop or scale")
        for side, value in (("width", width), ("height", height)):
            if not 1 <= value <= MAX_THUMBNAIL_SIDE:
                raise InvalidParamError(f"{side} must be in 1..{MAX_THUMBNAIL_SIDE}")
        row = await self._uploaded(
            server_name, media_id, authenticated=authenticated, timeout_ms=timeout_ms
        )
        if row.width is None or row.height is None or row.content_hash is None:
            raise BadRequestError("this media cannot be thumbnailed (not an image)")
        if row.width * row.height > self.config.max_image_pixels:
            raise ContentTooLargeError(
                f"image of {row.width}x{row.height} is too large to thumbnail"
            )
        making = self._pregenerating.get(media_id)
        if making is not None:
            # Its default thumbnails are being made here: one of them may serve.
            await asyncio.shield(making)
        source = ImageInfo(row.width, row.height, row.animated, "")
        kind: Method = "crop" if method == "crop" else "scale"
        size = target_size(kind, width, height, source)
        moving = animated and row.animated
        chosen = _choose(await self._thumbnails(media_id), kind, size, moving)
        if chosen is None:
            key = (media_id, kind, *size, moving)
            lock = self._making.setdefault(key, asyncio.Lock())
            try:
                async with lock:
                    chosen = _choose(await self._thumbnails(media_id), kind, size, moving)
                    if chosen is None:
                        chosen = await self._make(media_id, row.content_hash, kind, size, moving)
            finally:
                if not lock.locked():
                    self._making.pop(key, None)
        blob = await self.store.get(chosen.content_hash)
        if blob is None:
            raise NotFoundError("the thumbnail's content is missing")
        return Download(blob, chosen.media_type, None)

    async def _thumbnails(self, media_id: str) -> list[ThumbnailRow]:
        return await self.db.run_interaction("media_thumbnails", metadata.thumbnails_txn, media_id)

    async def _make(
        self, media_id: str, digest: str, method: Method, size: tuple[int, int], moving: bool
    ) -> ThumbnailRow:
        made = await self._render(media_id, digest, [(method, *size)], animated=moving)
        if not made:
            raise BadRequestError("this media cannot be thumbnailed")
        return made[0]

    async def _render(
        self,
        media_id: str,
        digest: str,
        wanted: list[tuple[Method, int, int]],
        *,
        animated: bool,
    ) -> list[ThumbnailRow]:
        """Make, store and record thumbnails of the content ``digest``."""
        async with self.store.local_file(digest) as path:
            if path is None:
                raise NotFoundError("the media's content is missing")
            try:
                rendered = await asyncio.to_thread(
                    render,
                    path,
                    wanted,
                    animated=animated,
                    max_pixels=self.config.max_image_pixels,
                )
            except TooManyPixels as exc:
                raise ContentTooLargeError(f"image too large to thumbnail: {exc}") from None
            except NotAnImage:
                raise BadRequestError("this media cannot be thumbnailed") from None
        rows = []
        for (method, _, _), thumb in zip(wanted, rendered, strict=True):
            thumb_digest = await asyncio.to_thread(_store_bytes_path, self.store, thumb.data)
            await self.store.put(thumb_digest[1], thumb_digest[0])
            rows.append(
                ThumbnailRow(
                    method,
                    thumb.width,
                    thumb.height,
                    thumb.animated,
                    thumb.media_type,
                    len(thumb.data),
                    thumb_digest[0],
                )
            )

        def record(t: Transaction) -> None:
            for row in rows:
                metadata.insert_thumbnail_txn(t, media_id, row)

        await self.db.run_interaction("media_thumbnail_add", record)
        return rows

    def _pregenerate(self, media_id: str, content: Content) -> None:
        """Make the default thumbnails of an upload in the background: the upload is
        answered without waiting for them (about 150 ms of Pillow for a 1 MB image). A
        thumbnail asked for on this process meanwhile waits for them; on another
        process it is made on demand."""
        if content.width is None:
            return
        task = asyncio.create_task(self._make_default_thumbnails(media_id, content))
        self._pregenerating[media_id] = task
        task.add_done_callback(lambda _: self._pregenerating.pop(media_id, None))

    async def idle(self) -> None:
        """Wait until no default thumbnails are being made (tests, shutdown)."""
        while self._pregenerating:
            await asyncio.gather(*self._pregenerating.values(), return_exceptions=True)

    def close(self) -> None:
        """Stop making thumbnails (those not made are made when asked for) and sweeping."""
        for task in list(self._pregenerating.values()):
            task.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # -- the orphan sweep ------------------------------------------------------------------

    async def sweep(self, now: float) -> SweepResult:
        """Remove what nothing refers to any more, as of ``now`` (seconds since the epoch):

        1. the asynchronous-upload reservations created ``unused_expiration_time`` or
           more before ``now`` and never given content (their rows; a late upload to
           one is 404 as it was already once expired);
        2. the blobs no ``media`` or ``media_thumbnails`` row names that were not put in
           the ``orphan_grace`` seconds before ``now`` (content of uploads whose row was
           never committed: a crash, a quota refused at commit, a reservation that
           expired);
        3. files left in the staging directory for as long (uploads that died mid-way).

        Safe against a concurrent upload of the same content, on this process or
        another: an upload puts its content (which refreshes a stored copy) before it
        commits the row naming it, and a blob is removed only if it was not put within
        the grace, judged atomically with the removal (``remove_unless_put_since``), so
        an upload that found the content stored either refreshed it first (it stays) or
        stores it again. This relies on an upload committing its row within
        ``orphan_grace`` of putting its content (it does so at once; the grace is an
        hour by default). Concurrent sweeps (several processes) are safe: each removal
        happens once."""
        expired_before = int((now - self.config.unused_expiration_time) * 1000)
        expired = await self.db.run_interaction(
            "media_sweep_reservations", metadata.delete_expired_pending_txn, expired_before
        )
        cutoff = now - self.config.orphan_grace
        candidates = await self.store.unput_since(cutoff)
        removed = 0
        for start in range(0, len(candidates), _SWEEP_BATCH):
            batch = candidates[start : start + _SWEEP_BATCH]
            named = await self.db.run_interaction(
                "media_sweep_referenced", metadata.referenced_txn, batch
            )
            for digest in batch:
                if digest not in named and await self.store.remove_unless_put_since(digest, cutoff):
                    removed += 1
        staged = await self.store.clean_staging(cutoff)
        if expired or removed or staged:
            logger.info(
                "media sweep: %d expired reservations, %d orphan blobs, %d staged files removed",
                expired,
                removed,
                staged,
            )
        return SweepResult(expired, removed, staged)

    def start_sweeping(self) -> None:
        """Run :meth:`sweep` every ``media.sweep_interval`` seconds (none if it is null)
        until :meth:`close`. A failed sweep is logged and tried again next time."""
        interval = self.config.sweep_interval
        if interval is None or self._sweeper is not None:
            return
        self._sweeper = asyncio.create_task(self._sweep_every(interval))

    async def _sweep_every(self, interval: float) -> None:
        while True:
            # A period, not a synchronisation: the sweep is due every `interval` seconds.
            await asyncio.sleep(interval)
            try:
                await self.sweep(self.clock())
            except Exception:
                logger.warning("media sweep failed (tried again later)", exc_info=True)

    async def _make_default_thumbnails(self, media_id: str, content: Content) -> None:
        """The thumbnails of :data:`DEFAULT_SIZES`, made after an image is uploaded
        (static; animated ones are made when asked for). Failing here fails nothing: a
        thumbnail missing is made when asked for."""
        if content.width is None or content.height is None:
            return
        if content.width * content.height > self.config.max_image_pixels:
            return
        source = ImageInfo(content.width, content.height, content.animated, "")
        wanted: list[tuple[Method, int, int]] = []
        for width, height, method in DEFAULT_SIZES:
            key = (method, *target_size(method, width, height, source))
            if key not in wanted:
                wanted.append(key)
        try:
            await self._render(media_id, content.content_hash, wanted, animated=False)
        except Exception:
            logger.warning("thumbnails of %s not made at upload", media_id, exc_info=True)


def _bare(media_type: str) -> str:
    return media_type.split(";", 1)[0].strip().lower()


def _probe_or_none(path: Path, max_pixels: int) -> ImageInfo | None:
    try:
        return probe(path, max_pixels)
    except NotAnImage:
        return None


def _store_bytes_path(store: BlobStore, data: bytes) -> tuple[str, Path]:
    """Spool ``data`` (a thumbnail) into the store's staging directory: (digest, path)."""
    with Spool(store.staging, len(data)) as spool:
        spool.write(data)
        digest = spool.finish()
        spool.keep()
    return digest, spool.path


def _choose(
    thumbnails: list[ThumbnailRow], method: Method, size: tuple[int, int], animated: bool
) -> ThumbnailRow | None:
    """The smallest cached thumbnail that serves ``method`` at ``size``: of that method
    and animation, at least as large in both sides, and for ``crop`` of the same aspect."""
    width, height = size
    fits = [
        t
        for t in thumbnails
        if t.method == method
        and t.animated == animated
        and t.width >= width
        and t.height >= height
        and (method == "scale" or t.width * height == t.height * width)
    ]
    return min(fits, key=lambda t: (t.width * t.height, t.media_length), default=None)
