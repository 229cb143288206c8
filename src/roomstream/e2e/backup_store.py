"""SQL for server-side key backup (``e2e_room_keys_versions``, ``e2e_room_keys``; written
only here). Every function runs in the caller's transaction."""

from __future__ import annotations

from typing import Any

import orjson

from roomstream.e2e.backup_rule import SessionQuality
from roomstream.storage import Transaction

__all__ = [
    "BackupVersion",
    "StoredSession",
    "bump_etag_txn",
    "count_keys_txn",
    "create_version_txn",
    "current_version_txn",
    "delete_keys_txn",
    "delete_version_txn",
    "get_keys_txn",
    "get_session_quality_txn",
    "get_version_txn",
    "put_session_txn",
    "update_version_txn",
]

#: (version, algorithm, auth_data, etag)
BackupVersion = tuple[int, str, dict[str, Any], int]
#: (room ID, session ID, key data as the client uploaded it)
StoredSession = tuple[str, str, dict[str, Any]]


def current_version_txn(t: Transaction, user_id: str) -> BackupVersion | None:
    """The user's newest backup version not deleted."""
    row = t.query_one(
        "SELECT version, algorithm, auth_data, etag FROM e2e_room_keys_versions"
        " WHERE user_id = ? AND deleted = ? ORDER BY version DESC LIMIT 1",
        (user_id, False),
    )
    return None if row is None else (int(row[0]), str(row[1]), orjson.loads(row[2]), int(row[3]))


def get_version_txn(t: Transaction, user_id: str, version: int) -> BackupVersion | None:
    row = t.query_one(
        "SELECT version, algorithm, auth_data, etag FROM e2e_room_keys_versions"
        " WHERE user_id = ? AND version = ? AND deleted = ?",
        (user_id, version, False),
    )
    return None if row is None else (int(row[0]), str(row[1]), orjson.loads(row[2]), int(row[3]))


def create_version_txn(t: Transaction, user_id: str, algorithm: str, auth_data: Any) -> int:
    """A new version, numbered above every earlier one (deleted ones included)."""
    row = t.query_one(
        "SELECT MAX(version) FROM e2e_room_keys_versions WHERE user_id = ?", (user_id,)
    )
    version = 1 if row is None or row[0] is None else int(row[0]) + 1
    t.execute(
        "INSERT INTO e2e_room_keys_versions (user_id, version, algorithm, auth_data, etag,"
        " deleted) VALUES (?, ?, ?, ?, ?, ?)",
        (user_id, version, algorithm, orjson.dumps(auth_data).decode(), 0, False),
    )
    return version


def update_version_txn(t: Transaction, user_id: str, version: int, auth_data: Any) -> None:
    t.execute(
        "UPDATE e2e_room_keys_versions SET auth_data = ? WHERE user_id = ? AND version = ?",
        (orjson.dumps(auth_data).decode(), user_id, version),
    )


def delete_version_txn(t: Transaction, user_id: str, version: int) -> None:
    """Mark the version deleted (its number is never reused) and drop its keys."""
    t.execute(
        "UPDATE e2e_room_keys_versions SET deleted = ? WHERE user_id = ? AND version = ?",
        (True, user_id, version),
    )
    t.execute("DELETE FROM e2e_room_keys WHERE user_id = ? AND version = ?", (user_id, version))


def bump_etag_txn(t: Transaction, user_id: str, version: int) -> None:
    t.execute(
        "UPDATE e2e_room_keys_versions SET etag = etag + 1 WHERE user_id = ? AND version = ?",
        (user_id, version),
    )


def count_keys_txn(t: Transaction, user_id: str, version: int) -> int:
    row = t.query_one(
        "SELECT COUNT(*) FROM e2e_room_keys WHERE user_id = ? AND version = ?",
        (user_id, version),
    )
    return int(row[0])


def get_session_quality_txn(
    t: Transaction, user_id: str, version: int, room_id: str, session_id: str
) -> SessionQuality | None:
    row = t.query_one(
        "SELECT is_verified, first_message_index, forwarded_count FROM e2e_room_keys"
        " WHERE user_id = ? AND version = ? AND room_id = ? AND session_id = ?",
        (user_id, version, room_id, session_id),
    )
    return None if row is None else SessionQuality(bool(row[0]), int(row[1]), int(row[2]))


def put_session_txn(
    t: Transaction,
    user_id: str,
    version: int,
    room_id: str,
    session_id: str,
    quality: SessionQuality,
    session_data: Any,
) -> None:
    t.execute(
        "INSERT INTO e2e_room_keys (user_id, version, room_id, session_id,"
        " first_message_index, forwarded_count, is_verified, session_data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, version, room_id, session_id)"
        " DO UPDATE SET first_message_index = excluded.first_message_index,"
        " forwarded_count = excluded.forwarded_count, is_verified = excluded.is_verified,"
        " session_data = excluded.session_data",
        (
            user_id,
            version,
            room_id,
            session_id,
            quality.first_message_index,
            quality.forwarded_count,
            quality.is_verified,
            orjson.dumps(session_data).decode(),
        ),
    )


def _where(room_id: str | None, session_id: str | None) -> tuple[str, tuple[str, ...]]:
    sql = ""
    params: tuple[str, ...] = ()
    if room_id is not None:
        sql, params = " AND room_id = ?", (room_id,)
        if session_id is not None:
            sql, params = sql + " AND session_id = ?", (room_id, session_id)
    return sql, params


def get_keys_txn(
    t: Transaction, user_id: str, version: int, room_id: str | None, session_id: str | None
) -> list[StoredSession]:
    where, params = _where(room_id, session_id)
    rows = t.query(
        "SELECT room_id, session_id, first_message_index, forwarded_count, is_verified,"
        " session_data FROM e2e_room_keys WHERE user_id = ? AND version = ?" + where,
        (user_id, version, *params),
    )
    return [
        (
            str(room),
            str(session),
            {
                "first_message_index": int(index),
                "forwarded_count": int(forwarded),
                "is_verified": bool(verified),
                "session_data": orjson.loads(data),
            },
        )
        for room, session, index, forwarded, verified, data in rows
    ]


def delete_keys_txn(
    t: Transaction, user_id: str, version: int, room_id: str | None, session_id: str | None
) -> int:
    where, params = _where(room_id, session_id)
    t.execute(
        "DELETE FROM e2e_room_keys WHERE user_id = ? AND version = ?" + where,
        (user_id, version, *params),
    )
    return t.rowcount
