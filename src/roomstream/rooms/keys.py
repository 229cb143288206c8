"""Verify keys of servers, against which the signatures of received events are checked.

With no federation yet, the keys roomstream knows are:

* the local server's own key (from its signing key file);
* keys an operator adds (``roomstream keys add SERVER KEY_ID KEY``), stored in the
  ``server_verify_keys`` table;
* for an import, keys files given with ``roomstream import --keys FILE`` (what
  ``roomstream generate`` writes next to a corpus as ``<path>.keys.json``).

A keys file is JSON, either ``{"server": {"ed25519:v": "<base64 key>", ...}, ...}`` (the
generator's form) or a server's own ``/_matrix/key/v2/server`` response
(``{"server_name": ..., "verify_keys": {"ed25519:v": {"key": "<base64>"}}}``), or a list of
such responses.

A :data:`KeyMap` holds keys as plain strings (it is pickled to Spark executors);
:func:`verify_keys_of` turns one into the :data:`~roomstream.events.signing.VerifyKeys` that
:func:`~roomstream.events.signing.check_event_signatures` takes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from roomstream.events.hashing import decode_base64, encode_base64
from roomstream.events.signing import (
    SigningKey,
    VerifyKey,
    decode_verify_key_bytes,
    get_verify_key,
    key_id,
)
from roomstream.rooms.store import chunks, placeholders
from roomstream.storage import Database, Transaction

KeyMap = dict[str, dict[str, str]]
"""Server name -> key ID -> unpadded base64 verify key."""


def parse_verify_key(server_name: str, key_id_: str, key_base64: str) -> VerifyKey:
    """A verify key from its ID and base64 text; ``ValueError`` saying what is wrong."""
    if not server_name or any(c.isspace() for c in server_name):
        raise ValueError(f"not a server name: {server_name!r}")
    alg, sep, version = key_id_.partition(":")
    if alg != "ed25519" or not sep or not version:
        raise ValueError(f"key ID must look like 'ed25519:<version>', got {key_id_!r}")
    try:
        raw = decode_base64(key_base64.strip())
    except ValueError as exc:
        raise ValueError(f"verify key for {key_id_} is not base64: {exc}") from exc
    if len(raw) != 32:
        raise ValueError(f"an ed25519 verify key is 32 bytes, {key_id_} has {len(raw)}")
    return decode_verify_key_bytes(key_id_, raw)


def verify_keys_of(keys: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, VerifyKey]]:
    """Decode a :data:`KeyMap` (``ValueError`` for a malformed key)."""
    return {
        server: {kid: parse_verify_key(server, kid, b64) for kid, b64 in by_id.items()}
        for server, by_id in keys.items()
    }


def local_key_map(server_name: str, signing_key: SigningKey) -> KeyMap:
    """The local server's own verify key, as a :data:`KeyMap`."""
    return {server_name: {key_id(signing_key): encode_base64(get_verify_key(signing_key).encode())}}


def merge_key_maps(*maps: Mapping[str, Mapping[str, str]]) -> KeyMap:
    """All keys of ``maps``; a key ID given twice with different keys is a ``ValueError``."""
    merged: KeyMap = {}
    for keys in maps:
        for server, by_id in keys.items():
            into = merged.setdefault(server, {})
            for kid, b64 in by_id.items():
                if into.setdefault(kid, b64) != b64:
                    raise ValueError(f"two different keys given for {server} {kid}")
    return merged


def _server_response_keys(doc: Mapping[str, Any]) -> KeyMap:
    server = doc.get("server_name")
    if not isinstance(server, str):
        raise ValueError("a server keys response needs a 'server_name' string")
    out: dict[str, str] = {}
    for field in ("verify_keys", "old_verify_keys"):
        for kid, entry in (doc.get(field) or {}).items():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), str):
                raise ValueError(f"{server} {kid}: expected an object with a 'key' string")
            out[kid] = entry["key"]
    return {server: out}


