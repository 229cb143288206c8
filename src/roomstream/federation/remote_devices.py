"""Remote users' device lists, as their servers' EDUs describe them (a small part of
Synapse's ``DeviceListUpdater``): the tables ``federation_remote_device_lists``,
``federation_remote_devices`` and ``federation_remote_cross_signing`` (migration 0025,
written only here).

What an ``m.device_list_update`` does:

- it is ignored for a user joined to no room on this server (nobody here needs their
  devices; Synapse does the same), and when its ``stream_id`` is not above the last one
  applied (a repeat or an old update);
- it is applied to the cached devices when it follows what is cached: its ``prev_id``
  list is empty or names only the last ``stream_id`` applied (a user not tracked yet is
  tracked from an update with no ``prev_id``); a ``deleted`` device leaves the cache, and
  device keys that do not verify (the device's own ed25519 signature, as on upload) are
  not cached;
- otherwise (a gap: an update we have not seen, or keys that do not verify) the user's
  list is marked **stale** and every cached device of theirs is dropped: nothing cached
  is served as their current devices until a resync (``GET /user/devices`` of their
  server, :meth:`RemoteDeviceLists.replace`) replaces it;
- in every case where it is not ignored, one ``device_lists`` row for the user is written
  in the same transaction (on a process that writes that stream), so the ``/sync``
  ``device_lists.changed`` of every local user sharing a room with them names them, and
  ``/keys/changes`` too: their clients query the keys again.

``m.signing_key_update`` replaces the user's cached master / self-signing keys (shape
checked: the user's key, the usage its kind needs, one ed25519 key) with the same row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from roomstream.e2e import device_lists
from roomstream.e2e.signatures import check_cross_signing_key, check_device_keys
from roomstream.errors import MatrixError
from roomstream.storage import Database, Transaction
from roomstream.streams import StreamIdGenerator

__all__ = ["DeviceListUpdate", "RemoteDeviceList", "RemoteDeviceLists", "joined_anywhere_txn"]

logger = logging.getLogger(__name__)

#: Cross-signing kinds another server may tell us of (a user-signing key never leaves
#: its owner's server).
FEDERATED_CROSS_SIGNING = ("master_key", "self_signing_key")
#: The usage name of each, as stored (``master``, ``self_signing``).
_KIND = {"master_key": "master", "self_signing_key": "self_signing"}


@dataclass(frozen=True)
class DeviceListUpdate:
    """One ``m.device_list_update`` EDU, parsed."""

    user_id: str
    device_id: str
    stream_id: int
    prev_ids: tuple[int, ...] = ()
    deleted: bool = False
    keys: Mapping[str, Any] | None = None


@dataclass
class RemoteDeviceList:
    """What is cached of a remote user's devices."""

    user_id: str
    stream_id: int
    stale: bool
    #: device ID -> device keys (None: named by an update without keys).
    devices: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: ``master`` / ``self_signing`` -> key object.
    cross_signing: dict[str, dict[str, Any]] = field(default_factory=dict)


def joined_anywhere_txn(t: Transaction, user_id: str) -> bool:
    """Whether ``user_id`` is joined to a room on this server (current state)."""
    row = t.query_one(
        "SELECT 1 FROM current_state_events WHERE type = 'm.room.member'"
        " AND state_key = ? AND membership = 'join'",
        (user_id,),
    )
    return row is not None


def _tracked_txn(t: Transaction, user_id: str) -> tuple[int, bool] | None:
    row = t.query_one(
        "SELECT stream_id, stale FROM federation_remote_device_lists WHERE user_id = ?",
        (user_id,),
    )
    return None if row is None else (int(row[0]), bool(row[1]))


def _set_tracked_txn(t: Transaction, user_id: str, stream_id: int, stale: bool, now: int) -> None:
    t.execute("DELETE FROM federation_remote_device_lists WHERE user_id = ?", (user_id,))
    t.execute(
        "INSERT INTO federation_remote_device_lists (user_id, stream_id, stale, updated_ts)"
        " VALUES (?, ?, ?, ?)",
        (user_id, stream_id, 1 if stale else 0, now),
    )


