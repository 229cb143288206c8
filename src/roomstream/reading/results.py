"""What the reads of :class:`roomstream.reading.RoomReader` return."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from roomstream.reading.format import ClientEvent
from roomstream.reading.tokens import (
    EventsToken,
    InvalidTokenError,
    PaginationToken,
    RoomPosition,
)

__all__ = [
    "EventContext",
    "LatestRoomsPage",
    "PaginationChunk",
    "RoomPage",
    "RoomStateView",
    "RoomTimeline",
    "RoomsCursor",
    "SyncResult",
]


@dataclass
class RoomTimeline:
    """One room as a sync (or the latest-rooms read) returns it.

    ``events``: visible events, oldest first (at most the limit asked for).
    ``limited``: more visible events exist in the range than were returned.
    ``prev_batch``: paginate backwards from here (``RoomReader.paginate``) for older ones.
    ``membership``: the user's membership in the room's current state (None: none).
    ``state``: see the read that returned it (current state, or the state at the start
    of ``events``; empty when not asked for).
    ``latest_activity``: stream ordering of the newest event the user may see there
    (orders rooms in :meth:`RoomReader.latest_rooms`).
    ``member_event``: the user's own current membership event, for a room they are not
    joined to (from :meth:`RoomReader.latest_rooms`; its sender tells a kick from a
    leave), else None.
    """

    room_id: str
    membership: str | None
    events: list[ClientEvent]
    limited: bool
    prev_batch: PaginationToken
    state: list[ClientEvent] = field(default_factory=list)
    latest_activity: int = 0
    member_event: ClientEvent | None = None


@dataclass
class RoomPage:
    """A room's latest visible events (:meth:`RoomReader.latest_pages`).

    ``events``: oldest first, at most the limit asked for. ``limited``: older visible
    events exist. ``prev_batch``: paginate backwards from here for them (the oldest
    returned event's position; the room's end when none is returned).
    """

    room_id: str
    events: list[ClientEvent]
    limited: bool
    prev_batch: RoomPosition
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``.
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class SyncResult:
    """New events for a user since a token (:meth:`RoomReader.sync`).

    ``rooms``: rooms the user is joined to that have new visible events, and rooms whose
    membership of the user changed since the token (a room left since then shows its
    events up to the user's leave, as visibility allows).
    ``membership_changes``: the user's own ``m.room.member`` events since the token, in
    any room, oldest first (invites, kicks, bans, leaves, joins), whatever the room's
    history visibility: they are about the user.
    ``next_token``: where the next incremental sync starts.
    """

    next_token: EventsToken
    rooms: dict[str, RoomTimeline]
    membership_changes: list[ClientEvent]
    #: An initial sync read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``
    #: (an incremental sync leaves it empty: its caller reads what the change cache
    #: says may have relations).
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def members_moved(self) -> bool:
        """Whether a membership moved in the range: the user's own, or another's in a
        room's timeline or state delta (who shares a room with the user may differ)."""
        return bool(self.membership_changes) or any(
            e.get("type") == "m.room.member"
            for t in self.rooms.values()
            for e in (*t.events, *t.state)
        )


_CURSOR_RE = re.compile(r"r(-?[0-9]{1,19})\.(.+)")


@dataclass(frozen=True, slots=True)
class RoomsCursor:
    """Where the next page of :meth:`RoomReader.latest_rooms` starts: rooms ordered by
    (latest activity, room ID) descending, strictly after this one."""

    latest_activity: int
    room_id: str

    def to_string(self) -> str:
        return f"r{self.latest_activity}.{self.room_id}"

    @classmethod
    def parse(cls, text: str) -> RoomsCursor:
        match = _CURSOR_RE.fullmatch(text)
        if not match:
            raise InvalidTokenError(f"invalid rooms cursor {text[:64]!r}")
        return cls(int(match.group(1)), match.group(2))


@dataclass
class LatestRoomsPage:
    """The latest N events of the latest M rooms (:meth:`RoomReader.latest_rooms`).

    ``token``: the events position the page was read at; an incremental sync from it
    sees what happened since. ``next_cursor``: None on the last page.
    """

    rooms: list[RoomTimeline]
    next_cursor: RoomsCursor | None
    token: EventsToken
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``.
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class PaginationChunk:
    """A page of :meth:`RoomReader.paginate`: events in the direction asked (newest first
    going backwards), ``start`` (the token given) and ``end`` (continue from here; None
    when nothing further exists in that direction). ``departed``: read with
    ``check_access``, the user may read the room only because they left it.
    ``aggregations``: see :meth:`RoomReader.paginate`'s ``aggregate``."""

    events: list[ClientEvent]
    start: PaginationToken
    end: RoomPosition | None
    departed: bool = False
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]`` (only the
    #: events that have one).
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class EventContext:
    """Around an event (:meth:`RoomReader.context`): ``events_before`` newest first,
    ``events_after`` oldest first, tokens to paginate further each way, and the room
    state at the event (after it)."""

    event: ClientEvent
    events_before: list[ClientEvent]
    events_after: list[ClientEvent]
    start: RoomPosition
    end: RoomPosition
    state: list[ClientEvent]
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``.
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class RoomStateView:
    """A room's state as one user may see it (:meth:`RoomReader.room_state_for`).

    ``membership``: ``join``, ``leave`` or ``ban`` (then ``state`` is the state after
    ``member_event``, their leave), or None for a peek into a ``world_readable`` room.
    """

    membership: str | None
    member_event: str | None
    state: list[ClientEvent]
