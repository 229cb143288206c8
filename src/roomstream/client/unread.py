"""Unread notification counts (``unread_notifications`` of ``/sync``): push-rule
evaluation and counting since the user's read receipt.

:func:`evaluate` runs a push-rules document (the user's, :mod:`roomstream.client.
push_store`; the server defaults of :mod:`roomstream.client.pushrules` without one) over
one event, as the spec's "Push Rules" section
says: kinds ``override``, ``content``, ``room``, ``sender``, ``underride`` in that order,
the first enabled rule whose conditions all hold decides; ``notify`` in its actions
counts a notification, a ``highlight`` tweak (value true or missing) a highlight.
Conditions: ``event_match`` (glob, case-insensitive, :mod:`roomstream.glob`; on
``content.body`` at word boundaries, as Synapse), ``contains_display_name``, ``room_member_count``,
``sender_notification_permission``, ``event_property_is``, ``event_property_contains``;
an unknown kind never holds. Events with ``content["m.mentions"]`` skip the legacy
mention rules (``contains_display_name``, ``contains_user_name``, ``roomnotif``), as the
spec's intentional mentions say.

:class:`UnreadCounter` counts, per room, the events after the later of the user's
``m.read`` / ``m.read.private`` receipts (or after their join, without one) that the
rules say notify: never the user's own events, never rejected or soft-failed ones. Cost:
the events since the receipt, read by the ``(room, stream)`` index and evaluated against
the room's current state (its member count, the user's display name, power levels).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roomstream.client.filtering import parse_field_path
from roomstream.client.pushrules import default_push_rules
from roomstream.errors import MatrixError
from roomstream.events.types import EventTypes
from roomstream.glob import Glob, compile_glob
from roomstream.lru import LruCache
from roomstream.reading import RoomReader
from roomstream.reading.relations import MAIN_TIMELINE, threads_of_txn
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Transaction

__all__ = [
    "PushContext",
    "ThreadedCounts",
    "UnreadCounter",
    "decide",
    "evaluate",
    "is_highlight",
    "push_context_txn",
]

#: Rules that intentional mentions (``m.mentions`` in the content) turn off.
LEGACY_MENTION_RULES = frozenset(
    {".m.rule.contains_display_name", ".m.rule.contains_user_name", ".m.rule.roomnotif"}
)
_KINDS = ("override", "content", "room", "sender", "underride")
#: Events counted per room at most (a room with more unread shows this many).
MAX_COUNTED = 10_000


@dataclass(frozen=True)
class PushContext:
    """What rules need besides the event: the user, their display name in the room,
    the room's joined member count, its power levels content (None: defaults)."""

    user_id: str
    display_name: str | None
    member_count: int
    power_levels: Mapping[str, Any] | None = None

    def power_of(self, user_id: str) -> int:
        levels = self.power_levels or {}
        users = levels.get("users")
        if isinstance(users, Mapping) and isinstance(users.get(user_id), int):
            return int(users[user_id])
        default = levels.get("users_default", 0)
        return default if isinstance(default, int) else 0

    def notification_level(self, key: str) -> int:
        notifications = (self.power_levels or {}).get("notifications")
        if isinstance(notifications, Mapping) and isinstance(notifications.get(key), int):
            return int(notifications[key])
        return 50


_MISSING = object()


def _value(event: Mapping[str, Any], key: str) -> Any:
    value: Any = event
    try:
        parts = parse_field_path(key)  # the spec's dotted path, as filters' event_fields
    except MatrixError:
        return _MISSING  # a malformed key matches nothing
    for part in parts:
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _glob(pattern: str, literal: bool = False) -> Glob:
    """``pattern`` (``*``, ``?`` wildcards unless ``literal``) matched case-insensitively
    (:mod:`roomstream.glob`: no backtracking, cost at most pattern x value length)."""
    return compile_glob(pattern, wildcards="" if literal else "*?", ignore_case=True)


def _matches_words(text: str, pattern: str, literal: bool = False) -> bool:
    return _glob(pattern, literal).search_words(text)


