"""Room summaries (the ``summary`` of ``/sync``): member counts and heroes, read once
per room for every member."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.reading.changes import ChangeTracker
from roomstream.reading.timeline_rows import _chunks, _marks
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Database, Transaction

#: Heroes a summary lists (spec: 5).
MAX_HEROES = 5


@dataclass(frozen=True)
class _RoomSummary:
    """What every member's summary of a room is made from: the member counts, whether
    the room is named, and (unnamed rooms) its first ``MAX_HEROES + 1`` members in hero
    order: joined and invited ones first, each group by membership event stream order."""

    joined: int
    invited: int
    named: bool
    members: tuple[tuple[str, str], ...]

    def for_user(self, user_id: str) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "m.joined_member_count": self.joined,
            "m.invited_member_count": self.invited,
        }
        if not self.named:
            others = [(m, ms) for m, ms in self.members if m != user_id]
            current = [m for m, ms in others if ms in ("join", "invite")]
            summary["m.heroes"] = (current or [m for m, _ in others])[:MAX_HEROES]
        return summary


def _summaries_txn(txn: Transaction, room_ids: Sequence[str]) -> dict[str, _RoomSummary]:
    counts: dict[str, dict[str, int]] = {r: {} for r in room_ids}
    named: set[str] = set()
    for chunk in _chunks(room_ids):
        marks = _marks(len(chunk))
        for room_id, membership, count in txn.query(
            "SELECT room_id, membership, COUNT(*) FROM current_state_events"
            f" WHERE room_id IN ({marks}) AND type = 'm.room.member'"
            " AND membership IN ('join', 'invite') GROUP BY room_id, membership",
            chunk,
        ):
            counts[str(room_id)][str(membership)] = int(count)
        naming = {
            str(event_id): str(room_id)
            for room_id, event_id in txn.query(
                "SELECT room_id, event_id FROM current_state_events"
                f" WHERE room_id IN ({marks}) AND state_key = ''"
                " AND type IN ('m.room.name', 'm.room.canonical_alias')",
                chunk,
            )
        }
        for event_id, event in load_events_txn(txn, list(naming)).items():
            content = event.content
            if (event.type == EventTypes.NAME and content.get("name")) or (
                event.type == EventTypes.CANONICAL_ALIAS and content.get("alias")
            ):
                named.add(naming[event_id])
    result: dict[str, _RoomSummary] = {}
    for room_id in room_ids:
        members: tuple[tuple[str, str], ...] = ()
        if room_id not in named:
            members = tuple(
                (str(member), str(membership))
                for member, membership in txn.query(
                    "SELECT c.state_key, c.membership FROM current_state_events c"
                    " JOIN events e ON e.event_id = c.event_id"
                    " WHERE c.room_id = ? AND c.type = 'm.room.member'"
                    " ORDER BY CASE WHEN c.membership IN ('join', 'invite') THEN 0 ELSE 1"
                    f" END, e.stream_ordering LIMIT {MAX_HEROES + 1}",
                    (room_id,),
                )
            )
        result[room_id] = _RoomSummary(
            counts[room_id].get("join", 0),
            counts[room_id].get("invite", 0),
            room_id in named,
            members,
        )
    return result


class RoomSummaries:
    """Room summaries, cached per room (not per user) while the room has no new event."""

    def __init__(self, db: Database, changes: ChangeTracker, *, cache_size: int) -> None:
        self.db = db
        self._changes = changes
        self._room_changes = changes.room_changes
        # room -> (ingested linear position before it was read, its summary's parts)
        self._summaries: LruCache[str, tuple[int, _RoomSummary]] = LruCache(
            "room_summaries", cache_size
        )

    async def room_summaries(
        self, user_id: str, room_ids: Collection[str]
    ) -> dict[str, dict[str, Any]]:
        """room -> its sync ``summary`` (spec, "Room summary"): ``m.joined_member_count``,
        ``m.invited_member_count`` from the current state, and ``m.heroes`` for rooms
        with neither a name nor a canonical alias: up to 5 members other than the
        user, joined and invited ones first, each group by the stream order of their
        membership event (as Synapse picks them); when no one else is joined or invited,
        those who left or were banned. One database interaction for all the rooms."""
        if not room_ids:
            return {}
        # Per room, not per user: kept while the change cache says the room has no event
        # after the position ingested before it was read (a later event is after it).
        checked_at = self._changes.ingested_floor
        cache = self._summaries
        known: dict[str, _RoomSummary] = {}
        for room_id in room_ids:
            entry = cache.get(room_id)
            if entry is not None and not self._room_changes.has_entity_changed(room_id, entry[0]):
                known[room_id] = entry[1]
        missing = sorted(r for r in room_ids if r not in known)
        if missing:
            read = await self.db.run_interaction("summaries", _summaries_txn, missing)
            for room_id, summary in read.items():
                known[room_id] = summary
                cache.set(room_id, (checked_at, summary))
        return {room_id: known[room_id].for_user(user_id) for room_id in room_ids}
