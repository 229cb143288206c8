"""Named in-memory caches, kept coherent across processes through the ``caches`` stream.

Each process holds a :class:`CacheRegistry` of :class:`roomstream.lru.LruCache` objects
keyed by tuples (with the prefix index).
A change that makes cached data stale writes a ``cache_invalidations`` row in the same
transaction as the change (:meth:`CacheInvalidator.invalidate_txn`), with an ID of the
``caches`` stream. The writer invalidates its own caches once the transaction commits;
every other process receives the row (``[cache_func, keys, invalidation_ts]``) over
replication and calls :meth:`CacheRegistry.apply_row`:

- ``keys`` a list: that key (a tuple of the list's items) is dropped from the cache, along
  with every longer key that starts with it;
- ``keys`` null: the whole cache is cleared;
- ``cache_func`` naming a *group* (:meth:`CacheRegistry.define_group`, e.g.
  ``cs_cache_fake`` for everything derived from a room's current state): one row
  invalidates several caches at once. With keys ``[room_id, user_id, ...]`` the group's
  room-keyed caches lose entries starting with ``(room_id,)``, its member-keyed caches lose
  ``(user_id,)`` for each user listed, and its ``whole`` caches are cleared; with keys null
  every cache of the group is cleared.

Invariant: once a process has applied a row, no entry that the row names survives in its
caches; an unknown cache name is ignored (that process caches nothing under it).
Invalidations commute and are idempotent, so applying a row twice or out of order across
writers is harmless.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from roomstream.lru import LruCache
from roomstream.storage import Transaction
from roomstream.streams import StreamSet

__all__ = [
    "STATE_CACHE_GROUP",
    "CacheGroup",
    "CacheInvalidator",
    "CacheRegistry",
    "stream_invalidation_txn",
]

#: The group invalidated when a room's current state changes (Synapse's name for it).
STATE_CACHE_GROUP = "cs_cache_fake"

Key = tuple[Hashable, ...]


@dataclass(frozen=True)
class CacheGroup:
    """Caches invalidated together by one row whose keys are ``[first, *rest]``.

    ``by_first``: keyed by ``first`` (a room ID), invalidated by prefix ``(first,)``;
    ``by_each_rest``: keyed by each of ``rest`` (user IDs); ``whole``: always cleared.
    """

    name: str
    by_first: tuple[str, ...] = ()
    by_each_rest: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        return self.by_first + self.by_each_rest + self.whole


class CacheRegistry:
    """The caches of one process, by name, and the groups defined over them."""

    def __init__(self) -> None:
        self._caches: dict[str, LruCache[Key, Any]] = {}
        self._groups: dict[str, CacheGroup] = {}
        self.rows_applied = 0

    def register(self, name: str, max_size: int = 10_000) -> LruCache[Key, Any]:
        """The cache called ``name``, created on first use."""
        cache = self._caches.get(name)
        if cache is None:
            if name in self._groups:
                raise ValueError(f"{name} is a cache group")
            cache = self._caches[name] = LruCache(name, max_size, prefix_index=True)
        return cache

    def get(self, name: str) -> LruCache[Key, Any] | None:
        return self._caches.get(name)

    def define_group(self, group: CacheGroup) -> None:
        if group.name in self._caches:
            raise ValueError(f"{group.name} is already a cache")
        self._groups[group.name] = group

    def invalidate(self, cache_func: str, keys: Sequence[Hashable] | None) -> None:
        """Apply one invalidation locally (a cache, a whole cache, or a group)."""
        group = self._groups.get(cache_func)
        if group is not None:
            self._invalidate_group(group, keys)
            return
        cache = self._caches.get(cache_func)
        if cache is None:
            return
        if keys is None:
            cache.invalidate_all()
        else:
            cache.invalidate(keys)

    def apply_row(self, row: Sequence[Any]) -> None:
        """Apply a ``caches`` stream row ``[cache_func, keys, invalidation_ts]``."""
        cache_func, keys = row[0], row[1]
        self.rows_applied += 1
        self.invalidate(str(cache_func), None if keys is None else _hashable(keys))

    def _invalidate_group(self, group: CacheGroup, keys: Sequence[Hashable] | None) -> None:
        caches = self._caches
        if keys is None or not keys:
            for name in group.members:
                cache = caches.get(name)
                if cache is not None:
                    cache.invalidate_all()
            return
        first, rest = keys[0], keys[1:]
        for name in group.by_first:
            cache = caches.get(name)
            if cache is not None:
                cache.invalidate((first,))
        for name in group.by_each_rest:
            cache = caches.get(name)
            if cache is not None:
                for item in rest:
                    cache.invalidate((item,))
        for name in group.whole:
            cache = caches.get(name)
            if cache is not None:
                cache.invalidate_all()


def _hashable(keys: Iterable[Any]) -> tuple[Hashable, ...]:
    # JSON turns tuples into lists; nested lists must become tuples to be dict keys.
    return tuple(_hashable(k) if isinstance(k, list) else k for k in keys)


def stream_invalidation_txn(
    txn: Transaction,
    stream_id: int,
    instance_name: str,
    cache_func: str,
    keys: Sequence[Any] | None,
    invalidation_ts: int | None = None,
) -> None:
    """Write one ``cache_invalidations`` row in the caller's transaction.

    ``stream_id`` must come from the ``caches`` generator's ``reserve()`` and the
    transaction must run inside that reservation, so the row is visible before the
    position that covers it is announced.
    """
    ts = int(time.time() * 1000) if invalidation_ts is None else invalidation_ts
    txn.execute(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) VALUES (?, ?, ?, ?, ?)",
        (
            stream_id,
            instance_name,
            cache_func,
            None if keys is None else orjson.dumps(list(keys)).decode(),
            ts,
        ),
    )


class CacheInvalidator:
    """Writes invalidations to the ``caches`` stream and applies them locally on commit.

    The local instance must be a writer of the ``caches`` stream. Typical use, in the
    transaction that changes the data::

        async with invalidator.reserve() as stream_id:
            await db.run_interaction(change_txn, stream_id)   # calls invalidate_txn
    """

    def __init__(self, streams: StreamSet, registry: CacheRegistry, instance_name: str) -> None:
        self._streams = streams
        self.registry = registry
        self.instance_name = instance_name

    def reserve(self) -> Any:
        """``async with`` block reserving one ``caches`` stream ID (see the class doc)."""
        return self._streams.generator("caches").reserve()

    def invalidate_txn(
        self,
        txn: Transaction,
        stream_id: int,
        cache_func: str,
        keys: Sequence[Any] | None,
    ) -> None:
        """Write the row; invalidate this process's caches if the transaction commits."""
        stream_invalidation_txn(txn, stream_id, self.instance_name, cache_func, keys)
        hashable = None if keys is None else _hashable(keys)
        txn.after_commit(_local(self.registry, cache_func, hashable))

    async def invalidate(self, cache_func: str, keys: Sequence[Any] | None) -> int:
        """Stream one invalidation in a transaction of its own; returns its stream ID."""
        async with self.reserve() as stream_id:
            await self._streams.database.run_interaction(
                "invalidate", self.invalidate_txn, stream_id, cache_func, keys
            )
        return int(stream_id)


def _local(
    registry: CacheRegistry, cache_func: str, keys: tuple[Hashable, ...] | None
) -> Callable[[], None]:
    return lambda: registry.invalidate(cache_func, keys)
