"""Where media content lives: a blob store, content addressed by its SHA-256.

The interface (:class:`BlobStore`) is what the media repository needs of a store and no
more, so that an object store (S3 and the like) is another implementation and a line
of configuration (``media.backend``), not a change to the repository:

- :attr:`BlobStore.staging` — a local directory where an upload is spooled
  (:class:`Spool`) while it arrives and is hashed; nothing there is content yet;
- :meth:`BlobStore.put` — take a finished spooled file and keep it as the content whose
  SHA-256 is ``digest``; idempotent: content stored already is not stored twice (the
  spooled file is dropped), so identical uploads share one copy;
- :meth:`BlobStore.get` — the content of ``digest`` (its size, and a local file to send
  if the store has one, else a stream of chunks), or None;
- :meth:`BlobStore.local_file` — the content as a local file for as long as the caller
  needs it (Pillow reads files): the file itself on disk, a temporary copy elsewhere;
- :meth:`BlobStore.unput_since` — the digests of the content not put since a time (a
  ``put`` of content stored already counts: it *refreshes* it);
- :meth:`BlobStore.remove_unless_put_since` — remove one such content, atomically
  unless a ``put`` refreshed it since the time (then it stays);
- :meth:`BlobStore.clean_staging` — remove spooled files left since before a time (an
  upload that died with its process).

The last three serve the orphan sweep (``MediaRepository.sweep``), and the refresh is
what makes it safe against a concurrent upload of the same content: an upload puts its
content (refreshing it if stored already) *before* it commits the row that references
it, so content the sweep finds unreferenced and not put within its grace period is
either orphaned or about to be re-put, and a re-put either refreshes it before the
removal (the removal sees that and keeps it) or finds it gone and stores it again.

An S3 store would spool locally as this one does, ``put`` with one ``PutObject`` (key:
the digest, skipped when ``HeadObject`` finds it), ``get`` as a ranged ``GetObject``
stream, and ``local_file`` by downloading to the staging directory. Its refresh would
be a ``CopyObject`` of the object onto itself (a new ``LastModified``), ``unput_since``
a ``ListObjectsV2`` filtered on ``LastModified``, and the atomic removal a copy to a
trash prefix and a conditional delete (``If-Match`` on the ETag seen), checked as below.

:class:`LocalBlobStore` keeps ``<root>/content/ab/cd/<digest>``. Invariants: a file at a
digest's path holds exactly the content of that digest, complete (it appears there by an
atomic rename of a finished file, never written in place); files are never modified.
Content whose metadata row was never committed (a crash between the two, a quota
refused at commit, a media ID expired) stays as an unreferenced file until the sweep
removes it. A file's modification time is when it was last put: written, or refreshed
by a ``put`` of the same content (``os.utime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from roomstream.errors import ContentTooLargeError

__all__ = ["Blob", "BlobStore", "LocalBlobStore", "Spool", "is_digest"]

_DIGEST = re.compile(r"[0-9a-f]{64}")
#: Bytes read from disk per chunk when streaming a blob.
CHUNK = 256 * 1024


def is_digest(value: str) -> bool:
    """Whether ``value`` is a SHA-256 in lower-case hex (a blob's key)."""
    return _DIGEST.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Blob:
    """Stored content: its size, and where to read it."""

    size: int
    #: A local file holding exactly the content (sent as it is), or None: read ``chunks``.
    path: Path | None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The content in chunks (read on a worker thread)."""
        assert self.path is not None, "a store without local files overrides chunks"
        file = await asyncio.to_thread(self.path.open, "rb")
        try:
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                yield chunk
        finally:
            file.close()


class BlobStore(Protocol):
    """Content by SHA-256 (the module docstring says what each method promises)."""

    @property
    def staging(self) -> Path: ...

    async def put(self, spooled: Path, digest: str) -> None: ...

    async def get(self, digest: str) -> Blob | None: ...

    def local_file(self, digest: str) -> AbstractAsyncContextManager[Path | None]: ...

    async def unput_since(self, cutoff: float) -> list[str]: ...

    async def remove_unless_put_since(self, digest: str, cutoff: float) -> bool: ...

    async def clean_staging(self, cutoff: float) -> int: ...


class LocalBlobStore:
    """Content as files under ``root`` (module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._staging = self.root / "staging"
        self._staging.mkdir(parents=True, exist_ok=True)

    @property
    def staging(self) -> Path:
        return self._staging

    def path_of(self, digest: str) -> Path:
        if not is_digest(digest):
            raise ValueError(f"not a SHA-256 digest: {digest!r}")
        return self.root / "content" / digest[:2] / digest[2:4] / digest

    async def put(self, spooled: Path, digest: str) -> None:
        await asyncio.to_thread(self._put, spooled, self.path_of(digest))

    @staticmethod
    def _put(spooled: Path, target: Path) -> None:
        try:
            # The same content is stored already: refresh it, so that a sweep does not
            # remove it before the caller's row referencing it is committed. Atomic
            # against the sweep's rename: this either refreshes the file before it is
            # moved (the sweep then puts it back) or finds none and stores it below.
            os.utime(target)
        except FileNotFoundError:
            pass
        else:
            spooled.unlink(missing_ok=True)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        # Atomic: a reader sees no file or the whole of it. Two puts of one digest race
        # harmlessly (the same bytes either way). The spooled file's modification time
        # is its last write: now.
        os.replace(spooled, target)

    async def get(self, digest: str) -> Blob | None:
        path = self.path_of(digest)
        try:
            size = (await asyncio.to_thread(path.stat)).st_size
        except FileNotFoundError:
            return None
        return Blob(size, path)

    @contextlib.asynccontextmanager
    async def local_file(self, digest: str) -> AsyncIterator[Path | None]:
        path = self.path_of(digest)
        yield path if await asyncio.to_thread(path.exists) else None

    async def unput_since(self, cutoff: float) -> list[str]:
        """The digests whose file was last put before ``cutoff`` (seconds since the
        epoch, as file modification times)."""
        return await asyncio.to_thread(self._unput_since, cutoff)

    def _unput_since(self, cutoff: float) -> list[str]:
        found: list[str] = []
        content = self.root / "content"
        if not content.is_dir():
            return found
        for first in os.scandir(content):
            if not first.is_dir():
                continue
            for second in os.scandir(first.path):
                if not second.is_dir():
                    continue
                for entry in os.scandir(second.path):
                    if not is_digest(entry.name):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if entry.stat().st_mtime < cutoff:
                            found.append(entry.name)
        return found

    async def remove_unless_put_since(self, digest: str, cutoff: float) -> bool:
        """Remove the content of ``digest`` unless it was put at or after ``cutoff``;
        whether it was removed (False too when it is gone already: another sweep)."""
        return await asyncio.to_thread(self._remove_unless_put_since, self.path_of(digest), cutoff)

    def _remove_unless_put_since(self, path: Path, cutoff: float) -> bool:
        # Moved aside first (atomic), then judged by the time it was last put: a put's
        # refresh lands either before the move (seen here: put back) or after it (the
        # put finds no file and stores its own copy). A download meanwhile of content
        # being put back may miss it for that instant (only content that had no row a
        # moment before: nothing older is ever moved).
        aside = self._staging / f"sweep-{secrets.token_hex(16)}"
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            return False
        try:
            put_at = aside.stat().st_mtime
        except FileNotFoundError:
            return False  # another process's staging clean-up: it was old, and is gone
        if put_at >= cutoff:
            # Same bytes either way if a put stored a copy meanwhile.
            os.replace(aside, path)
            return False
        aside.unlink(missing_ok=True)
        return True

    async def clean_staging(self, cutoff: float) -> int:
        """Remove the staging directory's files last written before ``cutoff`` (a
        spool of an upload in progress is written at least every chunk, and a
        thumbnail's is put at once); how many."""
        return await asyncio.to_thread(self._clean_staging, cutoff)

    def _clean_staging(self, cutoff: float) -> int:
        removed = 0
        for entry in os.scandir(self._staging):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed


class Spool:
    """An upload arriving: written to a new file in a staging directory as its chunks
    come, hashed and counted on the way, refused (:class:`ContentTooLargeError`) the
    moment it passes ``limit`` bytes. Memory: one chunk at a time.

    Use as a context manager: the file is removed on leaving unless :meth:`keep` handed
    it over (to :meth:`BlobStore.put`, which takes it)."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.path = directory / f"upload-{secrets.token_hex(16)}"
        self.limit = limit
        self.size = 0
        self._hash = hashlib.sha256()
        self._file: IO[bytes] | None = None
        self._kept = False

    def __enter__(self) -> Spool:
        self._file = self.path.open("xb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
        if not self._kept:
            self.path.unlink(missing_ok=True)

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise ContentTooLargeError(f"upload larger than {self.limit} bytes")
        self._hash.update(chunk)
        assert self._file is not None
        # A write to the page cache: microseconds for a network-sized chunk.
        self._file.write(chunk)

    def finish(self) -> str:
        """Close the file; the content's digest."""
        assert self._file is not None
        self._file.close()
        return self._hash.hexdigest()

    def keep(self) -> None:
        """The file now belongs to whoever it was handed to."""
        self._kept = True