_COUNT_RE = re.compile(r"(==|<=|>=|<|>)?([0-9]+)")


def _member_count_holds(spec: Any, count: int) -> bool:
    match = _COUNT_RE.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        return False
    op, number = match.group(1) or "==", int(match.group(2))
    return {
        "==": count == number,
        "<": count < number,
        ">": count > number,
        "<=": count <= number,
        ">=": count >= number,
    }[op]


def _holds(condition: Mapping[str, Any], event: Mapping[str, Any], ctx: PushContext) -> bool:
    kind = condition.get("kind")
    if kind == "event_match":
        value = _value(event, str(condition.get("key", "")))
        pattern = condition.get("pattern")
        if not isinstance(value, str) or not isinstance(pattern, str):
            return False
        if condition.get("key") == "content.body":
            return _matches_words(value, pattern)
        return _glob(pattern).matches(value)
    if kind == "contains_display_name":
        body = _value(event, "content.body")
        name = ctx.display_name
        return isinstance(body, str) and bool(name) and _matches_words(body, name or "", True)
    if kind == "room_member_count":
        return _member_count_holds(condition.get("is"), ctx.member_count)
    if kind == "sender_notification_permission":
        sender = event.get("sender")
        key = condition.get("key")
        if not isinstance(sender, str) or not isinstance(key, str):
            return False
        return ctx.power_of(sender) >= ctx.notification_level(key)
    if kind == "event_property_is":
        value = _value(event, str(condition.get("key", "")))
        expected = condition.get("value")
        return value is not _MISSING and type(value) is type(expected) and value == expected
    if kind == "event_property_contains":
        value = _value(event, str(condition.get("key", "")))
        return isinstance(value, list) and condition.get("value") in value
    return False


def _rule_holds(
    kind: str, rule: Mapping[str, Any], event: Mapping[str, Any], ctx: PushContext
) -> bool:
    if kind == "content":
        body = _value(event, "content.body")
        pattern = rule.get("pattern")
        return isinstance(body, str) and isinstance(pattern, str) and _matches_words(body, pattern)
    if kind == "room":
        return event.get("room_id") == rule.get("rule_id")
    if kind == "sender":
        return event.get("sender") == rule.get("rule_id")
    conditions = rule.get("conditions", [])
    return all(_holds(c, event, ctx) for c in conditions)


def decide(
    rules: Mapping[str, Any], event: Mapping[str, Any], ctx: PushContext
) -> list[Any] | None:
    """The actions of the rule that decides for ``event`` (a PDU or client-format event)
    under the push-rules document ``rules`` (``{"global": {kind: [rule...]}}``); None
    when no rule matches."""
    ruleset = rules.get("global", {})
    content = event.get("content")
    intentional = isinstance(content, Mapping) and "m.mentions" in content
    for kind in _KINDS:
        for rule in ruleset.get(kind, []):
            if not rule.get("enabled", True):
                continue
            if intentional and rule.get("rule_id") in LEGACY_MENTION_RULES:
                continue
            if _rule_holds(kind, rule, event, ctx):
                actions = rule.get("actions", [])
                return list(actions) if isinstance(actions, list) else []
    return None


def is_highlight(actions: Sequence[Any]) -> bool:
    """A ``highlight`` tweak whose value is true or missing."""
    return any(
        isinstance(a, Mapping)
        and a.get("set_tweak") == "highlight"
        and a.get("value", True) is True
        for a in actions
    )


def evaluate(
    rules: Mapping[str, Any], event: Mapping[str, Any], ctx: PushContext
) -> tuple[bool, bool]:
    """``(notify, highlight)`` for ``event`` under ``rules`` (:func:`decide`)."""
    actions = decide(rules, event, ctx)
    if actions is None or "notify" not in actions:
        return False, False
    return True, is_highlight(actions)


