"""End-to-end encryption's server side: what the client layer calls.

The server stores and hands out keys and never sees plaintext. Invariants:
- device keys are accepted only signed by the device, for the token's user and device,
  and never replaced by different ones (a device's identity is fixed);
- a one-time key is handed out at most once
  (:func:`~roomstream.e2e.device_keys_store.claim_one_time_keys_txn`); when a device has
  none left, its fallback key is handed out and marked used;
- every change other users must learn of (new or deleted device keys, renamed devices,
  cross-signing keys, signatures) writes a ``device_lists`` row in the same transaction,
  on this process when it writes that stream (else the caller forwards the write).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from roomstream.e2e import cross_signing_store as xs
from roomstream.e2e import device_keys_store as dk
from roomstream.e2e import device_lists
from roomstream.e2e.key_format import UserKeys, format_user_keys
from roomstream.e2e.keys_cache import KeysCache
from roomstream.e2e.signatures import (
    CROSS_SIGNING_USAGES,
    check_cross_signing_key,
    check_device_keys,
    cross_signing_public_key,
    has_valid_signature,
)
from roomstream.errors import (
    BadJsonError,
    BadRequestError,
    Codes,
    InvalidParamError,
    MissingParamError,
    UnrecognizedRequestError,
)
from roomstream.storage import Database, Transaction
from roomstream.streams import StreamIdGenerator

__all__ = ["E2eKeys", "KeyStatus", "PasswordCheck", "key_status_txn"]

R = TypeVar("R")

#: Longest key ID / algorithm name accepted.
MAX_KEY_ID = 255
#: The fallback-keys field before the spec settled it (MSC2732).
UNSTABLE_FALLBACK = "org.matrix.msc2732.fallback_keys"

#: Checks ``auth`` as user-interactive auth with the user's password (raises if not).
PasswordCheck = Callable[[str, "dict[str, Any] | None"], Any]
#: Hands a write (operation, JSON arguments) to the ``device_lists`` writer; its result.
Forward = Callable[[str, dict[str, Any]], Awaitable[Any]]


def _strip(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("signatures", "unsigned")}


def _key_rows(keys: Any, what: str) -> list[dk.KeyRow]:
    """``{"algorithm:key_id": key}`` as rows; M_INVALID_PARAM for anything else."""
    if keys is None:
        return []
    if not isinstance(keys, dict):
        raise InvalidParamError(f"{what} must be an object")
    rows = []
    for name, key in keys.items():
        algorithm, sep, key_id = name.partition(":")
        if not sep or not algorithm or not key_id or len(name) > MAX_KEY_ID:
            raise InvalidParamError(f"{what}: bad key name {name[:80]!r}")
        if not isinstance(key, dict | str):
            raise InvalidParamError(f"{what}: {name} must be a key")
        rows.append((algorithm, key_id, orjson.dumps(key).decode()))
    return rows


#: A device's one-time key counts by algorithm and its unused fallback key types.
KeyStatus = tuple[dict[str, int], list[str]]


def key_status_txn(t: Transaction, user_id: str, device_id: str) -> KeyStatus:
    """:meth:`E2eKeys.key_status` inside the caller's transaction (a ``/sync`` reads it
    with the device's to-device messages: one round trip for both)."""
    counts = dk.one_time_key_counts_txn(t, user_id, device_id)
    fallbacks = dk.unused_fallback_key_types_txn(t, user_id, device_id)
    # Synapse always reports signed_curve25519 (clients top up from 0).
    return {"signed_curve25519": 0, **counts}, fallbacks


