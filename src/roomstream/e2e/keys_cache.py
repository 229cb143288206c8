"""An in-memory cache of each user's formatted ``/keys/query`` part, kept correct across
processes by the ``device_lists`` stream.

Every change to what ``/keys/query`` answers for a user (device keys uploaded or deleted,
a device renamed or deleted, cross-signing keys, signatures on the user's keys) writes a
``device_lists`` row for that user (:class:`~roomstream.e2e.E2eKeys`, in the change's
transaction; a deleted device's row comes with the deletion of its keys, right after the
device's own deletion). So the cache drops a user's entry when such a row reaches this
process: at once on the process that committed it (:meth:`KeysCache.invalidate_users`
after the commit), on every other process when the row arrives over replication
(:meth:`KeysCache.apply_rows`). A change made elsewhere is seen here as soon as
replication delivers its row (milliseconds), as with the access-token cache.

That holds only while the rows reach this process as they are written: while the
``device_lists`` stream's links from its writers are not live (``live``, replication's
one definition, :meth:`~roomstream.replication.follower.FollowerSession.is_live`), the
cache is neither read nor filled (:meth:`KeysCache.trusted`): every query reads the
database, until the links are live again (by then the rows missed meanwhile have been
applied, dropping what they changed).

Invariant: an entry is only ever added from a database read that started after the last
invalidation this process applied (:attr:`KeysCache.generation` is compared), so a read
racing with a change can never put the old keys back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from roomstream.e2e.key_format import UserKeys
from roomstream.lru import LruCache
from roomstream.streams.rows import DeviceListsRow

__all__ = ["KeysCache"]


class KeysCache:
    """User ID -> :class:`~roomstream.e2e.key_format.UserKeys`, least recently used
    evicted first."""

    def __init__(
        self, max_size: int | None = None, *, live: Callable[[], bool] | None = None
    ) -> None:
        """``live``: whether ``device_lists`` rows reach this process as they are written
        (None: always, as on a process that writes them all). ``max_size``: the
        ``e2e_user_keys`` cache's configured size unless given."""
        self._live = live
        self._users: LruCache[str, UserKeys] = LruCache("e2e_user_keys", max_size)
        #: Bumped by every invalidation; see :meth:`put`.
        self.generation = 0

    def __len__(self) -> int:
        return len(self._users)

    def trusted(self) -> bool:
        """Whether cached entries may answer queries (and reads may fill them) now."""
        return self._live is None or self._live()

    def get_many(self, user_ids: Iterable[str]) -> dict[str, UserKeys]:
        """The cached entries of ``user_ids`` (those it has); none when not trusted."""
        if not self.trusted():
            return {}
        found = {}
        for user_id in user_ids:
            keys = self._users.get(user_id)
            if keys is not None:
                found[user_id] = keys
        return found

    def put(self, user_id: str, keys: UserKeys, generation: int) -> None:
        """Remember ``keys``, read from the database after :attr:`generation` was
        ``generation``; ignored if an invalidation has been applied since, or while the
        cache is not trusted."""
        if generation == self.generation and self.trusted():
            self._users.set(user_id, keys)

    def invalidate_users(self, user_ids: Iterable[str]) -> None:
        """Forget the entries of ``user_ids`` (their keys or devices changed)."""
        self.generation += 1
        for user_id in user_ids:
            self._users.pop(user_id)

    def invalidate_all(self) -> None:
        self.generation += 1
        self._users.invalidate_all()

    def apply_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """``device_lists`` rows (another process's, from replication)."""
        self.invalidate_users(DeviceListsRow.from_wire(row).user_id for row in rows)
