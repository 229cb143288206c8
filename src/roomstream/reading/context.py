"""Context around an event (``/context``): the events before and after it the user may
see, and the state after it."""

from __future__ import annotations

from typing import Literal

from roomstream.errors import ForbiddenError, InvalidParamError, NotFoundError
from roomstream.reading.events import EventRead, _Loaded
from roomstream.reading.format import ClientEvent
from roomstream.reading.relations import Related, bundles_of, related_txn, with_latest
from roomstream.reading.results import EventContext
from roomstream.reading.room_state import _state_ids_after_txn
from roomstream.reading.timeline_rows import (
    MAX_LIMIT,
    MAX_POSITION,
    MIN_POSITION,
    _load_views_txn,
    _page_txn,
    _Row,
    _timeline_row_txn,
)
from roomstream.reading.tokens import RoomPosition
from roomstream.storage import Transaction


class ContextReads(EventRead):
    """An event with its surroundings, as a user may see them."""

    async def context(
        self,
        user_id: str,
        room_id: str,
        event_id: str,
        *,
        before: int = 5,
        after: int = 5,
        device_id: str | None = None,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> EventContext:
        """The event, ``before`` visible events before it and ``after`` after it, and the
        state after it. ``404 M_NOT_FOUND`` if the room has no such timeline event,
        ``403 M_FORBIDDEN`` if it has but the user may not see it (as Synapse).
        ``aggregate``: the bundled aggregations of the events too, in the same
        transaction (as :meth:`Pagination.paginate`'s)."""
        for n in (before, after):
            if n < 0 or n > MAX_LIMIT:
                raise InvalidParamError(f"limit must be 0..{MAX_LIMIT}")
        raw = await self.db.run_interaction(
            "event_context",
            self._context_txn, user_id, room_id, event_id, before, after, device_id,
            ignored if aggregate else None,
        )  # fmt: skip
        if raw is None:
            raise NotFoundError("event not found")
        if raw == "hidden":
            raise ForbiddenError("you may not see that event")
        row, before_rows, after_rows, state_ids, loaded, related = raw
        self._complete(loaded)
        now = self._now()

        def fmt(r: _Row) -> ClientEvent:
            return self._format(r.event_id, r.replaces_state, loaded, now)

        start = RoomPosition.of_event(*(before_rows[-1] if before_rows else row).position)
        end = RoomPosition.after_event(*(after_rows[-1] if after_rows else row).position)
        event = fmt(row)
        events_before = [fmt(r) for r in before_rows]
        events_after = [fmt(r) for r in after_rows]
        served = [event, *events_before, *events_after]
        return EventContext(
            event,
            events_before,
            events_after,
            start,
            end,
            self._format_ids(state_ids, loaded, now),
            bundles_of(related, served, user_id, self._format_rows, loaded, now),
        )

    def _context_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_id: str,
        event_id: str,
        before: int,
        after: int,
        device_id: str | None,
        aggregate_ignoring: frozenset[str] | None = None,
    ) -> (
        tuple[_Row, list[_Row], list[_Row], list[str], _Loaded, Related] | Literal["hidden"] | None
    ):
        found = _timeline_row_txn(txn, event_id)
        if found is None or found[0] != room_id:
            return None
        row = found[1]
        view = _load_views_txn(txn, [room_id], user_id)[0][room_id]
        if not view.visible(row):
            return "hidden"
        position = row.position
        before_rows = (
            _page_txn(txn, room_id, view, MIN_POSITION, position, True, before) if before else []
        )
        after_position = (position[0], position[1] + 1)
        after_rows = (
            _page_txn(txn, room_id, view, after_position, MAX_POSITION, False, after)
            if after
            else []
        )
        state_ids = _state_ids_after_txn(txn, event_id)
        rows = [row, *before_rows, *after_rows]
        related = Related({}, [])
        if aggregate_ignoring is not None:
            related = related_txn(
                txn,
                user_id,
                {r.event_id: room_id for r in rows if r.redacted_by is None},
                aggregate_ignoring,
                {room_id: view},
            )
        loaded = self._load_txn(txn, with_latest(rows, related), state_ids, user_id, device_id)
        return row, before_rows, after_rows, state_ids, loaded, related
