"""New events since a token (the read behind an incremental ``/sync``): each room's
newest visible events after one events-stream token up to another, and the helpers of
lazy-loading members."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from roomstream.events.types import EventTypes
from roomstream.reading.changes import ChangeTracker
from roomstream.reading.events import EventFormatter, EventRead, _Loaded
from roomstream.reading.format import ClientEvent
from roomstream.reading.latest_rooms import LatestRooms
from roomstream.reading.results import RoomTimeline, SyncResult
from roomstream.reading.room_state import (
    _merged_state,
    _state_at_token_txn,
    _state_before_txn,
)
from roomstream.reading.timeline_rows import (
    _COLUMNS,
    _FROM,
    MAX_POSITION,
    MIN_POSITION,
    EventPredicate,
    RowMatcher,
    _check_limit,
    _chunks,
    _filtered_page_txn,
    _load_views_txn,
    _marks,
    _Row,
    _to_row,
    _View,
    filter_budget,
)
from roomstream.reading.tokens import EventsToken, PaginationToken, RoomPosition
from roomstream.rooms.store import current_state_txn
from roomstream.storage import Database, Transaction


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
    return [e for e in state if e.get("type") != EventTypes.MEMBER or e.get("state_key") in wanted]


def _new_rows_txn(
    txn: Transaction,
    room_id: str,
    view: _View,
    since: EventsToken,
    upto: EventsToken,
    limit: int,
    match: RowMatcher | None = None,
    stop: int | None = None,
) -> tuple[list[_Row], bool]:
    """The newest ``limit`` visible events of the room after ``since`` up to ``upto``
    (stream order, oldest first), and whether more were left out.

    ``match``: a timeline filter; rows it rejects do not count, and the read goes on
    past them, putting at most :func:`filter_budget` visible events to it (``limited``
    when it stops there with rows left). ``stop``: no row after this stream ordering
    (the user's leave: the timeline of a room left since ``since`` ends there)."""
    visible: list[_Row] = []
    upper = upto.maximum if stop is None else min(upto.maximum, stop)
    batch = limit + 1
    budget = None if match is None else filter_budget(limit)
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
        seen = [
            row
            for row in rows
            if upto.covers(row.instance_name, row.stream)
            and not since.covers(row.instance_name, row.stream)
            and view.visible(row)
        ]
        if match is not None and budget is not None:
            examined = seen[:budget]
            budget -= len(examined)
            visible.extend(match(examined))
            left_over = len(examined) < len(seen) or (budget <= 0 and len(rows) == batch)
            if left_over and len(visible) <= limit:
                # The bound, with rows left unread: older matching events may exist.
                return list(reversed(visible)), True
        else:
            visible.extend(seen)
        if len(rows) < batch:
            break
        upper = rows[-1].stream - 1
        batch = min(batch * 4, 4000)
    limited = len(visible) > limit
    return list(reversed(visible[:limit])), limited


class NewEvents(EventRead):
    """New events since a token in the user's rooms (``/sync``)."""

    def __init__(
        self, db: Database, formatter: EventFormatter, changes: ChangeTracker, latest: LatestRooms
    ) -> None:
        super().__init__(db, formatter)
        self._ingest = changes.ingest
        self._rooms_for_user = changes.rooms_for_user
        self._room_changes = changes.room_changes
        self._member_changes = changes.member_changes
        self.latest_rooms = latest.latest_rooms

    async def sync(
        self,
        user_id: str,
        since: EventsToken | None,
        *,
        timeline_limit: int = 10,
        device_id: str | None = None,
        full_state: bool = False,
        lazy_members: bool = False,
        timeline_filter: EventPredicate | None = None,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> SyncResult:
        """Every visible event in the user's rooms after ``since``, per room (newest
        ``timeline_limit``, with ``limited`` and ``prev_batch``), plus the user's own
        membership changes in any room. ``since=None`` is an initial sync: the latest
        ``timeline_limit`` events of every room the user is joined to (or invited to,
        or left), with the state before the timeline
        (:meth:`LatestRooms.latest_rooms`, ``state="timeline_start"``).

        Rooms whose membership of the user changed since ``since``:

        - **joined since the token** (the user's membership at ``since`` was not
          ``join``, or they left and rejoined since): as in an initial sync, the latest
          visible events whether or not they are after ``since`` (``limited`` when
          more exist before them) and the whole state before them, as Synapse sends a
          newly joined room (a client then shows the history it may see, not just what
          followed the join);
        - **left since the token** (now ``leave`` or ``ban``): the events after
          ``since`` up to the user's last leave or ban, none after it (spec: the
          timeline runs up to the point the user left), and the whole state before them.

        State of an incremental sync (spec: the state at the start of the timeline,
        minus what the client had at ``since``): none for a timeline that follows on
        from ``since``; for a ``limited`` one, the entries of the state before its first
        event that differ from the state at ``since``. ``full_state``: every
        joined room is in the result, each with its whole state at the start of its
        timeline (current state when it has no new events).

        ``lazy_members`` (lazy-loading members): of the ``m.room.member`` state, only
        the events of the timeline's senders and of the user, taken from the state at
        the start of the timeline (current state for an initial sync) whether or not
        they changed; the caller drops the ones it knows the device already has.

        ``timeline_filter``: only events it accepts fill the timelines, each room
        reading on past the ones it rejects up to
        :func:`~roomstream.reading.timeline_rows.filter_budget` visible events.

        Rooms whose events-stream position has not moved since ``since`` are skipped
        from the change cache without a query (unless ``full_state``).

        ``aggregate`` (an initial sync only): the result's ``aggregations`` hold the
        timelines' bundled aggregations, relations from ``ignored`` senders left out,
        read in the same transaction (:meth:`LatestRooms.latest_rooms`).
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
                state="timeline_start",
                timeline_filter=timeline_filter,
                aggregate=aggregate,
                ignored=ignored,
                _token=upto,
            )
            if lazy_members:
                for timeline in page.rooms:
                    if timeline.membership != "invite":
                        timeline.state = _lazy_members(timeline.state, timeline.events, user_id)
            return SyncResult(upto, {r.room_id: r for r in page.rooms}, [], page.aggregations)
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
            "sync_timelines",
            self._sync_txn, user_id, candidates, members_changed, since, upto, timeline_limit,
            device_id, full_state, lazy_members, rooms, timeline_filter,
        )  # fmt: skip
        timelines, changes, loaded = raw
        self._complete(loaded)
        now = self._now()
        result: dict[str, RoomTimeline] = {}
        for room_id, (rows, limited, state_ids) in timelines.items():
            # Back from the first event; without one, from the end when a filter kept
            # none of what it read (older events may match), else from the token.
            prev_batch: PaginationToken = (
                RoomPosition.of_event(*min(r.position for r in rows))
                if rows
                else (upto if limited else since)
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
        memberships: Mapping[str, str] | None = None,
        timeline_filter: EventPredicate | None = None,
    ) -> tuple[
        dict[str, tuple[list[_Row], bool, list[str]]], list[tuple[str, str | None]], _Loaded
    ]:
        # The user's own membership events in the range: (event, room, stream, membership).
        changes: list[tuple[str, str, int, str]] = []
        if members_changed:
            for event_id, room_id, stream, writer, membership in txn.query(
                "SELECT event_id, room_id, stream_ordering, instance_name, membership"
                " FROM events WHERE type = 'm.room.member' AND state_key = ?"
                " AND stream_ordering > ? AND stream_ordering <= ? AND rejected_reason IS NULL"
                " AND soft_failed = ? ORDER BY stream_ordering",
                (user_id, since.minimum, upto.maximum, False),
            ):
                if not since.covers(writer, int(stream)) and upto.covers(writer, int(stream)):
                    changes.append((str(event_id), str(room_id), int(stream), str(membership)))
        own_by_room: dict[str, list[tuple[str, int, str]]] = {}
        for event_id, room_id, stream, membership in changes:
            own_by_room.setdefault(room_id, []).append((event_id, stream, membership))
        room_ids = sorted(set(candidates) | set(own_by_room))
        views, _ = _load_views_txn(txn, room_ids, user_id)
        match: RowMatcher | None = None
        if timeline_filter is not None:
            keep = timeline_filter

            def match(rows: list[_Row]) -> list[_Row]:
                return self._matching_txn(txn, rows, keep)

        timelines: dict[str, tuple[list[_Row], bool, list[str]]] = {}
        for room_id in room_ids:
            view = views[room_id]
            membership = (memberships or {}).get(room_id)
            own = own_by_room.get(room_id, [])
            newly_joined = membership == "join" and _joined_since(view, own)
            if newly_joined:
                rows, limited = _latest_rows_upto_txn(txn, room_id, view, upto, limit, match)
            else:
                stop = None
                if membership in ("leave", "ban"):
                    leaves = [stream for _, stream, m in own if m in ("leave", "ban")]
                    stop = leaves[-1] if leaves else None
                rows, limited = _new_rows_txn(txn, room_id, view, since, upto, limit, match, stop)
            if not rows and not limited and room_id not in own_by_room and not full_state:
                continue
            state: dict[tuple[str, str], str] = {}
            # The state at the start of the timeline (current state without one).
            start: dict[tuple[str, str], str] | None = None
            if rows:
                if full_state or limited or room_id in own_by_room or lazy_members:
                    start = _state_before_txn(txn, rows[0].event_id)
            elif full_state or limited:
                start = current_state_txn(txn, room_id)
            if start is not None:
                if newly_joined and match is not None:
                    # What the filter left out of the timeline is state the client needs.
                    state = _merged_state(start, current_state_txn(txn, room_id), rows)
                elif full_state or room_id in own_by_room:
                    state = start
                elif limited:
                    had = _state_at_token_txn(txn, room_id, since)
                    state = {k: v for k, v in start.items() if had.get(k) != v}
                if lazy_members:
                    wanted = {user_id, *_senders_txn(txn, [r.event_id for r in rows]).values()}
                    state = {
                        k: v
                        for k, v in state.items()
                        if k[0] != EventTypes.MEMBER or k[1] in wanted
                    }
                    for member in wanted:
                        found = start.get((EventTypes.MEMBER, member))
                        if found is not None:
                            state[(EventTypes.MEMBER, member)] = found
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


def _joined_since(view: _View, own: list[tuple[str, int, str]]) -> bool:
    """Whether one of the user's membership events since the token (``own``: event,
    stream ordering, membership) is a join from another membership: a first join, or a
    rejoin after leaving (a join that only changes a display name is not)."""
    rows = {r.event_id: r for r in view.specials}
    for event_id, _, membership in own:
        if membership != "join":
            continue
        row = rows.get(event_id)
        if row is None or view.membership_at(row.position) != "join":
            return True
    return False


def _latest_rows_upto_txn(
    txn: Transaction,
    room_id: str,
    view: _View,
    upto: EventsToken,
    limit: int,
    match: RowMatcher | None,
) -> tuple[list[_Row], bool]:
    """A newly joined room's timeline: its latest ``limit`` visible events up to
    ``upto`` (oldest first), and whether more exist before them."""
    # From the room's end in topological order (a late event on an old branch can
    # have the highest stream ordering: no point of that order stands for ``upto``);
    # events that ``upto`` does not cover yet (persisted since) come with the next sync.
    rows, bounded = _filtered_page_txn(
        txn, room_id, view, MIN_POSITION, MAX_POSITION, limit, None, match
    )
    rows = [r for r in rows if upto.covers(r.instance_name, r.stream)]
    return list(reversed(rows[:limit])), len(rows) > limit or bounded