def count_unread(
    rules: Mapping[str, Any], events: Sequence[Mapping[str, Any]], ctx: PushContext
) -> tuple[int, int]:
    """``(notification_count, highlight_count)`` over ``events`` (those after the
    receipt), leaving out the user's own."""
    notifications = highlights = 0
    for event in events:
        if event.get("sender") == ctx.user_id:
            continue
        notify, highlight = evaluate(rules, event, ctx)
        notifications += notify
        highlights += highlight
    return notifications, highlights


#: A room's floors: where counting starts for the main timeline, and for each thread the
#: user has a threaded receipt in (``(thread root, floor)`` sorted); other threads start
#: at the first, the later of the join and the unthreaded receipts.
_Floors = tuple[int, int, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class _Counted:
    """Counts of a (user, room) from its floors up to and including stream ordering
    ``upto``, per thread (``main``: events in no thread), as the database held them
    when the room's events were last seen to move at or before ``checked_at`` (an events
    position: see :class:`UnreadCounter`). A room's events are persisted by one writer in
    stream order, so an event arriving later has a stream ordering above ``upto``: while
    the floors stay, new events only add to the counts."""

    floors: _Floors
    upto: int
    checked_at: int
    #: thread (``main`` or a thread root) -> (notifications, highlights); no zeros.
    counts: Mapping[str, tuple[int, int]]
    #: The rules document they were counted with (compared by identity: the rules store
    #: hands out one object until the user's rules change).
    rules: Mapping[str, Any]

    def total(self) -> dict[str, int]:
        """All threads' counts added up (the room's counts without the thread filter)."""
        return {
            "notification_count": sum(n for n, _ in self.counts.values()),
            "highlight_count": sum(h for _, h in self.counts.values()),
        }


def _as_counts(counts: tuple[int, int]) -> dict[str, int]:
    return {"notification_count": counts[0], "highlight_count": counts[1]}


@dataclass(frozen=True)
class ThreadedCounts:
    """A room's counts split as ``unread_thread_notifications`` asks: ``main`` (events
    in no thread) and ``threads`` (per thread root with any count)."""

    main: dict[str, int]
    threads: dict[str, dict[str, int]]


class UnreadCounter:
    """Counts for a user's rooms, read in one database interaction.

    Remembers each (user, room)'s counts: they are reused while the user's receipts (or
    join) have not moved and the read path's change cache says the room has no event
    after the position the reader had ingested before they were counted (an event
    persisted after counting is after that position, so it invalidates them once the
    reader sees it, which is also when a sync can first show it). So a repeated sync
    costs two statements (receipts, memberships) whatever the number of rooms.

    Threads, as Synapse: an event in thread T (:func:`~roomstream.reading.relations.
    threads_of_txn`) is unread after the later of the user's unthreaded receipts and
    their receipt for T; an event in no thread, after the later of the unthreaded and
    ``main`` receipts; with no receipt, after the user's join.
    """

    def __init__(
        self,
        reader: RoomReader,
        rules_of: Callable[[str], Awaitable[Mapping[str, Any]]] | None = None,
    ) -> None:
        """``rules_of``: a user's push rules (None: everyone has the server defaults)."""
        self.reader = reader
        self.rules_of = rules_of
        self._counted: LruCache[tuple[str, str], _Counted] = LruCache("unread_counts")

    async def counts(self, user_id: str, room_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """room -> ``{"notification_count", "highlight_count"}``, threads included."""
        return {r: c.total() for r, c in (await self._count(user_id, room_ids)).items()}

    async def threaded_counts(
        self, user_id: str, room_ids: Sequence[str]
    ) -> dict[str, ThreadedCounts]:
        """room -> its counts split into the main timeline and each thread."""
        result = {}
        for room_id, counted in (await self._count(user_id, room_ids)).items():
            threads = {t: _as_counts(c) for t, c in counted.counts.items() if t != MAIN_TIMELINE}
            main = _as_counts(counted.counts.get(MAIN_TIMELINE, (0, 0)))
            result[room_id] = ThreadedCounts(main, threads)
        return result

    async def _count(self, user_id: str, room_ids: Sequence[str]) -> dict[str, _Counted]:
        if not room_ids:
            return {}
        rules = (
            default_push_rules(user_id) if self.rules_of is None else await self.rules_of(user_id)
        )
        checked_at = self.reader.ingested_floor
        # Counts made under other rules (the user changed them) are counted again.
        known = {
            r: c
            for r in room_ids
            if (c := self._counted.get((user_id, r))) is not None and c.rules is rules
        }
        # Rooms with events since they were counted: counted on from where they stopped.
        grown = {
            r: known.pop(r)
            for r in list(known)
            if self.reader.rooms_changed_since((r,), known[r].checked_at)
        }
        found: dict[str, _Counted] = await self.reader.db.run_interaction(
            "unread_counts", _counts_txn, rules, user_id, sorted(room_ids), known, grown, checked_at
        )
        for room_id, counted in found.items():
            if counted is not known.get(room_id):
                self._counted.set((user_id, room_id), counted)
        return found


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _floors_txn(txn: Transaction, user_id: str, chunk: list[str]) -> dict[str, _Floors]:
    """Each room's floors (:data:`_Floors`) from the user's membership event and their
    ``m.read`` / ``m.read.private`` receipts (unthreaded: NULL or empty thread ID)."""
    marks = _marks(len(chunk))
    base: dict[str, int] = {}
    for room_id, stream in txn.query(
        "SELECT c.room_id, e.stream_ordering FROM current_state_events c"
        " JOIN events e ON e.event_id = c.event_id"
        f" WHERE c.room_id IN ({marks}) AND c.type = 'm.room.member' AND c.state_key = ?",
        (*chunk, user_id),
    ):
        base[str(room_id)] = int(stream)
    threaded: dict[str, dict[str, int]] = {}
    for room_id, thread_id, stream in txn.query(
        "SELECT r.room_id, r.thread_id, MAX(e.stream_ordering) FROM receipts r"
        " JOIN events e ON e.event_id = r.event_id"
        f" WHERE r.room_id IN ({marks}) AND r.user_id = ?"
        " AND r.receipt_type IN ('m.read', 'm.read.private')"
        " GROUP BY r.room_id, r.thread_id",
        (*chunk, user_id),
    ):
        if stream is None:
            continue
        if not thread_id:
            base[str(room_id)] = max(base.get(str(room_id), 0), int(stream))
        else:
            threaded.setdefault(str(room_id), {})[str(thread_id)] = int(stream)
    floors = {}
    for room_id in chunk:
        lowest = base.get(room_id, 0)
        receipts = threaded.get(room_id, {})
        main = max(lowest, receipts.pop(MAIN_TIMELINE, 0))
        floors[room_id] = (
            lowest,
            main,
            tuple(sorted((t, f) for t, f in receipts.items() if f > lowest)),
        )
    return floors


def _counts_txn(
    txn: Transaction,
    rules: Mapping[str, Any],
    user_id: str,
    room_ids: list[str],
    known: Mapping[str, _Counted],
    grown: Mapping[str, _Counted],
    checked_at: int,
) -> dict[str, _Counted]:
    """room -> its counts. A ``known`` entry with the same floors is reused as it is; a
    ``grown`` one with the same floors is extended by the events after its ``upto``.

    Counting afresh reads the room's events after the lowest floor but the unthreaded
    one (the main and threaded receipts), and before it only the relation events (by
    ``event_relations (room_id, stream_ordering)``): an event in no thread there is read."""
    result: dict[str, _Counted] = {}
    for start in range(0, len(room_ids), 500):
        chunk = room_ids[start : start + 500]
        all_floors = _floors_txn(txn, user_id, chunk)
        for room_id in chunk:
            floors = all_floors[room_id]
            cached = known.get(room_id)
            if cached is not None and cached.floors == floors:
                result[room_id] = cached
                continue
            base = grown.get(room_id)
            context: list[PushContext] = []
            if base is not None and base.floors == floors:
                after, counts = base.upto, dict(base.counts)
            else:
                lowest, main, threaded = floors
                after = min([main, *(f for _, f in threaded)])
                counts = {}
                if after > lowest:
                    rows = txn.query(
                        "SELECT r.event_id, r.stream_ordering FROM event_relations r"
                        " JOIN events e ON e.event_id = r.event_id"
                        " WHERE r.room_id = ? AND r.stream_ordering > ?"
                        " AND r.stream_ordering <= ? AND r.sender <> ?"
                        " AND e.rejected_reason IS NULL AND e.soft_failed = ? AND e.outlier = ?"
                        f" ORDER BY r.stream_ordering LIMIT {MAX_COUNTED}",
                        (room_id, lowest, after, user_id, False, False),
                    )
                    _count_rows(txn, rules, user_id, room_id, floors, rows, counts, context)
            rows = txn.query(
                "SELECT event_id, stream_ordering FROM events"
                " WHERE room_id = ? AND stream_ordering > ?"
                " AND sender <> ? AND rejected_reason IS NULL AND soft_failed = ?"
                f" AND outlier = ? ORDER BY stream_ordering LIMIT {MAX_COUNTED}",
                (room_id, after, user_id, False, False),
            )
            if rows:
                _count_rows(txn, rules, user_id, room_id, floors, rows, counts, context)
                after = int(rows[-1][1])
            result[room_id] = _Counted(floors, after, checked_at, counts, rules)
    return result


def _count_rows(
    txn: Transaction,
    rules: Mapping[str, Any],
    user_id: str,
    room_id: str,
    floors: _Floors,
    rows: Sequence[Sequence[Any]],
    counts: dict[str, tuple[int, int]],
    context: list[PushContext],
) -> None:
    """Add to ``counts`` the events of ``rows`` (``(event_id, stream_ordering)``, in
    order, none the user's own) after their thread's floor that the rules say notify.
    ``context``: the room's push context, read once (empty until needed)."""
    lowest, main, threaded = floors
    thread_floors = dict(threaded)
    event_ids = [str(r[0]) for r in rows]
    thread_of = threads_of_txn(txn, event_ids)
    streams = {str(r[0]): int(r[1]) for r in rows}
    unread = []
    for event_id in event_ids:
        thread = thread_of.get(event_id, MAIN_TIMELINE)
        floor = main if thread == MAIN_TIMELINE else thread_floors.get(thread, lowest)
        if streams[event_id] > floor:
            unread.append(event_id)
    if not unread:
        return
    if not context:
        context.append(push_context_txn(txn, room_id, user_id))
    loaded = _load_all(txn, unread)
    for event_id in unread:
        if event_id not in loaded:
            continue
        notify, highlight = evaluate(rules, loaded[event_id].data, context[0])
        if not notify:
            continue
        thread = thread_of.get(event_id, MAIN_TIMELINE)
        n, h = counts.get(thread, (0, 0))
        counts[thread] = (n + 1, h + highlight)


def _load_all(txn: Transaction, event_ids: list[str]) -> dict[str, Any]:
    loaded = {}
    for start in range(0, len(event_ids), 500):
        loaded.update(load_events_txn(txn, event_ids[start : start + 500]))
    return loaded


def push_context_txn(txn: Transaction, room_id: str, user_id: str) -> PushContext:
    row = txn.query_one(
        "SELECT COUNT(*) FROM current_state_events"
        " WHERE room_id = ? AND type = 'm.room.member' AND membership = 'join'",
        (room_id,),
    )
    count = 0 if row is None else int(row[0])
    ids = {
        str(t): str(e)
        for t, e in txn.query(
            "SELECT type, event_id FROM current_state_events WHERE room_id = ?"
            " AND ((type = 'm.room.member' AND state_key = ?)"
            " OR (type = 'm.room.power_levels' AND state_key = ''))",
            (room_id, user_id),
        )
    }
    loaded = load_events_txn(txn, list(ids.values()))
    member = loaded.get(ids.get(EventTypes.MEMBER, ""))
    levels = loaded.get(ids.get(EventTypes.POWER_LEVELS, ""))
    name = None if member is None else member.content.get("displayname")
    return PushContext(
        user_id,
        name if isinstance(name, str) else None,
        count,
        None if levels is None else levels.content,
    )
