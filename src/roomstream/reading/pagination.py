"""Pagination: a room's events in topological order from a token (``/messages``),
and the latest page of many rooms at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from roomstream.errors import ForbiddenError, InvalidParamError, NotFoundError
from roomstream.reading.events import EventRead, _Loaded
from roomstream.reading.latest_rooms import _latest_rows_txn
from roomstream.reading.relations import Related, bundles_of, related_txn, with_latest
from roomstream.reading.results import PaginationChunk, RoomPage
from roomstream.reading.timeline_rows import (
    MAX_POSITION,
    MIN_POSITION,
    _check_limit,
    _load_views_txn,
    _page_txn,
    _point_txn,
    _range_query,
    _Row,
    _timeline_row_txn,
)
from roomstream.reading.tokens import PaginationToken, RoomPosition
from roomstream.reading.visibility import WORLD_READABLE
from roomstream.storage import Transaction


class Pagination(EventRead):
    """Pages of a room's timeline as a user may see it."""

    async def position_of_event(self, room_id: str, event_id: str) -> RoomPosition:
        """The point just before a timeline event (paginate from an event with it);
        ``M_NOT_FOUND`` if the room has no such timeline event."""
        row = await self.db.run_interaction("timeline_row", _timeline_row_txn, event_id)
        if row is None or row[0] != room_id:
            raise NotFoundError(f"no event {event_id} in {room_id}")
        return RoomPosition.of_event(row[1].topo, row[1].stream)

    async def paginate(
        self,
        user_id: str,
        room_id: str,
        from_token: PaginationToken | None,
        *,
        direction: Literal["b", "f"] = "b",
        limit: int = 10,
        to_token: PaginationToken | None = None,
        device_id: str | None = None,
        check_access: bool = False,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> PaginationChunk:
        """``limit`` visible events of the room in topological order from ``from_token``
        (None: the end going backwards, the start going forwards), stopping at
        ``to_token``. An events-stream token stands for the point after the room's latest
        event it covers.

        ``check_access`` (``/messages``, as Synapse's
        ``check_user_in_room_or_world_readable`` with departed users allowed):
        ``M_FORBIDDEN`` unless the user's current membership is ``join`` or ``leave``
        or the room's current history visibility is ``world_readable``, so a user who
        never joined, is banned or is only invited is refused, and so is anyone for a
        room this server does not know (its existence is not revealed). The chunk's
        ``departed`` says access came only from a leave (the caller may refuse a
        forgotten room). Read in the page's own statement: no extra round trip.

        ``aggregate``: the chunk's ``aggregations`` hold the page's bundled aggregations
        (``unsigned["m.relations"]`` by event ID, relations from ``ignored`` senders left
        out; see :func:`~roomstream.reading.relations.related_txn`), read in the page's
        own transaction: a page with relations costs the round trips of one without.

        ``end`` is None only when the page is empty: there is nothing more the user may
        see in that direction. A page shorter than ``limit`` still has one (as Synapse):
        it was cut by ``to_token``, or going forwards new events may follow, and a client
        paginating on from it gets an empty page without ``end`` when nothing did."""
        _check_limit(limit)
        if direction not in ("b", "f"):
            raise InvalidParamError("direction must be 'b' or 'f'")
        backwards = direction == "b"
        rows, loaded, departed, related = await self.db.run_interaction(
            "paginate",
            self._paginate_txn, user_id, room_id, from_token, backwards, limit, to_token,
            device_id, check_access, ignored if aggregate else None,
        )  # fmt: skip
        self._complete(loaded)
        now = self._now()
        events = self._format_rows(rows, loaded, now)
        aggregations = bundles_of(related, events, user_id, self._format_rows, loaded, now)
        end: RoomPosition | None = None
        if rows:
            last = rows[-1]
            end = (
                RoomPosition.of_event(last.topo, last.stream)
                if backwards
                else RoomPosition.after_event(last.topo, last.stream)
            )
        start = (
            from_token
            if from_token is not None
            else RoomPosition(*(MAX_POSITION if backwards else MIN_POSITION))
        )
        return PaginationChunk(events, start, end, departed, aggregations)

    async def latest_pages(
        self,
        user_id: str,
        room_ids: Sequence[str],
        *,
        limit: int,
        device_id: str | None = None,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> dict[str, RoomPage]:
        """Each room's latest ``limit`` events the user may see: the events of
        ``paginate(user_id, room, None, direction="b", limit=limit)``, for many rooms in
        one transaction (the views in one statement, then an index seek per room), so
        a page of rooms costs a few round trips, not a few per room. ``aggregate``:
        each page's ``aggregations`` too, read in the same transaction (as
        :meth:`paginate`'s)."""
        _check_limit(limit)
        if not room_ids:
            return {}
        rows_by_room, loaded, related = await self.db.run_interaction(
            "latest_pages",
            self._latest_pages_txn,
            user_id,
            list(dict.fromkeys(room_ids)),
            limit,
            device_id,
            ignored if aggregate else None,
        )
        self._complete(loaded)
        now = self._now()
        pages: dict[str, RoomPage] = {}
        for room_id, rows in rows_by_room.items():
            limited = len(rows) > limit
            kept = list(reversed(rows[:limit]))
            prev = RoomPosition.of_event(*kept[0].position) if kept else RoomPosition(*MAX_POSITION)
            events = self._format_rows(kept, loaded, now)
            bundles = bundles_of(related, events, user_id, self._format_rows, loaded, now)
            pages[room_id] = RoomPage(room_id, events, limited, prev, bundles)
        return pages

    def _latest_pages_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_ids: list[str],
        limit: int,
        device_id: str | None,
        aggregate_ignoring: frozenset[str] | None = None,
    ) -> tuple[dict[str, list[_Row]], _Loaded, Related]:
        views, _ = _load_views_txn(txn, room_ids, user_id)
        latest = _latest_rows_txn(txn, room_ids, limit + 1)
        rows_by_room = {
            room_id: _page_txn(
                txn,
                room_id,
                views[room_id],
                MIN_POSITION,
                MAX_POSITION,
                True,
                limit + 1,
                latest[room_id],
            )
            for room_id in room_ids
        }
        kept = [r for rows in rows_by_room.values() for r in rows[:limit]]
        related = Related({}, [])
        if aggregate_ignoring is not None and kept:
            related = related_txn(
                txn,
                user_id,
                {
                    r.event_id: room_id
                    for room_id, rows in rows_by_room.items()
                    for r in rows[:limit]
                    if r.redacted_by is None
                },
                aggregate_ignoring,
                views,
            )
        loaded = self._load_txn(txn, with_latest(kept, related), (), user_id, device_id)
        return rows_by_room, loaded, related

    def _paginate_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_id: str,
        from_token: PaginationToken | None,
        backwards: bool,
        limit: int,
        to_token: PaginationToken | None,
        device_id: str | None,
        check_access: bool = False,
        aggregate_ignoring: frozenset[str] | None = None,
    ) -> tuple[list[_Row], _Loaded, bool, Related]:
        point = _point_txn(txn, room_id, from_token, MAX_POSITION if backwards else MIN_POSITION)
        bound = _point_txn(txn, room_id, to_token, MIN_POSITION if backwards else MAX_POSITION)
        low, high = (bound, point) if backwards else (point, bound)
        rows: list[_Row] = []
        departed = False
        related = Related({}, [])
        if low < high or check_access:
            # The view and the page's first candidates in one statement: for a user who
            # sees all of them (the usual case) that is the whole page.
            candidates = (
                _range_query(room_id, low, high, None, backwards, limit) if low < high else None
            )
            views, extra = _load_views_txn(
                txn, [room_id], user_id, candidates, current=check_access
            )
            view = views[room_id]
            if check_access:
                membership = view.current_membership
                world_readable = view.current_visibility == WORLD_READABLE
                if membership != "join" and membership != "leave" and not world_readable:
                    raise ForbiddenError(f"user {user_id} may not read room {room_id}")
                departed = membership == "leave" and not world_readable
            if low < high:
                rows = _page_txn(txn, room_id, view, low, high, backwards, limit, extra[room_id])
            if aggregate_ignoring is not None and rows:
                related = related_txn(
                    txn,
                    user_id,
                    {r.event_id: room_id for r in rows if r.redacted_by is None},
                    aggregate_ignoring,
                    views,
                )
        loaded = self._load_txn(txn, with_latest(rows, related), (), user_id, device_id)
        return rows, loaded, departed, related
