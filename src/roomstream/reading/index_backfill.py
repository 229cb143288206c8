"""Rebuilding the relations and search indexes from the stored events
(``docs/reading.md``, "Rebuilding the indexes").

The persister's participants index relations (:class:`RelationsRecorder`:
``event_relations``, ``threads``) and searchable text (:class:`SearchIndexer`:
``event_search``) as it commits events. Events persisted before those tables existed
(migrations 0016/0017) have no index rows, and neither have events a bulk import loads
(its loader copies what its persisters wrote, the visibility and relations records,
but not the search index): migration 0022 and the import list those rooms in
``index_backfill_rooms``, and :meth:`IndexBackfill.run_pending` indexes them, as
``roomstream migrate`` and every start-up do (in the background, like the visibility
rebuild).

How: a room's timeline events (neither outliers, rejected nor soft-failed) that may
have index rows (``events.relates_to`` set, or a searchable type) are read in stream
order from ``event_json`` and handed to the participants themselves, so the rows are
those the persister writes.

Invariants:

- **Bounded transactions.** One transaction indexes at most ``batch_size`` events of one
  room and records how far it got (``done_through``) in the same commit.
- **Idempotent and resumable.** Both participants skip events that have their rows
  (``ON CONFLICT``; FTS5 by rowid, see :class:`~roomstream.reading.search.SqliteSearch`)
  and ``threads`` only moves forward, so a batch run twice, from two processes at once,
  or next to a persist of the same events writes nothing twice; a stopped rebuild
  carries on from ``done_through``. A room leaves the list only once complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from roomstream.events.types import EventTypes
from roomstream.reading.relations import RelationsRecorder
from roomstream.reading.search import SearchIndexer
from roomstream.rooms.participants import TimelineInput
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Database, Transaction

__all__ = [
    "BATCH_SIZE",
    "IndexBackfill",
    "IndexSummary",
    "list_rooms_txn",
    "run_pending_in_background",
]

logger = logging.getLogger(__name__)

#: Events indexed per transaction.
BATCH_SIZE = 1000
#: Before every stream ordering (backfilled events have negative ones).
_START = -(2**62)

#: Timeline events that may have index rows: a relation (``events.relates_to`` holds a
#: string ``m.relates_to.event_id``, which :func:`relation_of` requires) or a searchable
#: type (``SEARCH_KEYS``). Every other event is skipped without reading its JSON.
_CANDIDATES_SQL = (
    "SELECT e.event_id, e.stream_ordering, e.instance_name FROM events e"
    " WHERE e.room_id = ? AND e.stream_ordering > ?"
    " AND NOT e.outlier AND NOT e.soft_failed AND e.rejected_reason IS NULL"
    " AND (e.relates_to IS NOT NULL OR e.type IN (?, ?, ?))"
    " ORDER BY e.stream_ordering LIMIT ?"
)
_SEARCHABLE = (EventTypes.MESSAGE, EventTypes.NAME, EventTypes.TOPIC)


@dataclass
class IndexSummary:
    """What a rebuild did: rooms finished, candidate events read, transactions used."""

    rooms: int = 0
    events: int = 0
    batches: int = 0


class IndexBackfill:
    """Indexes the relations and searchable text of listed rooms' stored events."""

    def __init__(self, database: Database, *, batch_size: int = BATCH_SIZE) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.db = database
        self.batch_size = batch_size
        self._participants = (RelationsRecorder(), SearchIndexer())

    async def pending_rooms(self) -> int:
        """How many rooms still wait for :meth:`run_pending`."""
        row = await self.db.run_interaction(
            "pending_index_rooms",
            lambda t: t.query_one("SELECT COUNT(*) FROM index_backfill_rooms"),
        )
        return int(row[0])

    async def run_pending(self) -> IndexSummary:
        """Index every listed room, each removed from the list once complete. Safe to run
        in several processes at once and to stop at any point."""
        done = IndexSummary()
        after: str | None = None
        while True:
            room_id = await self.db.run_interaction("next_index_room", _next_room_txn, after)
            if room_id is None:
                return done
            events, batches = await self.rebuild_room(room_id)
            done.rooms, done.events = done.rooms + 1, done.events + events
            done.batches += batches
            logger.info("relations and search indexed for %s (%d events)", room_id, events)
            after = room_id

    async def rebuild_room(self, room_id: str) -> tuple[int, int]:
        """Index ``room_id``'s events from where the list says it got to (all of them if
        the room is not listed) and take it off the list; returns (candidate events
        read, transactions). A small room is one transaction."""
        after: int | None = None
        events = batches = 0
        while True:
            count, after = await self.db.run_interaction(
                "index_batch", self._batch_txn, room_id, after
            )
            events, batches = events + count, batches + 1
            if count < self.batch_size:
                return events, batches

    def _batch_txn(self, txn: Transaction, room_id: str, after: int | None) -> tuple[int, int]:
        """Index the room's next candidates after the stream ordering ``after`` (None:
        where the list says) and record how far it got, or take the room off the list if
        these were its last; returns how many were read (fewer than ``batch_size``: the
        room is done) and the last one's stream ordering."""
        if after is None:
            row = txn.query_one(
                "SELECT done_through FROM index_backfill_rooms WHERE room_id = ?", (room_id,)
            )
            after = _START if row is None or row[0] is None else int(row[0])
        rows = txn.query(_CANDIDATES_SQL, (room_id, after, *_SEARCHABLE, self.batch_size))
        if rows:
            loaded = load_events_txn(txn, [str(r[0]) for r in rows])
            items = [
                TimelineInput(loaded[str(e)], int(ordering), str(instance), True, None, None)
                for e, ordering, instance in rows
                if str(e) in loaded
            ]
            for participant in self._participants:
                participant.record_txn(txn, room_id, items)
            after = int(rows[-1][1])
        # In this batch's commit (no-op if unlisted): a stopped rebuild resumes after it,
        # and a room leaves the list exactly when its last events are indexed.
        if len(rows) < self.batch_size:
            txn.execute("DELETE FROM index_backfill_rooms WHERE room_id = ?", (room_id,))
        else:
            txn.execute(
                "UPDATE index_backfill_rooms SET done_through = ? WHERE room_id = ?",
                (after, room_id),
            )
        return len(rows), after


def list_rooms_txn(txn: Transaction, room_ids: Sequence[str]) -> None:
    """Put ``room_ids`` on the list (from the start), for :meth:`IndexBackfill.run_pending`:
    the bulk import does, in its load transaction."""
    txn.executemany(
        "INSERT INTO index_backfill_rooms (room_id) VALUES (?)"
        " ON CONFLICT (room_id) DO UPDATE SET done_through = NULL",
        [(r,) for r in room_ids],
    )


def _next_room_txn(txn: Transaction, after: str | None) -> str | None:
    if after is None:
        row = txn.query_one("SELECT MIN(room_id) FROM index_backfill_rooms")
    else:
        row = txn.query_one(
            "SELECT MIN(room_id) FROM index_backfill_rooms WHERE room_id > ?", (after,)
        )
    return None if row is None or row[0] is None else str(row[0])


async def run_pending_in_background(database: Database) -> asyncio.Task[IndexSummary] | None:
    """Start :meth:`IndexBackfill.run_pending` as a task if any room waits (the process's
    start-up does, so an upgraded or imported database is indexed while serving); None
    if none does."""
    backfill = IndexBackfill(database)
    if not await backfill.pending_rooms():
        return None
    logger.info("indexing relations and search of rooms not indexed when persisted")
    return asyncio.create_task(backfill.run_pending(), name="index-backfill")
