"""Rebuilding the visibility records (``timeline_events``, ``visibility_memberships``)
from what the write side stored (``docs/reading.md``, "Rebuilding the records").

The persister records visibility as it commits events. A database whose events were
persisted before those tables existed (schema version 4 or older) has none: migration 7
(``visibility_backfill_rooms``) lists its rooms, and :meth:`VisibilityBackfill.run_pending`
records them, as ``roomstream migrate`` and every start-up do.

How: a room's stored events that are in its timeline (neither outliers, rejected nor
soft-failed) are replayed in topological order ``(topological_ordering,
stream_ordering)`` through the persister's own :class:`VisibilityRecorder`, with the state
before and after each event read from its state groups (``event_state``). So the rows are
those the persister writes when it persists the room's events in that order.

Invariants:

- **Bounded transactions.** One transaction records at most ``batch_size`` events, and at
  most ``STATE_BUDGET`` state entries materialised for them; it holds the room's
  :func:`~roomstream.reading.visibility.timeline_lock` (which the persister takes too)
  until it commits, so a concurrent persist into the room waits for one batch at most.
  Nothing of the room is held in memory between batches but a position and the last
  few state maps.
- **Idempotent and resumable.** A batch records only events that have no
  ``timeline_events`` row yet, so running it again (after a crash, from another process,
  on a complete room) records nothing twice. ``reset=True`` first deletes the room's
  rows (in batches too), so the result is exactly the replay's.
- **Concurrent persists stay right.** Events the persister records meanwhile are skipped;
  replayed events that land before them take the recorder's "inserted in the middle"
  path, which keeps the membership-interval invariant.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from roomstream.events.model import StateKey
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.reading.visibility import (
    Position,
    TimelineInput,
    VisibilityRecorder,
    delete_newest_records_txn,
    timeline_lock,
)
from roomstream.rooms.store import load_events_txn
from roomstream.state.groups import get_state_txn
from roomstream.storage import Database, Transaction

__all__ = [
    "BATCH_SIZE",
    "STATE_BUDGET",
    "RebuildSummary",
    "VisibilityBackfill",
]

logger = logging.getLogger(__name__)

#: Events recorded per transaction.
BATCH_SIZE = 1000
#: State entries (over all state maps built for one batch) past which a batch ends early:
#: bounds its memory in rooms with large state (each state event needs a map of its own).
STATE_BUDGET = 2_000_000
#: Before every position (depths and stream orderings of backfilled events are negative).
_START: Position = (-(2**62), -(2**62))

_TIMELINE_SQL = (
    "SELECT e.event_id, e.topological_ordering, e.stream_ordering, e.instance_name,"
    " s.before_group, s.after_group"
    " FROM events e JOIN event_state s ON s.event_id = e.event_id"
    " WHERE e.room_id = ? AND NOT e.outlier AND NOT e.soft_failed"
    " AND e.rejected_reason IS NULL"
    " AND (e.topological_ordering > ? OR (e.topological_ordering = ? AND e.stream_ordering > ?))"
    " AND NOT EXISTS (SELECT 1 FROM timeline_events t WHERE t.event_id = e.event_id)"
    " ORDER BY e.topological_ordering, e.stream_ordering"
    " LIMIT ?"
)


@dataclass(frozen=True)
class RebuildSummary:
    """What a rebuild did: rooms finished, events recorded, transactions used."""

    rooms: int
    events: int
    batches: int


class _StateMaps:
    """The state maps of the last few state groups. Consecutive events share groups (one's
    state after is the next one's state before), so handing the recorder the same object
    keeps its identity checks, and each group is read or built once."""

    def __init__(self) -> None:
        self._maps: LruCache[int, Mapping[StateKey, str]] = LruCache("backfill_states")

    def get(self, group: int) -> Mapping[StateKey, str] | None:
        return self._maps.get(group)

    def put(self, group: int, state: Mapping[StateKey, str]) -> None:
        self._maps.set(group, state)


class VisibilityBackfill:
    """Rebuilds one room's, every room's, or the pending rooms' visibility records."""

    def __init__(
        self,
        database: Database,
        *,
        batch_size: int = BATCH_SIZE,
        state_budget: int = STATE_BUDGET,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.db = database
        self.batch_size = batch_size
        self.state_budget = state_budget

    # -- entry points ----------------------------------------------------------------------

    async def rebuild_room(self, room_id: str, *, reset: bool = False) -> RebuildSummary:
        """Record every timeline event of ``room_id`` that has no record yet (with
        ``reset``: delete the room's records first, then record them all), and take the
        room off the pending list."""
        batches = 0
        if reset:
            while await self.db.run_interaction(
                "delete_newest_records", delete_newest_records_txn, room_id, self.batch_size
            ):
                batches += 1
            batches += 1
        recorder = VisibilityRecorder(room_cache_size=1)
        states = _StateMaps()
        cursor = _START
        events = 0
        while True:
            count, more, cursor = await self.db.run_interaction(
                "fill_batch", self._fill_batch_txn, room_id, cursor, recorder, states
            )
            batches += 1
            events += count
            if not more:
                break
        await self.db.run_interaction(
            "rebuild_room",
            lambda t: t.execute(
                "DELETE FROM visibility_backfill_rooms WHERE room_id = ?", (room_id,)
            ),
        )
        return RebuildSummary(1, events, batches)

    async def rebuild_all(self, *, reset: bool = False) -> RebuildSummary:
        """:meth:`rebuild_room` for every room that has events, one after the other."""
        rooms = events = batches = 0
        room_id = await self.db.run_interaction("next_room", _next_room_txn, None)
        while room_id is not None:
            done = await self.rebuild_room(room_id, reset=reset)
            rooms, events, batches = rooms + 1, events + done.events, batches + done.batches
            room_id = await self.db.run_interaction("next_room", _next_room_txn, room_id)
        return RebuildSummary(rooms, events, batches)

    async def pending_rooms(self) -> int:
        """How many rooms still wait for :meth:`run_pending`."""
        row = await self.db.run_interaction(
            "pending_rooms", lambda t: t.query_one("SELECT COUNT(*) FROM visibility_backfill_rooms")
        )
        return int(row[0])

    async def run_pending(self) -> RebuildSummary:
        """Record the rooms migration 7 listed (events persisted before the visibility
        tables existed), each removed from the list once complete. Safe to run in several
        processes at once, and to stop at any point: the list and the records are durable."""
        rooms = events = batches = 0
        after: str | None = None
        while True:
            room_id = await self.db.run_interaction("next_pending", _next_pending_txn, after)
            if room_id is None:
                break
            done = await self.rebuild_room(room_id)
            rooms, events, batches = rooms + 1, events + done.events, batches + done.batches
            logger.info("visibility records rebuilt for %s (%d events)", room_id, done.events)
            after = room_id
        return RebuildSummary(rooms, events, batches)

    # -- one batch -------------------------------------------------------------------------

    def _fill_batch_txn(
        self,
        txn: Transaction,
        room_id: str,
        after: Position,
        recorder: VisibilityRecorder,
        states: _StateMaps,
    ) -> tuple[int, bool, Position]:
        """Record the next events after ``after`` that have no record; returns how many,
        whether more may follow, and the position of the last one."""
        # Before reading which events lack records: a persist holding it may add some.
        txn.lock_exclusively(timeline_lock(room_id))
        topo, stream = after
        rows = txn.query(_TIMELINE_SQL, (room_id, topo, topo, stream, self.batch_size))
        if not rows:
            return 0, False, after
        events = load_events_txn(txn, [str(r[0]) for r in rows])
        items: list[TimelineInput] = []
        built = 0
        for event_id, _topo, ordering, instance, before_group, after_group in rows:
            if built > self.state_budget:
                break
            event = events[str(event_id)]
            before: Mapping[StateKey, str] | None
            if event.type == EventTypes.CREATE and not event.prev_event_ids:
                # The persister stores the group after it as its "before" too (there is
                # no group for the empty state).
                before, before_group = {}, None
            else:
                before = states.get(int(before_group))
                if before is None:
                    before = get_state_txn(txn, int(before_group))
                    states.put(int(before_group), before)
                    built += len(before)
            state_after = before
            if after_group != before_group:
                known = states.get(int(after_group))
                if known is not None:
                    state_after = known
                else:
                    if event.is_state():
                        # An accepted state event's state after is its state before plus
                        # itself: cheaper than reading the group.
                        derived = dict(before)
                        derived[event.state_tuple] = event.event_id
                    else:
                        derived = get_state_txn(txn, int(after_group))
                    states.put(int(after_group), derived)
                    built += len(derived)
                    state_after = derived
            items.append(
                TimelineInput(event, int(ordering), str(instance), True, before, state_after)
            )
        recorder.record_txn(txn, room_id, items)
        last = items[-1]
        more = len(items) < len(rows) or len(rows) == self.batch_size
        return len(items), more, last.position


def _next_room_txn(txn: Transaction, after: str | None) -> str | None:
    """The next room (by ID) with stored events: one index seek."""
    if after is None:
        row = txn.query_one("SELECT MIN(room_id) FROM events")
    else:
        row = txn.query_one("SELECT MIN(room_id) FROM events WHERE room_id > ?", (after,))
    return None if row is None or row[0] is None else str(row[0])


def _next_pending_txn(txn: Transaction, after: str | None) -> str | None:
    if after is None:
        row = txn.query_one("SELECT MIN(room_id) FROM visibility_backfill_rooms")
    else:
        row = txn.query_one(
            "SELECT MIN(room_id) FROM visibility_backfill_rooms WHERE room_id > ?", (after,)
        )
    return None if row is None or row[0] is None else str(row[0])


async def run_pending_in_background(database: Database) -> asyncio.Task[RebuildSummary] | None:
    """Start :meth:`VisibilityBackfill.run_pending` as a task if any room waits (the
    process's start-up does, so that an upgraded database fills its rooms while serving);
    None if none does."""
    backfill = VisibilityBackfill(database)
    if not await backfill.pending_rooms():
        return None
    logger.info("rebuilding the visibility records of rooms persisted before schema 5")
    return asyncio.create_task(backfill.run_pending(), name="visibility-backfill")
