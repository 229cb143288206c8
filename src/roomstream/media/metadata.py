"""SQL for the media repository's tables, ``media`` and ``media_thumbnails`` (written
only here). Every function runs in the caller's transaction; the same SQL on both
engines."""

from __future__ import annotations

from dataclasses import dataclass

from roomstream.storage import Transaction

__all__ = [
    "MediaRow",
    "ThumbnailRow",
    "complete_pending_txn",
    "count_pending_txn",
    "delete_expired_pending_txn",
    "get_media_txn",
    "insert_media_txn",
    "insert_pending_txn",
    "insert_thumbnail_txn",
    "referenced_txn",
    "thumbnails_txn",
    "uploaded_bytes_since_txn",
]


@dataclass(frozen=True, slots=True)
class MediaRow:
    media_id: str
    user_id: str
    created_ts: int
    #: None while an asynchronous upload is pending (and every content field is None).
    upload_ts: int | None
    media_type: str | None
    upload_name: str | None
    media_length: int | None
    content_hash: str | None
    width: int | None
    height: int | None
    animated: bool
    authenticated: bool


@dataclass(frozen=True, slots=True)
class ThumbnailRow:
    method: str
    width: int
    height: int
    animated: bool
    media_type: str
    media_length: int
    content_hash: str


@dataclass(frozen=True, slots=True)
class Content:
    """What an upload stores in a media row."""

    media_type: str
    upload_name: str | None
    media_length: int
    content_hash: str
    width: int | None
    height: int | None
    animated: bool


_COLUMNS = (
    "media_id, user_id, created_ts, upload_ts, media_type, upload_name, media_length,"
    " content_hash, width, height, animated, authenticated"
)


def get_media_txn(t: Transaction, media_id: str) -> MediaRow | None:
    row = t.query_one(f"SELECT {_COLUMNS} FROM media WHERE media_id = ?", (media_id,))
    if row is None:
        return None
    return MediaRow(
        str(row[0]),
        str(row[1]),
        int(row[2]),
        None if row[3] is None else int(row[3]),
        row[4],
        row[5],
        None if row[6] is None else int(row[6]),
        row[7],
        None if row[8] is None else int(row[8]),
        None if row[9] is None else int(row[9]),
        bool(row[10]),
        bool(row[11]),
    )


def insert_media_txn(
    t: Transaction,
    media_id: str,
    user_id: str,
    now_ms: int,
    content: Content,
    *,
    authenticated: bool,
) -> None:
    t.execute(
        f"INSERT INTO media ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            media_id,
            user_id,
            now_ms,
            now_ms,
            content.media_type,
            content.upload_name,
            content.media_length,
            content.content_hash,
            content.width,
            content.height,
            content.animated,
            authenticated,
        ),
    )


def insert_pending_txn(
    t: Transaction, media_id: str, user_id: str, now_ms: int, *, authenticated: bool
) -> None:
    t.execute(
        "INSERT INTO media (media_id, user_id, created_ts, animated, authenticated)"
        " VALUES (?, ?, ?, ?, ?)",
        (media_id, user_id, now_ms, False, authenticated),
    )


def complete_pending_txn(
    t: Transaction, media_id: str, user_id: str, now_ms: int, content: Content
) -> bool:
    """Give the pending media ID its content; False if it is not pending (any more) or
    not ``user_id``'s: the one writer that completes it is the one this returns True to."""
    t.execute(
        "UPDATE media SET upload_ts = ?, media_type = ?, upload_name = ?, media_length = ?,"
        " content_hash = ?, width = ?, height = ?, animated = ?"
        " WHERE media_id = ? AND user_id = ? AND upload_ts IS NULL",
        (
            now_ms,
            content.media_type,
            content.upload_name,
            content.media_length,
            content.content_hash,
            content.width,
            content.height,
            content.animated,
            media_id,
            user_id,
        ),
    )
    return t.rowcount == 1


def count_pending_txn(t: Transaction, user_id: str, since_ms: int) -> tuple[int, int | None]:
    """(how many of the user's media IDs created after ``since_ms`` await their upload,
    the oldest one's creation time)."""
    row = t.query_one(
        "SELECT COUNT(*), MIN(created_ts) FROM media"
        " WHERE user_id = ? AND upload_ts IS NULL AND created_ts > ?",
        (user_id, since_ms),
    )
    return int(row[0]), None if row[1] is None else int(row[1])


def uploaded_bytes_since_txn(t: Transaction, user_id: str, since_ms: int) -> int:
    row = t.query_one(
        "SELECT COALESCE(SUM(media_length), 0) FROM media WHERE user_id = ? AND upload_ts > ?",
        (user_id, since_ms),
    )
    return int(row[0])


def thumbnails_txn(t: Transaction, media_id: str) -> list[ThumbnailRow]:
    rows = t.query(
        "SELECT method, width, height, animated, media_type, media_length, content_hash"
        " FROM media_thumbnails WHERE media_id = ?",
        (media_id,),
    )
    return [
        ThumbnailRow(str(r[0]), int(r[1]), int(r[2]), bool(r[3]), str(r[4]), int(r[5]), str(r[6]))
        for r in rows
    ]


def insert_thumbnail_txn(t: Transaction, media_id: str, thumbnail: ThumbnailRow) -> None:
    """Record a thumbnail; one made twice at once (two processes) is recorded once, and
    is the same image either way."""
    t.execute(
        "INSERT INTO media_thumbnails (media_id, method, width, height, animated, media_type,"
        " media_length, content_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (media_id, method, width, height, animated) DO NOTHING",
        (
            media_id,
            thumbnail.method,
            thumbnail.width,
            thumbnail.height,
            thumbnail.animated,
            thumbnail.media_type,
            thumbnail.media_length,
            thumbnail.content_hash,
        ),
    )


def delete_expired_pending_txn(t: Transaction, created_before_ms: int) -> int:
    """Delete the media IDs created before ``created_before_ms`` that never got their
    upload (expired asynchronous-upload reservations); how many. A completion racing
    this is refused by its own re-read of the row (gone, or expired either way)."""
    t.execute("DELETE FROM media WHERE upload_ts IS NULL AND created_ts < ?", (created_before_ms,))
    return max(t.rowcount, 0)


def referenced_txn(t: Transaction, digests: list[str]) -> set[str]:
    """Those of ``digests`` (at most 500) some media row or thumbnail row names as its
    content."""
    marks = ", ".join("?" * len(digests))
    found = {
        str(r[0])
        for r in t.query(f"SELECT content_hash FROM media WHERE content_hash IN ({marks})", digests)
    }
    found.update(
        str(r[0])
        for r in t.query(
            f"SELECT content_hash FROM media_thumbnails WHERE content_hash IN ({marks})", digests
        )
    )
    return found
