"""Reads of a room's state: at an event (before or after it, from its state groups),
at a token, and the current state of many rooms with their redaction flags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from roomstream.errors import ForbiddenError
from roomstream.events.types import EventTypes
from roomstream.reading.events import EventRead, _Loaded
from roomstream.reading.results import RoomStateView
from roomstream.reading.timeline_rows import (
    MIN_POSITION,
    _chunks,
    _marks,
    _neighbour_before_txn,
    _point_txn,
    _redacted_by,
    _Row,
)
from roomstream.reading.tokens import EventsToken
from roomstream.reading.visibility import WORLD_READABLE, visibility_class
from roomstream.rooms.store import current_state_txn, load_events_txn
from roomstream.state.groups import get_state_txn
from roomstream.storage import Transaction


def _current_state_ids_txn(
    txn: Transaction, room_ids: Sequence[str]
) -> tuple[dict[str, dict[tuple[str, str], str]], dict[str, str | None]]:
    """Each room's current state, (type, state_key) -> event ID, and the redaction flags
    of those events, read with them."""
    result: dict[str, dict[tuple[str, str], str]] = {r: {} for r in room_ids}
    flags: dict[str, str | None] = {}
    for chunk in _chunks(list(room_ids)):
        for room_id, event_type, state_key, event_id, redacted_by in txn.query(
            f"SELECT c.room_id, c.type, c.state_key, c.event_id, {_redacted_by('c.event_id')}"
            f" FROM current_state_events c WHERE c.room_id IN ({_marks(len(chunk))})",
            chunk,
        ):
            result[room_id][(event_type, state_key)] = event_id
            flags[event_id] = redacted_by
    return result, flags


def _rewound_state(
    current: Mapping[tuple[str, str], str], timeline: Sequence[_Row]
) -> dict[tuple[str, str], str]:
    """The state before ``timeline`` (oldest first), when it holds the room's latest
    timeline events: ``current`` with the timeline's own state events taken back, each
    key to the event its oldest timeline event replaced (``replaces_state``; none: the
    key goes). In a linear history that is the state before the first event, read with
    no state-group query; where branches interleave, it is the state that the
    timeline's events bring to the current state."""
    state = dict(current)
    by_id = {event_id: key for key, event_id in state.items()}
    for row in reversed(timeline):
        key = by_id.pop(row.event_id, None)
        if key is None:
            continue  # not a state event, or not the one the state holds for its key
        if row.replaces_state is None:
            del state[key]
        else:
            state[key] = row.replaces_state
            by_id[row.replaces_state] = key
    return state


def _merged_state(
    start: Mapping[tuple[str, str], str],
    end: Mapping[tuple[str, str], str],
    timeline: Sequence[_Row],
) -> dict[tuple[str, str], str]:
    """The state to send with a timeline that does not hold every event between its
    start and ``end`` (a filter or visibility left some out), as Synapse computes it:
    the state at the start, plus each entry of ``end`` that differs from it and is not
    in the timeline (so the client still reaches ``end``: a name change a filter
    excluded is in ``state``)."""
    in_timeline = {r.event_id for r in timeline}
    state = dict(start)
    for key, event_id in end.items():
        if start.get(key) != event_id and event_id not in in_timeline:
            state[key] = event_id
    return state


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
    """The state before an event. An event is never in the state before itself: the
    persister stores a room's create event with the group after it as its "before" too
    (there is no group for the empty state), so that entry is dropped."""
    groups = _state_groups_txn(txn, event_id)
    if groups is None:
        return {}
    state = get_state_txn(txn, groups[0])
    if groups[0] == groups[1]:
        state = {k: v for k, v in state.items() if v != event_id}
    return state


def _state_at_token_txn(
    txn: Transaction, room_id: str, token: EventsToken
) -> dict[tuple[str, str], str]:
    """The room's state after its latest timeline event ``token`` covers (empty when it
    covers none): what a client synced up to ``token`` has."""
    point = _point_txn(txn, room_id, token, MIN_POSITION)
    event_id = _neighbour_before_txn(txn, room_id, point)
    return {} if event_id is None else _state_after_txn(txn, event_id)


class RoomStateReads(EventRead):
    """A room's state as a user may see it (the legacy room ``initialSync``)."""

    async def room_state_for(
        self, user_id: str, room_id: str, *, departed: bool = True
    ) -> RoomStateView:
        """The room's state as the user may see it (the legacy room ``initialSync``): a
        member sees the current state; one who left or was banned the state after their
        leave (or ban) event; anyone else (invited, never joined) the current state of a
        ``world_readable`` room only, as a peek (``membership`` None). ``M_FORBIDDEN``
        otherwise, and for a room this server does not know.

        ``departed=False``: one who left or was banned is treated as one who never
        joined (a peek or ``M_FORBIDDEN``)."""
        raw = await self.db.run_interaction(
            "room_state", self._room_state_txn, user_id, room_id, departed
        )
        if raw is None:
            raise ForbiddenError(f"user {user_id} may not see room {room_id}")
        membership, member_event, state_ids, loaded = raw
        self._complete(loaded)
        return RoomStateView(
            membership, member_event, self._format_ids(state_ids, loaded, self._now())
        )

    def _room_state_txn(
        self, txn: Transaction, user_id: str, room_id: str, departed: bool = True
    ) -> tuple[str | None, str | None, list[str], _Loaded] | None:
        current = current_state_txn(txn, room_id)
        if not current:
            return None
        own = current.get((EventTypes.MEMBER, user_id))
        row = (
            None
            if own is None
            else txn.query_one("SELECT membership FROM events WHERE event_id = ?", (own,))
        )
        membership = None if row is None else str(row[0])
        if membership == "join":
            state_ids = sorted(current.values())
        elif membership in ("leave", "ban") and own is not None and departed:
            state_ids = _state_ids_after_txn(txn, own)
        else:
            hv = current.get((EventTypes.HISTORY_VISIBILITY, ""))
            hv_event = None if hv is None else load_events_txn(txn, [hv]).get(hv)
            if visibility_class(None if hv_event is None else hv_event.content) != WORLD_READABLE:
                return None
            membership, own, state_ids = None, None, sorted(current.values())
        return membership, own, state_ids, self._load_txn(txn, (), state_ids, user_id, None)
