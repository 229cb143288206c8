"""Relations: threads, edits, reactions, references (``m.relates_to``).

Recorded when events are persisted (:class:`RelationsRecorder`, a persist participant:
the client API's sends, federation and the Spark import all persist through it), read
through the visibility records like every other read (:class:`RelationReads`): a user
is served, counted or shown the latest of only the relations they may see, and never
one whose event was redacted.

Tables (``storage/schema/0016_relations.sql``): ``event_relations`` (one row per
timeline event with a well-formed ``m.relates_to``) and ``threads`` (each thread root's
latest ``m.thread`` relation, the order of ``/threads``).

Where the spec leaves a choice we do what Synapse does: ``recurse`` follows relations
:data:`MAX_RECURSION_DEPTH` levels deep, applying the ``rel_type``/``event_type``
filters at every level; bundled aggregations are ``m.thread`` (``latest_event``,
``count``, ``current_user_participated``) and ``m.reference`` (``chunk`` of event IDs),
never edits (spec v1.7+) and never for state or redacted events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from roomstream.errors import ForbiddenError, InvalidParamError, NotFoundError
from roomstream.reading.events import EventRead, _Loaded
from roomstream.reading.format import ClientEvent
from roomstream.reading.timeline_rows import (
    _COLUMNS,
    MAX_POSITION,
    MIN_POSITION,
    _check_limit,
    _chunks,
    _load_views_txn,
    _marks,
    _point_txn,
    _Row,
    _timeline_row_txn,
    _to_row,
    _View,
)
from roomstream.reading.tokens import PaginationToken, RoomPosition
from roomstream.reading.visibility import WORLD_READABLE
from roomstream.rooms.participants import TimelineInput
from roomstream.storage import Transaction

__all__ = [
    "MAIN_TIMELINE",
    "MAX_RECURSION_DEPTH",
    "Related",
    "RelationReads",
    "RelationsChunk",
    "RelationsRecorder",
    "ThreadsChunk",
    "attach_bundles",
    "bundles_of",
    "receipt_thread_txn",
    "related_txn",
    "relation_of",
    "threads_of_txn",
    "with_latest",
]

#: How many levels of relations ``recurse=true`` follows (Synapse's, as MSC3981 asks).
MAX_RECURSION_DEPTH = 3

THREAD = "m.thread"
#: The thread ID of events in no thread (threaded receipts, unread thread counts).
MAIN_TIMELINE = "main"
REFERENCE = "m.reference"
ANNOTATION = "m.annotation"

#: Relation events read per statement while filling a page (most are visible).
_BATCH = 100


def relation_of(content: Mapping[str, Any]) -> tuple[str, str, str | None] | None:
    """``(rel_type, parent event ID, aggregation key)`` of an event's content, or None
    unless ``m.relates_to`` is an object with string ``rel_type`` and ``event_id``
    (a plain rich reply, ``m.in_reply_to`` alone, is no relation: as Synapse)."""
    relation = content.get("m.relates_to")
    if not isinstance(relation, dict):
        return None
    rel_type, parent = relation.get("rel_type"), relation.get("event_id")
    if not isinstance(rel_type, str) or not isinstance(parent, str):
        return None
    key = relation.get("key") if rel_type == ANNOTATION else None
    return rel_type, parent, key if isinstance(key, str) else None


class RelationsRecorder:
    """The persist participant that indexes relations (see rooms.participants).

    Invariant: every timeline event (not outlier, rejected or soft-failed) whose content
    :func:`relation_of` accepts has its ``event_relations`` row, committed with the
    event; and ``threads`` holds, per thread root, the latest such ``m.thread`` row.
    Idempotent (a retried batch writes nothing twice). Holds no memory, so one may be
    shared; each persister gets its own anyway."""

    def record_txn(self, txn: Transaction, room_id: str, items: Sequence[TimelineInput]) -> None:
        rows = []
        for item in items:
            if not item.in_timeline:
                continue
            event = item.event
            found = relation_of(event.content)
            if found is None:
                continue
            rel_type, parent, key = found
            rows.append(
                (
                    event.event_id,
                    room_id,
                    parent,
                    rel_type,
                    key,
                    event.type,
                    event.sender,
                    event.depth,
                    item.stream_ordering,
                )
            )
        if not rows:
            return
        txn.executemany(
            "INSERT INTO event_relations (event_id, room_id, relates_to_id, relation_type,"
            " aggregation_key, event_type, sender, topological_ordering, stream_ordering)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
            rows,
        )
        txn.executemany(
            "INSERT INTO threads (room_id, thread_id, latest_event_id, topological_ordering,"
            " stream_ordering) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (room_id, thread_id) DO UPDATE SET"
            " latest_event_id = excluded.latest_event_id,"
            " topological_ordering = excluded.topological_ordering,"
            " stream_ordering = excluded.stream_ordering"
            " WHERE (excluded.topological_ordering, excluded.stream_ordering)"
            " > (threads.topological_ordering, threads.stream_ordering)",
            [(r[1], r[2], r[0], r[7], r[8]) for r in rows if r[3] == THREAD],
        )


@dataclass
class RelationsChunk:
    """A page of ``/relations``: ``events`` in the order asked; ``next_batch`` (None: no
    more); ``recursion_depth`` when ``recurse`` was asked."""

    events: list[ClientEvent]
    next_batch: RoomPosition | None
    recursion_depth: int | None = None
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``.
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ThreadsChunk:
    """A page of ``/threads``: thread roots, latest activity first; ``next_batch``."""

    events: list[ClientEvent]
    next_batch: RoomPosition | None
    #: Read with ``aggregate``: event ID -> its ``unsigned["m.relations"]``.
    aggregations: dict[str, dict[str, Any]] = field(default_factory=dict)


def _relation_filters(rel_type: str | None, event_type: str | None) -> tuple[str, list[Any]]:
    sql, params = "", []
    if rel_type is not None:
        sql += " AND r.relation_type = ?"
        params.append(rel_type)
    if event_type is not None:
        sql += " AND r.event_type = ?"
        params.append(event_type)
    return sql, params


class RelationReads(EventRead):
    """``/relations``, ``/threads`` and the bundled aggregations, as a user may see them."""

    async def relations(
        self,
        user_id: str,
        room_id: str,
        event_id: str,
        *,
        rel_type: str | None = None,
        event_type: str | None = None,
        direction: Literal["b", "f"] = "b",
        from_token: PaginationToken | None = None,
        to_token: PaginationToken | None = None,
        limit: int = 5,
        recurse: bool = False,
        device_id: str | None = None,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> RelationsChunk:
        """The relations of ``event_id`` the user may see, in topological order (newest
        first for ``b``), ``limit`` from ``from_token``, stopping at ``to_token``.

        ``M_FORBIDDEN`` unless the user is joined or departed or the room is
        ``world_readable`` now (as ``/messages``); ``M_NOT_FOUND`` unless the parent is
        an event of the room the user may see. Redacted relations are left out.
        ``aggregate``: the served events' bundled aggregations too, in the same
        transaction (relations from ``ignored`` senders left out)."""
        _check_limit(limit)
        if direction not in ("b", "f"):
            raise InvalidParamError("dir must be b or f")
        if event_type is not None and rel_type is None:
            raise InvalidParamError("an event type needs a relation type")
        backwards = direction == "b"
        rows, loaded, related = await self.db.run_interaction(
            "relations",
            self._relations_txn, user_id, room_id, event_id, rel_type, event_type, backwards,
            from_token, to_token, limit, recurse, device_id, ignored if aggregate else None,
        )  # fmt: skip
        self._complete(loaded)
        more = len(rows) > limit
        rows = rows[:limit]
        now = self._now()
        events = self._format_rows(rows, loaded, now)
        aggregations = bundles_of(related, events, user_id, self._format_rows, loaded, now)
        next_batch = None
        if more:
            last = rows[-1]
            next_batch = (
                RoomPosition.of_event(last.topo, last.stream)
                if backwards
                else RoomPosition.after_event(last.topo, last.stream)
            )
        return RelationsChunk(
            events, next_batch, MAX_RECURSION_DEPTH if recurse else None, aggregations
        )

    def _relations_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_id: str,
        event_id: str,
        rel_type: str | None,
        event_type: str | None,
        backwards: bool,
        from_token: PaginationToken | None,
        to_token: PaginationToken | None,
        limit: int,
        recurse: bool,
        device_id: str | None,
        aggregate_ignoring: frozenset[str] | None = None,
    ) -> tuple[list[_Row], _Loaded, Related]:
        view = _readable_view_txn(txn, user_id, room_id)
        parent = _timeline_row_txn(txn, event_id)
        if parent is None or parent[0] != room_id or not view.visible(parent[1]):
            raise NotFoundError(f"no event {event_id} in {room_id}")
        point = _point_txn(txn, room_id, from_token, MAX_POSITION if backwards else MIN_POSITION)
        bound = _point_txn(txn, room_id, to_token, MIN_POSITION if backwards else MAX_POSITION)
        low, high = (bound, point) if backwards else (point, bound)
        filters, filter_params = _relation_filters(rel_type, event_type)
        order = "DESC" if backwards else "ASC"
        if recurse:
            # Every level filtered as the top one (MSC3981), MAX_RECURSION_DEPTH deep.
            source = (
                "WITH RECURSIVE related (event_id, depth) AS ("
                " SELECT r.event_id, 1 FROM event_relations r"
                f" WHERE r.relates_to_id = ? AND r.room_id = ?{filters}"
                " UNION ALL SELECT r.event_id, related.depth + 1 FROM event_relations r"
                " JOIN related ON r.relates_to_id = related.event_id"
                f" WHERE related.depth < ? AND r.room_id = ?{filters})"
                " SELECT r.topological_ordering, r.stream_ordering, "
                f"{_COLUMNS} FROM related JOIN event_relations r ON r.event_id = related.event_id"
                " JOIN timeline_events t ON t.event_id = r.event_id WHERE 1 = 1"
            )
            params: list[Any] = [
                event_id, room_id, *filter_params, MAX_RECURSION_DEPTH, room_id, *filter_params
            ]  # fmt: skip
        else:
            source = (
                "SELECT r.topological_ordering, r.stream_ordering, "
                f"{_COLUMNS} FROM event_relations r"
                " JOIN timeline_events t ON t.event_id = r.event_id"
                f" WHERE r.relates_to_id = ? AND r.room_id = ?{filters}"
            )
            params = [event_id, room_id, *filter_params]
        rows: list[_Row] = []
        while low < high and len(rows) <= limit:
            sql = (
                f"{source} AND (r.topological_ordering, r.stream_ordering) >= (?, ?)"
                " AND (r.topological_ordering, r.stream_ordering) < (?, ?)"
                f" ORDER BY r.topological_ordering {order}, r.stream_ordering {order} LIMIT ?"
            )
            batch = [
                _to_row(r[2:])
                for r in txn.query(sql, [*params, low[0], low[1], high[0], high[1], _BATCH])
            ]
            rows.extend(r for r in batch if r.redacted_by is None and view.visible(r))
            if len(batch) < _BATCH:
                break
            last = batch[-1]
            if backwards:
                high = last.position
            else:
                low = (last.topo, last.stream + 1)
        rows = rows[: limit + 1]
        served, related = _related_of_txn(
            txn, user_id, room_id, view, rows[:limit], aggregate_ignoring
        )
        return rows, self._load_txn(txn, served, (), user_id, device_id), related

    async def threads(
        self,
        user_id: str,
        room_id: str,
        *,
        include: Literal["all", "participated"] = "all",
        from_token: RoomPosition | None = None,
        limit: int = 5,
        device_id: str | None = None,
        aggregate: bool = False,
        ignored: frozenset[str] = frozenset(),
    ) -> ThreadsChunk:
        """The room's thread roots the user may see, latest thread activity first;
        ``participated``: only those the user started or replied to. Access and
        ``aggregate`` as :meth:`relations`."""
        _check_limit(limit)
        if include not in ("all", "participated"):
            raise InvalidParamError("include must be all or participated")
        rows, latest, loaded, related = await self.db.run_interaction(
            "threads",
            self._threads_txn,
            user_id,
            room_id,
            include == "participated",
            from_token,
            limit,
            device_id,
            ignored if aggregate else None,
        )
        self._complete(loaded)
        more = len(rows) > limit
        rows = rows[:limit]
        now = self._now()
        events = self._format_rows(rows, loaded, now)
        next_batch = None
        if more:
            next_batch = RoomPosition.of_event(*latest[rows[-1].event_id])
        aggregations = bundles_of(related, events, user_id, self._format_rows, loaded, now)
        return ThreadsChunk(events, next_batch, aggregations)

    def _threads_txn(
        self,
        txn: Transaction,
        user_id: str,
        room_id: str,
        participated: bool,
        from_token: RoomPosition | None,
        limit: int,
        device_id: str | None,
        aggregate_ignoring: frozenset[str] | None = None,
    ) -> tuple[list[_Row], dict[str, tuple[int, int]], _Loaded, Related]:
        view = _readable_view_txn(txn, user_id, room_id)
        high = MAX_POSITION if from_token is None else from_token.as_tuple()
        mine = ""
        mine_params: list[Any] = []
        if participated:
            mine = (
                " AND (EXISTS (SELECT 1 FROM event_relations m WHERE m.relates_to_id = h.thread_id"
                " AND m.relation_type = 'm.thread' AND m.sender = ? AND m.room_id = h.room_id"
                # A redacted reply is no participation (it left the thread).
                " AND NOT EXISTS (SELECT 1 FROM events x WHERE x.event_id = m.event_id"
                " AND x.redacted_by IS NOT NULL))"
                " OR EXISTS (SELECT 1 FROM events e WHERE e.event_id = h.thread_id"
                " AND e.sender = ?))"
            )
            mine_params = [user_id, user_id]
        rows: list[_Row] = []
        latest: dict[str, tuple[int, int]] = {}
        while len(rows) <= limit:
            batch = txn.query(
                f"SELECT h.topological_ordering, h.stream_ordering, {_COLUMNS}"
                " FROM threads h JOIN timeline_events t ON t.event_id = h.thread_id"
                " WHERE h.room_id = ? AND t.room_id = h.room_id"
                f" AND (h.topological_ordering, h.stream_ordering) < (?, ?){mine}"
                " ORDER BY h.topological_ordering DESC, h.stream_ordering DESC LIMIT ?",
                [room_id, high[0], high[1], *mine_params, _BATCH],
            )
            for r in batch:
                row = _to_row(r[2:])
                if view.visible(row):
                    rows.append(row)
                    latest[row.event_id] = (int(r[0]), int(r[1]))
            if len(batch) < _BATCH:
                break
            high = (int(batch[-1][0]), int(batch[-1][1]))
        rows = rows[: limit + 1]
        served, related = _related_of_txn(
            txn, user_id, room_id, view, rows[:limit], aggregate_ignoring
        )
        return rows, latest, self._load_txn(txn, served, (), user_id, device_id), related

    async def aggregations(
        self,
        user_id: str,
        events: Iterable[ClientEvent],
        *,
        device_id: str | None = None,
        ignored: frozenset[str] = frozenset(),
    ) -> dict[str, dict[str, Any]]:
        """Event ID -> its ``unsigned["m.relations"]`` for those of ``events`` (served to
        the user already) that have visible, unredacted ``m.thread`` or ``m.reference``
        relations from users the user does not ignore (``ignored``). State and redacted
        events get none (as Synapse). One transaction; the reads that serve pages
        (``/messages``, an initial sync) read the same in their own
        (:func:`related_txn`)."""
        parents = _parents_of(events)
        if not parents:
            return {}
        related, loaded = await self.db.run_interaction(
            "relation_aggregations", self._aggregations_txn, user_id, parents, device_id, ignored
        )
        if not related.found:
            return {}
        self._complete(loaded)
        return bundles_of(related, events, user_id, self._format_rows, loaded, self._now())

    def _aggregations_txn(
        self,
        txn: Transaction,
        user_id: str,
        parents: Mapping[str, str],
        device_id: str | None,
        ignored: frozenset[str],
    ) -> tuple[Related, _Loaded]:
        related = related_txn(txn, user_id, parents, ignored)
        return related, self._load_txn(txn, related.latest, (), user_id, device_id)


@dataclass
class _Aggregate:
    """What one parent's bundle is made of: its visible, unredacted ``m.thread``
    replies from users not ignored (oldest first), whether the viewer sent any visible
    reply (ignored or not: participation is the viewer's own), and its visible
    ``m.reference`` relations from users not ignored."""

    threads: list[_Row]
    participated: bool
    references: list[_Row]


@dataclass
class Related:
    """The relations read for bundled aggregations (:func:`related_txn`): ``found``:
    parent event ID -> its :class:`_Aggregate`; ``latest``: each thread's latest reply,
    which the read's own formatting load must include (:func:`bundles_of` formats it)."""

    found: dict[str, _Aggregate]
    latest: list[_Row]


def _parents_of(events: Iterable[ClientEvent]) -> dict[str, str]:
    """event ID -> room ID of the served events that may carry an aggregation (not
    state, not redacted)."""
    parents: dict[str, str] = {}
    for event in events:
        if "state_key" in event or _redacted(event):
            continue
        event_id, room_id = event.get("event_id"), event.get("room_id")
        if isinstance(event_id, str) and isinstance(room_id, str):
            parents[event_id] = room_id
    return parents


def _redacted(event: ClientEvent) -> bool:
    unsigned = event.get("unsigned")
    return isinstance(unsigned, dict) and "redacted_because" in unsigned


def related_txn(
    txn: Transaction,
    user_id: str,
    parents: Mapping[str, str],
    ignored: frozenset[str] = frozenset(),
    views: Mapping[str, _View] | None = None,
) -> Related:
    """The ``m.thread``/``m.reference`` relations of ``parents`` (event ID -> room ID)
    that the user may see, inside the caller's transaction: one statement per 500
    parents, plus the user's views of the rooms involved unless ``views`` holds them
    all. Relations from another room than their parent's, redacted ones and ones the
    user may not see are left out; so are ``ignored`` senders' (as Synapse: not counted,
    never the latest event, no reference), though a user's own reply still counts as
    participation. A parent's eligibility (state, redacted) is :func:`bundles_of`'s."""
    candidates: list[tuple[str, str, str, _Row]] = []
    for chunk in _chunks(list(parents)):
        for r in txn.query(
            f"SELECT r.relates_to_id, r.relation_type, r.sender, r.room_id, {_COLUMNS}"
            " FROM event_relations r JOIN timeline_events t ON t.event_id = r.event_id"
            f" WHERE r.relates_to_id IN ({_marks(len(chunk))})"
            " AND r.relation_type IN ('m.thread', 'm.reference')"
            " ORDER BY r.topological_ordering, r.stream_ordering",
            chunk,
        ):
            parent = str(r[0])
            if r[3] != parents[parent]:
                continue  # a relation from another room is no relation
            row = _to_row(r[4:])
            if row.redacted_by is None:
                candidates.append((parent, str(r[1]), str(r[2]), row))
    if not candidates:
        return Related({}, [])
    rooms = list(dict.fromkeys(parents[c[0]] for c in candidates))
    known = views or {}
    if any(room not in known for room in rooms):
        known = {**known, **_load_views_txn(txn, [r for r in rooms if r not in known], user_id)[0]}
    found: dict[str, _Aggregate] = {}
    for parent, rel_type, sender, row in candidates:
        if not known[parents[parent]].visible(row):
            continue
        aggregate = found.setdefault(parent, _Aggregate([], False, []))
        if rel_type == THREAD:
            if sender == user_id:
                aggregate.participated = True
            if sender not in ignored:
                aggregate.threads.append(row)
        elif sender not in ignored:
            aggregate.references.append(row)
    latest = [max(a.threads, key=lambda row: row.position) for a in found.values() if a.threads]
    return Related(found, latest)


def bundles_of(
    related: Related,
    events: Iterable[ClientEvent],
    user_id: str,
    format_rows: Callable[[Iterable[_Row], _Loaded, int | None], list[ClientEvent]],
    loaded: _Loaded,
    now: int | None,
) -> dict[str, dict[str, Any]]:
    """Event ID -> ``unsigned["m.relations"]`` for those of ``events`` that may carry
    one (not state, not redacted) and have something in ``related`` (after the
    formatter completed ``loaded``, which holds ``related.latest``). A thread whose
    every reply came from ignored users has no ``m.thread`` summary."""
    result: dict[str, dict[str, Any]] = {}
    if not related.found:
        return result
    for event in events:
        event_id = event.get("event_id")
        aggregate = related.found.get(event_id) if isinstance(event_id, str) else None
        if aggregate is None or "state_key" in event or _redacted(event):
            continue
        bundle: dict[str, Any] = {}
        if aggregate.threads:
            latest = max(aggregate.threads, key=lambda row: row.position)
            bundle[THREAD] = {
                "latest_event": format_rows([latest], loaded, now)[0],
                "count": len(aggregate.threads),
                "current_user_participated": event.get("sender") == user_id
                or aggregate.participated,
            }
        if aggregate.references:
            bundle[REFERENCE] = {"chunk": [{"event_id": r.event_id} for r in aggregate.references]}
        if bundle:
            result[str(event_id)] = bundle
    return result


def with_latest(rows: list[_Row], related: Related) -> list[_Row]:
    """``rows`` and the threads' latest replies the aggregations format (each once): what
    a read that folds the aggregations in loads for formatting."""
    if not related.latest:
        return rows
    served = {r.event_id for r in rows}
    return [*rows, *(r for r in related.latest if r.event_id not in served)]


def attach_bundles(events: Iterable[ClientEvent], bundles: Mapping[str, dict[str, Any]]) -> None:
    """Put each bundle in its event's ``unsigned["m.relations"]`` (in place; each such
    event gets a new ``unsigned`` dict, so cached formats are never touched)."""
    if not bundles:
        return
    for event in events:
        bundle = bundles.get(str(event.get("event_id")))
        if bundle is not None:
            unsigned = event.get("unsigned")
            event["unsigned"] = {
                **(unsigned if isinstance(unsigned, dict) else {}),
                "m.relations": bundle,
            }


def _related_of_txn(
    txn: Transaction,
    user_id: str,
    room_id: str,
    view: _View,
    rows: list[_Row],
    aggregate_ignoring: frozenset[str] | None,
) -> tuple[list[_Row], Related]:
    """For a read of one room's ``rows`` that folds the aggregations in (unless
    ``aggregate_ignoring`` is None): (the rows to load for formatting, the relations)."""
    if aggregate_ignoring is None or not rows:
        return rows, Related({}, [])
    related = related_txn(
        txn,
        user_id,
        {r.event_id: room_id for r in rows if r.redacted_by is None},
        aggregate_ignoring,
        {room_id: view},
    )
    return with_latest(rows, related), related


def _readable_view_txn(txn: Transaction, user_id: str, room_id: str) -> _View:
    """The user's view of the room, if they may read it (as ``/messages``:
    ``M_FORBIDDEN`` unless joined, departed, or the room is ``world_readable`` now; an
    unknown room too)."""
    view = _load_views_txn(txn, [room_id], user_id, current=True)[0][room_id]
    membership = view.current_membership
    if membership != "join" and membership != "leave" and view.current_visibility != WORLD_READABLE:
        raise ForbiddenError(f"user {user_id} may not read room {room_id}")
    return view


def threads_of_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, str]:
    """event -> the root of the thread it is in, for those of ``event_ids`` in a thread
    (the rest are in the main timeline). As Synapse's ``get_thread_id``: an event is in
    thread T if it has an ``m.thread`` relation to T, or any relation to an event that
    has one (a reaction to, or an edit of, a thread reply); a thread root itself is in
    the main timeline. Both lookups are by primary key."""
    found: dict[str, str] = {}
    for chunk in _chunks(list(event_ids)):
        for event_id, rel_type, parent, parent_type, parent_parent in txn.query(
            "SELECT c.event_id, c.relation_type, c.relates_to_id, p.relation_type,"
            " p.relates_to_id FROM event_relations c"
            " LEFT JOIN event_relations p ON p.event_id = c.relates_to_id"
            f" WHERE c.event_id IN ({_marks(len(chunk))})",
            chunk,
        ):
            if rel_type == THREAD:
                found[str(event_id)] = str(parent)
            elif parent_type == THREAD:
                found[str(event_id)] = str(parent_parent)
    return found


def receipt_thread_txn(txn: Transaction, room_id: str, event_id: str) -> str:
    """The thread a receipt on ``event_id`` may name (Synapse's
    ``get_thread_id_for_receipts``): walking up its relations (at most
    :data:`MAX_RECURSION_DEPTH` levels), the first event that is in a thread (an
    ``m.thread`` relation: that thread) or is a thread root (that event); else
    :data:`MAIN_TIMELINE`. So a receipt for thread T may be on T, its replies, and what
    relates to them; a reaction to the root is in T's receipts too."""
    current = event_id
    for _ in range(MAX_RECURSION_DEPTH + 1):
        if txn.query_one(
            "SELECT 1 FROM threads WHERE room_id = ? AND thread_id = ?", (room_id, current)
        ):
            return current
        row = txn.query_one(
            "SELECT relation_type, relates_to_id FROM event_relations WHERE event_id = ?",
            (current,),
        )
        if row is None:
            break
        if row[0] == THREAD:
            return str(row[1])
        current = str(row[1])
    return MAIN_TIMELINE
