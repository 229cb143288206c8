"""The one in-memory cache type: a named, bounded map that evicts the least recently used.

Every cache a process keeps is an :class:`LruCache` with a name from :data:`CACHES`, where
its default size and its owner are written down once. The configuration's
``caches.sizes`` sets any of them (:func:`configure_sizes`, called by whoever assembles
the process, before or after the caches exist); ``roomstream.metrics`` exports each
name's hits, misses, evictions, invalidations, entries and size, read at scrape time from
the live caches (nothing on the hot path but integer increments).

Invariants:

- ``len(cache) <= cache.max_size`` after every call returns;
- a key read with :meth:`LruCache.get` becomes the most recently used; :meth:`peek` reads
  without touching the order or the counters (safe from a database worker thread while
  the event loop writes: both are single dictionary operations under the GIL);
- with ``prefix_index=True`` keys are non-empty tuples, indexed by their first element, so
  :meth:`LruCache.invalidate` of a prefix ``(a,)`` costs the number of keys starting with
  ``a``, not the size of the cache.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from roomstream.metrics import CacheFigures, set_cache_source

__all__ = [
    "CACHES",
    "CacheSpec",
    "LruCache",
    "configure_sizes",
    "configured_size",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING: Any = object()


@dataclass(frozen=True)
class CacheSpec:
    """A cache's default size and what it holds (``docs/operations.md`` lists them)."""

    default_size: int
    holds: str


#: Every named cache of a process: name -> default size and what it holds. A name set in
#: ``caches.sizes`` must be one of these.
CACHES: dict[str, CacheSpec] = {
    "events": CacheSpec(20_000, "parsed events (rooms.store.EventStore)"),
    "formatted_events": CacheSpec(20_000, "events in the client format (reading.events)"),
    "persist_rooms": CacheSpec(1_000, "rooms' forward extremities and versions (persister)"),
    "persist_states": CacheSpec(1_000, "state maps by state group (persister)"),
    "visibility_rooms": CacheSpec(512, "rooms' visibility snapshots (visibility recorder)"),
    "visibility_memberships": CacheSpec(50_000, "membership of member events (recorder)"),
    "visibility_classes": CacheSpec(50_000, "history visibility of events (recorder)"),
    "backfill_states": CacheSpec(8, "the last state maps of a visibility rebuild"),
    "room_summaries": CacheSpec(100_000, "rooms' sync summaries (reading.summaries)"),
    "room_state_json": CacheSpec(256, "serialised /state answers by room (client.rooms)"),
    "device_transactions": CacheSpec(10_000, "a device's transaction IDs in a room"),
    "sync_sent_members": CacheSpec(10_000, "lazy-loaded members sent to each device"),
    "unread_counts": CacheSpec(100_000, "unread counts by (user, room) (client.unread)"),
    "ignored_users": CacheSpec(50_000, "users' ignored users (client.ignored)"),
    "push_rules": CacheSpec(50_000, "users' effective push rules (client.push_store)"),
    "sliding_lists": CacheSpec(10_000, "sliding sync room lists by user"),
    "sliding_derived": CacheSpec(256, "sliding sync derived room data"),
    "sliding_direct": CacheSpec(10_000, "users' direct rooms (m.direct)"),
    "access_tokens": CacheSpec(100_000, "access token owners (accounts.token_cache)"),
    "client_ips": CacheSpec(100_000, "recently recorded client IPs (accounts.client_ips)"),
    "e2e_user_keys": CacheSpec(5_000, "users' formatted /keys/query parts (e2e.keys_cache)"),
}

#: Sizes from the configuration, by name (``caches.sizes``).
_configured: dict[str, int] = {}
#: Every live cache, for the metrics and for :func:`configure_sizes`.
_live: weakref.WeakSet[LruCache[Any, Any]] = weakref.WeakSet()


def configured_size(name: str, default: int | None = None) -> int:
    """The size a cache called ``name`` gets: the configured one, else its default."""
    if name in _configured:
        return _configured[name]
    if default is not None:
        return default
    spec = CACHES.get(name)
    if spec is None:
        raise KeyError(f"no cache called {name!r} in roomstream.lru.CACHES")
    return spec.default_size


