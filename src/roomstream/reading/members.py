"""Members of a room (``/members``): its ``m.room.member`` state at a point, as a user
may see it."""

from __future__ import annotations

from collections.abc import Collection

from roomstream.errors import ForbiddenError
from roomstream.events.types import EventTypes
from roomstream.reading.events import EventRead, _Loaded
from roomstream.reading.format import ClientEvent
from roomstream.reading.room_state import _state_after_txn
from roomstream.reading.timeline_rows import (
    MAX_POSITION,
    _neighbour_before_txn,
    _point_txn,
    _timeline_row_txn,
)
from roomstream.reading.tokens import PaginationToken
from roomstream.reading.visibility import WORLD_READABLE, visibility_class
from roomstream.rooms.store import current_state_txn, load_events_txn
from roomstream.storage import Transaction


class Members(EventRead):
    """A room's members at a point, as a user may see them."""

    async def members(
        self,
        user_id: str,
        room_id: str,
        *,
        at: PaginationToken | str | None = None,
        membership: Collection[str] | None = None,
        not_membership: Collection[str] | None = None,
        users: Collection[str] | None = None,
    ) -> list[ClientEvent]:
        """The room's ``m.room.member`` state at a point: ``at`` a token, an event ID
        (the state after it), or None (now). A user who has left sees the members at
        their leave at the latest; one who never joined only a ``world_readable`` room's.
        ``M_FORBIDDEN`` otherwise. Filtered by ``membership`` / ``not_membership``, and
        to the member events of ``users`` (lazy-loading members of ``/messages``)."""
        raw = await self.db.run_interaction(
            "room_members", self._members_txn, user_id, room_id, at, users
        )
        if raw is None:
            raise ForbiddenError("you may not see the members of this room")
        member_ids, loaded = raw
        self._complete(loaded)
        now = self._now()
        result = []
        for event_id in member_ids:
            formatted = loaded.formatted.get(event_id)
            if formatted is None:
                continue
            value = formatted.base["content"].get("membership")
            if membership is not None and value not in membership:
                continue
            if not_membership is not None and value in not_membership:
                continue
            result.append(self._format(event_id, None, loaded, now))
        return result

    def _members_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_id: str,
        at: PaginationToken | str | None,
        users: Collection[str] | None = None,
    ) -> tuple[list[str], _Loaded] | None:
        current = current_state_txn(txn, room_id)
        if not current:
            return None
        own = current.get((EventTypes.MEMBER, user_id))
        own_membership = None
        if own is not None:
            row = txn.query_one("SELECT membership FROM events WHERE event_id = ?", (own,))
            own_membership = None if row is None else row[0]
        limit_event: str | None = None
        if own_membership != "join":
            if own_membership in ("leave", "ban") and own is not None:
                limit_event = own
            else:
                hv = current.get((EventTypes.HISTORY_VISIBILITY, ""))
                hv_event = None if hv is None else load_events_txn(txn, [hv]).get(hv)
                if (
                    visibility_class(None if hv_event is None else hv_event.content)
                    != WORLD_READABLE
                ):
                    return None
        event_id: str | None
        if isinstance(at, str):
            event_id = at
        elif at is None:
            event_id = None
        else:
            point = _point_txn(txn, room_id, at, MAX_POSITION)
            found = _neighbour_before_txn(txn, room_id, point)
            event_id = found
        if limit_event is not None:
            limit_row = _timeline_row_txn(txn, limit_event)
            event_row = None if event_id is None else _timeline_row_txn(txn, event_id)
            if event_row is None or (
                limit_row is not None and event_row[1].position > limit_row[1].position
            ):
                event_id = limit_event
        if event_id is None:
            state = current
        else:
            row = _timeline_row_txn(txn, event_id)
            if row is None or row[0] != room_id:
                return [], self._load_txn(txn, (), (), user_id, None)
            state = _state_after_txn(txn, event_id)
        ids = sorted(
            v
            for k, v in state.items()
            if k[0] == EventTypes.MEMBER and (users is None or k[1] in users)
        )
        return ids, self._load_txn(txn, (), ids, user_id, None)
