"""What changed since a position: which rooms have new events and whose membership
changed (change caches fed from the events stream itself, so any process can run the
reads: it sees what its stream positions say is complete), and each user's rooms."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from roomstream.reading.tokens import EventsToken
from roomstream.storage import Database, Transaction
from roomstream.streams import StreamChangeCache, StreamSet
from roomstream.streams.rows import EventRow, events_row_from_wire


class ChangeTracker:
    """The change caches every read that starts from a token consults (one per reader)."""

    def __init__(self, db: Database, streams: StreamSet, *, change_cache_size: int) -> None:
        self.db = db
        self.streams = streams
        generator = streams.generator("events")
        self.ingested: dict[str, int] = dict(generator.get_positions())
        start = min(self.ingested.values(), default=0)
        self.room_changes = StreamChangeCache("room_events", start, change_cache_size)
        self.member_changes = StreamChangeCache("user_memberships", start, change_cache_size)
        #: Events that relations (m.relates_to) point at, by the relation's position.
        self.relation_targets = StreamChangeCache("relation_targets", start, change_cache_size)
        self._ingest_lock = asyncio.Lock()
        # user -> (ingested linear position when loaded, {room: membership})
        self._rooms_of: dict[str, tuple[int, dict[str, str]]] = {}

    @property
    def ingested_floor(self) -> int:
        """An events-stream position every event of which, on every writer, the change
        caches have seen: an event persisted later is after it."""
        return min(self.ingested.values(), default=0)

    def may_have_relations_since(self, event_ids: Iterable[str], position: int) -> set[str]:
        """Of ``event_ids`` (events persisted after ``position``), those a relation may
        point at: any relation to such an event is persisted after it, so after
        ``position``, and the change cache has seen it (or cannot tell, and says so)."""
        targets = self.relation_targets
        return {e for e in event_ids if targets.has_entity_changed(e, position)}

    def rooms_changed_since(self, room_ids: Iterable[str], position: int) -> set[str]:
        """Of ``room_ids``, those that may have new events after ``position``."""
        changes = self.room_changes
        return {r for r in room_ids if changes.has_entity_changed(r, position)}

    async def ingest(self) -> EventsToken:
        """Bring the change caches up to the events positions this process knows."""
        positions = self.streams.generator("events").get_positions()
        if all(self.ingested.get(w, 0) >= p for w, p in positions.items()):
            return EventsToken.from_positions(
                {w: self.ingested.get(w, p) for w, p in positions.items()}
            )
        async with self._ingest_lock:
            for writer, position in positions.items():
                since = self.ingested.get(writer, 0)
                while since < position:
                    updates, upto, limited = await self.streams.get_updates(
                        "events", writer, since, position, 10_000
                    )
                    self._note_changes(updates)
                    since = upto
                    if not limited:
                        break
                self.ingested[writer] = max(self.ingested.get(writer, 0), position)
        return EventsToken.from_positions(dict(self.ingested))

    def ingest_rows(
        self, writer: str, since: int, upto: int, updates: Sequence[tuple[int, Any]]
    ) -> bool:
        """Take ``writer``'s complete ``events`` rows after ``since`` up to ``upto``, read
        by someone else (the notifier reads each local batch once to wake syncs), so the
        sync they wake need not read them again. Ignored (False) unless this reader has
        everything up to ``since`` already: the change caches must have no gap."""
        if self.ingested.get(writer, 0) < since:
            return False
        self._note_changes(updates)
        self.ingested[writer] = max(self.ingested.get(writer, 0), upto)
        return True

    def _note_changes(self, updates: Iterable[tuple[int, Any]]) -> None:
        for token, wire in updates:
            row = events_row_from_wire(wire)
            if not isinstance(row, EventRow):
                continue
            self.room_changes.entity_has_changed(row.room_id, token)
            member = row.member_user_id
            if member is not None:
                self.member_changes.entity_has_changed(member, token)
            if row.relates_to is not None:
                self.relation_targets.entity_has_changed(row.relates_to, token)

    async def rooms_for_user(self, user_id: str) -> dict[str, str]:
        """room -> the user's membership in its current state (any membership)."""
        cached = self._rooms_of.get(user_id)
        if cached is not None and not self.member_changes.has_entity_changed(user_id, cached[0]):
            return cached[1]
        loaded_at = min(self.ingested.values(), default=0)
        rooms = await self.db.run_interaction("rooms_for_user", _rooms_for_user_txn, user_id)
        self._rooms_of[user_id] = (loaded_at, rooms)
        if len(self._rooms_of) > 100_000:
            self._rooms_of.pop(next(iter(self._rooms_of)))
        return rooms


def _rooms_for_user_txn(txn: Transaction, user_id: str) -> dict[str, str]:
    return {
        str(r[0]): str(r[1])
        for r in txn.query(
            "SELECT room_id, membership FROM current_state_events"
            " WHERE type = 'm.room.member' AND state_key = ?",
            (user_id,),
        )
    }
