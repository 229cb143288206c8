"""The latest rooms: a user's rooms by their latest activity, each with its latest
events (the read behind an initial ``/sync`` and sliding sync's room lists)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from roomstream.reading.timeline_rows import (
    _COLUMNS,
    _FROM,
    _chunks,
    _marks,
    _Row,
    _to_row,
    _to_rows,
)
from roomstream.storage import Transaction

StateChoice = Literal["current", "timeline_start", "none"]

#: Room state types an invited user is shown (the spec's suggested stripped state).
INVITE_STATE_TYPES = frozenset(
    {
        "m.room.create",
        "m.room.join_rules",
        "m.room.name",
        "m.room.avatar",
        "m.room.canonical_alias",
        "m.room.encryption",
        "m.room.topic",
    }
)


def _room_activity_txn(txn: Transaction, room_ids: Sequence[str]) -> dict[str, int]:
    """room -> stream ordering of its newest event (one index seek per room)."""
    result: dict[str, int] = {}
    for chunk in _chunks(list(room_ids)):
        for room_id, stream in txn.query(
            "SELECT r.room_id, (SELECT MAX(e.stream_ordering) FROM events e"
            " WHERE e.room_id = r.room_id) FROM rooms r"
            f" WHERE r.room_id IN ({_marks(len(chunk))})",
            chunk,
        ):
            result[str(room_id)] = int(stream or 0)
    return result


def _latest_rows_txn(
    txn: Transaction, room_ids: Sequence[str], limit: int
) -> dict[str, list[_Row]]:
    """Each room's latest ``limit`` timeline events, newest first: an index seek per
    room. On PostgreSQL one statement (a LATERAL join over the room IDs: one round trip,
    and the planner plans the seek once); on SQLite, which runs in this process, one
    execution of the same prepared statement per room, which costs less than a UNION
    ALL of per-room parts (2.6 against 3.5 ms for 100 rooms, 21 rows each)."""
    order = " ORDER BY t.topological_ordering DESC, t.stream_ordering DESC"
    if txn.engine_name == "postgres":
        result: dict[str, list[_Row]] = {r: [] for r in room_ids}
        for r in txn.query(
            "SELECT x.* FROM unnest(?::text[]) AS q(room_id) CROSS JOIN LATERAL ("
            f"SELECT t.room_id, {_COLUMNS} FROM {_FROM} WHERE t.room_id = q.room_id"
            f"{order} LIMIT {int(limit)}) AS x",
            (list(room_ids),),
        ):
            result[str(r[0])].append(_to_row(r[1:]))
        for found in result.values():
            found.sort(reverse=True)  # by position: a row's first fields
        return result
    sql = f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.room_id = ?{order} LIMIT {int(limit)}"
    return {room_id: _to_rows(txn.query(sql, (room_id,))) for room_id in room_ids}
