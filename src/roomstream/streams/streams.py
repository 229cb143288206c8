"""The streams of one process: an ID generator per table-backed stream, ready to use."""

from __future__ import annotations

from collections.abc import Mapping

from roomstream.storage import Database
from roomstream.streams.id_generator import StreamIdGenerator
from roomstream.streams.registry import STREAMS, StreamDefinition, Update, get_updates_txn


class StreamSet:
    """Every table-backed stream with its generator, as configured for this instance."""

    def __init__(self, database: Database, generators: Mapping[str, StreamIdGenerator]) -> None:
        self.database = database
        self._generators = dict(generators)

    @classmethod
    async def open(
        cls,
        database: Database,
        instance_name: str,
        writers: Mapping[str, tuple[str, ...]],
        streams: Mapping[str, StreamDefinition] = STREAMS,
    ) -> StreamSet:
        """``writers`` maps stream name to its writers; unnamed streams are written by main."""
        generators = {}
        for stream in streams.values():
            if stream.in_memory:
                continue
            generators[stream.name] = await StreamIdGenerator.create(
                database,
                stream.name,
                stream.sequence,
                stream.table_refs,
                writers.get(stream.name) or stream.default_writers,
                instance_name,
                positive=not stream.negative,
            )
        return cls(database, generators)

    async def flush(self) -> None:
        """Wait until every local position is stored (before shutting down, say)."""
        for generator in self._generators.values():
            await generator.flush()

    def generator(self, stream_name: str) -> StreamIdGenerator:
        return self._generators[stream_name]

    def __contains__(self, stream_name: object) -> bool:
        return stream_name in self._generators

    @property
    def names(self) -> list[str]:
        return sorted(self._generators)

    def current_token(self, stream_name: str, writer: str) -> int:
        """The writer's position as a positive token (negative streams are negated)."""
        stream = STREAMS[stream_name]
        position = self._generators[stream_name].get_position(writer)
        return -position if stream.negative else position

    async def get_updates(
        self,
        stream_name: str,
        writer: str,
        from_token: int,
        upto_token: int,
        limit: int,
        *,
        transaction_name: str = "get_updates",
    ) -> tuple[list[Update], int, bool]:
        """See :func:`roomstream.streams.registry.get_updates_txn`. ``transaction_name``
        tells readers apart in the transaction metrics (the notifier's reads are its own)."""
        return await self.database.run_interaction(
            transaction_name,
            get_updates_txn,
            STREAMS[stream_name],
            writer,
            from_token,
            upto_token,
            limit,
        )
