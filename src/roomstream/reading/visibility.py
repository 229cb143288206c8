"""History visibility: the spec's rules, and what the persister records so that reads can
apply them by range tests (``docs/reading.md``).

The rules (Client-Server API, "History visibility"), for an event E and a user U, where
"at E" means in the state before E:

1. E is visible if the room's history visibility at E is ``world_readable``;
2. or U's membership at E is ``join``;
3. or the visibility is ``shared`` and U joined the room (sent a join that is part of the
   room's timeline) at a later position in the room's topological order than E;
4. or the visibility is ``invited`` and U's membership at E is ``invite``.

Edge cases the spec settles: an ``m.room.history_visibility`` event is visible if the
visibility before *or after* it allows it; U's own ``m.room.member`` events are visible
if U's membership before *or after* it allows it. A missing or unknown visibility counts
as ``shared`` (the spec's default; Synapse treats unknown values the same way).

What is stored, per room, when events are persisted (:class:`VisibilityRecorder`):

- ``timeline_events``: one row per event that may appear in timelines, with its position
  and the *class* of the visibility at it (:data:`WORLD_READABLE` ... :data:`JOINED`);
- ``visibility_memberships``: for each user, the positions where their membership at the
  event differs from their membership at the previous timeline event of the room. These
  are the user's *membership intervals*: U's membership at E is the row with the largest
  position not after E. A message adds no row; a membership event adds one row (at the
  next event, whose state includes it); forks add rows only where branches interleaved
  in topological order disagree on someone's membership.

Rule 3's "joined later" is a range test too: E is before U's last join in the room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from roomstream.events.model import Event, StateKey
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.rooms.participants import TimelineInput
from roomstream.state.groups import get_state_txn
from roomstream.storage import Transaction

__all__ = [
    "CLASS_NAMES",
    "INVITED",
    "JOINED",
    "SHARED",
    "WORLD_READABLE",
    "TimelineInput",
    "VisibilityRecorder",
    "allowed",
    "delete_newest_records_txn",
    "timeline_lock",
    "visibility_class",
]

#: Visibility classes, as stored (``timeline_events.visibility``).
WORLD_READABLE, SHARED, INVITED, JOINED = 0, 1, 2, 3
CLASS_NAMES = {
    "world_readable": WORLD_READABLE,
    "shared": SHARED,
    "invited": INVITED,
    "joined": JOINED,
}
ALL_CLASSES = frozenset(CLASS_NAMES.values())

HISTORY_VISIBILITY_KEY: StateKey = (EventTypes.HISTORY_VISIBILITY, "")

Position = tuple[int, int]
"""(topological_ordering, stream_ordering) of a timeline event."""


def timeline_lock(room_id: str) -> str:
    """The lock every writer of a room's visibility records holds until it commits (the
    persister, :mod:`roomstream.reading.backfill`): each appends relative to the room's
    last committed timeline event, so two must not decide that concurrently."""
    return f"roomstream.timeline:{room_id}"


def delete_newest_records_txn(txn: Transaction, room_id: str, limit: int) -> bool:
    """Delete up to about ``limit`` of the room's newest visibility records (rows of
    ``timeline_events`` and ``visibility_memberships``); True if any remain. For a
    rebuild (:mod:`roomstream.reading.backfill`): this module is the one writer of both
    tables (``roomstream.storage.owners``)."""
    txn.lock_exclusively(timeline_lock(room_id))
    remain = False
    for table in ("timeline_events", "visibility_memberships"):
        # Rows at positions after the limit-th newest (several users may share one).
        row = txn.query_one(
            f"SELECT topological_ordering, stream_ordering FROM {table} WHERE room_id = ?"
            " ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1 OFFSET ?",
            (room_id, limit),
        )
        if row is None:
            txn.execute(f"DELETE FROM {table} WHERE room_id = ?", (room_id,))
            continue
        remain = True
        topo, stream = int(row[0]), int(row[1])
        txn.execute(
            f"DELETE FROM {table} WHERE room_id = ? AND (topological_ordering > ?"
            " OR (topological_ordering = ? AND stream_ordering > ?))",
            (room_id, topo, topo, stream),
        )
    return remain


def visibility_class(content: Mapping[str, Any] | None) -> int:
    """The class of an ``m.room.history_visibility`` content; missing/unknown: shared."""
    if content is None:
        return SHARED
    return CLASS_NAMES.get(str(content.get("history_visibility")), SHARED)


def allowed(visibility: int, membership: str | None, joined_later: bool) -> bool:
    """Rules 1-4 for one (visibility class, membership at the event, joined later)."""
    if visibility == WORLD_READABLE or membership == "join":
        return True
    if visibility == SHARED:
        return joined_later
    if visibility == INVITED:
        return membership == "invite"
    return False


def allowed_classes(membership: str | None, joined_later: bool) -> frozenset[int]:
    """The classes whose events a user with this membership (and joined-later flag) sees."""
    return frozenset(c for c in ALL_CLASSES if allowed(c, membership, joined_later))


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """A timeline event's state before and after it, and the key it changed."""

    before: Mapping[StateKey, str]
    after: Mapping[StateKey, str] | None
    changed: StateKey | None


