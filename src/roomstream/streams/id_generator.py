"""Stream ID generators: reserve IDs from a database sequence, track their completion.

One :class:`StreamIdGenerator` per stream per process. Single-writer streams are the
one-writer case of the same class. For a negative stream (backfill) every ID and position
it hands out is the negation of the positive value it tracks internally, so IDs run
-1, -2, ... and "at or below" reads as "at or above".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from roomstream.storage import Database, Transaction
from roomstream.streams.positions import StreamPositionTracker


@dataclass(frozen=True)
class StreamTableRef:
    """A table holding rows of a stream: where to look for stream IDs and their writers."""

    table: str
    id_column: str = "stream_id"
    instance_column: str = "instance_name"


logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

PositionListener = Callable[[str, int], object]
"""Called with (writer instance, new position) when the local writer's stored position moves."""


class StreamIdGenerator:
    """Reserves stream IDs for the local writer and tracks every writer's position.

    Invariants (beyond those of :class:`StreamPositionTracker`):

    - an ID is handed out once, ever: it comes from the database sequence;
    - leaving a reservation's ``async with`` block completes its IDs, whether the block
      committed its rows or raised (a rolled-back fact is a completed fact with no rows);
    - the local writer stores its position in ``stream_positions`` before reporting it to
      position listeners, so a reader that learnt a position can never find an older one
      in the table after a restart.
    """

    def __init__(
        self,
        database: Database,
        stream_name: str,
        sequence_name: str,
        tables: Sequence[StreamTableRef],
        writers: Sequence[str],
        instance_name: str,
        positive: bool = True,
    ) -> None:
        if not writers:
            raise ValueError(f"stream {stream_name} has no writers configured")
        self._db = database
        self.stream_name = stream_name
        self._sequence = sequence_name
        self._tables = list(tables)
        self._writers = sorted(set(writers))
        self.instance_name = instance_name
        self._sign = 1 if positive else -1
        self._tracker: StreamPositionTracker | None = None
        self._stored_position = 0
        self._store_lock = asyncio.Lock()
        self._store_task: asyncio.Task[None] | None = None
        self._listeners: list[PositionListener] = []

    # -- start-up ------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        database: Database,
        stream_name: str,
        sequence_name: str,
        tables: Sequence[StreamTableRef],
        writers: Sequence[str],
        instance_name: str,
        positive: bool = True,
    ) -> StreamIdGenerator:
        generator = cls(
            database, stream_name, sequence_name, tables, writers, instance_name, positive
        )
        await generator.load()
        return generator

    async def load(self) -> None:
        """(Re)build positions from the database, as at process start.

        Anything the local writer had in flight before is gone (its transactions died with
        the old process), so the local position starts at the sequence's value.
        """
        positions, sequence_value = await self._db.run_interaction(
            "load_stream_positions", self._load_txn
        )
        self._tracker = StreamPositionTracker(
            self._writers, self._local_writer, positions, sequence_value
        )
        self._stored_position = positions.get(self.instance_name, 0)

    @property
    def _local_writer(self) -> str | None:
        return self.instance_name if self.instance_name in self._writers else None

    def _load_txn(self, txn: Transaction) -> tuple[dict[str, int], int]:
        txn.create_sequence(self._sequence)
        # A sequence behind its tables (restored backup, manual edits) would hand out IDs
        # that already exist; move it past the highest stored ID first.
        highest = 0
        for ref in self._tables:
            agg = "MAX" if self._sign > 0 else "MIN"
            row = txn.query_one(f"SELECT {agg}({ref.id_column}) FROM {ref.table}")
            if row and row[0] is not None:
                highest = max(highest, self._sign * int(row[0]))
        txn.advance_sequence_to(self._sequence, highest)
        # Read the sequence before the stored positions: a writer missing from the table
        # had not reserved anything when we looked, so its future IDs exceed this value.
        sequence_value = txn.sequence_value(self._sequence)
        stored = dict(
            txn.query(
                "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
                (self.stream_name,),
            )
        )
        positions: dict[str, int] = {}
        for writer in self._writers:
            if writer == self.instance_name or writer not in stored:
                positions[writer] = sequence_value
            else:
                positions[writer] = int(stored[writer])
        if self._local_writer is not None:
            # Registering before reserving anything is what makes the rule above sound.
            self._store_position_txn(txn, sequence_value)
            positions[self.instance_name] = max(
                sequence_value, int(stored.get(self.instance_name, 0))
            )
        return positions, sequence_value

    def _store_position_txn(self, txn: Transaction, position: int) -> None:
        greatest = "GREATEST" if txn.engine_name == "postgres" else "MAX"
        txn.execute(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
            " VALUES (?, ?, ?) ON CONFLICT (stream_name, instance_name)"
            " DO UPDATE SET stream_id ="
            f" {greatest}(stream_positions.stream_id, excluded.stream_id)",
            (self.stream_name, self.instance_name, position),
        )

    # -- positions -----------------------------------------------------------------

    @property
    def tracker(self) -> StreamPositionTracker:
        if self._tracker is None:
            raise RuntimeError(f"ID generator for {self.stream_name} used before load()")
        return self._tracker

    @property
    def writers(self) -> list[str]:
        return list(self._writers)

    def is_writer(self) -> bool:
        return self._local_writer is not None

    def get_position(self, writer: str) -> int:
        """The writer's position: all its facts at or below it (above, if negative) are done."""
        return self._sign * self.tracker.position(writer)

    def get_positions(self) -> dict[str, int]:
        """Every writer's position, keys in sorted order."""
        return {w: self._sign * p for w, p in self.tracker.positions().items()}

    def get_linear_position(self) -> int:
        """Every fact of every writer at or below this position (above, if negative) is done."""
        return self._sign * self.tracker.linear_position

    def get_local_position(self) -> int:
        """The position the local writer can announce now (see StreamPositionTracker)."""
        if self._local_writer is None:
            raise RuntimeError(f"{self.instance_name} is not a writer of {self.stream_name}")
        return self.get_position(self.instance_name)

    def get_stored_position(self) -> int:
        """The local writer's position as last stored in ``stream_positions``."""
        return self._sign * self._stored_position

    def advance(self, writer: str, position: int) -> bool:
        """Record a position another process announced; False if it was not news.

        Learning of others' IDs can move an idle local writer's position too (it will
        never write below what it has seen allocated). Callers that announce positions
        follow up with :meth:`store_local_position`, which stores and announces it.
        """
        return self.tracker.advance(writer, self._sign * position)

    def add_position_listener(self, listener: PositionListener) -> None:
        self._listeners.append(listener)

    # -- reserving -----------------------------------------------------------------

    @asynccontextmanager
    async def reserve(self) -> AsyncIterator[int]:
        """Reserve one ID; it completes when the block exits, normally or by exception."""
        async with self.reserve_many(1) as ids:
            yield ids[0]

    @asynccontextmanager
    async def reserve_many(self, count: int) -> AsyncIterator[list[int]]:
        """Reserve ``count`` increasing IDs (one round trip); they complete together."""
        if count < 1:
            raise ValueError("count must be at least 1")
        tracker = self.tracker
        token = tracker.fetch_started()
        ids: list[int] = []
        try:
            ids = await self._db.run_interaction(
                "stream_nextval", _nextval_txn, self._sequence, count
            )
        finally:
            tracker.fetch_finished(token, ids)
        try:
            yield [self._sign * i for i in ids]
        finally:
            tracker.complete(ids)
            await self.store_local_position()

    async def run_with_ids(
        self,
        name: str,
        count: int,
        func: Callable[Concatenate[Transaction, list[int], P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[list[int], R]:
        """Draw ``count`` IDs and write their facts in ONE transaction named ``name`` (see
        :meth:`roomstream.storage.Database.run_interaction`): ``func(txn, ids)``.

        The IDs complete when the transaction ends (committed or not). The new position is
        stored in the background and announced once stored (see :meth:`flush`); this saves
        two round trips per fact over ``reserve_many`` for writers on a hot path.
        """
        if count < 1:
            raise ValueError("count must be at least 1")
        tracker = self.tracker
        sign = self._sign
        sequence = self._sequence
        # With one connection, transactions run one after another in submission order. If
        # nothing else of ours is in flight now, every later draw gets higher IDs, so when
        # this transaction commits the position is exactly its highest ID: store it in the
        # same transaction and skip a round trip.
        store_inline = (
            self._local_writer is not None
            and self._db.engine.concurrency == 1
            and not tracker.has_in_flight()
        )
        token = tracker.fetch_started()
        drawn: list[int] = []

        def txn_func(txn: Transaction) -> R:
            ids = txn.nextval_many(sequence, count)
            result = func(txn, [sign * i for i in ids], *args, **kwargs)
            if store_inline:
                self._store_position_txn(txn, ids[-1])
            drawn[:] = ids  # only once the whole transaction body succeeded
            return result

        try:
            result = await self._db.run_interaction(name, txn_func)
        finally:
            # IDs drawn by a failed attempt have no rows: leaving them out is the same as
            # completing them.
            tracker.fetch_finished(token, drawn)
            tracker.complete(drawn)
        if store_inline and drawn[-1] > self._stored_position:
            self._stored_position = drawn[-1]
            for listener in self._listeners:
                listener(self.instance_name, sign * drawn[-1])
        self._store_in_background()
        return [sign * i for i in drawn], result

    def _store_in_background(self) -> None:
        if self._local_writer is None:
            return
        if self._store_task is None or self._store_task.done():
            self._store_task = asyncio.get_running_loop().create_task(self._store_loop())

    async def _store_loop(self) -> None:
        try:
            while self.tracker.position(self.instance_name) > self._stored_position:
                await self.store_local_position()
        except Exception:
            logger.exception("storing the %s position failed", self.stream_name)

    async def flush(self) -> None:
        """Wait until the local position is stored (and announced)."""
        while self._store_task is not None and not self._store_task.done():
            await self._store_task
        if self._local_writer is not None:
            await self.store_local_position()

    async def store_local_position(self) -> None:
        """Store the local position if it moved, then tell listeners.

        Concurrent callers share writes: whoever holds the lock stores the newest
        position, which covers every caller waiting behind it.
        """
        needed = self.tracker.position(self.instance_name)
        if needed <= self._stored_position:
            return
        async with self._store_lock:
            if needed <= self._stored_position:
                return
            position = self.tracker.position(self.instance_name)
            await self._db.run_interaction("store_position", self._store_position_txn, position)
            self._stored_position = max(self._stored_position, position)
        for listener in self._listeners:
            listener(self.instance_name, self._sign * position)


def _nextval_txn(txn: Transaction, sequence: str, count: int) -> list[int]:
    # Losing this commit in a crash loses only IDs no durable row uses: a row committed
    # with one of them flushes the log, sequence advance included.
    txn.relax_durability()
    return txn.nextval_many(sequence, count)
