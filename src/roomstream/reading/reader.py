"""The reads: new events since a token, the latest events of the latest rooms,
pagination, context around an event, members, single events (``docs/reading.md``).

Every read runs its SQL in one database interaction (the hop to a worker thread costs
more than most of these queries) and formats events on the event loop with
:func:`roomstream.reading.format.client_event`. Visibility comes from what the persister
recorded (:mod:`roomstream.reading.visibility`): a user's membership intervals in a room
(a handful of rows) split the room's topological order into *segments*; in each segment
the user sees a fixed set of visibility classes, so a page is a few index range scans
per segment — invisible history is skipped by seeking, never scanned.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from roomstream.errors import Codes, MatrixError
from roomstream.events.model import Event
from roomstream.reading.format import (
    ClientEvent,
    FormattedEvent,
    format_event,
    with_viewer_fields,
)
from roomstream.reading.results import (
    EventContext,
    LatestRoomsPage,
    PaginationChunk,
    RoomPage,
    RoomsCursor,
    RoomStateView,
    RoomTimeline,
    SyncResult,
)
from roomstream.reading.tokens import EventsToken, PaginationToken, RoomPosition
from roomstream.reading.visibility import (
    WORLD_READABLE,
    visibility_class,
)
from roomstream.rooms.store import EventStore, load_events_txn
from roomstream.storage import Transaction
from roomstream.streams import StreamChangeCache, StreamSet

if TYPE_CHECKING:
    from roomstream.rooms.engine import RoomEngine

from roomstream.reading.latest_rooms import (
    INVITE_STATE_TYPES,
    StateChoice,
    _latest_rows_txn,
    _room_activity_txn,
)
from roomstream.reading.room_state import (
    _current_state_ids_txn,
    _current_state_txn,
    _state_after_txn,
    _state_at_token_txn,
    _state_before_txn,
    _state_ids_after_txn,
    _state_ids_before_txn,
)
from roomstream.reading.summaries import _RoomSummary, _summaries_txn
from roomstream.reading.timeline import _lazy_members, _new_rows_txn, _senders_txn
from roomstream.reading.timeline_rows import (
    MAX_LIMIT,
    MAX_POSITION,
    MIN_POSITION,
    _check_limit,
    _chunks,
    _load_views_txn,
    _marks,
    _neighbour_before_txn,
    _page_txn,
    _point_txn,
    _range_query,
    _Row,
    _timeline_row_txn,
)

__all__ = ["MAX_LIMIT", "RoomReader"]


@dataclass
class _Loaded:
    """Everything formatting needs besides the rows, read in the transaction.

    ``formatted``: event ID -> its viewer-independent format, for the events whose format
    (for their current redaction) the reader's cache held; :meth:`RoomReader._complete`
    adds the ``missing`` ones, formatted from ``events`` (those events and their
    redactions; ``fresh``: the ones read from the database). ``redacted_by``: event ID ->
    its accepted redaction. ``transaction_ids``: event ID -> the viewing device's.
    """

    formatted: dict[str, FormattedEvent]
    missing: list[str]
    events: dict[str, Event]
    fresh: list[Event]
    redacted_by: dict[str, str]
    transaction_ids: dict[str, str]


class RoomReader:
    """The read side over one process's storage and streams.

    Safe to share between requests. Holds caches of which rooms and users changed at
    which events-stream position (fed from the events stream itself, so any process can
    run a reader: it sees what its stream positions say is complete), and of each user's
    rooms.
    """

    def __init__(
        self,
        store: EventStore,
        streams: StreamSet,
        *,
        clock: Callable[[], float] = time.time,
        include_age: bool = True,
        change_cache_size: int = 100_000,
        # As many as the event cache's (EventStore; both are `caches` in the
        # configuration): a process's memory for served events levels off once that many
        # distinct events have been served (bench/bench_memory.py).
        format_cache_size: int = 20_000,
    ) -> None:
        self.store = store
        self.db = store.db
        self.streams = streams
        self._clock = clock
        self._include_age = include_age
        generator = streams.generator("events")
        self._ingested: dict[str, int] = dict(generator.get_positions())
        start = min(self._ingested.values(), default=0)
        self._room_changes = StreamChangeCache("room_events", start, change_cache_size)
        self._member_changes = StreamChangeCache("user_memberships", start, change_cache_size)
        self._ingest_lock = asyncio.Lock()
        # event ID -> the client format's viewer-independent part, for the redaction the
        # event had when formatted (a later redaction makes the entry a miss). Read by
        # database interactions on worker threads (a plain get), written on the loop.
        self._formatted: OrderedDict[str, FormattedEvent] = OrderedDict()
        self._formatted_size = format_cache_size
        # user -> (ingested linear position when loaded, {room: membership})
        self._rooms_of: dict[str, tuple[int, dict[str, str]]] = {}
        # room -> (ingested linear position before it was read, its summary's parts)
        self._summaries: OrderedDict[str, tuple[int, _RoomSummary]] = OrderedDict()
        self._summaries_size = change_cache_size

    @classmethod
    def for_engine(cls, engine: RoomEngine, **kwargs: Any) -> RoomReader:
        """A reader over a :class:`~roomstream.rooms.engine.RoomEngine`'s store and streams."""
        return cls(engine.store, engine.streams, **kwargs)

    # -- tokens ----------------------------------------------------------------------

    def current_token(self) -> EventsToken:
        """The events position this process has seen complete, per writer."""
        return EventsToken.from_positions(self.streams.generator("events").get_positions())

    async def position_of_event(self, room_id: str, event_id: str) -> RoomPosition:
        """The point just before a timeline event (paginate from an event with it);
        ``M_NOT_FOUND`` if the room has no such timeline event."""
        row = await self.db.run_interaction(_timeline_row_txn, event_id)
        if row is None or row[0] != room_id:
            raise MatrixError(404, Codes.NOT_FOUND, f"no event {event_id} in {room_id}")
        return RoomPosition.of_event(row[1].topo, row[1].stream)

    # -- change caches ---------------------------------------------------------------

    @property
    def ingested_floor(self) -> int:
        """An events-stream position every event of which, on every writer, the change
        caches have seen: an event persisted later is after it."""
        return min(self._ingested.values(), default=0)

    def rooms_changed_since(self, room_ids: Iterable[str], position: int) -> set[str]:
        """Of ``room_ids``, those that may have new events after ``position``."""
        changes = self._room_changes
        return {r for r in room_ids if changes.has_entity_changed(r, position)}

    async def _ingest(self) -> EventsToken:
        """Bring the change caches up to the events positions this process knows."""
        positions = self.streams.generator("events").get_positions()
        if all(self._ingested.get(w, 0) >= p for w, p in positions.items()):
            return EventsToken.from_positions(
                {w: self._ingested.get(w, p) for w, p in positions.items()}
            )
        async with self._ingest_lock:
            for writer, position in positions.items():
                since = self._ingested.get(writer, 0)
                while since < position:
                    updates, upto, limited = await self.streams.get_updates(
                        "events", writer, since, position, 10_000
                    )
                    self._note_changes(updates)
                    since = upto
                    if not limited:
                        break
                self._ingested[writer] = max(self._ingested.get(writer, 0), position)
        return EventsToken.from_positions(dict(self._ingested))

    def ingest_rows(
        self, writer: str, since: int, upto: int, updates: Sequence[tuple[int, Any]]
    ) -> bool:
        """Take ``writer``'s complete ``events`` rows after ``since`` up to ``upto``, read
        by someone else (the notifier reads each local batch once to wake syncs), so the
        sync they wake need not read them again. Ignored (False) unless this reader has
        everything up to ``since`` already: the change caches must have no gap."""
        if self._ingested.get(writer, 0) < since:
            return False
        self._note_changes(updates)
        self._ingested[writer] = max(self._ingested.get(writer, 0), upto)
        return True

    def _note_changes(self, updates: Iterable[tuple[int, Any]]) -> None:
        for token, (kind, data) in updates:
            if kind != "ev":
                continue
            self._room_changes.entity_has_changed(data[1], token)
            if data[2] == "m.room.member" and data[3] is not None:
                self._member_changes.entity_has_changed(data[3], token)

    async def _rooms_for_user(self, user_id: str) -> dict[str, str]:
        """room -> the user's membership in its current state (any membership)."""
        cached = self._rooms_of.get(user_id)
        if cached is not None and not self._member_changes.has_entity_changed(user_id, cached[0]):
            return cached[1]
        loaded_at = min(self._ingested.values(), default=0)
        rooms = await self.db.run_interaction(_rooms_for_user_txn, user_id)
        self._rooms_of[user_id] = (loaded_at, rooms)
        if len(self._rooms_of) > 100_000:
            self._rooms_of.pop(next(iter(self._rooms_of)))
        return rooms

    # -- sync --------------------------------------------------------------------------

    async def sync(
        self,
        user_id: str,
        since: EventsToken | None,
        *,
        timeline_limit: int = 10,
        device_id: str | None = None,
        full_state: bool = False,
        lazy_members: bool = False,
    ) -> SyncResult:
        """Every visible event in the user's rooms after ``since``, per room (newest
        ``timeline_limit``, with ``limited`` and ``prev_batch``), plus the user's own
        membership changes in any room. ``since=None`` is an initial sync: the latest
        ``timeline_limit`` events of every room the user is joined to (or invited to,
        or left), with current state.

        State of an incremental sync (spec: the state at the start of the timeline,
        minus what the client had at ``since``): none for a timeline that follows on
        from ``since``; for a ``limited`` one, the entries of the state before its first
        event that differ from the state at ``since``; the whole state before the first
        event for rooms whose membership of the user changed. ``full_state``: every
        joined room is in the result, each with its whole state at the start of its
        timeline (current state when it has no new events).

        ``lazy_members`` (lazy-loading members): of the ``m.room.member`` state, only
        the events of the timeline's senders and of the user, taken from the state at
        the start of the timeline (current state for an initial sync) whether or not
        they changed; the caller drops the ones it knows the device already has.

        Rooms whose events-stream position has not moved since ``since`` are skipped
        from the change cache without a query (unless ``full_state``).
        """
        _check_limit(timeline_limit)
        upto = await self._ingest()
        rooms = await self._rooms_for_user(user_id)
        if since is None:
            page = await self.latest_rooms(
                user_id,
                room_limit=max(1, len(rooms)),
                event_limit=timeline_limit,
                device_id=device_id,
                _token=upto,
            )
            if lazy_members:
                for timeline in page.rooms:
                    if timeline.membership != "invite":
                        timeline.state = _lazy_members(timeline.state, timeline.events, user_id)
            return SyncResult(upto, {r.room_id: r for r in page.rooms}, [])
        floor = since.minimum
        # The rooms changed since the floor, from the change cache when it knows them
        # and they are fewer than the user's rooms (a wake then costs what changed, not
        # the number of rooms the user is in); full_state asks for every joined room.
        changed = None if full_state else self._room_changes.get_all_entities_changed(floor)
        if changed is not None and len(changed) < len(rooms):
            candidates = sorted({r for r in changed if rooms.get(r) == "join"})
        else:
            candidates = sorted(
                r
                for r, m in rooms.items()
                if m == "join" and (full_state or self._room_changes.has_entity_changed(r, floor))
            )
        members_changed = self._member_changes.has_entity_changed(user_id, floor)
        if not candidates and not members_changed:
            return SyncResult(upto.advance(since), {}, [])
        raw = await self.db.run_interaction(
            self._sync_txn, user_id, candidates, members_changed, since, upto, timeline_limit,
            device_id, full_state, lazy_members,
        )  # fmt: skip
        timelines, changes, loaded = raw
        self._complete(loaded)
        now = self._now()
        result: dict[str, RoomTimeline] = {}
        for room_id, (rows, limited, state_ids) in timelines.items():
            prev_batch: PaginationToken = (
                RoomPosition.of_event(*min(r.position for r in rows)) if rows else since
            )
            result[room_id] = RoomTimeline(
                room_id,
                rooms.get(room_id),
                self._format_rows(rows, loaded, now),
                limited,
                prev_batch,
                self._format_ids(state_ids, loaded, now),
                max((r.stream for r in rows), default=0),
            )
        membership = [
            self._format(event_id, replaces, loaded, now) for event_id, replaces in changes
        ]
        # A token from a process that has seen further than this one: never go back.
        return SyncResult(upto.advance(since), result, membership)

    def _sync_txn(
        self,
        txn: Transaction,
        user_id: str,
        candidates: list[str],
        members_changed: bool,
        since: EventsToken,
        upto: EventsToken,
        limit: int,
        device_id: str | None,
        full_state: bool = False,
        lazy_members: bool = False,
    ) -> tuple[
        dict[str, tuple[list[_Row], bool, list[str]]], list[tuple[str, str | None]], _Loaded
    ]:
        changes: list[tuple[str, str | None, str]] = []
        if members_changed:
            for event_id, room_id, stream, writer in txn.query(
                "SELECT event_id, room_id, stream_ordering, instance_name FROM events"
                " WHERE type = 'm.room.member' AND state_key = ? AND stream_ordering > ?"
                " AND stream_ordering <= ? AND rejected_reason IS NULL AND soft_failed = ?"
                " ORDER BY stream_ordering",
                (user_id, since.minimum, upto.maximum, False),
            ):
                if not since.covers(writer, int(stream)) and upto.covers(writer, int(stream)):
                    changes.append((str(event_id), None, str(room_id)))
        changed_rooms = {c[2] for c in changes}
        room_ids = sorted(set(candidates) | changed_rooms)
        views, _ = _load_views_txn(txn, room_ids, user_id)
        timelines: dict[str, tuple[list[_Row], bool, list[str]]] = {}
        for room_id in room_ids:
            rows, limited = _new_rows_txn(txn, room_id, views[room_id], since, upto, limit)
            if not rows and room_id not in changed_rooms and not full_state:
                continue
            state: dict[tuple[str, str], str] = {}
            # The state at the start of the timeline (current state without one).
            start: dict[tuple[str, str], str] | None = None
            if rows:
                if full_state or limited or room_id in changed_rooms or lazy_members:
                    start = _state_before_txn(txn, rows[0].event_id)
            elif full_state:
                start = _current_state_txn(txn, room_id)
            if start is not None:
                if full_state or room_id in changed_rooms:
                    state = start
                elif limited:
                    had = _state_at_token_txn(txn, room_id, since)
                    state = {k: v for k, v in start.items() if had.get(k) != v}
                if lazy_members:
                    wanted = {user_id, *_senders_txn(txn, [r.event_id for r in rows]).values()}
                    state = {
                        k: v for k, v in state.items() if k[0] != "m.room.member" or k[1] in wanted
                    }
                    for member in wanted:
                        found = start.get(("m.room.member", member))
                        if found is not None:
                            state[("m.room.member", member)] = found
            timelines[room_id] = (rows, limited, sorted(state.values()))
        replaces: dict[str, str | None] = {}
        if changes:
            for chunk in _chunks([c[0] for c in changes]):
                replaces.update(
                    txn.query(
                        "SELECT event_id, replaces_state FROM timeline_events"
                        f" WHERE event_id IN ({_marks(len(chunk))})",
                        chunk,
                    )
                )
        rows_all = [r for rows, _, _ in timelines.values() for r in rows]
        others = [c[0] for c in changes] + [v for v in replaces.values() if v]
        others += [s for _, _, state in timelines.values() for s in state]
        loaded = self._load_txn(txn, rows_all, others, user_id, device_id)
        return timelines, [(c[0], replaces.get(c[0])) for c in changes], loaded

    # -- room summaries ----------------------------------------------------------------

    async def room_summaries(
        self, user_id: str, room_ids: Collection[str]
    ) -> dict[str, dict[str, Any]]:
        """room -> its sync ``summary`` (spec, "Room summary"): ``m.joined_member_count``,
        ``m.invited_member_count`` from the current state, and ``m.heroes`` for rooms
        with neither a name nor a canonical alias: up to 5 members other than the
        user, joined and invited ones first, each group by the stream order of their
        membership event (as Synapse picks them); when no one else is joined or invited,
        those who left or were banned. One database interaction for all the rooms."""
        if not room_ids:
            return {}
        # Per room, not per user: kept while the change cache says the room has no event
        # after the position ingested before it was read (a later event is after it).
        checked_at = self.ingested_floor
        cache = self._summaries
        known: dict[str, _RoomSummary] = {}
        for room_id in room_ids:
            entry = cache.get(room_id)
            if entry is not None and not self._room_changes.has_entity_changed(room_id, entry[0]):
                known[room_id] = entry[1]
        missing = sorted(r for r in room_ids if r not in known)
        if missing:
            read = await self.db.run_interaction(_summaries_txn, missing)
            for room_id, summary in read.items():
                known[room_id] = summary
                cache[room_id] = (checked_at, summary)
                cache.move_to_end(room_id)
            while len(cache) > self._summaries_size:
                cache.popitem(last=False)
        return {room_id: known[room_id].for_user(user_id) for room_id in room_ids}

    # -- latest rooms ------------------------------------------------------------------

    async def latest_rooms(
        self,
        user_id: str,
        *,
        room_limit: int = 20,
        event_limit: int = 20,
        cursor: RoomsCursor | None = None,
        state: StateChoice = "current",
        memberships: Collection[str] = ("join", "invite", "leave", "ban"),
        device_id: str | None = None,
        _token: EventsToken | None = None,
    ) -> LatestRoomsPage:
        """The user's rooms ordered by their latest activity the user may see (newest
        first, after ``cursor``), at most ``room_limit``, each with its latest
        ``event_limit`` visible events and its current state (or the state at the start
        of the returned timeline, or none). Invited (and knocked) rooms get no timeline
        and, as state, the user's invite (or knock) event and the room's descriptive
        state (name, topic, join rules...).
        """
        _check_limit(event_limit)
        if room_limit < 1:
            raise MatrixError(400, Codes.INVALID_PARAM, "room_limit must be at least 1")
        token = _token if _token is not None else await self._ingest()
        users_rooms = await self._rooms_for_user(user_id)
        # The change cache knows the latest event of every room that changed since it
        # started: those rank above every other room, so usually no room's activity
        # has to be read from the database.
        horizon = self._room_changes.horizon
        joined = (
            sorted(r for r, m in users_rooms.items() if m == "join")
            if "join" in memberships
            else []
        )
        known: dict[str, int] = {}
        for room_id in joined:
            position = self._room_changes.get_max_position_of_entity(room_id)
            if position > horizon:
                known[room_id] = position
        others = tuple(m for m in memberships if m != "join")
        raw = await self.db.run_interaction(
            self._latest_txn, user_id, room_limit, event_limit, cursor, state, joined, known,
            horizon, others, device_id,
        )  # fmt: skip
        picked, more, loaded = raw
        self._complete(loaded)
        now = self._now()
        rooms = []
        for room_id, membership, activity, rows, limited, state_ids in picked:
            prev_batch = (
                RoomPosition.of_event(*rows[0].position) if rows else RoomPosition(*MIN_POSITION)
            )
            rooms.append(
                RoomTimeline(
                    room_id,
                    membership,
                    self._format_rows(rows, loaded, now),
                    limited,
                    prev_batch,
                    self._format_ids(state_ids, loaded, now),
                    activity,
                )
            )
        next_cursor = (
            RoomsCursor(rooms[-1].latest_activity, rooms[-1].room_id) if more and rooms else None
        )
        return LatestRoomsPage(rooms, next_cursor, token)

    def _latest_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_limit: int,
        event_limit: int,
        cursor: RoomsCursor | None,
        state: StateChoice,
        joined: list[str],
        known_activity: dict[str, int],
        horizon: int,
        others: tuple[str, ...],
        device_id: str | None,
    ) -> tuple[list[tuple[str, str, int, list[_Row], bool, list[str]]], bool, _Loaded]:
        # Latest activity: the stream ordering of the room's newest event for members;
        # of the user's membership event otherwise (nothing later is theirs to see,
        # unless visibility lets them, which the timeline below still honours).
        ranked = [(activity, room_id, "join", "") for room_id, activity in known_activity.items()]
        if others:
            for room_id, membership, event_id, stream in txn.query(
                "SELECT c.room_id, c.membership, c.event_id, e.stream_ordering"
                " FROM current_state_events c JOIN events e ON e.event_id = c.event_id"
                " WHERE c.state_key = ? AND c.type = 'm.room.member'"
                f" AND c.membership IN ({_marks(len(others))})",
                (user_id, *others),
            ):
                ranked.append((int(stream), str(room_id), str(membership), str(event_id)))

        def after_cursor(items: Iterable[tuple[int, str, str, str]]) -> list[Any]:
            ordered = sorted(items, reverse=True)
            if cursor is None:
                return ordered
            mark = (cursor.latest_activity, cursor.room_id)
            return [c for c in ordered if (c[0], c[1]) < mark]

        ordered = after_cursor(ranked)
        above = [c for c in ordered if c[0] > horizon]
        if len(above) <= room_limit:
            # The rest of the page comes from rooms the cache knows nothing about.
            unknown = [r for r in joined if r not in known_activity]
            ranked.extend(
                (activity, room_id, "join", "")
                for room_id, activity in _room_activity_txn(txn, unknown).items()
            )
            ordered = after_cursor(ranked)
        more = len(ordered) > room_limit
        ordered = [(room, membership, event, activity) for activity, room, membership, event
                   in ordered[:room_limit]]  # fmt: skip
        # Invited and knocking users see no timeline, only the stripped state.
        readable = [r[0] for r in ordered if r[1] not in ("invite", "knock")]
        views, _ = _load_views_txn(txn, readable, user_id)
        latest = _latest_rows_txn(txn, readable, event_limit + 1)
        currents, flags = _current_state_ids_txn(txn, readable) if state == "current" else ({}, {})
        picked: list[tuple[str, str, int, list[_Row], bool, list[str]]] = []
        for room_id, membership, member_event, activity in ordered:
            state_ids: list[str] = []
            if membership in ("invite", "knock"):
                current = _current_state_txn(txn, room_id)
                state_ids = [v for k, v in sorted(current.items()) if k[0] in INVITE_STATE_TYPES]
                state_ids.append(member_event)
                picked.append((room_id, membership, activity, [], False, state_ids))
                continue
            visible = _page_txn(
                txn, room_id, views[room_id], MIN_POSITION, MAX_POSITION, True,
                event_limit + 1, latest[room_id],
            )  # fmt: skip
            limited = len(visible) > event_limit
            timeline = list(reversed(visible[:event_limit]))
            if state == "current":
                state_ids = currents[room_id]
            elif state == "timeline_start" and timeline:
                state_ids = _state_ids_before_txn(txn, timeline[0].event_id)
            picked.append((room_id, membership, activity, timeline, limited, state_ids))
        rows_all = [r for p in picked for r in p[3]]
        state_all = [s for p in picked for s in p[5]]
        loaded = self._load_txn(txn, rows_all, state_all, user_id, device_id, flags)
        return picked, more, loaded

    # -- pagination ----------------------------------------------------------------------

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
    ) -> PaginationChunk:
        """``limit`` visible events of the room in topological order from ``from_token``
        (None: the end going backwards, the start going forwards), stopping at
        ``to_token``. An events-stream token stands for the point after the room's latest
        event it covers.

        ``end`` is None only when the page is empty: there is nothing more the user may
        see in that direction. A page shorter than ``limit`` still has one (as Synapse):
        it was cut by ``to_token``, or going forwards new events may follow, and a client
        paginating on from it gets an empty page without ``end`` when nothing did."""
        _check_limit(limit)
        if direction not in ("b", "f"):
            raise MatrixError(400, Codes.INVALID_PARAM, "direction must be 'b' or 'f'")
        backwards = direction == "b"
        rows, loaded = await self.db.run_interaction(
            self._paginate_txn, user_id, room_id, from_token, backwards, limit, to_token,
            device_id,
        )  # fmt: skip
        self._complete(loaded)
        now = self._now()
        events = self._format_rows(rows, loaded, now)
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
        return PaginationChunk(events, start, end)

    async def latest_pages(
        self,
        user_id: str,
        room_ids: Sequence[str],
        *,
        limit: int,
        device_id: str | None = None,
    ) -> dict[str, RoomPage]:
        """Each room's latest ``limit`` events the user may see: the events of
        ``paginate(user_id, room, None, direction="b", limit=limit)``, for many rooms in
        one transaction (the views in one statement, then an index seek per room), so
        a page of rooms costs a few round trips, not a few per room."""
        _check_limit(limit)
        if not room_ids:
            return {}
        rows_by_room, loaded = await self.db.run_interaction(
            self._latest_pages_txn, user_id, list(dict.fromkeys(room_ids)), limit, device_id
        )
        self._complete(loaded)
        now = self._now()
        pages: dict[str, RoomPage] = {}
        for room_id, rows in rows_by_room.items():
            limited = len(rows) > limit
            kept = list(reversed(rows[:limit]))
            prev = RoomPosition.of_event(*kept[0].position) if kept else RoomPosition(*MAX_POSITION)
            pages[room_id] = RoomPage(room_id, self._format_rows(kept, loaded, now), limited, prev)
        return pages

    def _latest_pages_txn(
        self, txn: Transaction, user_id: str, room_ids: list[str], limit: int, device_id: str | None
    ) -> tuple[dict[str, list[_Row]], _Loaded]:
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
        loaded = self._load_txn(txn, kept, (), user_id, device_id)
        return rows_by_room, loaded

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
    ) -> tuple[list[_Row], _Loaded]:
        point = _point_txn(txn, room_id, from_token, MAX_POSITION if backwards else MIN_POSITION)
        bound = _point_txn(txn, room_id, to_token, MIN_POSITION if backwards else MAX_POSITION)
        low, high = (bound, point) if backwards else (point, bound)
        rows: list[_Row] = []
        if low < high:
            # The view and the page's first candidates in one statement: for a user who
            # sees all of them (the usual case) that is the whole page.
            candidates = _range_query(room_id, low, high, None, backwards, limit)
            views, extra = _load_views_txn(txn, [room_id], user_id, candidates)
            rows = _page_txn(
                txn, room_id, views[room_id], low, high, backwards, limit, extra[room_id]
            )
        loaded = self._load_txn(txn, rows, (), user_id, device_id)
        return rows, loaded

    # -- context -------------------------------------------------------------------------

    async def context(
        self,
        user_id: str,
        room_id: str,
        event_id: str,
        *,
        before: int = 5,
        after: int = 5,
        device_id: str | None = None,
    ) -> EventContext:
        """The event, ``before`` visible events before it and ``after`` after it, and the
        state after it. ``404 M_NOT_FOUND`` if the room has no such timeline event,
        ``403 M_FORBIDDEN`` if it has but the user may not see it (as Synapse)."""
        for n in (before, after):
            if n < 0 or n > MAX_LIMIT:
                raise MatrixError(400, Codes.INVALID_PARAM, f"limit must be 0..{MAX_LIMIT}")
        raw = await self.db.run_interaction(
            self._context_txn, user_id, room_id, event_id, before, after, device_id
        )
        if raw is None:
            raise MatrixError(404, Codes.NOT_FOUND, "event not found")
        if raw == "hidden":
            raise MatrixError(403, Codes.FORBIDDEN, "you may not see that event")
        row, before_rows, after_rows, state_ids, loaded = raw
        self._complete(loaded)
        now = self._now()

        def fmt(r: _Row) -> ClientEvent:
            return self._format(r.event_id, r.replaces_state, loaded, now)

        start = RoomPosition.of_event(*(before_rows[-1] if before_rows else row).position)
        end = RoomPosition.after_event(*(after_rows[-1] if after_rows else row).position)
        return EventContext(
            fmt(row),
            [fmt(r) for r in before_rows],
            [fmt(r) for r in after_rows],
            start,
            end,
            self._format_ids(state_ids, loaded, now),
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
    ) -> tuple[_Row, list[_Row], list[_Row], list[str], _Loaded] | Literal["hidden"] | None:
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
        loaded = self._load_txn(txn, rows, state_ids, user_id, device_id)
        return row, before_rows, after_rows, state_ids, loaded

    # -- members -------------------------------------------------------------------------

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
        raw = await self.db.run_interaction(self._members_txn, user_id, room_id, at, users)
        if raw is None:
            raise MatrixError(403, Codes.FORBIDDEN, "you may not see the members of this room")
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
        current = _current_state_txn(txn, room_id)
        if not current:
            return None
        own = current.get(("m.room.member", user_id))
        own_membership = None
        if own is not None:
            row = txn.query_one("SELECT membership FROM events WHERE event_id = ?", (own,))
            own_membership = None if row is None else row[0]
        limit_event: str | None = None
        if own_membership != "join":
            if own_membership in ("leave", "ban") and own is not None:
                limit_event = own
            else:
                hv = current.get(("m.room.history_visibility", ""))
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
            if k[0] == "m.room.member" and (users is None or k[1] in users)
        )
        return ids, self._load_txn(txn, (), ids, user_id, None)

    # -- a room's state as a user may see it -------------------------------------------

    async def room_state_for(self, user_id: str, room_id: str) -> RoomStateView:
        """The room's state as the user may see it (the legacy room ``initialSync``): a
        member sees the current state; one who left or was banned the state after their
        leave (or ban) event; anyone else (invited, never joined) the current state of a
        ``world_readable`` room only, as a peek (``membership`` None). ``M_FORBIDDEN``
        otherwise, and for a room this server does not know."""
        raw = await self.db.run_interaction(self._room_state_txn, user_id, room_id)
        if raw is None:
            raise MatrixError(403, Codes.FORBIDDEN, f"user {user_id} may not see room {room_id}")
        membership, member_event, state_ids, loaded = raw
        self._complete(loaded)
        return RoomStateView(
            membership, member_event, self._format_ids(state_ids, loaded, self._now())
        )

    def _room_state_txn(
        self, txn: Transaction, user_id: str, room_id: str
    ) -> tuple[str | None, str | None, list[str], _Loaded] | None:
        current = _current_state_txn(txn, room_id)
        if not current:
            return None
        own = current.get(("m.room.member", user_id))
        row = (
            None
            if own is None
            else txn.query_one("SELECT membership FROM events WHERE event_id = ?", (own,))
        )
        membership = None if row is None else str(row[0])
        if membership == "join":
            state_ids = sorted(current.values())
        elif membership in ("leave", "ban") and own is not None:
            state_ids = _state_ids_after_txn(txn, own)
        else:
            hv = current.get(("m.room.history_visibility", ""))
            hv_event = None if hv is None else load_events_txn(txn, [hv]).get(hv)
            if visibility_class(None if hv_event is None else hv_event.content) != WORLD_READABLE:
                return None
            membership, own, state_ids = None, None, sorted(current.values())
        return membership, own, state_ids, self._load_txn(txn, (), state_ids, user_id, None)

    # -- single events -------------------------------------------------------------------

    async def get_event(
        self, user_id: str, event_id: str, *, device_id: str | None = None
    ) -> ClientEvent | None:
        """One event as the user may see it; None if unknown or not visible to them.

        Outliers are served only when they are the user's own membership events (an
        invite received out of band)."""
        raw = await self.db.run_interaction(self._get_event_txn, user_id, event_id, device_id)
        if raw is None:
            return None
        replaces, loaded = raw
        self._complete(loaded)
        return self._format(event_id, replaces, loaded, self._now())

    def _get_event_txn(
        self, txn: Transaction, user_id: str, event_id: str, device_id: str | None
    ) -> tuple[str | None, _Loaded] | None:
        found = _timeline_row_txn(txn, event_id)
        if found is None:
            meta = txn.query_one(
                "SELECT type, state_key, outlier, rejected_reason FROM events WHERE event_id = ?",
                (event_id,),
            )
            if (
                meta is None
                or meta[0] != "m.room.member"
                or meta[1] != user_id
                or not meta[2]
                or meta[3] is not None
            ):
                return None
            return None, self._load_txn(txn, (), [event_id], user_id, device_id)
        room_id, row = found
        view = _load_views_txn(txn, [room_id], user_id)[0][room_id]
        if not view.visible(row):
            return None
        return row.replaces_state, self._load_txn(txn, [row], (), user_id, device_id)

    async def is_visible(self, user_id: str, event_id: str) -> bool:
        """May the user see this timeline event?"""

        def txn(t: Transaction) -> bool:
            found = _timeline_row_txn(t, event_id)
            if found is None:
                return False
            return _load_views_txn(t, [found[0]], user_id)[0][found[0]].visible(found[1])

        return await self.db.run_interaction(txn)

    # -- transaction IDs -------------------------------------------------------------------

    async def record_transaction_id(
        self, event_id: str, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> None:
        """Remember that ``device_id`` of ``user_id`` sent ``event_id`` with ``txn_id``
        (shown to that device only). The client API does not call this: its sends store
        the record in the event's own transaction (``EventPersister``)."""
        now = int(self._clock() * 1000)
        await self.db.run_interaction(
            lambda t: t.execute(
                "INSERT INTO event_txn_ids"
                " (event_id, room_id, user_id, device_id, txn_id, inserted_ts)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (event_id, room_id, user_id, device_id, txn_id, now),
            )
        )

    async def transactions_of_device(
        self, room_id: str, user_id: str, device_id: str, limit: int
    ) -> dict[str, str] | None:
        """Transaction ID -> event ID of every send of this device in the room; None if
        there are more than ``limit``."""
        rows = await self.db.run_interaction(
            lambda t: t.query(
                "SELECT txn_id, event_id FROM event_txn_ids WHERE room_id = ? AND user_id = ?"
                " AND device_id = ? LIMIT ?",
                (room_id, user_id, device_id, limit + 1),
            )
        )
        if len(rows) > limit:
            return None
        return {str(r[0]): str(r[1]) for r in rows}

    async def event_for_transaction(
        self, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> str | None:
        """The event a device already sent with this transaction ID (idempotent sends)."""
        row = await self.db.run_interaction(
            lambda t: t.query_one(
                "SELECT event_id FROM event_txn_ids WHERE room_id = ? AND user_id = ?"
                " AND device_id = ? AND txn_id = ?",
                (room_id, user_id, device_id, txn_id),
            )
        )
        return None if row is None else str(row[0])

    # -- formatting ------------------------------------------------------------------------

    def _now(self) -> int | None:
        return int(self._clock() * 1000) if self._include_age else None

    def _load_txn(
        self,
        txn: Transaction,
        rows: Sequence[_Row],
        others: Iterable[str],
        user_id: str,
        device_id: str | None,
        known: Mapping[str, str | None] | None = None,
    ) -> _Loaded:
        """What formatting the events of ``rows`` and ``others`` (any other event IDs:
        state, ``prev_content`` sources) needs: redaction flags, the cached formats, the
        events whose format is not cached (from the store's cache where it has them), and
        the viewer's transaction IDs. The rows' redaction flags are the ones read with
        them, ``known`` those read with some of ``others``; the rest are read here.

        Once per event served, so the rows take one pass and cache hits load nothing.
        """
        cache_get = self._formatted.get
        formatted: dict[str, FormattedEvent] = {}
        missing: list[str] = []
        redacted_by: dict[str, str] = {}
        extra: list[str] = []
        for row in rows:
            event_id, redaction = row.event_id, row.redacted_by
            entry = cache_get(event_id)
            if entry is not None and entry.redacted_by == redaction:
                formatted[event_id] = entry
            else:
                missing.append(event_id)
            if redaction is not None:
                redacted_by[event_id] = redaction
            if row.replaces_state is not None:
                extra.append(row.replaces_state)
        resolved = set(formatted).union(missing)
        pending = [e for e in dict.fromkeys(itertools.chain(others, extra)) if e not in resolved]
        known = known or {}
        redacted_by.update((e, r) for e in pending if (r := known.get(e)) is not None)
        unknown = [e for e in pending if e not in known]
        for chunk in _chunks(unknown):
            for event_id, redaction in txn.query(
                "SELECT event_id, redacted_by FROM events"
                f" WHERE event_id IN ({_marks(len(chunk))}) AND redacted_by IS NOT NULL",
                chunk,
            ):
                redacted_by[str(event_id)] = str(redaction)
        for event_id in pending:
            entry = cache_get(event_id)
            if entry is not None and entry.redacted_by == redacted_by.get(event_id):
                formatted[event_id] = entry
            else:
                missing.append(event_id)
        needed = [*missing, *(redacted_by[e] for e in missing if e in redacted_by)]
        events: dict[str, Event] = {}
        uncached = []
        for event_id in needed:
            event = self.store.cached_event(event_id)
            if event is None:
                uncached.append(event_id)
            else:
                events[event_id] = event
        fresh = load_events_txn(txn, uncached) if uncached else {}
        events.update(fresh)
        transaction_ids: dict[str, str] = {}
        if device_id is not None:
            own = []
            for event_id in itertools.chain(formatted, missing):
                entry = formatted.get(event_id)
                if entry is not None:
                    sender = entry.base["sender"]
                else:
                    event = events.get(event_id)
                    sender = None if event is None else event.sender
                if sender == user_id:
                    own.append(event_id)
            for chunk in _chunks(own):
                for event_id, txn_id in txn.query(
                    "SELECT event_id, txn_id FROM event_txn_ids"
                    f" WHERE event_id IN ({_marks(len(chunk))}) AND user_id = ? AND device_id = ?",
                    (*chunk, user_id, device_id),
                ):
                    transaction_ids[str(event_id)] = str(txn_id)
        return _Loaded(
            formatted, missing, events, list(fresh.values()), redacted_by, transaction_ids
        )

    def _complete(self, loaded: _Loaded) -> None:
        """On the event loop, after :meth:`_load_txn`: cache the events read from the
        database, and format (and cache) those whose format was not cached."""
        self.store.cache_events(loaded.fresh)
        cache = self._formatted
        for event_id in loaded.missing:
            event = loaded.events.get(event_id)
            if event is None:
                continue  # not stored: callers skip it (or fail loudly, as before)
            redaction_id = loaded.redacted_by.get(event_id)
            redaction = None if redaction_id is None else loaded.events.get(redaction_id)
            entry = format_event(event, redaction)
            loaded.formatted[event_id] = cache[event_id] = entry
        while len(cache) > self._formatted_size:
            cache.popitem(last=False)

    def _format_rows(
        self, rows: Iterable[_Row], loaded: _Loaded, now: int | None
    ) -> list[ClientEvent]:
        """The rows' events as the viewer sees them (after :meth:`_complete`)."""
        formatted = loaded.formatted
        if loaded.transaction_ids:
            return [self._format(r.event_id, r.replaces_state, loaded, now) for r in rows]
        # Once per event served: the usual case (no prev_content, no transaction ID)
        # calls the formatter directly.
        return [
            with_viewer_fields(formatted[r.event_id], now_ms=now)
            if r.replaces_state is None
            else self._format(r.event_id, r.replaces_state, loaded, now)
            for r in rows
        ]

    def _format_ids(
        self, event_ids: Iterable[str], loaded: _Loaded, now: int | None
    ) -> list[ClientEvent]:
        """Events (state, membership changes) as the viewer sees them, without
        ``prev_content`` (after :meth:`_complete`)."""
        if loaded.transaction_ids:
            return [self._format(e, None, loaded, now) for e in event_ids]
        formatted = loaded.formatted
        return [with_viewer_fields(formatted[e], now_ms=now) for e in event_ids]

    def _format(
        self, event_id: str, replaces: str | None, loaded: _Loaded, now: int | None
    ) -> ClientEvent:
        """``event_id`` as the viewer sees it (after :meth:`_complete`). ``replaces``:
        the state event it replaced, whose (pruned) content is its ``prev_content``."""
        previous = None if replaces is None else loaded.formatted.get(replaces)
        if previous is None:
            return with_viewer_fields(
                loaded.formatted[event_id],
                transaction_id=loaded.transaction_ids.get(event_id),
                now_ms=now,
            )
        return with_viewer_fields(
            loaded.formatted[event_id],
            prev_content=previous.base["content"],
            replaces_state=replaces,
            transaction_id=loaded.transaction_ids.get(event_id),
            now_ms=now,
        )


def _rooms_for_user_txn(txn: Transaction, user_id: str) -> dict[str, str]:
    return {
        str(r[0]): str(r[1])
        for r in txn.query(
            "SELECT room_id, membership FROM current_state_events"
            " WHERE type = 'm.room.member' AND state_key = ?",
            (user_id,),
        )
    }
