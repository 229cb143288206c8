"""``GET /rooms/{id}/timestamp_to_event``: the event of a room nearest a timestamp, in a
direction, among those the user may see.

Access is Synapse's ``check_user_in_room_or_world_readable``: a user joined to the room
now, or anyone when its current history visibility is ``world_readable``; otherwise
``403 M_FORBIDDEN`` (also for an unknown room, whose existence is not revealed). Then,
beyond Synapse (which answers the nearest event whoever may see it), the event is the
nearest one the user may see by the read path's visibility records: the answer never
names an event the user could not fetch with ``GET /event``.
"""

from __future__ import annotations

from dataclasses import dataclass

from roomstream.errors import ForbiddenError, NotFoundError
from roomstream.reading.timeline_rows import _COLUMNS, _FROM, _load_views_txn, _to_row
from roomstream.reading.visibility import WORLD_READABLE
from roomstream.storage import Database, Transaction

__all__ = ["TimestampReads", "TimestampedEvent"]

#: Candidates read per statement while looking for one the user may see.
_BATCH = 200


@dataclass(frozen=True)
class TimestampedEvent:
    event_id: str
    origin_server_ts: int


class TimestampReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def event_at_timestamp(
        self, user_id: str, room_id: str, timestamp: int, forwards: bool
    ) -> TimestampedEvent:
        """The first event at or after ``timestamp`` (``forwards``), else the last at or
        before it, by ``origin_server_ts`` (ties: by stream order in the same direction),
        that the user may see; 404 ``M_NOT_FOUND`` when there is none."""
        found = await self.db.run_interaction(
            "event_at_timestamp", self._txn, user_id, room_id, timestamp, forwards
        )
        if found is None:
            direction = "f" if forwards else "b"
            raise NotFoundError(f"Unable to find event from {timestamp} in direction {direction}")
        return found

    def _txn(
        self, txn: Transaction, user_id: str, room_id: str, timestamp: int, forwards: bool
    ) -> TimestampedEvent | None:
        view = _load_views_txn(txn, [room_id], user_id, current=True)[0][room_id]
        if view.current_membership != "join" and view.current_visibility != WORLD_READABLE:
            raise ForbiddenError(f"user {user_id} is not in room {room_id}")
        compare, order = (">", "ASC") if forwards else ("<", "DESC")
        # Outliers and rejected events have no timeline row: the join leaves them out.
        sql = (
            f"SELECT e.origin_server_ts, {_COLUMNS} FROM events e"
            f" JOIN {_FROM} ON t.event_id = e.event_id"
            f" WHERE e.room_id = ? AND (e.origin_server_ts, e.stream_ordering) {compare} (?, ?)"
            f" ORDER BY e.origin_server_ts {order}, e.stream_ordering {order} LIMIT ?"
        )
        # The first key is just outside the timestamp's range in the walk's direction.
        after: tuple[int, int] = (timestamp, -(2**62)) if forwards else (timestamp, 2**62)
        while True:
            rows = txn.query(sql, (room_id, after[0], after[1], _BATCH))
            for raw in rows:
                row = _to_row(raw[1:])
                if view.visible(row):
                    return TimestampedEvent(row.event_id, int(raw[0]))
            if len(rows) < _BATCH:
                return None
            after = (int(rows[-1][0]), int(rows[-1][2]))
