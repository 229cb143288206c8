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
    "claim_one_time_keys_txn",
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


#: Devices per statement of :func:`claim_one_time_keys_txn` (three parameters each).
CLAIM_CHUNK = 500

#: One-time keys wanted, as (user ID, device ID, algorithm).
Wanted = tuple[str, str, str]


def _wanted_values(chunk: Sequence[Wanted]) -> tuple[str, list[str]]:
    """A ``WITH wanted (user_id, device_id, algorithm) AS (VALUES ...)`` clause, and its
    parameters."""
    values = ",".join(["(?, ?, ?)"] * len(chunk))
    sql = f"WITH wanted (user_id, device_id, algorithm) AS (VALUES {values})"
    return sql, [part for w in chunk for part in w]


def claim_one_time_keys_txn(
    t: Transaction, wanted: Iterable[Wanted]
) -> dict[Wanted, tuple[str, str]]:
    """Take (delete and return) each wanted device's one-time key of that algorithm with
    the lowest key ID: (user, device, algorithm) -> (key ID, key JSON), for those that
    have one. One statement per :data:`CLAIM_CHUNK` devices.

    Atomic on both engines: the DELETE ... RETURNING removes the rows it returns, so two
    claims never return the same key (on SQLite a RETURNING statement finishes only once
    its rows are all read: ``query`` reads them all). On PostgreSQL
    (read committed) a row the statement chose that a concurrent claim removed first is
    skipped; the devices left without a key are tried again while they have keys (each
    round, some concurrent claim took a key of theirs, so this ends).
    """
    claimed: dict[Wanted, tuple[str, str]] = {}
    pending = list(dict.fromkeys(wanted))
    while pending:
        for start in range(0, len(pending), CLAIM_CHUNK):
            with_wanted, params = _wanted_values(pending[start : start + CLAIM_CHUNK])
            # The lowest key ID per device by a correlated MIN (an index search each);
            # a GROUP BY over a join would scan the whole index on SQLite.
            rows = t.query(
                f"{with_wanted} DELETE FROM e2e_one_time_keys"
                " WHERE (user_id, device_id, algorithm, key_id) IN ("
                "SELECT w.user_id, w.device_id, w.algorithm, (SELECT MIN(k.key_id)"
                " FROM e2e_one_time_keys k WHERE k.user_id = w.user_id"
                " AND k.device_id = w.device_id AND k.algorithm = w.algorithm)"
                " FROM wanted w) RETURNING user_id, device_id, algorithm, key_id, key_json",
                params,
            )
            for user_id, device_id, algorithm, key_id, raw in rows:
                claimed[(str(user_id), str(device_id), str(algorithm))] = (str(key_id), str(raw))
        missing = [w for w in pending if w not in claimed]
        left: set[Wanted] = set()
        for start in range(0, len(missing), CLAIM_CHUNK):
            with_wanted, params = _wanted_values(missing[start : start + CLAIM_CHUNK])
            rows = t.query(
                f"{with_wanted} SELECT w.user_id, w.device_id, w.algorithm FROM wanted w"
                " WHERE EXISTS (SELECT 1 FROM e2e_one_time_keys k WHERE k.user_id = w.user_id"
                " AND k.device_id = w.device_id AND k.algorithm = w.algorithm)",
                params,
            )
            left |= {(str(u), str(d), str(a)) for u, d, a in rows}
        pending = [w for w in missing if w in left]
    return claimed


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