class VisibilityRecorder:
    """Writes ``timeline_events`` and ``visibility_memberships`` in the persist
    transaction (called by :class:`roomstream.rooms.persist.EventPersister`).

    Invariant kept (for every room and user U): for every row of ``timeline_events``, U's
    membership in the state before that event equals the ``membership`` of U's
    ``visibility_memberships`` row with the largest position not after it (no row: none).

    Events are placed in topological order. The common case appends after the room's last
    timeline event, and only the membership keys differing between the two events' states
    before are written; the persister's state maps make that an identity check for
    consecutive events. An event placed in the middle (a late fork, backfill) also
    restores, at the next event, the memberships it changed. Snapshots of the last events
    of recent rooms are kept in memory; anything missing (or from a transaction that did
    not commit) is re-read from the database, so the memory is only a cache.
    """

    def __init__(self, room_cache_size: int = 512, value_cache_size: int = 50_000) -> None:
        # room -> {position: snapshot} of its last timeline events (a few per room).
        self._rooms: LruCache[str, dict[Position, _Snapshot]] = LruCache(
            "visibility_rooms", room_cache_size
        )
        # Immutable facts about events: membership of member events, class of hv events.
        self._memberships: LruCache[str, str] = LruCache("visibility_memberships", value_cache_size)
        self._classes: LruCache[str, int] = LruCache("visibility_classes", value_cache_size)

    # -- the hook ------------------------------------------------------------------------

    def record_txn(self, txn: Transaction, room_id: str, items: Sequence[TimelineInput]) -> None:
        """Record the timeline events among ``items`` (one room's events of one batch)."""
        timeline = sorted((i for i in items if i.in_timeline), key=lambda i: i.position)
        if not timeline:
            return
        # Serialise with other writers of this room (a backfill): on PostgreSQL, two
        # transactions reading the same "last event" would each append after it.
        txn.lock_exclusively(timeline_lock(room_id))
        batch_events = {i.event.event_id: i.event for i in items}
        self._prefetch_values(txn, timeline, batch_events)
        snapshots: dict[Position, _Snapshot] = {}
        cached: dict[Position, _Snapshot] = self._rooms.get(room_id) or {}
        last = _last_position_txn(txn, room_id)
        rows: list[tuple[Any, ...]] = []
        member_rows: list[tuple[Any, ...]] = []
        for item in timeline:
            event, position = item.event, item.position
            before = item.state_before
            if before is None:  # not handed over: read it back (same transaction)
                before = _state_before_txn(txn, event.event_id)
                item = TimelineInput(
                    event, item.stream_ordering, item.instance_name, True, before, None
                )
            snapshot = _Snapshot(
                before,
                item.state_after,
                event.state_tuple if event.is_state() else None,
            )
            if last is None or position > last[0]:
                predecessor = (
                    None if last is None else self._snapshot(txn, room_id, last, cached, snapshots)
                )
                successor = None
                last = (position, event.event_id)
            else:
                # In the middle: the events around it must be visible to the queries.
                self._flush(txn, rows, member_rows)
                found = _neighbour_txn(txn, room_id, position, before=True)
                predecessor = (
                    None
                    if found is None
                    else self._snapshot(txn, room_id, found, cached, snapshots)
                )
                successor = _neighbour_txn(txn, room_id, position, before=False)
            changed = self._changed_members(txn, before, predecessor, batch_events)
            for user_id, (old, new) in sorted(changed.items()):
                member_rows.append((room_id, user_id, position[0], position[1], new, False))
                if successor is not None:
                    member_rows.append(
                        (room_id, user_id, successor[0][0], successor[0][1], old, True)
                    )
            rows.append(self._timeline_row(txn, room_id, item, batch_events))
            snapshots[position] = snapshot
            if successor is not None:
                self._flush(txn, rows, member_rows)
        self._flush(txn, rows, member_rows)
        # Keep the snapshots of the room's last two timeline events.
        assert last is not None
        known = {**cached, **snapshots}
        keep = {p: s for p, s in known.items() if p <= last[0]}
        self._rooms.set(room_id, dict(sorted(keep.items())[-2:]))

    # -- pieces --------------------------------------------------------------------------

    def _timeline_row(
        self, txn: Transaction, room_id: str, item: TimelineInput, batch: Mapping[str, Event]
    ) -> tuple[Any, ...]:
        event = item.event
        before = item.state_before
        assert before is not None
        hv = before.get(HISTORY_VISIBILITY_KEY)
        visibility = SHARED if hv is None else self._class_of(txn, hv, batch)
        visibility_after = None
        if event.is_state() and event.state_tuple == HISTORY_VISIBILITY_KEY:
            visibility_after = visibility_class(event.content)
        member_user = membership = replaces = None
        if event.type == EventTypes.MEMBER and event.state_key is not None:
            member_user, membership = event.state_key, event.membership
        if event.is_state():
            replaces = before.get(event.state_tuple)
        return (
            room_id,
            event.depth,
            item.stream_ordering,
            event.event_id,
            item.instance_name,
            visibility,
            visibility_after,
            member_user,
            membership,
            replaces,
        )

    def _flush(
        self, txn: Transaction, rows: list[tuple[Any, ...]], member_rows: list[tuple[Any, ...]]
    ) -> None:
        txn.insert_many(
            "timeline_events",
            (
                "room_id", "topological_ordering", "stream_ordering", "event_id",
                "instance_name", "visibility", "visibility_after", "member_user",
                "membership", "replaces_state",
            ),
            rows,
        )  # fmt: skip
        plain = [r[:5] for r in member_rows if not r[5]]
        restores = [r[:5] for r in member_rows if r[5]]
        txn.insert_many(
            "visibility_memberships",
            ("room_id", "user_id", "topological_ordering", "stream_ordering", "membership"),
            plain,
        )
        # A restore never overrides what the next event already records.
        txn.executemany(
            "INSERT INTO visibility_memberships"
            " (room_id, user_id, topological_ordering, stream_ordering, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            restores,
        )
        rows.clear()
        member_rows.clear()

    def _snapshot(
        self,
        txn: Transaction,
        room_id: str,
        found: tuple[Position, str],
        cached: Mapping[Position, _Snapshot],
        batch: Mapping[Position, _Snapshot],
    ) -> _Snapshot:
        position, event_id = found
        snapshot = batch.get(position) or cached.get(position)
        if snapshot is not None:
            return snapshot
        return _Snapshot(_state_before_txn(txn, event_id), None, None)

    def _changed_members(
        self,
        txn: Transaction,
        before: Mapping[StateKey, str],
        predecessor: _Snapshot | None,
        batch: Mapping[str, Event],
    ) -> dict[str, tuple[str | None, str | None]]:
        """user -> (membership at the predecessor, membership at this event), for the
        users whose membership differs."""
        if predecessor is None:
            keys = [k for k in before if k[0] == EventTypes.MEMBER]
            previous: Mapping[StateKey, str] = {}
        else:
            previous = predecessor.before
            if before is previous:
                return {}
            if before is predecessor.after:
                key = predecessor.changed
                keys = [key] if key is not None and key[0] == EventTypes.MEMBER else []
            elif before == previous:
                return {}
            else:
                keys = list(
                    {k for k, _ in before.items() ^ previous.items() if k[0] == EventTypes.MEMBER}
                )
        if not keys:
            return {}
        ids = [v for k in keys for v in (before.get(k), previous.get(k)) if v is not None]
        memberships = self._memberships_of(txn, ids, batch)
        result: dict[str, tuple[str | None, str | None]] = {}
        for key in keys:
            old_id, new_id = previous.get(key), before.get(key)
            old = None if old_id is None else memberships.get(old_id)
            new = None if new_id is None else memberships.get(new_id)
            if old != new:
                result[key[1]] = (old, new)
        return result

    def _prefetch_values(
        self, txn: Transaction, timeline: Sequence[TimelineInput], batch: Mapping[str, Event]
    ) -> None:
        ids = {
            hv
            for i in timeline
            if i.state_before is not None
            and (hv := i.state_before.get(HISTORY_VISIBILITY_KEY)) is not None
        }
        missing = [i for i in ids if i not in batch and self._classes.get(i) is None]
        if missing:
            for event_id, content in _contents_txn(txn, missing).items():
                self._classes.set(event_id, visibility_class(content))

    def _class_of(self, txn: Transaction, event_id: str, batch: Mapping[str, Event]) -> int:
        if event_id in batch:
            return visibility_class(batch[event_id].content)
        cls = self._classes.get(event_id)
        if cls is None:
            cls = visibility_class(_contents_txn(txn, [event_id]).get(event_id))
            self._classes.set(event_id, cls)
        return int(cls)

    def _memberships_of(
        self, txn: Transaction, event_ids: Sequence[str], batch: Mapping[str, Event]
    ) -> dict[str, str | None]:
        result: dict[str, str | None] = {}
        missing: list[str] = []
        for event_id in event_ids:
            if event_id in batch:
                result[event_id] = batch[event_id].membership
                continue
            value = self._memberships.get(event_id)
            if value is None:
                missing.append(event_id)
            else:
                result[event_id] = value or None
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for event_id, membership in txn.query(
                f"SELECT event_id, membership FROM events WHERE event_id IN ({marks})", chunk
            ):
                result[event_id] = membership
                self._memberships.set(event_id, membership or "")
        return result


