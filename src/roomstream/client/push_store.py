"""Each user's push rules, on every process: loaded from their ``m.push_rules`` global
account data (:mod:`roomstream.client.pushrules`), cached, and changed through the
``account_data`` stream's writer.

Why account data rather than a ``push_rules`` stream of its own (Synapse's): the rules are
one document per user that clients already receive as ``m.push_rules`` account data in
``/sync``, and the ``account_data`` stream already carries a change to every process and
forwards writes to its writer. A change of rules is one ``account_data`` row.

Cache invalidation as :mod:`roomstream.client.ignored`: the process that writes (or
forwards) a change forgets the user's entry when the write returns; every other process
forgets it when the ``account_data`` row reaches it; a read that raced an invalidation is
not kept (a generation check).

Edits are read-modify-write of the whole document: two edits of one user's rules at the
same moment can lose one (the last write wins), as with tags.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from roomstream.client.pushrules import PUSH_RULES, with_defaults
from roomstream.lru import LruCache
from roomstream.streams.rows import AccountDataRow

__all__ = ["PushRulesStore"]

Loader = Callable[[str], Awaitable[dict[str, Any] | None]]
Writer = Callable[[str, Mapping[str, Any]], Awaitable[None]]
Edit = Callable[[dict[str, Any]], dict[str, Any]]


class PushRulesStore:
    def __init__(self, load: Loader, write: Writer) -> None:
        self._load = load
        self._write = write
        self._cache: LruCache[str, dict[str, Any]] = LruCache("push_rules")
        self._generation = 0
        #: One edit at a time per process (edits from one process never lose each other).
        self._lock = asyncio.Lock()

    async def rules_of(self, user_id: str) -> dict[str, Any]:
        """The user's effective document (never modify it: it is the cached one)."""
        cached = self._cache.get(user_id)
        if cached is not None:
            return cached
        generation = self._generation
        rules = with_defaults(user_id, await self._load(user_id))
        if generation == self._generation:
            self._cache.set(user_id, rules)
        return rules

    async def edit(self, user_id: str, change: Edit) -> None:
        """Apply ``change`` (a pure function of :mod:`~roomstream.client.pushrules`, which
        raises for bad input) to the user's current document and store the result."""
        async with self._lock:
            current = with_defaults(user_id, await self._load(user_id))
            await self._write(user_id, change(current))
            self.invalidate(user_id)

    def invalidate(self, user_id: str) -> None:
        self._generation += 1
        self._cache.pop(user_id)

    def on_account_data_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """``account_data`` rows ``(user_id, room_id, data_type)``: forget the users whose
        push rules changed."""
        for wire in rows:
            if len(wire) < 3:
                continue
            row = AccountDataRow.from_wire(wire[:3])
            if row.room_id is None and row.data_type == PUSH_RULES:
                self.invalidate(str(row.user_id))