def _drop_devices_txn(t: Transaction, user_id: str) -> None:
    t.execute("DELETE FROM federation_remote_devices WHERE user_id = ?", (user_id,))


def _put_device_txn(
    t: Transaction, user_id: str, device_id: str, keys: Mapping[str, Any] | None
) -> None:
    t.execute(
        "DELETE FROM federation_remote_devices WHERE user_id = ? AND device_id = ?",
        (user_id, device_id),
    )
    t.execute(
        "INSERT INTO federation_remote_devices (user_id, device_id, keys_json) VALUES (?, ?, ?)",
        (user_id, device_id, None if keys is None else orjson.dumps(dict(keys)).decode()),
    )


class _Unverified:
    """Device keys that did not verify."""


UNVERIFIED = _Unverified()


def _verified_keys(update: DeviceListUpdate) -> Mapping[str, Any] | _Unverified | None:
    """The update's keys if they verify, None without keys, :data:`UNVERIFIED` else."""
    if update.keys is None:
        return None
    try:
        return check_device_keys(dict(update.keys), update.user_id, update.device_id)
    except MatrixError:
        return UNVERIFIED


class RemoteDeviceLists:
    """The three tables, and the ``device_lists`` rows their changes call for.

    ``stream``: the ``device_lists`` stream's generator. On a process that does not
    write it, the tables are still kept but no row is written (logged at WARNING): local
    syncs then learn of the change only when something else writes a row for the user.
    ``on_changed``: told of the users a committed change concerned (the e2e keys cache's
    ``invalidate_users``), also when the commit's outcome is unknown."""

    def __init__(
        self,
        db: Database,
        stream: StreamIdGenerator,
        *,
        on_changed: Callable[[set[str]], object] | None = None,
        joined: Callable[[Transaction, str], bool] = joined_anywhere_txn,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """``joined``: whether a user is in a room here (tests replace it)."""
        self.db = db
        self.stream = stream
        self.on_changed = on_changed
        self._joined = joined
        self._clock = clock_ms

    async def _write(self, name: str, user_id: str, func: Callable[[Transaction], bool]) -> bool:
        """Run ``func`` (True: the user's devices changed, a row is due) in one
        transaction, with the ``device_lists`` row."""
        wrote = False
        try:
            if self.stream.is_writer():
                instance = self.stream.instance_name

                def txn(t: Transaction, ids: list[int]) -> bool:
                    changed = func(t)
                    if changed:
                        device_lists.append_txn(t, ids[0], instance, [user_id])
                    return changed

                _, wrote = await self.stream.run_with_ids(name, 1, txn)
            else:
                wrote = await self.db.run_interaction(name, func)
                if wrote:
                    logger.warning(
                        "remote device list of %s changed, but %s does not write the"
                        " device_lists stream: local syncs are not told",
                        user_id,
                        self.stream.instance_name,
                    )
        finally:
            if self.on_changed is not None:
                self.on_changed({user_id})
        return wrote

    async def apply_update(self, update: DeviceListUpdate) -> bool:
        """Apply one ``m.device_list_update`` (see the module docstring); whether it was
        taken (a ``device_lists`` row written), not ignored."""
        keys = _verified_keys(update)
        now = self._clock()

        def func(t: Transaction) -> bool:
            if not self._joined(t, update.user_id):
                return False
            tracked = _tracked_txn(t, update.user_id)
            if tracked is not None and update.stream_id <= tracked[0]:
                return False
            follows = (tracked is None and not update.prev_ids) or (
                tracked is not None
                and not tracked[1]
                and all(p == tracked[0] for p in update.prev_ids)
            )
            if not follows or isinstance(keys, _Unverified):
                _drop_devices_txn(t, update.user_id)
                _set_tracked_txn(t, update.user_id, update.stream_id, True, now)
                return True
            if update.deleted:
                t.execute(
                    "DELETE FROM federation_remote_devices WHERE user_id = ? AND device_id = ?",
                    (update.user_id, update.device_id),
                )
            else:
                _put_device_txn(t, update.user_id, update.device_id, keys)
            _set_tracked_txn(t, update.user_id, update.stream_id, False, now)
            return True

        return await self._write("federation_device_list_update", update.user_id, func)

    async def apply_signing_keys(self, user_id: str, keys: Mapping[str, Any]) -> bool:
        """Apply one ``m.signing_key_update`` (``master_key`` / ``self_signing_key``);
        whether anything was stored. Keys of the wrong shape are left out (logged)."""
        checked: dict[str, dict[str, Any]] = {}
        for kind in FEDERATED_CROSS_SIGNING:
            key = keys.get(kind)
            if key is None:
                continue
            try:
                checked[_KIND[kind]] = check_cross_signing_key(key, user_id, kind, None)
            except MatrixError as exc:
                logger.info("m.signing_key_update of %s: %s dropped (%s)", user_id, kind, exc)
        if not checked:
            return False

        def func(t: Transaction) -> bool:
            if not self._joined(t, user_id):
                return False
            for kind, key in checked.items():
                t.execute(
                    "DELETE FROM federation_remote_cross_signing"
                    " WHERE user_id = ? AND key_type = ?",
                    (user_id, kind),
                )
                t.execute(
                    "INSERT INTO federation_remote_cross_signing (user_id, key_type, key_json)"
                    " VALUES (?, ?, ?)",
                    (user_id, kind, orjson.dumps(key).decode()),
                )
            return True

        return await self._write("federation_signing_key_update", user_id, func)

    async def replace(
        self,
        user_id: str,
        stream_id: int,
        devices: Mapping[str, Mapping[str, Any] | None],
        cross_signing: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """A resync: the user's whole list as their server's ``GET /user/devices``
        answered it (devices whose keys do not verify are kept without keys); no longer
        stale. For the outbound side (the fetch is not made here)."""
        now = self._clock()
        kept: dict[str, Mapping[str, Any] | None] = {}
        for device_id, keys in devices.items():
            update = DeviceListUpdate(user_id, device_id, stream_id, keys=keys)
            verified = _verified_keys(update)
            kept[device_id] = verified if isinstance(verified, Mapping) else None

        def func(t: Transaction) -> bool:
            _drop_devices_txn(t, user_id)
            for device_id, keys in sorted(kept.items()):
                _put_device_txn(t, user_id, device_id, keys)
            t.execute("DELETE FROM federation_remote_cross_signing WHERE user_id = ?", (user_id,))
            for kind, key in sorted(cross_signing.items()):
                t.execute(
                    "INSERT INTO federation_remote_cross_signing (user_id, key_type, key_json)"
                    " VALUES (?, ?, ?)",
                    (user_id, kind, orjson.dumps(dict(key)).decode()),
                )
            _set_tracked_txn(t, user_id, stream_id, False, now)
            return True

        await self._write("federation_device_list_resync", user_id, func)

    async def get(self, user_id: str) -> RemoteDeviceList | None:
        """What is cached of the user (None: not tracked)."""

        def txn(t: Transaction) -> RemoteDeviceList | None:
            tracked = _tracked_txn(t, user_id)
            if tracked is None:
                return None
            found = RemoteDeviceList(user_id, tracked[0], tracked[1])
            for device_id, keys_json in t.query(
                "SELECT device_id, keys_json FROM federation_remote_devices WHERE user_id = ?"
                " ORDER BY device_id",
                (user_id,),
            ):
                found.devices[str(device_id)] = (
                    None if keys_json is None else orjson.loads(keys_json)
                )
            for kind, key_json in t.query(
                "SELECT key_type, key_json FROM federation_remote_cross_signing WHERE user_id = ?",
                (user_id,),
            ):
                found.cross_signing[str(kind)] = orjson.loads(key_json)
            return found

        return await self.db.run_interaction("federation_remote_devices", txn)

    async def stale_users(self, limit: int = 100) -> Sequence[str]:
        """Users whose cached list is stale (the resync's to-do list), oldest first."""
        rows = await self.db.run_interaction(
            "federation_stale_device_lists",
            lambda t: t.query(
                "SELECT user_id FROM federation_remote_device_lists WHERE stale = 1"
                f" ORDER BY updated_ts, user_id LIMIT {int(limit)}"
            ),
        )
        return [str(r[0]) for r in rows]
