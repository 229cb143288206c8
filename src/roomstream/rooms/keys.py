"""Verify keys of servers, against which the signatures of received events are checked.

One store (:class:`ServerKeyStore`, the ``server_verify_keys`` table) holds every key
roomstream knows besides its own:

* the local server's own key (from its signing key file; never stored);
* keys an operator adds (``roomstream keys add SERVER KEY_ID KEY``): no validity limit;
* keys fetched over federation (:mod:`roomstream.federation.keyring`, from the server
  itself or a notary), each with the validity its server gave it: a current key's
  ``valid_until_ts``, an old key's ``expired_ts``;
* for an import, keys files given with ``roomstream import --keys FILE`` (what
  ``roomstream generate`` writes next to a corpus as ``<path>.keys.json``).

Validity (as Synapse's ``minimum_valid_until_ts``): a key verifies a signature made at
time ``t`` (an event's ``origin_server_ts``, a request's arrival) only if its validity
reaches ``t``. :meth:`ServerKeyStore.verify_keys_at` asks an injected fetcher (the rooms
layer does not know federation: the process assembly passes a callable) for the keys it
lacks or whose validity falls short, then answers from the store.

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
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyNeed:
    """A key wanted to check a signature made at ``at_ts`` (ms): ``key_id`` of ``server``
    valid at least until then."""

    server: str
    key_id: str
    at_ts: int


@dataclass(frozen=True)
class FetchedKey:
    """A key learnt from a server's (self-signed) key answer."""

    server: str
    key_id: str
    key_base64: str
    #: A current key's ``valid_until_ts``, or an old key's ``expired_ts``.
    valid_until_ts: int


KeyFetcher = Callable[[Sequence[KeyNeed]], Awaitable[None]]
"""Fetches (and stores, through :meth:`ServerKeyStore.store_fetched`) the keys of the
needs given, as far as it can; never raises for a server it cannot reach."""

ValidKeys = dict[str, dict[str, tuple[VerifyKey, int | None]]]
"""Server -> key ID -> (key, valid until ms or None for no limit)."""


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
        "SELECT verify_key, fetched_from FROM server_verify_keys"
        " WHERE server_name = ? AND key_id = ?",
        (server, kid),
    )
    if row is not None:
        if row[0] != b64:
            raise ValueError(f"{server} {kid} is already known with a different key")
        if row[1] is None:
            return False
        # A fetched key an operator vouches for: theirs from now on, with no limit.
        txn.execute(
            "UPDATE server_verify_keys SET valid_until_ts = NULL, fetched_from = NULL"
            " WHERE server_name = ? AND key_id = ?",
            (server, kid),
        )
        return True
    txn.execute(
        "INSERT INTO server_verify_keys (server_name, key_id, verify_key, added_ts)"
        " VALUES (?, ?, ?, ?)",
        (server, kid, b64, now),
    )
    return True


def _load_txn(txn: Transaction, servers: list[str] | None) -> KeyMap:
    return {
        server: {kid: b64 for kid, (b64, _until) in by_id.items()}
        for server, by_id in _load_valid_txn(txn, servers).items()
    }


def _load_valid_txn(
    txn: Transaction, servers: list[str] | None
) -> dict[str, dict[str, tuple[str, int | None]]]:
    sql = "SELECT server_name, key_id, verify_key, valid_until_ts FROM server_verify_keys"
    rows: list[Any] = []
    if servers is None:
        rows = txn.query(sql)
    else:
        for chunk in chunks(servers):
            rows.extend(
                txn.query(f"{sql} WHERE server_name IN ({placeholders(len(chunk))})", chunk)
            )
    out: dict[str, dict[str, tuple[str, int | None]]] = {}
    for server, kid, b64, until in rows:
        out.setdefault(str(server), {})[str(kid)] = (
            str(b64),
            None if until is None else int(until),
        )
    return out


def _store_fetched_txn(
    txn: Transaction,
    keys: Sequence[FetchedKey],
    responses: Sequence[tuple[str, str, int]],
    fetched_from: str,
    now: int,
) -> None:
    for key in keys:
        row = txn.query_one(
            "SELECT verify_key, valid_until_ts, fetched_from FROM server_verify_keys"
            " WHERE server_name = ? AND key_id = ?",
            (key.server, key.key_id),
        )
        if row is None:
            txn.execute(
                "INSERT INTO server_verify_keys (server_name, key_id, verify_key, added_ts,"
                " valid_until_ts, fetched_from) VALUES (?, ?, ?, ?, ?, ?)",
                (key.server, key.key_id, key.key_base64, now, key.valid_until_ts, fetched_from),
            )
        elif row[2] is None:
            # An operator's key stays as they set it (with no validity limit).
            if row[0] != key.key_base64:
                logger.warning(
                    "%s says its key %s is not the one an operator added: keeping the operator's",
                    key.server,
                    key.key_id,
                )
        elif row[0] != key.key_base64 or (row[1] is not None and key.valid_until_ts > row[1]):
            # The newest answer wins: a key's validity only grows, as Synapse's does,
            # unless its key changed (then the server's latest word is taken).
            txn.execute(
                "UPDATE server_verify_keys SET verify_key = ?, valid_until_ts = ?,"
                " fetched_from = ? WHERE server_name = ? AND key_id = ?",
                (key.key_base64, key.valid_until_ts, fetched_from, key.server, key.key_id),
            )
    for server, response, valid_until in responses:
        row = txn.query_one(
            "SELECT valid_until_ts FROM server_key_responses WHERE server_name = ?", (server,)
        )
        if row is None:
            txn.execute(
                "INSERT INTO server_key_responses (server_name, response, valid_until_ts,"
                " fetched_ts) VALUES (?, ?, ?, ?)",
                (server, response, valid_until, now),
            )
        elif int(row[0]) <= valid_until:
            txn.execute(
                "UPDATE server_key_responses SET response = ?, valid_until_ts = ?,"
                " fetched_ts = ? WHERE server_name = ?",
                (response, valid_until, now, server),
            )


