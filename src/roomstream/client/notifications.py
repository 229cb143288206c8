"""Which events notify a user: ``GET /notifications`` and the pushers' source.

There is no table of push actions (Synapse's ``event_push_actions``): a user's
notifications are found by evaluating their push rules (:mod:`roomstream.client.unread`)
over the events of the rooms they are joined to, from their join on, read by the
``(room, stream)`` index, each batch in one database interaction.

Invariants:

- only rooms the user is joined to now, and only events after their membership event
  (their join): a user never learns of an event from before they joined, nor of one
  from a room they left (Synapse keeps notifications of a room one left; we do not);
- never the user's own events, nor rejected, soft-failed or outlier ones;
- an event notifies when the rule deciding for it has ``notify`` in its actions, with
  the room's current state as context (member count, display name, power levels);
- a scan reads at most :data:`SCAN_BUDGET` events per call, so a user with few
  notifications among many events gets a page (possibly short) and a token to go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roomstream.client.push_store import PushRulesStore
from roomstream.client.unread import PushContext, decide, is_highlight, push_context_txn
from roomstream.reading import RoomReader
from roomstream.reading.relations import MAIN_TIMELINE, threads_of_txn
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Transaction

__all__ = ["SCAN_BUDGET", "Found", "Notification", "Notifications", "notifying_events_txn"]

#: Events evaluated per call at most.
SCAN_BUDGET = 5_000
_BATCH = 500


@dataclass(frozen=True)
class Notification:
    room_id: str
    event_id: str
    stream_ordering: int
    actions: list[Any]
    #: The event's origin_server_ts.
    ts: int
    #: At or before the user's read receipt in the room for its thread (``main`` for
    #: an event in no thread) or their unthreaded one.
    read: bool

    @property
    def highlight(self) -> bool:
        return is_highlight(self.actions)


@dataclass(frozen=True)
class Found:
    """Notifications in scan order, and where the scan stopped: the stream ordering of
    the last event it evaluated (None: it evaluated none), and whether events may remain
    beyond it (the budget or the limit stopped it)."""

    notifications: list[Notification]
    scanned_to: int | None
    more: bool


@dataclass(frozen=True)
class _Room:
    """What a scan needs of one of the user's rooms: the stream ordering of their join,
    and of their read receipts (``m.read``, ``m.read.private``): the latest unthreaded
    one (0: none) and the latest per thread (``main`` or a thread root)."""

    joined_at: int
    unthreaded: int
    threads: Mapping[str, int]

    def read_up_to(self, thread: str) -> int:
        """Events of ``thread`` (``main``: in no thread) at or before this are read: the
        later of the unthreaded receipt and the thread's own (as unread counts)."""
        return max(self.unthreaded, self.threads.get(thread, 0))


def _rooms_txn(txn: Transaction, user_id: str) -> dict[str, _Room]:
    joined = {
        str(room_id): int(stream)
        for room_id, stream in txn.query(
            "SELECT c.room_id, e.stream_ordering FROM current_state_events c"
            " JOIN events e ON e.event_id = c.event_id"
            " WHERE c.type = 'm.room.member' AND c.state_key = ? AND c.membership = 'join'",
            (user_id,),
        )
    }
    unthreaded: dict[str, int] = {}
    threads: dict[str, dict[str, int]] = {}
    for room_id, thread_id, stream in txn.query(
        "SELECT r.room_id, r.thread_id, MAX(e.stream_ordering) FROM receipts r"
        " JOIN events e ON e.event_id = r.event_id"
        " WHERE r.user_id = ? AND r.receipt_type IN ('m.read', 'm.read.private')"
        " GROUP BY r.room_id, r.thread_id",
        (user_id,),
    ):
        room = str(room_id)
        if room not in joined or stream is None:
            continue
        if thread_id:
            threads.setdefault(room, {})[str(thread_id)] = int(stream)
        else:
            unthreaded[room] = max(unthreaded.get(room, 0), int(stream))
    return {
        room: _Room(joined_at, unthreaded.get(room, 0), threads.get(room, {}))
        for room, joined_at in joined.items()
    }


