"""SQL for cross-signing keys and uploaded signatures (``e2e_cross_signing_keys``,
``e2e_signatures``; written only here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from roomstream.rooms.store import chunks, placeholders
from roomstream.storage import Transaction

__all__ = [
    "cross_signing_keys_of_users_txn",
    "cross_signing_keys_txn",
    "put_cross_signing_key_txn",
    "put_signature_txn",
    "signatures_on_users_txn",
]


def cross_signing_keys_txn(t: Transaction, user_id: str) -> dict[str, dict[str, Any]]:
    """key type (``master``, ``self_signing``, ``user_signing``) -> key object."""
    rows = t.query(
        "SELECT key_type, key_json FROM e2e_cross_signing_keys WHERE user_id = ?", (user_id,)
    )
    return {str(kind): dict(orjson.loads(raw)) for kind, raw in rows}


def cross_signing_keys_of_users_txn(
    t: Transaction, user_ids: Sequence[str]
) -> dict[str, dict[str, tuple[str, str]]]:
    """user -> key type -> (public key, key JSON as stored), one statement per chunk of
    users, the JSON left undecoded."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for chunk in chunks(user_ids):
        rows = t.query(
            "SELECT user_id, key_type, public_key, key_json FROM e2e_cross_signing_keys"
            f" WHERE user_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for user_id, kind, public_key, raw in rows:
            found.setdefault(str(user_id), {})[str(kind)] = (str(public_key), str(raw))
    return found


def put_cross_signing_key_txn(
    t: Transaction, user_id: str, key_type: str, public_key: str, key: Mapping[str, Any]
) -> None:
    t.execute(
        "INSERT INTO e2e_cross_signing_keys (user_id, key_type, public_key, key_json)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, key_type) DO UPDATE SET"
        " public_key = excluded.public_key, key_json = excluded.key_json",
        (user_id, key_type, public_key, orjson.dumps(key).decode()),
    )


def put_signature_txn(
    t: Transaction,
    signer_user_id: str,
    signer_key_id: str,
    target_user_id: str,
    target_key_id: str,
    signature: str,
) -> None:
    t.execute(
        "INSERT INTO e2e_signatures (signer_user_id, signer_key_id, target_user_id,"
        " target_key_id, signature) VALUES (?, ?, ?, ?, ?) ON CONFLICT (target_user_id,"
        " target_key_id, signer_user_id, signer_key_id) DO UPDATE SET signature ="
        " excluded.signature",
        (signer_user_id, signer_key_id, target_user_id, target_key_id, signature),
    )


def signatures_on_users_txn(
    t: Transaction, target_user_ids: Sequence[str]
) -> dict[str, dict[str, dict[str, dict[str, str]]]]:
    """target user -> target key ID -> signer user -> signer key ID -> signature, for
    every uploaded signature on the users' keys (one statement per chunk of users)."""
    found: dict[str, dict[str, dict[str, dict[str, str]]]] = {}
    for chunk in chunks(target_user_ids):
        rows = t.query(
            "SELECT target_user_id, target_key_id, signer_user_id, signer_key_id, signature"
            f" FROM e2e_signatures WHERE target_user_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for user_id, target, signer, key_id, signature in rows:
            by_target = found.setdefault(str(user_id), {})
            by_target.setdefault(str(target), {}).setdefault(str(signer), {})[str(key_id)] = str(
                signature
            )
    return found
