"""Reads of a room's state: at an event (before or after it, from its state groups),
at a token, and the current state of many rooms with their redaction flags."""

from __future__ import annotations

from collections.abc import Sequence

from roomstream.reading.timeline_rows import (
    MIN_POSITION,
    _chunks,
    _marks,
    _neighbour_before_txn,
    _point_txn,
    _redacted_by,
)
from roomstream.reading.tokens import EventsToken
from roomstream.state.groups import get_state_txn
from roomstream.storage import Transaction


def _current_state_txn(txn: Transaction, room_id: str) -> dict[tuple[str, str], str]:
    return {
        (str(r[0]), str(r[1])): str(r[2])
        for r in txn.query(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            (room_id,),
        )
    }


def _current_state_ids_txn(
    txn: Transaction, room_ids: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    """Each room's current state event IDs (sorted), and their redaction flags, read
    with them."""
    result: dict[str, list[str]] = {r: [] for r in room_ids}
    flags: dict[str, str | None] = {}
    for chunk in _chunks(list(room_ids)):
        for room_id, event_id, redacted_by in txn.query(
            f"SELECT c.room_id, c.event_id, {_redacted_by('c.event_id')}"
            f" FROM current_state_events c WHERE c.room_id IN ({_marks(len(chunk))})",
            chunk,
        ):
            result[room_id].append(event_id)
            flags[event_id] = redacted_by
    for ids in result.values():
        ids.sort()
    return result, flags


def _state_groups_txn(txn: Transaction, event_id: str) -> tuple[int, int] | None:
    row = txn.query_one(
        "SELECT before_group, after_group FROM event_state WHERE event_id = ?", (event_id,)
    )
    return None if row is None else (int(row[0]), int(row[1]))


def _state_after_txn(txn: Transaction, event_id: str) -> dict[tuple[str, str], str]:
    groups = _state_groups_txn(txn, event_id)
    return {} if groups is None else get_state_txn(txn, groups[1])


def _state_ids_after_txn(txn: Transaction, event_id: str) -> list[str]:
    return sorted(_state_after_txn(txn, event_id).values())


def _state_before_txn(txn: Transaction, event_id: str) -> dict[tuple[str, str], str]:
    groups = _state_groups_txn(txn, event_id)
    return {} if groups is None else get_state_txn(txn, groups[0])


def _state_at_token_txn(
    txn: Transaction, room_id: str, token: EventsToken
) -> dict[tuple[str, str], str]:
    """The room's state after its latest timeline event ``token`` covers (empty when it
    covers none): what a client synced up to ``token`` has."""
    point = _point_txn(txn, room_id, token, MIN_POSITION)
    event_id = _neighbour_before_txn(txn, room_id, point)
    return {} if event_id is None else _state_after_txn(txn, event_id)


def _state_ids_before_txn(txn: Transaction, event_id: str) -> list[str]:
    groups = _state_groups_txn(txn, event_id)
    return [] if groups is None else sorted(get_state_txn(txn, groups[0]).values())