def notifying_events_txn(
    txn: Transaction,
    rules: Mapping[str, Any],
    user_id: str,
    *,
    before: int | None = None,
    after: int | None = None,
    upto: int | None = None,
    limit: int,
    only_highlight: bool = False,
) -> Found:
    """The user's notifications: newest first below ``before`` (None: from the newest),
    or, with ``after``, oldest first above it and at most ``upto``. At most ``limit``."""
    forward = after is not None
    rooms = _rooms_txn(txn, user_id)
    if not rooms:
        return Found([], None, False)
    contexts: dict[str, PushContext] = {}
    found: list[Notification] = []
    scanned = 0
    position = after if forward else before
    scanned_to: int | None = None
    marks = ",".join("?" * len(rooms))
    while scanned < SCAN_BUDGET and len(found) < limit:
        if forward:
            bound = "stream_ordering > ?" + ("" if upto is None else " AND stream_ordering <= ?")
            params: tuple[Any, ...] = (position,) if upto is None else (position, upto)
            order = "ASC"
        else:
            bound = "1 = 1" if position is None else "stream_ordering < ?"
            params = () if position is None else (position,)
            order = "DESC"
        rows = txn.query(
            "SELECT event_id, room_id, stream_ordering FROM events"
            f" WHERE room_id IN ({marks}) AND {bound} AND sender <> ?"
            " AND rejected_reason IS NULL AND soft_failed = ? AND outlier = ?"
            f" ORDER BY stream_ordering {order} LIMIT {_BATCH}",
            (*rooms, *params, user_id, False, False),
        )
        if not rows:
            return Found(found, scanned_to, False)
        events = load_events_txn(txn, [str(r[0]) for r in rows])
        #: (room, event, stream ordering, actions, origin_server_ts), in scan order.
        notifying: list[tuple[str, str, int, list[Any], int]] = []
        for event_id, room_id, stream in rows:
            scanned += 1
            position = scanned_to = int(stream)
            room = rooms[str(room_id)]
            event = events.get(str(event_id))
            if event is None or int(stream) <= room.joined_at:
                continue
            ctx = contexts.get(str(room_id))
            if ctx is None:
                ctx = contexts[str(room_id)] = push_context_txn(txn, str(room_id), user_id)
            actions = decide(rules, event.data, ctx)
            if actions is None or "notify" not in actions:
                continue
            if only_highlight and not is_highlight(actions):
                continue
            ts = int(event.data.get("origin_server_ts", 0))
            notifying.append((str(room_id), str(event_id), int(stream), actions, ts))
            if len(found) + len(notifying) >= limit:
                break
        # Whether each is read depends on its thread: one lookup for the batch.
        thread_of = threads_of_txn(txn, [n[1] for n in notifying])
        for room_id, event_id, stream, actions, ts in notifying:
            thread = thread_of.get(event_id, MAIN_TIMELINE)
            read = stream <= rooms[room_id].read_up_to(thread)
            found.append(Notification(room_id, event_id, stream, actions, ts, read))
        if len(rows) < _BATCH and len(found) < limit:
            return Found(found, scanned_to, False)
    return Found(found, scanned_to, True)


class Notifications:
    """``GET /notifications``: pages of a user's notifications, newest first."""

    def __init__(self, reader: RoomReader, push_rules: PushRulesStore) -> None:
        self.reader = reader
        self.push_rules = push_rules

    async def page(
        self, user_id: str, before: int | None, limit: int, only_highlight: bool
    ) -> dict[str, Any]:
        """The response body: ``notifications`` and, when more may follow, ``next_token``
        (the ``from`` of the next page)."""
        rules = await self.push_rules.rules_of(user_id)
        found: Found = await self.reader.db.run_interaction(
            "notifications",
            lambda t: notifying_events_txn(
                t, rules, user_id, before=before, limit=limit, only_highlight=only_highlight
            ),
        )
        notifications = []
        for item in found.notifications:
            # Through the read path: an event the user may not see is never served.
            event = await self.reader.get_event(user_id, item.event_id)
            if event is None:
                continue
            notifications.append(
                {
                    "room_id": item.room_id,
                    "event": event,
                    "actions": item.actions,
                    "ts": item.ts,
                    "read": item.read,
                    "profile_tag": None,
                }
            )
        body: dict[str, Any] = {"notifications": notifications}
        if found.more and found.scanned_to is not None:
            body["next_token"] = str(found.scanned_to)
        return body
