"""The ``device_lists`` stream's table (``device_lists_stream``, written only here) and the
questions /sync and ``/keys/changes`` ask of it.

"Who shares a room with whom" is read from the rooms' current state
(``current_state_events``, read-only here): two users share a room when both are joined.
"""

from __future__ import annotations

from collections.abc import Iterable

from roomstream.storage import Transaction

__all__ = [
    "append_txn",
    "changed_since_txn",
    "changed_users_txn",
    "membership_changes_txn",
    "shares_room_with_txn",
]


def append_txn(t: Transaction, stream_id: int, instance: str, user_ids: Iterable[str]) -> None:
    """One stream fact: these users' devices or keys changed."""
    t.executemany(
        "INSERT INTO device_lists_stream (stream_id, instance_name, user_id) VALUES (?, ?, ?)",
        [(stream_id, instance, u) for u in sorted(set(user_ids))],
    )


def changed_users_txn(t: Transaction, from_pos: int, to_pos: int) -> set[str]:
    """Users with a row in ``(from_pos, to_pos]`` (every writer)."""
    if to_pos <= from_pos:
        return set()
    rows = t.query(
        "SELECT DISTINCT user_id FROM device_lists_stream WHERE stream_id > ? AND stream_id <= ?",
        (from_pos, to_pos),
    )
    return {str(r[0]) for r in rows}


def shares_room_with_txn(t: Transaction, user_id: str, others: Iterable[str]) -> set[str]:
    """Those of ``others`` joined to a room ``user_id`` is joined to (and ``user_id``
    itself when asked)."""
    others = set(others)
    shared = {user_id} & others
    candidates = sorted(others - shared)
    for start in range(0, len(candidates), 500):
        chunk = candidates[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        rows = t.query(
            "SELECT DISTINCT b.state_key FROM current_state_events a"
            " JOIN current_state_events b ON b.room_id = a.room_id"
            " WHERE a.type = 'm.room.member' AND a.state_key = ? AND a.membership = 'join'"
            " AND b.type = 'm.room.member' AND b.membership = 'join'"
            f" AND b.state_key IN ({marks})",
            (user_id, *chunk),
        )
        shared.update(str(r[0]) for r in rows)
    return shared


def changed_since_txn(t: Transaction, user_id: str, from_pos: int, to_pos: int) -> set[str]:
    """Users whose device lists changed in ``(from_pos, to_pos]`` and who share a room with
    ``user_id`` now (``user_id`` itself included)."""
    return shares_room_with_txn(t, user_id, changed_users_txn(t, from_pos, to_pos))


def membership_changes_txn(
    t: Transaction, user_id: str, from_ordering: int, to_ordering: int
) -> set[str]:
    """Users whose sharing of a room with ``user_id`` may have changed in
    ``(from_ordering, to_ordering]`` of the events stream: those with a membership event
    then in a room ``user_id`` is joined to now, and, for each room whose membership of
    ``user_id`` itself moved then, its members then and now (joining a room brings its
    members; leaving it takes them away)."""
    if to_ordering <= from_ordering:
        return set()
    own_moves = (
        "SELECT room_id FROM events WHERE type = 'm.room.member' AND state_key = ?"
        " AND stream_ordering > ? AND stream_ordering <= ?"
    )
    rows = t.query(
        "SELECT DISTINCT e.state_key FROM events e WHERE e.type = 'm.room.member'"
        " AND e.stream_ordering > ? AND e.stream_ordering <= ? AND (e.room_id IN ("
        "SELECT room_id FROM current_state_events WHERE type = 'm.room.member'"
        f" AND state_key = ? AND membership = 'join') OR e.room_id IN ({own_moves}))"
        " UNION SELECT c.state_key FROM current_state_events c"
        f" WHERE c.type = 'm.room.member' AND c.room_id IN ({own_moves})",
        (
            from_ordering,
            to_ordering,
            user_id,
            user_id,
            from_ordering,
            to_ordering,
            user_id,
            from_ordering,
            to_ordering,
        ),
    )
    return {str(r[0]) for r in rows if r[0] is not None}
