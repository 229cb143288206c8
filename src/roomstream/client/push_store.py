"""Each user's push rules, on every process: stored in the ``push_rules`` table (one
document per user, :mod:`roomstream.client.pushrules`), cached, and changed by the
``push_rules`` stream's one writer, as Synapse's ``push_rules`` stream.

Writes: the writer (``stream_writers.push_rules``, default main) carries out every edit,
its own clients' and those other processes forward to it (:class:`PushRuleEdit`), one at
a time (an asyncio lock: the one writer never loses an edit to another), each a
read-modify-write of the user's document stored with a new stream ID. The stream's row
is the user (``[user_id]``).

Cache invalidation: the writer forgets the user's entry when its write returns, the
process that forwarded the edit when the forwarded call returns, every other process
when the ``push_rules`` row reaches it (:meth:`PushRulesStore.on_push_rules_rows`); a read
that raced an invalidation is not kept (a generation check). So every process that
evaluates rules (unread counts, ``/notifications``, the pushers) uses a user's new rules
once the row reached it.

What clients see: after each edit the writer also stores the document as the user's
``m.push_rules`` global account data (``copy_out``: on the ``account_data`` writer,
forwarded if need be), so ``/sync``'s ``account_data`` (and sliding sync's, and
``/initialSync``) carries it as Synapse sends it; ``GET /pushrules`` reads this table.
Invariant: the copy is the document as of the user's last edit, except after a crash
between the two writes, or a failure of the second (the ``account_data`` writer out of
reach: the edit answers that error though the rules changed), when it stays one edit
behind until the user's next edit (the rules in force, the table's, are never behind).
Every initial ``/sync`` carries the rules whether or not a copy exists
(:mod:`roomstream.client.sync_sections.account_data`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from roomstream.client.pushrules import PushRuleEdit, with_defaults
from roomstream.lru import LruCache
from roomstream.storage import Transaction
from roomstream.streams import StreamSet
from roomstream.streams.rows import PushRulesRow

__all__ = ["PushRulesStore"]

#: Carries an edit out on the ``push_rules`` writer (another process).
Forward = Callable[[str, PushRuleEdit], Awaitable[None]]
#: Stores the user's document as their ``m.push_rules`` account data.
CopyOut = Callable[[str, Mapping[str, Any]], Awaitable[None]]


class PushRulesStore:
    """The ``push_rules`` table (its one writer module) and every process's cache of it.

    ``forward``: None when this process carries edits out itself (it is the writer, or
    has no writer to reach, as a single process)."""

    def __init__(
        self,
        streams: StreamSet,
        instance_name: str,
        *,
        forward: Forward | None = None,
        copy_out: CopyOut | None = None,
    ) -> None:
        self.streams = streams
        self.db = streams.database
        self.instance_name = instance_name
        self._forward = forward
        self._copy_out = copy_out
        self._cache: LruCache[str, dict[str, Any]] = LruCache("push_rules")
        self._generation = 0
        #: One edit at a time on the writer (its edits never lose each other).
        self._lock = asyncio.Lock()

    @property
    def writes(self) -> bool:
        """Whether edits are carried out here (else forwarded to the writer)."""
        return self._forward is None

    async def _load(self, user_id: str) -> dict[str, Any] | None:
        row = await self.db.run_interaction(
            "get_push_rules",
            lambda t: t.query_one("SELECT rules FROM push_rules WHERE user_id = ?", (user_id,)),
        )
        if row is None:
            return None
        value = orjson.loads(row[0])
        return value if isinstance(value, dict) else None

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

    async def edit(self, user_id: str, change: PushRuleEdit) -> None:
        """Apply ``change`` to the user's current document (raising its named error for
        bad input, nothing stored) and store the result, here or on the writer."""
        if self._forward is not None:
            try:
                await self._forward(user_id, change)
            finally:
                self.invalidate(user_id)
            return
        async with self._lock:
            current = with_defaults(user_id, await self._load(user_id))
            document = change.apply(current)
            generator = self.streams.generator("push_rules")
            instance = self.instance_name
            encoded = orjson.dumps(document).decode()

            def txn(t: Transaction, ids: list[int]) -> None:
                t.execute(
                    "INSERT INTO push_rules (user_id, stream_id, instance_name, rules)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET"
                    " stream_id = excluded.stream_id, instance_name = excluded.instance_name,"
                    " rules = excluded.rules",
                    (user_id, ids[0], instance, encoded),
                )

            try:
                await generator.run_with_ids("edit_push_rules", 1, txn)
            finally:
                self.invalidate(user_id)
            if self._copy_out is not None:
                await self._copy_out(user_id, document)

    def invalidate(self, user_id: str) -> None:
        self._generation += 1
        self._cache.pop(user_id)

    def on_push_rules_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """``push_rules`` rows ``[user_id]``: forget those users' rules."""
        for wire in rows:
            self.invalidate(PushRulesRow.from_wire(wire).user_id)
