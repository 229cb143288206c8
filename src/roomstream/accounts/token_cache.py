"""An in-memory cache of access-token owners, kept correct across processes.

A request's token is looked up here before the database. Every change that ends tokens
(logout, logout from all devices) deletes them and, in the same database transaction,
writes a row to the ``caches`` stream (``[TOKEN_CACHE, [user_id], ts]``): the process
that commits it drops the user's cached tokens at once, every other process when the row
reaches it over replication (:meth:`TokenCache.apply_cache_row`). So a token that stopped
working on one process stops working on all of them as soon as replication delivers
that row (milliseconds), with no database read per request in between.

That holds only while the rows reach this process as they are written. While the
``caches`` stream's link from its writer is not live (connection lost, Redis down, or
still catching up to the position the writer announced: replication's one definition,
:meth:`~roomstream.replication.follower.FollowerSession.is_live`), a logout elsewhere
would go unnoticed, so the cache is not trusted: :meth:`TokenCache.trusted` says no and
every request reads the database, until the link is live again (by then the rows
missed meanwhile have been applied). The liveness is a callable handed in by the process
(``live``), so this module knows nothing of replication.

Invariant: an entry is only ever added from a database read that started after the last
invalidation this process applied (:attr:`TokenCache.generation` is compared), so a read
racing with a logout can never put the logged-out token back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from roomstream.lru import LruCache

__all__ = ["TOKEN_CACHE", "TokenCache"]

#: The ``cache_func`` of the ``caches`` stream rows that end a user's cached tokens.
TOKEN_CACHE = "get_token_owner"


class TokenCache:
    """Token hash -> (user ID, device ID), least recently used evicted first."""

    def __init__(
        self, max_size: int | None = None, *, live: Callable[[], bool] | None = None
    ) -> None:
        """``live``: whether invalidations reach this process as they are written (None:
        always, as on the process that writes them all). ``max_size``: the
        ``access_tokens`` cache's configured size unless given."""
        self._live = live
        self._owners: LruCache[str, tuple[str, str]] = LruCache(
            "access_tokens",
            max_size,
            on_evict=lambda hashed, owner: self._discard(owner[0], hashed),
        )
        self._by_user: dict[str, set[str]] = {}
        #: Bumped by every invalidation; see :meth:`put`.
        self.generation = 0

    def __len__(self) -> int:
        return len(self._owners)

    def trusted(self) -> bool:
        """Whether cached owners may answer requests now (see the module docstring);
        when not, callers read the database and do not fill the cache."""
        return self._live is None or self._live()

    @property
    def max_size(self) -> int:
        return self._owners.max_size

    def get(self, hashed: str) -> tuple[str, str] | None:
        return self._owners.get(hashed)

    def put(self, hashed: str, owner: tuple[str, str], generation: int) -> None:
        """Remember ``owner``, read from the database after :attr:`generation` was
        ``generation``; ignored if an invalidation has been applied since."""
        if generation != self.generation:
            return
        self._by_user.setdefault(owner[0], set()).add(hashed)
        self._owners.set(hashed, owner)

    def invalidate_user(self, user_id: str) -> None:
        """Forget every cached token of ``user_id``."""
        self.generation += 1
        for hashed in self._by_user.pop(user_id, ()):
            self._owners.pop(hashed)

    def invalidate_all(self) -> None:
        self.generation += 1
        self._owners.invalidate_all()
        self._by_user.clear()

    def apply_cache_row(self, row: Sequence[Any]) -> None:
        """A ``caches`` stream row ``[cache_func, keys, ts]`` from another process."""
        if not row or row[0] != TOKEN_CACHE:
            return
        keys = row[1] if len(row) > 1 else None
        if not keys:
            self.invalidate_all()
        else:
            self.invalidate_user(str(keys[0]))

    def _discard(self, user_id: str, hashed: str) -> None:
        hashes = self._by_user.get(user_id)
        if hashes is not None:
            hashes.discard(hashed)
            if not hashes:
                del self._by_user[user_id]
