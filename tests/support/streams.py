"""Helpers for driving reservations by hand in tests."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from roomstream.storage import Database, Transaction
from roomstream.streams import StreamIdGenerator
from roomstream.streams.registry import CACHES


class Rollback(Exception):
    """Raised inside a reservation to roll its fact back."""


class OpenReservation:
    """A reservation entered but not yet left, so tests choose the completion order."""

    def __init__(self, cm: AbstractAsyncContextManager[list[int]], ids: list[int]) -> None:
        self._cm = cm
        self.ids = ids

    @classmethod
    async def open(cls, generator: StreamIdGenerator, count: int = 1) -> OpenReservation:
        cm = generator.reserve_many(count)
        ids = await cm.__aenter__()
        return cls(cm, ids)

    async def commit(self, database: Database, writer: str) -> None:
        """Write one caches-stream row per ID, then complete."""
        await database.run_interaction("write_cache_rows", write_cache_rows, self.ids, writer)
        await self._cm.__aexit__(None, None, None)

    async def rollback(self) -> None:
        try:
            raise Rollback()
        except Rollback as exc:
            suppressed = await self._cm.__aexit__(type(exc), exc, exc.__traceback__)
            assert not suppressed


def write_cache_rows(txn: Transaction, ids: list[int], writer: str) -> None:
    txn.executemany(
        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) VALUES (?, ?, ?, ?, ?)",
        [(i, writer, "get_thing", f'["k{i}"]', 0) for i in ids],
    )


async def caches_generator(
    database: Database, instance: str, writers: list[str], **kwargs: Any
) -> StreamIdGenerator:
    return await StreamIdGenerator.create(
        database,
        CACHES.name,
        CACHES.sequence,
        CACHES.table_refs,
        writers,
        instance,
        **kwargs,
    )