def _contents_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
    """Events' contents from their stored JSON. (``roomstream.rooms.store`` has the full
    loader, but this module is imported by the persister, which that package imports.)"""
    result: dict[str, Mapping[str, Any]] = {}
    for start in range(0, len(event_ids), 500):
        chunk = event_ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for event_id, raw in txn.query(
            f"SELECT event_id, json FROM event_json WHERE event_id IN ({marks})", chunk
        ):
            content = orjson.loads(bytes(raw)).get("content")
            result[str(event_id)] = content if isinstance(content, dict) else {}
    return result


def _state_before_txn(txn: Transaction, event_id: str) -> Mapping[StateKey, str]:
    row = txn.query_one("SELECT before_group FROM event_state WHERE event_id = ?", (event_id,))
    return {} if row is None else get_state_txn(txn, int(row[0]))


def _last_position_txn(txn: Transaction, room_id: str) -> tuple[Position, str] | None:
    row = txn.query_one(
        "SELECT topological_ordering, stream_ordering, event_id FROM timeline_events"
        " WHERE room_id = ? ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1",
        (room_id,),
    )
    return None if row is None else ((int(row[0]), int(row[1])), str(row[2]))


def _neighbour_txn(
    txn: Transaction, room_id: str, position: Position, *, before: bool
) -> tuple[Position, str] | None:
    """The timeline event just before (or after) ``position`` in the room."""
    topo, stream = position
    if before:
        sql = (
            "SELECT topological_ordering, stream_ordering, event_id FROM timeline_events"
            " WHERE room_id = ? AND (topological_ordering < ? OR"
            " (topological_ordering = ? AND stream_ordering < ?))"
            " ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1"
        )
    else:
        sql = (
            "SELECT topological_ordering, stream_ordering, event_id FROM timeline_events"
            " WHERE room_id = ? AND (topological_ordering > ? OR"
            " (topological_ordering = ? AND stream_ordering > ?))"
            " ORDER BY topological_ordering, stream_ordering LIMIT 1"
        )
    row = txn.query_one(sql, (room_id, topo, topo, stream))
    return None if row is None else ((int(row[0]), int(row[1])), str(row[2]))