def _responses_txn(txn: Transaction, servers: list[str]) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for chunk in chunks(servers):
        for server, response, until in txn.query(
            "SELECT server_name, response, valid_until_ts FROM server_key_responses"
            f" WHERE server_name IN ({placeholders(len(chunk))})",
            chunk,
        ):
            out[str(server)] = (str(response), int(until))
    return out


class ServerKeyStore:
    """The verify keys this instance trusts: its own plus those stored by operators.

    Keys are looked up in the database on every call (one indexed query for the servers
    a batch needs), so a key added by ``roomstream keys add`` from another process is
    used by a running server at once. A key, once added, is never changed silently:
    adding another key under the same ID is an error.
    """

    def __init__(
        self, db: Database, local: KeyMap | None = None, fetcher: KeyFetcher | None = None
    ) -> None:
        self.db = db
        self.local: KeyMap = dict(local or {})
        self._decoded: dict[tuple[str, str, str], VerifyKey] = {}
        #: Asked for keys :meth:`verify_keys_at` lacks (None: only stored keys are used).
        #: Set by the process assembly once federation is up.
        self.fetcher = fetcher

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
        """The decoded keys of ``servers`` whatever their validity (decoded once, then
        cached): for data whose time is not checked (imports)."""
        out: dict[str, dict[str, VerifyKey]] = {}
        for server, by_id in (await self.key_map(servers)).items():
            for kid, b64 in by_id.items():
                out.setdefault(server, {})[kid] = self._decode(server, kid, b64)
        return out

    def _decode(self, server: str, kid: str, b64: str) -> VerifyKey:
        cache_key = (server, kid, b64)
        key = self._decoded.get(cache_key)
        if key is None:
            key = self._decoded[cache_key] = parse_verify_key(server, kid, b64)
        return key

    async def valid_keys(self, servers: Iterable[str]) -> ValidKeys:
        """The decoded keys of ``servers`` with their validity (local ones: no limit)."""
        wanted = sorted(set(servers))
        stored = await self.db.run_interaction("server_valid_keys", _load_valid_txn, wanted)
        out: ValidKeys = {}
        for server, by_id in stored.items():
            for kid, (b64, until) in by_id.items():
                out.setdefault(server, {})[kid] = (self._decode(server, kid, b64), until)
        for server, local_by_id in self.local.items():
            if server in wanted:
                for kid, b64 in local_by_id.items():
                    out.setdefault(server, {})[kid] = (self._decode(server, kid, b64), None)
        return out

    async def verify_keys_at(self, needs: Iterable[KeyNeed]) -> ValidKeys:
        """The keys of the servers ``needs`` name, after asking the fetcher (once, for
        all of them) for each needed key that is unknown or not valid until its time.

        What the fetcher could not provide is simply absent or short-lived in the
        answer: the caller's check then fails, naming the key."""
        needs = list(needs)
        servers = {n.server for n in needs}
        known = await self.valid_keys(servers)
        if self.fetcher is None:
            return known
        missing = [n for n in needs if not _satisfies(known, n)]
        if not missing:
            return known
        await self.fetcher(missing)
        return await self.valid_keys(servers)

    async def store_fetched(
        self,
        keys: Sequence[FetchedKey],
        responses: Sequence[tuple[str, str, int]] = (),
        *,
        fetched_from: str,
    ) -> None:
        """Store keys learnt from ``fetched_from`` (validated by the caller: self-signed
        by their server), and the raw answers ``(server, response JSON, valid_until_ts)``
        they came in. A key an operator added is never replaced."""
        for key in keys:
            parse_verify_key(key.server, key.key_id, key.key_base64)
        await self.db.run_interaction(
            "store_fetched_server_keys",
            _store_fetched_txn,
            list(keys),
            list(responses),
            fetched_from,
            int(time.time() * 1000),
        )

    async def key_responses(self, servers: Iterable[str]) -> dict[str, tuple[str, int]]:
        """The stored raw key answers of ``servers``: server -> (JSON, valid_until_ts)."""
        return dict(
            await self.db.run_interaction("server_key_responses", _responses_txn, sorted(servers))
        )


def _satisfies(known: ValidKeys, need: KeyNeed) -> bool:
    entry = known.get(need.server, {}).get(need.key_id)
    return entry is not None and (entry[1] is None or entry[1] >= need.at_ts)


def keys_valid_at(known: ValidKeys, at_ts: int) -> dict[str, dict[str, VerifyKey]]:
    """The keys of ``known`` whose validity reaches ``at_ts``, as ``VerifyKeys``."""
    return {
        server: {kid: key for kid, (key, until) in by_id.items() if until is None or until >= at_ts}
        for server, by_id in known.items()
    }
