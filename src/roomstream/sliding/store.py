"""The reads sliding sync needs beside the read path: the user's room list with each
room's recency, and the current state entries of the rooms a response carries.

The room list is one statement over the user's membership rows (index seeks per room
for its latest stream positions, no event read); its order is the read path's
(:meth:`roomstream.reading.RoomReader.latest_rooms`): the newest timeline event for
members, the membership event otherwise, ties by room ID, newest first. That is the
proposal's "last activity" (any event moves a room up the server's list, so a client
watching a range sees every room with news).

A room's ``bump_stamp`` is a different notion (the proposal's "proper" activity, which
clients sort their room list by): the newest event of one of :data:`BUMP_EVENT_TYPES`
for members (a reaction, an edit of state, a receipt do not bump), the membership
event otherwise, and the membership event too when the room has no bump event the
server knows of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from roomstream.events.types import EventTypes
from roomstream.storage import Database, Transaction

__all__ = ["BUMP_EVENT_TYPES", "RoomEntry", "SlidingStore", "StateRow"]

#: The event types that bump a room (MSC4186's list of "proper" activity; Synapse's
#: ``SLIDING_SYNC_DEFAULT_BUMP_EVENT_TYPES`` is the same set).
BUMP_EVENT_TYPES: frozenset[str] = frozenset(
    {
        EventTypes.CREATE,
        EventTypes.MESSAGE,
        EventTypes.ENCRYPTED,
        "m.sticker",
        "m.call.invite",
        "m.poll.start",
        "m.beacon_info",
    }
)
_BUMP_TYPES_SQL = ", ".join(f"'{t}'" for t in sorted(BUMP_EVENT_TYPES))
#: The newest bump event of room ``c.room_id`` that is in its timeline (not an outlier,
#: rejected or soft-failed): a backwards walk of ``events_room_stream`` that stops at
#: the first event of a bump type.
_LATEST_BUMP_SQL = (
    "SELECT b.stream_ordering FROM events b WHERE b.room_id = c.room_id"
    f" AND b.type IN ({_BUMP_TYPES_SQL}) AND NOT b.outlier AND NOT b.soft_failed"
    " AND b.rejected_reason IS NULL AND b.stream_ordering > 0"
    " ORDER BY b.stream_ordering DESC LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class RoomEntry:
    room_id: str
    membership: str
    #: Recency (a stream position) of any event: orders the list.
    activity: int
    #: Who sent the user's membership event (tells a kick from a leave).
    member_sender: str
    #: The room's ``bump_stamp`` (a stream position; only :data:`BUMP_EVENT_TYPES`
    #: count for members), never above ``activity``.
    bump: int


@dataclass(frozen=True, slots=True)
class StateRow:
    event_type: str
    state_key: str
    event_id: str
    membership: str | None
    stream: int


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _chunks(items: Sequence[str], size: int = 500) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class SlidingStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # Room types never change (they live in the create event).
        self._room_types: dict[str, str | None] = {}

    async def room_list(self, user_id: str) -> list[RoomEntry]:
        """Every room with a membership of the user, newest activity first."""

        def txn(t: Transaction) -> list[RoomEntry]:
            rows = t.query(
                "SELECT c.room_id, c.membership, e.sender,"
                " CASE WHEN c.membership = 'join' THEN (SELECT MAX(x.stream_ordering)"
                " FROM timeline_events x WHERE x.room_id = c.room_id)"
                " ELSE e.stream_ordering END,"
                f" CASE WHEN c.membership = 'join' THEN ({_LATEST_BUMP_SQL}) END,"
                " e.stream_ordering"
                " FROM current_state_events c JOIN events e ON e.event_id = c.event_id"
                " WHERE c.type = 'm.room.member' AND c.state_key = ?",
                (user_id,),
            )
            return [
                RoomEntry(str(r[0]), str(r[1]), int(r[3] or 0), str(r[2]), int(r[4] or r[5]))
                for r in rows
            ]

        entries = await self.db.run_interaction("room_list", txn)
        entries.sort(key=lambda e: (e.activity, e.room_id), reverse=True)
        return entries

    async def bump_stamps(self, room_ids: Sequence[str]) -> dict[str, int]:
        """room -> the stream position of its newest bump event (rooms without one are
        absent)."""

        def txn(t: Transaction) -> dict[str, int]:
            found: dict[str, int] = {}
            for chunk in _chunks(list(room_ids)):
                for room_id, stream in t.query(
                    f"SELECT c.room_id, ({_LATEST_BUMP_SQL}) FROM rooms c"
                    f" WHERE c.room_id IN ({_marks(len(chunk))})",
                    chunk,
                ):
                    if stream is not None:
                        found[str(room_id)] = int(stream)
            return found

        return await self.db.run_interaction("bump_stamps", txn) if room_ids else {}

    async def current_state(self, room_ids: Sequence[str]) -> dict[str, list[StateRow]]:
        """Each room's current state entries (IDs, no event bodies)."""

        def txn(t: Transaction) -> dict[str, list[StateRow]]:
            result: dict[str, list[StateRow]] = {r: [] for r in room_ids}
            for chunk in _chunks(list(room_ids)):
                for room_id, etype, key, event_id, membership, stream in t.query(
                    "SELECT c.room_id, c.type, c.state_key, c.event_id, c.membership,"
                    " e.stream_ordering FROM current_state_events c"
                    " JOIN events e ON e.event_id = c.event_id"
                    f" WHERE c.room_id IN ({_marks(len(chunk))})",
                    chunk,
                ):
                    result[str(room_id)].append(
                        StateRow(str(etype), str(key), str(event_id), membership, int(stream))
                    )
            return result

        if not room_ids:
            return {}
        return await self.db.run_interaction("sliding_current_state", txn)

    async def room_types(self, room_ids: Sequence[str]) -> dict[str, str | None]:
        """Each room's type (the create event's ``content.type``; None: none)."""
        missing = [r for r in room_ids if r not in self._room_types]

        def txn(t: Transaction) -> list[tuple[str, bytes | str]]:
            rows: list[tuple[str, bytes | str]] = []
            for chunk in _chunks(missing):
                rows += t.query(
                    "SELECT c.room_id, j.json FROM current_state_events c"
                    " JOIN event_json j ON j.event_id = c.event_id"
                    f" WHERE c.type = 'm.room.create' AND c.room_id IN ({_marks(len(chunk))})",
                    chunk,
                )
            return rows

        if missing:
            for room_id, raw in await self.db.run_interaction("room_types", txn):
                data = orjson.loads(raw)
                content = data.get("content") if isinstance(data, dict) else None
                kind = content.get("type") if isinstance(content, dict) else None
                self._room_types[str(room_id)] = kind if isinstance(kind, str) else None
            if len(self._room_types) > 200_000:
                self._room_types.clear()
        return {r: self._room_types.get(r) for r in room_ids}

    async def encrypted_rooms(self, room_ids: Sequence[str]) -> set[str]:
        def txn(t: Transaction) -> set[str]:
            found: set[str] = set()
            for chunk in _chunks(list(room_ids)):
                found.update(
                    str(r[0])
                    for r in t.query(
                        "SELECT room_id FROM current_state_events WHERE type = 'm.room.encryption'"
                        f" AND state_key = '' AND room_id IN ({_marks(len(chunk))})",
                        chunk,
                    )
                )
            return found

        return await self.db.run_interaction("encrypted_rooms", txn) if room_ids else set()

    async def space_children(self, space_ids: Sequence[str]) -> set[str]:
        """Rooms named by the current ``m.space.child`` state of the spaces (children
        whose event has a ``via``; removed children have empty content)."""

        def txn(t: Transaction) -> list[tuple[str, bytes | str]]:
            rows: list[tuple[str, bytes | str]] = []
            for chunk in _chunks(list(space_ids)):
                rows += t.query(
                    "SELECT c.state_key, j.json FROM current_state_events c"
                    " JOIN event_json j ON j.event_id = c.event_id"
                    f" WHERE c.type = 'm.space.child' AND c.room_id IN ({_marks(len(chunk))})",
                    chunk,
                )
            return rows

        children = set()
        for state_key, raw in (
            await self.db.run_interaction("space_children", txn) if space_ids else []
        ):
            data = orjson.loads(raw)
            content = data.get("content") if isinstance(data, dict) else None
            if isinstance(content, dict) and content.get("via"):
                children.add(str(state_key))
        return children

    async def room_tags(self, user_id: str) -> dict[str, set[str]]:
        """room -> the user's tag names on it."""

        def txn(t: Transaction) -> list[tuple[str, bytes | str]]:
            return list(
                t.query(
                    "SELECT room_id, content FROM room_account_data"
                    " WHERE user_id = ? AND account_data_type = 'm.tag'",
                    (user_id,),
                )
            )

        tags: dict[str, set[str]] = {}
        for room_id, raw in await self.db.run_interaction("room_tags", txn):
            content = orjson.loads(raw)
            names = content.get("tags") if isinstance(content, dict) else None
            if isinstance(names, dict) and names:
                tags[str(room_id)] = {str(n) for n in names}
        return tags
