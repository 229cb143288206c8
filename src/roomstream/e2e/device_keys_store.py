"""SQL for device keys, one-time keys and fallback keys (``e2e_device_keys``,
``e2e_one_time_keys``, ``e2e_fallback_keys``; written only here).

Functions ending in ``_txn`` run inside a caller's transaction so that a key write and
its ``device_lists`` row commit together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from roomstream.rooms.store import chunks, placeholders
from roomstream.storage import Transaction

__all__ = [
    "claim_fallback_key_txn",
    "claim_one_time_key_txn",
    "delete_device_keys_txn",
    "device_keys_of_txn",
    "device_keys_of_users_txn",
    "get_device_keys_txn",
    "one_time_key_counts_txn",
    "put_device_keys_txn",
    "put_fallback_keys_txn",
    "put_one_time_keys_txn",
    "unused_fallback_key_types_txn",
]

#: (algorithm, key ID, key JSON as stored)
KeyRow = tuple[str, str, str]


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def get_device_keys_txn(t: Transaction, user_id: str, device_id: str) -> dict[str, Any] | None:
    row = t.query_one(
        "SELECT key_json FROM e2e_device_keys WHERE user_id = ? AND device_id = ?",
        (user_id, device_id),
    )
    return None if row is None else dict(orjson.loads(row[0]))


def put_device_keys_txn(
    t: Transaction, user_id: str, device_id: str, keys: Mapping[str, Any]
) -> None:
    t.execute(
        "INSERT INTO e2e_device_keys (user_id, device_id, key_json) VALUES (?, ?, ?)"
        " ON CONFLICT (user_id, device_id) DO UPDATE SET key_json = excluded.key_json",
        (user_id, device_id, _dumps(keys)),
    )


def device_keys_of_txn(
    t: Transaction, user_id: str, device_ids: Iterable[str] | None
) -> dict[str, dict[str, Any]]:
    """device ID -> its uploaded keys with ``unsigned.device_display_name``, for the
    user's devices (all when None) that exist (``devices``, read-only here: keys of a
    device being deleted are not handed out)."""
    rows = t.query(
        "SELECT k.device_id, k.key_json, d.display_name FROM e2e_device_keys k"
        " JOIN devices d ON d.user_id = k.user_id AND d.device_id = k.device_id"
        " WHERE k.user_id = ?",
        (user_id,),
    )
    wanted = None if device_ids is None else set(device_ids)
    found = {}
    for device_id, raw, name in rows:
        if wanted is not None and device_id not in wanted:
            continue
        keys = dict(orjson.loads(raw))
        unsigned = dict(keys.get("unsigned") or {})
        if name is not None:
            unsigned["device_display_name"] = name
        keys["unsigned"] = unsigned
        found[str(device_id)] = keys
    return found


def device_keys_of_users_txn(
    t: Transaction, user_ids: Sequence[str]
) -> dict[str, dict[str, tuple[str, str | None]]]:
    """user -> device ID -> (its uploaded keys' JSON as stored, its display name), for
    every existing device (``devices``) of the users that has keys: one statement per
    :data:`~roomstream.rooms.store.CHUNK` users, the JSON left undecoded (a caller that
    only passes it on need not parse it)."""
    found: dict[str, dict[str, tuple[str, str | None]]] = {}
    for chunk in chunks(user_ids):
        rows = t.query(
            "SELECT k.user_id, k.device_id, k.key_json, d.display_name FROM e2e_device_keys k"
            " JOIN devices d ON d.user_id = k.user_id AND d.device_id = k.device_id"
            f" WHERE k.user_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for user_id, device_id, raw, name in rows:
            found.setdefault(str(user_id), {})[str(device_id)] = (
                str(raw),
                None if name is None else str(name),
            )
    return found


def put_one_time_keys_txn(
    t: Transaction, user_id: str, device_id: str, keys: Iterable[KeyRow]
) -> list[KeyRow]:
    """Add one-time keys; a key ID already stored keeps its key (returned as conflicts
    when the new key differs)."""
    conflicts = []
    for algorithm, key_id, key_json in keys:
        existing = t.query_one(
            "SELECT key_json FROM e2e_one_time_keys"
            " WHERE user_id = ? AND device_id = ? AND algorithm = ? AND key_id = ?",
            (user_id, device_id, algorithm, key_id),
        )
        if existing is None:
            t.execute(
                "INSERT INTO e2e_one_time_keys"
                " (user_id, device_id, algorithm, key_id, key_json) VALUES (?, ?, ?, ?, ?)",
                (user_id, device_id, algorithm, key_id, key_json),
            )
        elif orjson.loads(existing[0]) != orjson.loads(key_json):
            conflicts.append((algorithm, key_id, key_json))
    return conflicts


def put_fallback_keys_txn(
    t: Transaction, user_id: str, device_id: str, keys: Iterable[KeyRow]
) -> None:
    """Replace the device's fallback key of each algorithm (a re-upload of the same key
    keeps its ``used`` mark)."""
    for algorithm, key_id, key_json in keys:
        t.execute(
            "INSERT INTO e2e_fallback_keys"
            " (user_id, device_id, algorithm, key_id, key_json, used) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (user_id, device_id, algorithm) DO UPDATE SET"
            " key_id = excluded.key_id, key_json = excluded.key_json, used = CASE WHEN"
            " e2e_fallback_keys.key_id = excluded.key_id AND e2e_fallback_keys.key_json"
            " = excluded.key_json THEN e2e_fallback_keys.used ELSE excluded.used END",
            (user_id, device_id, algorithm, key_id, key_json, False),
        )


def one_time_key_counts_txn(t: Transaction, user_id: str, device_id: str) -> dict[str, int]:
    rows = t.query(
        "SELECT algorithm, COUNT(*) FROM e2e_one_time_keys"
        " WHERE user_id = ? AND device_id = ? GROUP BY algorithm",
        (user_id, device_id),
    )
    return {str(a): int(n) for a, n in rows}


def unused_fallback_key_types_txn(t: Transaction, user_id: str, device_id: str) -> list[str]:
    rows = t.query(
        "SELECT algorithm FROM e2e_fallback_keys"
        " WHERE user_id = ? AND device_id = ? AND used = ? ORDER BY algorithm",
        (user_id, device_id, False),
    )
    return [str(r[0]) for r in rows]


def claim_one_time_key_txn(
    t: Transaction, user_id: str, device_id: str, algorithm: str
) -> tuple[str, str] | None:
    """Take (delete and return) the device's one-time key of ``algorithm`` with the lowest
    key ID: (key ID, key JSON); None when it has none.

    Atomic on both engines: the DELETE ... RETURNING removes the row it returns, so two
    claims never return the same key. On PostgreSQL (read committed) a DELETE whose chosen
    row a concurrent claim removed first deletes nothing; it is re-run with a fresh
    snapshot while keys remain (each round, some claim took a key, so this ends).
    """
    while True:
        # query (every row), not query_one: SQLite finishes a RETURNING statement only
        # once its rows are all read.
        rows = t.query(
            "DELETE FROM e2e_one_time_keys"
            " WHERE user_id = ? AND device_id = ? AND algorithm = ? AND key_id = ("
            "SELECT key_id FROM e2e_one_time_keys"
            " WHERE user_id = ? AND device_id = ? AND algorithm = ? ORDER BY key_id LIMIT 1)"
            " RETURNING key_id, key_json",
            (user_id, device_id, algorithm, user_id, device_id, algorithm),
        )
        if rows:
            return str(rows[0][0]), str(rows[0][1])
        left = t.query_one(
            "SELECT 1 FROM e2e_one_time_keys"
            " WHERE user_id = ? AND device_id = ? AND algorithm = ? LIMIT 1",
            (user_id, device_id, algorithm),
        )
        if left is None:
            return None


def claim_fallback_key_txn(
    t: Transaction, user_id: str, device_id: str, algorithm: str
) -> tuple[str, str] | None:
    """The device's fallback key of ``algorithm``, marked used (it is not deleted: it is
    handed out again until the device uploads a new one)."""
    rows = t.query(
        "UPDATE e2e_fallback_keys SET used = ?"
        " WHERE user_id = ? AND device_id = ? AND algorithm = ? RETURNING key_id, key_json",
        (True, user_id, device_id, algorithm),
    )
    return (str(rows[0][0]), str(rows[0][1])) if rows else None


def delete_device_keys_txn(t: Transaction, user_id: str, device_id: str | None) -> None:
    """Forget every key of one device (None: of every device of the user)."""
    where, params = (
        ("user_id = ?", (user_id,))
        if device_id is None
        else ("user_id = ? AND device_id = ?", (user_id, device_id))
    )
    for table in ("e2e_device_keys", "e2e_one_time_keys", "e2e_fallback_keys"):
        t.execute(f"DELETE FROM {table} WHERE {where}", params)
