"""Named in-memory caches, kept coherent across processes through the ``caches`` stream.

Each process holds a :class:`CacheRegistry` of :class:`LruCache` objects keyed by tuples.
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
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from roomstream.storage import Transaction
from roomstream.streams import StreamSet

__all__ = [
    "STATE_CACHE_GROUP",
    "CacheGroup",
    "CacheInvalidator",
    "CacheRegistry",
    "LruCache",
    "stream_invalidation_txn",
]

#: The group invalidated when a room's current state changes (Synapse's name for it).
STATE_CACHE_GROUP = "cs_cache_fake"

V = TypeVar("V")
Key = tuple[Hashable, ...]
_MISSING: Any = object()


class LruCache(Generic[V]):
    """A bounded mapping from tuple keys to values, evicting the least recently used.

    Keys are indexed by their first element too, so invalidating a prefix ``(a,)`` costs
    the number of keys starting with ``a``, not the size of the cache.
    """

    def __init__(self, name: str, max_size: int = 10_000) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._data: OrderedDict[Key, V] = OrderedDict()
        self._by_first: dict[Hashable, set[Key]] = {}
        self.hits = 0
        self.misses = 0
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: Key, default: V | None = None) -> V | None:
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value  # type: ignore[no-any-return]

    def set(self, key: Key, value: V) -> None:
        if not isinstance(key, tuple) or not key:
            raise TypeError(f"cache {self.name}: keys are non-empty tuples, got {key!r}")
        data = self._data
        if key in data:
            data.move_to_end(key)
        else:
            self._by_first.setdefault(key[0], set()).add(key)
        data[key] = value
        while len(data) > self.max_size:
            old, _ = data.popitem(last=False)
            self._unindex(old)

    def keys(self) -> list[Key]:
        return list(self._data)

    def invalidate(self, key: Sequence[Hashable]) -> int:
        """Drop ``key`` and every key that extends it; returns how many entries went."""
        prefix = tuple(key)
        if not prefix:
            return self.invalidate_all()
        candidates = self._by_first.get(prefix[0])
        if not candidates:
            return 0
        n = len(prefix)
        doomed = [k for k in candidates if k[:n] == prefix]
        for k in doomed:
            del self._data[k]
            self._unindex(k)
        self.invalidations += len(doomed)
        return len(doomed)

    def invalidate_all(self) -> int:
        count = len(self._data)
        self._data.clear()
        self._by_first.clear()
        self.invalidations += count
        return count

    def _unindex(self, key: Key) -> None:
        bucket = self._by_first.get(key[0])
        if bucket is not None:
            bucket.discard(key)
            if not bucket:
                del self._by_first[key[0]]


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
        self._caches: dict[str, LruCache[Any]] = {}
        self._groups: dict[str, CacheGroup] = {}
        self.rows_applied = 0

    def register(self, name: str, max_size: int = 10_000) -> LruCache[Any]:
        """The cache called ``name``, created on first use."""
        cache = self._caches.get(name)
        if cache is None:
            if name in self._groups:
                raise ValueError(f"{name} is a cache group")
            cache = self._caches[name] = LruCache(name, max_size)
        return cache

    def get(self, name: str) -> LruCache[Any] | None:
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
