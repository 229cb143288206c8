"""New events since a token (the read behind an incremental ``/sync``): each room's
newest visible events after one events-stream token up to another, and the helpers of
lazy-loading members."""

from __future__ import annotations

from collections.abc import Sequence

from roomstream.reading.format import ClientEvent
from roomstream.reading.timeline_rows import (
    _COLUMNS,
    _FROM,
    _chunks,
    _marks,
    _Row,
    _to_row,
    _View,
)
from roomstream.reading.tokens import EventsToken
from roomstream.storage import Transaction


def _senders_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for chunk in _chunks(list(event_ids)):
        for event_id, sender in txn.query(
            f"SELECT event_id, sender FROM events WHERE event_id IN ({_marks(len(chunk))})",
            chunk,
        ):
            result[str(event_id)] = str(sender)
    return result


def _lazy_members(
    state: list[ClientEvent], timeline: list[ClientEvent], user_id: str
) -> list[ClientEvent]:
    """``state`` with only the ``m.room.member`` events of the timeline's senders and of
    ``user_id`` (lazy-loading members)."""
    wanted = {user_id, *(e.get("sender") for e in timeline)}
    return [e for e in state if e.get("type") != "m.room.member" or e.get("state_key") in wanted]


def _new_rows_txn(
    txn: Transaction,
    room_id: str,
    view: _View,
    since: EventsToken,
    upto: EventsToken,
    limit: int,
) -> tuple[list[_Row], bool]:
    """The newest ``limit`` visible events of the room after ``since`` up to ``upto``
    (stream order, oldest first), and whether more were left out."""
    visible: list[_Row] = []
    upper = upto.maximum
    batch = limit + 1
    while len(visible) <= limit:
        rows = [
            _to_row(r)
            for r in txn.query(
                f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.room_id = ?"
                " AND t.stream_ordering > ? AND t.stream_ordering <= ?"
                " ORDER BY t.stream_ordering DESC LIMIT ?",
                (room_id, since.minimum, upper, batch),
            )
        ]
        for row in rows:
            if (
                upto.covers(row.instance_name, row.stream)
                and not since.covers(row.instance_name, row.stream)
                and view.visible(row)
            ):
                visible.append(row)
        if len(rows) < batch:
            break
        upper = rows[-1].stream - 1
        batch = min(batch * 4, 4000)
    limited = len(visible) > limit
    return list(reversed(visible[:limit])), limited