def configure_sizes(sizes: Mapping[str, int]) -> None:
    """Set the sizes of named caches, those alive now and those made later; names left
    out go back to their defaults. ``ValueError`` for an unknown name or a size below 1."""
    for name, size in sizes.items():
        if name not in CACHES:
            raise ValueError(f"caches.sizes: no cache called {name!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"caches.sizes.{name}: a size is a whole number above 0")
    _configured.clear()
    _configured.update(sizes)
    for cache in list(_live):
        if cache.name in CACHES:
            cache.resize(configured_size(cache.name))


class LruCache(Generic[K, V]):
    """A bounded map from keys to values, least recently used out first (see the module).

    ``max_size`` defaults to the configured size of ``name`` (which must then be in
    :data:`CACHES`); caches made at run time under other names (the replicated caches of
    :mod:`roomstream.caches`) pass one.
    """

    __slots__ = (
        "__weakref__",
        "_by_first",
        "_data",
        "evictions",
        "hits",
        "invalidations",
        "max_size",
        "misses",
        "name",
        "on_evict",
    )

    def __init__(
        self,
        name: str,
        max_size: int | None = None,
        *,
        prefix_index: bool = False,
        on_evict: Callable[[K, V], object] | None = None,
    ) -> None:
        """``on_evict(key, value)`` is called for each entry evicted for room (not for
        :meth:`pop` or invalidations), for owners that index the entries elsewhere."""
        size = configured_size(name, max_size)
        if size < 1:
            raise ValueError(f"cache {name}: max_size must be at least 1")
        self.name = name
        self.max_size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._by_first: dict[Hashable, set[Any]] | None = {} if prefix_index else None
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0
        self.on_evict = on_evict
        _live.add(self)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value (now the most recently used), counted as a hit; else ``default``,
        counted as a miss."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value  # type: ignore[no-any-return]

    def peek(self, key: K, default: V | None = None) -> V | None:
        """The value without touching the order or the counters."""
        return self._data.get(key, default)

    def count_lookups(self, hits: int, misses: int) -> None:
        """Count lookups made with :meth:`peek` (by a caller that must not reorder, such as
        a database worker thread; counts from other threads may be slightly off)."""
        self.hits += hits
        self.misses += misses

    def set(self, key: K, value: V) -> None:
        """Store ``value`` as the most recently used, evicting the least recently used
        entries beyond the size."""
        data = self._data
        if key in data:
            data.move_to_end(key)
        elif self._by_first is not None:
            if not isinstance(key, tuple) or not key:
                raise TypeError(f"cache {self.name}: keys are non-empty tuples, got {key!r}")
            self._by_first.setdefault(key[0], set()).add(key)
        data[key] = value
        if len(data) > self.max_size:
            self._evict()

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove and return the value (not counted as an invalidation)."""
        value = self._data.pop(key, _MISSING)
        if value is _MISSING:
            return default
        self._unindex(key)
        return value  # type: ignore[no-any-return]

    def keys(self) -> list[K]:
        """The keys, least recently used first."""
        return list(self._data)

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first."""
        return list(self._data.items())

    def resize(self, max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"cache {self.name}: max_size must be at least 1")
        self.max_size = max_size
        self._evict()

    def invalidate(self, key: Sequence[Hashable]) -> int:
        """Drop the tuple ``key`` and every key that extends it (``prefix_index``
        caches); returns how many entries went."""
        if self._by_first is None:
            raise TypeError(f"cache {self.name} has no prefix index")
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
        """Drop every entry; returns how many went."""
        count = len(self._data)
        self._data.clear()
        if self._by_first is not None:
            self._by_first.clear()
        self.invalidations += count
        return count

    def _evict(self) -> None:
        data = self._data
        while len(data) > self.max_size:
            old, value = data.popitem(last=False)
            self._unindex(old)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(old, value)

    def _unindex(self, key: Any) -> None:
        if self._by_first is None:
            return
        bucket = self._by_first.get(key[0])
        if bucket is not None:
            bucket.discard(key)
            if not bucket:
                del self._by_first[key[0]]


def _figures() -> list[CacheFigures]:
    """Per name, the sums over its live caches (several in one process only in tests)."""
    by_name: dict[str, CacheFigures] = {}
    for cache in list(_live):
        figures = by_name.get(cache.name)
        if figures is None:
            figures = by_name[cache.name] = CacheFigures(cache.name)
        figures.hits += cache.hits
        figures.misses += cache.misses
        figures.evictions += cache.evictions
        figures.invalidations += cache.invalidations
        figures.entries += len(cache)
        figures.max_size += cache.max_size
    return sorted(by_name.values(), key=lambda f: f.name)


set_cache_source(_figures)