class E2eKeys:
    def __init__(
        self,
        database: Database,
        device_lists_writer: StreamIdGenerator,
        check_password: PasswordCheck,
        forward: Forward | None = None,
        *,
        cache_live: Callable[[], bool] | None = None,
    ) -> None:
        """``forward``: how a process that does not write ``device_lists`` has the
        writer carry out the writes that add a row (see :meth:`perform`); None: refused
        with 400 there. ``cache_live``: whether the ``device_lists`` rows of other
        processes reach this one as they are written (see
        :class:`~roomstream.e2e.keys_cache.KeysCache`; None: there are none)."""
        self.db = database
        #: Users' formatted ``/keys/query`` parts; see :meth:`apply_device_lists_rows`.
        self.cache = KeysCache(live=cache_live)
        self.stream = device_lists_writer
        self._check_password = check_password
        self._forward = forward

    def _forwards(self) -> bool:
        return self._forward is not None and not self.stream.is_writer()

    async def perform(self, op: str, args: dict[str, Any]) -> Any:
        """Carry out a write another process forwarded (its ``op`` and JSON ``args``)."""
        try:
            if op == "upload":
                return await self.upload(
                    str(args["user_id"]),
                    str(args["device_id"]),
                    args.get("device_keys"),
                    args.get("one_time_keys"),
                    args.get("fallback_keys"),
                )
            if op == "device_deleted":
                return await self.device_deleted(
                    str(args["user_id"]), [str(d) for d in args["device_ids"]]
                )
            if op == "device_renamed":
                return await self.device_renamed(str(args["user_id"]))
            if op == "upload_cross_signing":
                return await self.upload_cross_signing(
                    str(args["user_id"]), dict(args["body"]), args.get("auth")
                )
            if op == "upload_signatures":
                return await self.upload_signatures(str(args["user_id"]), dict(args["body"]))
        except (KeyError, TypeError, ValueError):
            raise BadJsonError(f"bad arguments for {op}") from None
        raise UnrecognizedRequestError(f"unknown e2e keys operation {op[:40]!r}")

    # -- the device_lists stream -------------------------------------------------------

    def apply_device_lists_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """``device_lists`` rows another process wrote (replication): their users'
        cached keys are dropped."""
        self.cache.apply_rows(rows)

    def position(self) -> int:
        """Every ``device_lists`` fact at or below this is complete."""
        return self.stream.get_linear_position()

    @property
    def writes_device_lists(self) -> bool:
        return self.stream.is_writer()

    @property
    def forwards_writes(self) -> bool:
        """Whether writes that add a ``device_lists`` row go to its writer from here."""
        return self._forwards()

    async def _write(self, name: str, func: Callable[[Transaction], tuple[set[str], R]]) -> R:
        """Run ``func`` (returning (users whose device lists changed, result)) in one
        transaction named ``name``, with the ``device_lists`` row it calls for."""
        if not self.stream.is_writer():
            raise BadRequestError(f"{self.stream.instance_name} does not write device_lists")
        instance = self.stream.instance_name
        changed: set[str] = set()

        def txn(t: Transaction, ids: list[int]) -> R:
            changed.clear()  # a retried transaction starts again
            users, result = func(t)
            changed.update(users)
            if users:
                device_lists.append_txn(t, ids[0], instance, users)
            return result

        try:
            _, result = await self.stream.run_with_ids(name, 1, txn)
        finally:
            # At once, before the writer's client hears of it: its next query here sees
            # the change (other processes drop it when the row reaches them). Also when
            # the commit's outcome is unknown (an error after it): dropping is safe.
            if changed:
                self.cache.invalidate_users(changed)
        return result

    async def _forwarded(self, op: str, args: dict[str, Any], users: Iterable[str]) -> Any:
        """Have the ``device_lists`` writer carry out ``op``; then forget ``users``' cached
        keys here at once (the row's replication does too, a little later), so that this
        process's next query after the write sees it."""
        assert self._forward is not None
        try:
            return await self._forward(op, args)
        finally:
            self.cache.invalidate_users(users)

    async def changed_since(
        self,
        user_id: str,
        from_pos: int,
        to_pos: int,
        membership_range: tuple[int, int] | None = None,
    ) -> tuple[set[str], set[str]]:
        """(changed, left) for a sync of ``user_id`` from ``from_pos`` to ``to_pos`` of the
        ``device_lists`` stream: ``changed`` holds users who share a room with ``user_id``
        now (and ``user_id``) whose device lists changed; with ``membership_range`` (an
        events-stream range), also users who came to share a room then; ``left`` users
        whose membership changed then and who share no room with ``user_id`` now."""

        def txn(t: Transaction) -> tuple[set[str], set[str]]:
            changed = device_lists.changed_since_txn(t, user_id, from_pos, to_pos)
            left: set[str] = set()
            if membership_range is not None:
                moved = device_lists.membership_changes_txn(t, user_id, *membership_range)
                sharing = device_lists.shares_room_with_txn(t, user_id, moved)
                # Their own membership moving tells users nothing about their own keys.
                changed |= sharing - {user_id}
                left = moved - sharing - {user_id}
            return changed, left

        return await self.db.run_interaction("device_list_changes_since", txn)

    # -- device keys, one-time keys, fallback keys --------------------------------------

    async def upload(
        self,
        user_id: str,
        device_id: str,
        device_keys: Any,
        one_time_keys: Any,
        fallback_keys: Any,
    ) -> dict[str, int]:
        """``POST /keys/upload``; the device's one-time key counts after it."""
        if device_keys is not None and self._forwards():
            args = {"user_id": user_id, "device_id": device_id, "device_keys": device_keys}
            args |= {"one_time_keys": one_time_keys, "fallback_keys": fallback_keys}
            return dict(await self._forwarded("upload", args, [user_id]))
        keys = None if device_keys is None else check_device_keys(device_keys, user_id, device_id)
        otks = _key_rows(one_time_keys, "one_time_keys")
        fallbacks = _key_rows(fallback_keys, "fallback_keys")

        def txn(t: Transaction) -> tuple[set[str], dict[str, int]]:
            changed: set[str] = set()
            if keys is not None:
                stored = dk.get_device_keys_txn(t, user_id, device_id)
                if stored is None:
                    dk.put_device_keys_txn(t, user_id, device_id, keys)
                    changed.add(user_id)
                elif _strip(stored) != _strip(keys):
                    raise InvalidParamError("this device already has different keys")
            conflicts = dk.put_one_time_keys_txn(t, user_id, device_id, otks)
            if conflicts:
                algorithm, key_id, _ = conflicts[0]
                raise InvalidParamError(f"one-time key {algorithm}:{key_id} already exists")
            dk.put_fallback_keys_txn(t, user_id, device_id, fallbacks)
            return changed, dk.one_time_key_counts_txn(t, user_id, device_id)

        if keys is None:  # no device_lists row possible: any process may write it
            _, counts = await self.db.run_interaction("e2e_upload_keys", txn)
        else:
            counts = await self._write("e2e_upload_keys", txn)
        # Synapse always reports signed_curve25519 (clients top up from 0).
        return {"signed_curve25519": 0, **counts}

    async def one_time_key_counts(self, user_id: str, device_id: str) -> dict[str, int]:
        counts = await self.db.run_interaction(
            "e2e_one_time_key_counts", dk.one_time_key_counts_txn, user_id, device_id
        )
        return {"signed_curve25519": 0, **counts}

    async def key_status(self, user_id: str, device_id: str) -> KeyStatus:
        """(one-time key counts, unused fallback key types) of a device, in one
        transaction (what every /sync sends; :func:`key_status_txn` inside another)."""
        return await self.db.run_interaction("e2e_key_status", key_status_txn, user_id, device_id)

    async def unused_fallback_key_types(self, user_id: str, device_id: str) -> list[str]:
        return await self.db.run_interaction(
            "e2e_unused_fallback_key_types", dk.unused_fallback_key_types_txn, user_id, device_id
        )

    async def query(self, requester: str, wanted: Mapping[str, list[str]]) -> dict[str, Any]:
        """``POST /keys/query``: ``wanted`` maps user -> device IDs (empty: all).

        The answer's key objects are :class:`orjson.Fragment` (JSON text, ready for
        ``orjson.dumps``), not dicts: a user's keys are read as stored and passed on.
        Users in :attr:`cache` cost no database read; the others are read with three
        statements for them all (per chunk of them), in one transaction, and cached."""
        cache = self.cache
        formatted = cache.get_many(wanted)
        missing = [u for u in wanted if u not in formatted]
        if missing:
            generation = cache.generation

            def txn(t: Transaction) -> dict[str, UserKeys]:
                devices = dk.device_keys_of_users_txn(t, missing)
                cross = xs.cross_signing_keys_of_users_txn(t, missing)
                signatures = xs.signatures_on_users_txn(t, missing)
                return {
                    u: format_user_keys(devices.get(u, {}), cross.get(u, {}), signatures.get(u, {}))
                    for u in missing
                }

            fresh = await self.db.run_interaction("e2e_query_keys", txn)
            for user_id, keys in fresh.items():
                cache.put(user_id, keys, generation)
            formatted.update(fresh)
        result: dict[str, Any] = {
            "device_keys": {},
            "master_keys": {},
            "self_signing_keys": {},
            "user_signing_keys": {},
            "failures": {},
        }
        for user_id, device_ids in wanted.items():
            keys = formatted[user_id]
            result["device_keys"][user_id] = keys.select(device_ids)
            for kind, fragment in keys.cross.items():
                if kind == "user_signing" and user_id != requester:
                    continue
                result[f"{kind}_keys"][user_id] = fragment
        return result

    async def claim(self, wanted: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        """``POST /keys/claim``: user -> device -> algorithm; one key per device, all in
        one transaction: one statement for every device's one-time key
        (:func:`~roomstream.e2e.device_keys_store.claim_one_time_keys_txn`), then one per
        device that had none, for its fallback key."""
        asked = [(u, d, a) for u, devices in wanted.items() for d, a in devices.items()]

        def txn(t: Transaction) -> dict[str, Any]:
            found = dk.claim_one_time_keys_txn(t, asked)
            claimed: dict[str, dict[str, dict[str, Any]]] = {}
            for user_id, device_id, algorithm in asked:
                key = found.get((user_id, device_id, algorithm))
                if key is None:  # no one-time key left: the fallback key, if any
                    key = dk.claim_fallback_key_txn(t, user_id, device_id, algorithm)
                if key is not None:
                    key_id, raw = key
                    claimed.setdefault(user_id, {})[device_id] = {
                        f"{algorithm}:{key_id}": orjson.loads(raw)
                    }
            return {"one_time_keys": claimed, "failures": {}}

        return await self.db.run_interaction("e2e_claim_keys", txn)

    async def device_deleted(self, user_id: str, device_ids: list[str]) -> None:
        """Forget the keys of deleted devices and tell the user's contacts."""
        if self._forwards():
            args = {"user_id": user_id, "device_ids": device_ids}
            await self._forwarded("device_deleted", args, [user_id])
            return

        def txn(t: Transaction) -> tuple[set[str], None]:
            for device_id in device_ids:
                dk.delete_device_keys_txn(t, user_id, device_id)
            return {user_id}, None

        await self._write("device_deleted", txn)

    async def device_renamed(self, user_id: str) -> None:
        if self._forwards():
            await self._forwarded("device_renamed", {"user_id": user_id}, [user_id])
            return
        await self._write("device_renamed", lambda t: ({user_id}, None))

    # -- cross-signing --------------------------------------------------------------------

    async def upload_cross_signing(
        self, user_id: str, body: Mapping[str, Any], auth: dict[str, Any] | None
    ) -> None:
        """``POST /keys/device_signing/upload``. Replacing an existing master key needs the
        user's password (user-interactive auth); the first one does not (as Synapse)."""
        if self._forwards():
            args = {"user_id": user_id, "body": dict(body), "auth": auth}
            await self._forwarded("upload_cross_signing", args, [user_id])
            return
        uploaded = {k: body[k] for k in CROSS_SIGNING_USAGES if body.get(k) is not None}
        current = await self.db.run_interaction(
            "e2e_cross_signing_keys", xs.cross_signing_keys_txn, user_id
        )
        master = uploaded.get("master_key")
        if master is not None:
            check_cross_signing_key(master, user_id, "master_key", None)
            old = current.get("master")
            if old is not None and _strip(old) != _strip(master):
                await self._check_password(user_id, auth)
        master_key = master if master is not None else current.get("master")
        if master_key is None and uploaded:
            raise MissingParamError("no master key uploaded")
        signer = None if master_key is None else cross_signing_public_key(master_key)
        for kind in ("self_signing_key", "user_signing_key"):
            if kind in uploaded:
                check_cross_signing_key(uploaded[kind], user_id, kind, signer)

        def txn(t: Transaction) -> tuple[set[str], None]:
            for kind, key in uploaded.items():
                usage = CROSS_SIGNING_USAGES[kind]
                xs.put_cross_signing_key_txn(
                    t, user_id, usage, cross_signing_public_key(key)[1], key
                )
            return ({user_id} if uploaded else set()), None

        await self._write("e2e_upload_cross_signing", txn)

    async def upload_signatures(self, requester: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /keys/signatures/upload``: each signature by ``requester`` is checked
        against the signing key it names; the ones that fail are reported per key in
        ``failures`` and not stored."""
        if self._forwards():
            args = {"user_id": requester, "body": dict(body)}
            targets = [u for u in body if isinstance(u, str)]
            return dict(await self._forwarded("upload_signatures", args, targets))
        failures: dict[str, dict[str, dict[str, str]]] = {}

        def fail(user: str, key_id: str, errcode: str, error: str) -> None:
            failures.setdefault(user, {})[key_id] = {"errcode": errcode, "error": error}

        def txn(t: Transaction) -> tuple[set[str], None]:
            own_cross = xs.cross_signing_keys_txn(t, requester)
            own_devices = dk.device_keys_of_txn(t, requester, None)
            signer_keys: dict[str, str] = {}
            for key in own_cross.values():
                key_id, public = cross_signing_public_key(key)
                signer_keys[key_id] = public
            for device_id, keys in own_devices.items():
                public = keys.get("keys", {}).get(f"ed25519:{device_id}")
                if isinstance(public, str):
                    signer_keys[f"ed25519:{device_id}"] = public
            changed: set[str] = set()
            for user_id, objects in body.items():
                if not isinstance(objects, dict):
                    raise InvalidParamError("expected user -> key -> object")
                devices = dk.device_keys_of_txn(t, user_id, None)
                cross = xs.cross_signing_keys_txn(t, user_id)
                by_public = {cross_signing_public_key(k)[1]: k for k in cross.values()}
                for target, signed in objects.items():
                    stored = devices.get(target) or by_public.get(target)
                    if stored is None:
                        fail(user_id, target, Codes.NOT_FOUND, "unknown key")
                        continue
                    if not isinstance(signed, dict) or _strip(signed) != _strip(stored):
                        fail(user_id, target, Codes.INVALID_SIGNATURE, "key does not match")
                        continue
                    all_signatures = signed.get("signatures")
                    mine = (
                        all_signatures.get(requester) if isinstance(all_signatures, dict) else None
                    )
                    if not isinstance(mine, dict) or not mine:
                        fail(user_id, target, Codes.INVALID_SIGNATURE, "no signature")
                        continue
                    for signer_key_id, signature in mine.items():
                        signer_public = signer_keys.get(signer_key_id)
                        if signer_public is None or not has_valid_signature(
                            {**signed, "signatures": {requester: {signer_key_id: signature}}},
                            requester,
                            signer_key_id,
                            signer_public,
                        ):
                            fail(user_id, target, Codes.INVALID_SIGNATURE, "invalid signature")
                            continue
                        xs.put_signature_txn(
                            t, requester, signer_key_id, user_id, target, str(signature)
                        )
                        changed.add(user_id)
            return changed, None

        await self._write("e2e_upload_signatures", txn)
        return {"failures": failures}
