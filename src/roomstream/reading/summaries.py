"""Room summaries (the ``summary`` of ``/sync``): member counts and heroes, read once
per room for every member."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roomstream.reading.timeline_rows import _chunks, _marks
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Transaction

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
            if (event.type == "m.room.name" and content.get("name")) or (
                event.type == "m.room.canonical_alias" and content.get("alias")
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
