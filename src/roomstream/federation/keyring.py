"""Server keys over federation: ours served, others' fetched, checked and cached.

- :meth:`Keyring.own_keys` is this server's ``GET /_matrix/key/v2/server`` answer:
  its signing key in ``verify_keys``, retired keys (``federation.old_signing_keys``) in
  ``old_verify_keys`` with their ``expired_ts``, ``valid_until_ts`` the configured period
  ahead (an hour by default), the whole signed by the current key.
- :meth:`Keyring.fetch` is the :data:`~roomstream.rooms.keys.KeyFetcher` the room
  engine's key store calls for keys it lacks: it asks each server itself
  (``GET /_matrix/key/v2/server``), then, for what is still missing, each configured
  notary (``POST /_matrix/key/v2/query``). An answer is used only if it is for the server
  asked about and is signed by that server with a key it lists in ``verify_keys``
  (:func:`check_key_response`), and, from a notary whose keys are configured, also
  signed by the notary. Keys are stored with their validity: a current key until the
  answer's ``valid_until_ts`` (at most seven days ahead, as the spec says), an old key
  until its ``expired_ts``; the raw answer is stored too, for the notary.
- :meth:`Keyring.notary_query` answers ``/_matrix/key/v2/query``: each asked server's
  stored answer when it is valid until the ``minimum_valid_until_ts`` asked for (fetched
  from the server first otherwise), with our signature added.

Concurrent fetches for one server share one request. A server that cannot be reached
makes the check needing its key fail (the caller's error names the key); nothing is
retried here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from signedjson.sign import SignatureVerifyException, sign_json, verify_signed_json

from roomstream.config import TrustedKeyServer
from roomstream.errors import MatrixError
from roomstream.events.hashing import encode_base64
from roomstream.events.signing import SigningKey, VerifyKey, get_verify_key, key_id
from roomstream.rooms.keys import FetchedKey, KeyNeed, ServerKeyStore, parse_verify_key

__all__ = [
    "MAX_KEY_VALIDITY_MS",
    "InvalidKeyResponseError",
    "Keyring",
    "OldSigningKey",
    "check_key_response",
]

logger = logging.getLogger(__name__)

#: The spec: "the lesser of [valid_until_ts] and 7 days into the future".
MAX_KEY_VALIDITY_MS = 7 * 24 * 3600 * 1000
KEY_SERVER_PATH = "/_matrix/key/v2/server"
KEY_QUERY_PATH = "/_matrix/key/v2/query"

RequestFn = Callable[..., Awaitable[Any]]
"""``FederationClient.request``: ``(method, destination, path, *, content=...)``."""


class InvalidKeyResponseError(ValueError):
    """A key answer that is not usable (shape, server, or signatures)."""


@dataclass(frozen=True)
class OldSigningKey:
    """A key this server signed with before (listed in ``old_verify_keys``)."""

    key_id: str
    key_base64: str
    expired_ts: int


def _entries(doc: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = doc.get(field, {})
    if not isinstance(value, Mapping):
        raise InvalidKeyResponseError(f"'{field}' must be an object")
    return value


def check_key_response(
    doc: object,
    server_name: str,
    now_ms: int,
    *,
    notary: tuple[str, Mapping[str, VerifyKey]] | None = None,
) -> tuple[list[FetchedKey], int]:
    """The keys of ``server_name``'s key answer ``doc`` and its (clamped) validity.

    ``InvalidKeyResponseError`` unless ``doc`` is for ``server_name``, well formed, and
    carries at least one signature by ``server_name`` with a key of its ``verify_keys``,
    every such signature verifying; with ``notary = (name, keys)`` and keys given, a
    signature of the notary by one of those keys must verify too."""
    if not isinstance(doc, Mapping):
        raise InvalidKeyResponseError("a key answer must be a JSON object")
    if doc.get("server_name") != server_name:
        raise InvalidKeyResponseError(
            f"answer is for {doc.get('server_name')!r}, not {server_name!r}"
        )
    valid_until = doc.get("valid_until_ts")
    if not isinstance(valid_until, int) or isinstance(valid_until, bool):
        raise InvalidKeyResponseError("'valid_until_ts' must be an integer")
    valid_until = min(valid_until, now_ms + MAX_KEY_VALIDITY_MS)
    current: dict[str, VerifyKey] = {}
    keys: list[FetchedKey] = []
    try:
        for kid, entry in _entries(doc, "verify_keys").items():
            b64 = entry.get("key") if isinstance(entry, Mapping) else None
            if not isinstance(b64, str):
                raise InvalidKeyResponseError(f"verify_keys.{kid} has no 'key' string")
            current[kid] = parse_verify_key(server_name, kid, b64)
            keys.append(FetchedKey(server_name, kid, b64, valid_until))
        for kid, entry in _entries(doc, "old_verify_keys").items():
            b64 = entry.get("key") if isinstance(entry, Mapping) else None
            expired = entry.get("expired_ts") if isinstance(entry, Mapping) else None
            if not isinstance(b64, str) or not isinstance(expired, int):
                raise InvalidKeyResponseError(f"old_verify_keys.{kid} needs 'key', 'expired_ts'")
            parse_verify_key(server_name, kid, b64)
            if kid not in current:
                keys.append(FetchedKey(server_name, kid, b64, min(expired, valid_until)))
    except ValueError as exc:
        raise InvalidKeyResponseError(str(exc)) from exc
    signatures = doc.get("signatures")
    own = signatures.get(server_name) if isinstance(signatures, Mapping) else None
    signed_with = [k for k in own if k in current] if isinstance(own, Mapping) else []
    if not signed_with:
        raise InvalidKeyResponseError(f"not signed by {server_name} with a key it lists")
    for kid in signed_with:
        _verify(doc, server_name, current[kid])
    if notary is not None and notary[1]:
        notary_name, notary_keys = notary
        by_notary = signatures.get(notary_name) if isinstance(signatures, Mapping) else None
        usable = (
            [k for k in by_notary if k in notary_keys] if isinstance(by_notary, Mapping) else []
        )
        if not usable:
            raise InvalidKeyResponseError(f"not signed by the notary {notary_name}")
        for kid in usable:
            _verify(doc, notary_name, notary_keys[kid])
    return keys, valid_until


def _verify(doc: Mapping[str, Any], server: str, key: VerifyKey) -> None:
    # verify_signed_json checks only `server`'s signature by this key ID; others stay.
    try:
        verify_signed_json(dict(doc), server, key)
    except (SignatureVerifyException, ValueError, TypeError) as exc:
        raise InvalidKeyResponseError(
            f"signature of {server} ({key_id(key)}) does not verify"
        ) from exc


class Keyring:
    """This server's keys served, and others' fetched into ``store`` (module doc)."""

    def __init__(
        self,
        store: ServerKeyStore,
        server_name: str,
        signing_key: SigningKey,
        request: RequestFn,
        *,
        trusted_key_servers: Sequence[TrustedKeyServer] = (),
        old_signing_keys: Sequence[OldSigningKey] = (),
        key_validity_ms: int = 3600 * 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.server_name = server_name
        self.signing_key = signing_key
        self._request = request
        self.notaries = [
            (
                notary.server_name,
                {
                    kid: parse_verify_key(notary.server_name, kid, b64)
                    for kid, b64 in notary.verify_keys.items()
                },
            )
            for notary in trusted_key_servers
        ]
        self.old_signing_keys = list(old_signing_keys)
        self.key_validity_ms = key_validity_ms
        self._clock = clock
        self._in_flight: dict[str, asyncio.Future[None]] = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- ours -------------------------------------------------------------------------------

    def own_keys(self) -> dict[str, Any]:
        """Our signed ``/_matrix/key/v2/server`` answer, valid for the configured period."""
        doc: dict[str, Any] = {
            "server_name": self.server_name,
            "valid_until_ts": self._now_ms() + self.key_validity_ms,
            "verify_keys": {
                key_id(self.signing_key): {
                    "key": encode_base64(get_verify_key(self.signing_key).encode())
                }
            },
            "old_verify_keys": {
                old.key_id: {"key": old.key_base64, "expired_ts": old.expired_ts}
                for old in self.old_signing_keys
            },
        }
        signed: dict[str, Any] = sign_json(doc, self.server_name, self.signing_key)
        return signed

    # -- theirs -----------------------------------------------------------------------------

    async def fetch(self, needs: Sequence[KeyNeed]) -> None:
        """Fetch what ``needs`` asks for (the store's :data:`KeyFetcher`); servers in
        parallel, each first directly, then through the notaries."""
        by_server: dict[str, dict[str, int]] = {}
        for need in needs:
            if need.server == self.server_name:
                continue  # our own keys are the store's local ones
            wanted = by_server.setdefault(need.server, {})
            wanted[need.key_id] = max(wanted.get(need.key_id, 0), need.at_ts)
        await asyncio.gather(*(self._fetch_server(s, w) for s, w in by_server.items()))

    async def _fetch_server(self, server: str, wanted: Mapping[str, int]) -> None:
        running = self._in_flight.get(server)
        if running is not None:
            await asyncio.shield(running)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight[server] = future
        try:
            await self._fetch_directly(server)
            if self.notaries and not await self._satisfied(server, wanted):
                await self._fetch_from_notaries(server, wanted)
        finally:
            del self._in_flight[server]
            future.set_result(None)

    async def _satisfied(self, server: str, wanted: Mapping[str, int]) -> bool:
        known = (await self.store.valid_keys([server])).get(server, {})
        return all(
            kid in known and (known[kid][1] is None or known[kid][1] >= at)  # type: ignore[operator]
            for kid, at in wanted.items()
        )

    async def _fetch_directly(self, server: str) -> None:
        try:
            doc = await self._request("GET", server, KEY_SERVER_PATH)
            keys, valid_until = check_key_response(doc, server, self._now_ms())
        except (MatrixError, InvalidKeyResponseError) as exc:
            logger.info("keys of %s not fetched from it: %s", server, exc)
            return
        await self.store.store_fetched(
            keys, [(server, orjson.dumps(doc).decode(), valid_until)], fetched_from=server
        )

    async def _fetch_from_notaries(self, server: str, wanted: Mapping[str, int]) -> None:
        body = {
            "server_keys": {
                server: {kid: {"minimum_valid_until_ts": at} for kid, at in wanted.items()}
            }
        }
        for notary_name, notary_keys in self.notaries:
            try:
                answer = await self._request("POST", notary_name, KEY_QUERY_PATH, content=body)
            except MatrixError as exc:
                logger.info("notary %s not reached for %s's keys: %s", notary_name, server, exc)
                continue
            docs = answer.get("server_keys") if isinstance(answer, Mapping) else None
            for doc in docs if isinstance(docs, list) else ():
                if not isinstance(doc, Mapping) or doc.get("server_name") != server:
                    continue
                try:
                    keys, valid_until = check_key_response(
                        doc, server, self._now_ms(), notary=(notary_name, notary_keys)
                    )
                except InvalidKeyResponseError as exc:
                    logger.info("notary %s's answer for %s refused: %s", notary_name, server, exc)
                    continue
                own_doc = {k: v for k, v in doc.items() if k != "signatures"}
                own_doc["signatures"] = {server: doc["signatures"][server]}
                await self.store.store_fetched(
                    keys,
                    [(server, orjson.dumps(own_doc).decode(), valid_until)],
                    fetched_from=notary_name,
                )
            if await self._satisfied(server, wanted):
                return

    # -- the notary ---------------------------------------------------------------------------

    async def notary_query(
        self, asked: Mapping[str, Mapping[str, Mapping[str, Any]]]
    ) -> dict[str, Any]:
        """The ``/_matrix/key/v2/query`` answer for ``{server: {key_id: {"minimum_valid_until_ts":
        ts}}}`` (an empty key map: any key): stored answers valid long enough, fetched
        from their server when not, each with our signature added. A server whose keys
        cannot be had is left out (as Synapse does)."""
        now = self._now_ms()
        results: list[dict[str, Any]] = []
        remote: dict[str, int] = {}
        for server, by_key in asked.items():
            if server == self.server_name:
                results.append(self.own_keys())
                continue
            minimum = now
            for criteria in by_key.values() if isinstance(by_key, Mapping) else ():
                ts = (
                    criteria.get("minimum_valid_until_ts")
                    if isinstance(criteria, Mapping)
                    else None
                )
                if isinstance(ts, int) and not isinstance(ts, bool):
                    minimum = max(minimum, ts)
            remote[server] = minimum
        stored = await self.store.key_responses(remote)
        stale = [s for s, minimum in remote.items() if s not in stored or stored[s][1] < minimum]
        if stale:
            await asyncio.gather(*(self._fetch_directly(s) for s in stale))
            stored.update(await self.store.key_responses(stale))
        for server in sorted(remote):
            if server in stored:
                doc = orjson.loads(stored[server][0])
                results.append(sign_json(doc, self.server_name, self.signing_key))
        return {"server_keys": results}

    async def verify_key_at(self, server: str, key_id_: str, at_ms: int) -> VerifyKey | None:
        """``server``'s key ``key_id_`` if it is valid at ``at_ms`` (fetched if needed)."""
        for attempt in range(2):
            known = await self.store.valid_keys([server])
            entry = known.get(server, {}).get(key_id_)
            if entry is not None and (entry[1] is None or entry[1] >= at_ms):
                return entry[0]
            if attempt == 0:
                await self.fetch([KeyNeed(server, key_id_, at_ms)])
        return None