def load_keys_file(path: str | os.PathLike[str]) -> KeyMap:
    """Read a keys file (see the module docstring); ``ValueError`` naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        docs = doc if isinstance(doc, list) else [doc]
        maps: list[KeyMap] = []
        for item in docs:
            if not isinstance(item, Mapping):
                raise ValueError("expected a JSON object (or a list of objects)")
            if "server_name" in item:
                maps.append(_server_response_keys(item))
                continue
            for server, by_id in item.items():
                if not isinstance(by_id, Mapping) or not all(
                    isinstance(v, str) for v in by_id.values()
                ):
                    raise ValueError(f"{server}: expected an object of key ID -> base64 key")
            maps.append({s: dict(by_id) for s, by_id in item.items()})
        keys = merge_key_maps(*maps)
        verify_keys_of(keys)  # every key must decode
    except (OSError, ValueError) as exc:
        raise ValueError(f"keys file {os.fspath(path)}: {exc}") from exc
    return keys


def _add_txn(txn: Transaction, server: str, kid: str, b64: str, now: int) -> bool:
    row = txn.query_one(
        "SELECT verify_key FROM server_verify_keys WHERE server_name = ? AND key_id = ?",
        (server, kid),
    )
    if row is not None:
        if row[0] != b64:
            raise ValueError(f"{server} {kid} is already known with a different key")
        return False
    txn.execute(
        "INSERT INTO server_verify_keys (server_name, key_id, verify_key, added_ts)"
        " VALUES (?, ?, ?, ?)",
        (server, kid, b64, now),
    )
    return True


def _load_txn(txn: Transaction, servers: list[str] | None) -> KeyMap:
    sql = "SELECT server_name, key_id, verify_key FROM server_verify_keys"
    rows: list[Any] = []
    if servers is None:
        rows = txn.query(sql)
    else:
        for chunk in chunks(servers):
            rows.extend(
                txn.query(f"{sql} WHERE server_name IN ({placeholders(len(chunk))})", chunk)
            )
    out: KeyMap = {}
    for server, kid, b64 in rows:
        out.setdefault(str(server), {})[str(kid)] = str(b64)
    return out


class ServerKeyStore:
    """The verify keys this instance trusts: its own plus those stored by operators.

    Keys are looked up in the database on every call (one indexed query for the servers
    a batch needs), so a key added by ``roomstream keys add`` from another process is
    used by a running server at once. A key, once added, is never changed silently:
    adding another key under the same ID is an error.
    """

    def __init__(self, db: Database, local: KeyMap | None = None) -> None:
        self.db = db
        self.local: KeyMap = dict(local or {})
        self._decoded: dict[tuple[str, str, str], VerifyKey] = {}

    async def add(self, server_name: str, key_id_: str, key_base64: str) -> bool:
        """Store a key; False if it was already stored. ``ValueError`` if malformed."""
        key = parse_verify_key(server_name, key_id_, key_base64)
        b64 = encode_base64(key.encode())  # normalised: unpadded standard base64
        return bool(
            await self.db.run_interaction(
                "add_server_key", _add_txn, server_name, key_id_, b64, int(time.time() * 1000)
            )
        )

    async def key_map(self, servers: Iterable[str] | None = None) -> KeyMap:
        """Every known key (local ones included), or those of ``servers``."""
        wanted = None if servers is None else sorted(set(servers))
        stored = await self.db.run_interaction("server_key_map", _load_txn, wanted)
        local = {s: k for s, k in self.local.items() if wanted is None or s in wanted}
        return merge_key_maps(local, stored)

    async def verify_keys(self, servers: Iterable[str]) -> dict[str, dict[str, VerifyKey]]:
        """The decoded keys of ``servers`` (decoded once, then cached)."""
        out: dict[str, dict[str, VerifyKey]] = {}
        for server, by_id in (await self.key_map(servers)).items():
            for kid, b64 in by_id.items():
                cache_key = (server, kid, b64)
                key = self._decoded.get(cache_key)
                if key is None:
                    key = self._decoded[cache_key] = parse_verify_key(server, kid, b64)
                out.setdefault(server, {})[kid] = key
        return out
