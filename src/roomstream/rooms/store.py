"""Reading rooms back: events (byte for byte), state at any event, the DAG."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from roomstream import exactjson
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion, room_version
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.state.groups import StateMap, get_state_entry_txn, get_state_txn
from roomstream.storage import Database, Transaction

#: Rows fetched per ``IN (...)`` query.
CHUNK = 500


#: Most events :meth:`EventStore.get_events` reads in one interaction.
READ_SLICE_EVENTS = 500


def chunks(items: Sequence[str], size: int = CHUNK) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def placeholders(n: int) -> str:
    return ",".join("?" * n)


@dataclass(frozen=True, slots=True)
class EventMeta:
    """What the events table knows of an event beyond its JSON."""

    event_id: str
    room_id: str
    stream_ordering: int
    topological_ordering: int
    outlier: bool
    rejected_reason: str | None
    soft_failed: bool
    redacted_by: str | None


def current_state_txn(txn: Transaction, room_id: str) -> StateMap:
    """The room's current state, (type, state_key) -> event ID (empty for a room this
    server does not know): the one query for it, used by every package."""
    # Both engines return TEXT columns as str: no conversion per entry.
    return {
        (r[0], r[1]): r[2]
        for r in txn.query(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            (room_id,),
        )
    }


def load_events_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, Event]:
    """Events by ID from their stored bytes (trusted: they were validated on the way in)."""
    result: dict[str, Event] = {}
    for chunk in chunks(list(dict.fromkeys(event_ids))):
        rows = txn.query(
            "SELECT event_id, room_version, json FROM event_json"
            f" WHERE event_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for event_id, version, raw in rows:
            raw = bytes(raw)
            # exactjson: room versions 1-5 may hold integers beyond 64 bits.
            result[event_id] = Event(exactjson.loads(raw), room_version(version), event_id, raw)
    return result


def load_meta_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, EventMeta]:
    result: dict[str, EventMeta] = {}
    for chunk in chunks(list(dict.fromkeys(event_ids))):
        rows = txn.query(
            "SELECT event_id, room_id, stream_ordering, topological_ordering, outlier,"
            " rejected_reason, soft_failed, redacted_by FROM events"
            f" WHERE event_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for row in rows:
            result[row[0]] = EventMeta(
                row[0],
                row[1],
                int(row[2]),
                int(row[3]),
                bool(row[4]),
                row[5],
                bool(row[6]),
                row[7],
            )
    return result


def state_groups_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """event ID -> (state group before, state group after), for events that have state."""
    result: dict[str, tuple[int, int]] = {}
    for chunk in chunks(list(dict.fromkeys(event_ids))):
        rows = txn.query(
            "SELECT event_id, before_group, after_group FROM event_state"
            f" WHERE event_id IN ({placeholders(len(chunk))})",
            chunk,
        )
        for event_id, before, after in rows:
            result[event_id] = (int(before), int(after))
    return result


class EventStore:
    """Read access to stored rooms. Safe to share; holds only caches of immutable data."""

    def __init__(self, database: Database, event_cache_size: int = 20_000) -> None:
        self.db = database
        self._events: LruCache[str, Event] = LruCache("events", event_cache_size)

    # -- events ----------------------------------------------------------------------

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        """Events as stored (unredacted); missing ones are absent from the result."""
        wanted = list(dict.fromkeys(event_ids))
        found: dict[str, Event] = {}
        missing = []
        for event_id in wanted:
            event = self._events.get(event_id)
            if event is None:
                missing.append(event_id)
            else:
                found[event_id] = event
        # Many events are read in several interactions, so that other rooms' reads and
        # commits can run between them instead of waiting for one long read.
        for part in chunks(missing, READ_SLICE_EVENTS):
            loaded = await self.db.run_interaction("load_events", load_events_txn, part)
            for event_id, event in loaded.items():
                self._events.set(event_id, event)
            found.update(loaded)
        return found

    async def get_event(self, event_id: str) -> Event | None:
        return (await self.get_events([event_id])).get(event_id)

    def cached_event(self, event_id: str) -> Event | None:
        """An event if the cache holds it. A plain lookup that does not reorder the cache,
        so database interactions may call it from their worker thread."""
        return self._events.peek(event_id)

    def cache_events(self, events: Iterable[Event]) -> None:
        for event in events:
            self._events.set(event.event_id, event)

    async def get_event_raw(self, event_id: str) -> bytes | None:
        """The exact bytes the event was received or created as."""
        row = await self.db.run_interaction(
            "get_event_raw",
            lambda t: t.query_one("SELECT json FROM event_json WHERE event_id = ?", (event_id,)),
        )
        return None if row is None else bytes(row[0])

    async def get_meta(self, event_ids: Iterable[str]) -> dict[str, EventMeta]:
        return await self.db.run_interaction("load_meta", load_meta_txn, list(event_ids))

    async def have_events(self, event_ids: Iterable[str]) -> set[str]:
        ids = list(dict.fromkeys(event_ids))

        def txn(t: Transaction) -> set[str]:
            seen: set[str] = set()
            for chunk in chunks(ids):
                rows = t.query(
                    f"SELECT event_id FROM events WHERE event_id IN ({placeholders(len(chunk))})",
                    chunk,
                )
                seen.update(r[0] for r in rows)
            return seen

        return await self.db.run_interaction("have_events", txn) if ids else set()

    # -- rooms -----------------------------------------------------------------------

    async def get_room_version(self, room_id: str) -> RoomVersion | None:
        row = await self.db.run_interaction(
            "get_room_version",
            lambda t: t.query_one("SELECT room_version FROM rooms WHERE room_id = ?", (room_id,)),
        )
        return None if row is None else room_version(row[0])

    async def get_forward_extremities(self, room_id: str) -> list[str]:
        rows = await self.db.run_interaction(
            "get_forward_extremities",
            lambda t: t.query(
                "SELECT event_id FROM event_forward_extremities WHERE room_id = ?"
                " ORDER BY event_id",
                (room_id,),
            ),
        )
        return [r[0] for r in rows]

    async def get_current_state(self, room_id: str) -> StateMap:
        return await self.db.run_interaction("get_current_state", current_state_txn, room_id)

    async def get_current_state_and_membership(
        self, room_id: str, user_id: str
    ) -> tuple[StateMap, str | None]:
        """The room's current state and ``user_id``'s membership in it, in one read."""

        def txn(t: Transaction) -> tuple[StateMap, str | None]:
            state: StateMap = {}
            membership = None
            for event_type, state_key, event_id, member in t.query(
                "SELECT type, state_key, event_id, membership FROM current_state_events"
                " WHERE room_id = ?",
                (room_id,),
            ):
                state[(event_type, state_key)] = event_id
                if event_type == EventTypes.MEMBER and state_key == user_id:
                    membership = member
            return state, membership

        return await self.db.run_interaction("get_current_state_and_membership", txn)

    async def get_current_state_entry(self, room_id: str, key: StateKey) -> str | None:
        """The event ID of one (type, state_key) of the room's current state."""
        row = await self.db.run_interaction(
            "get_current_state_entry",
            lambda t: t.query_one(
                "SELECT event_id FROM current_state_events"
                " WHERE room_id = ? AND type = ? AND state_key = ?",
                (room_id, key[0], key[1]),
            ),
        )
        return None if row is None else str(row[0])

    async def get_membership(self, room_id: str, user_id: str) -> str | None:
        """The user's membership in the room's current state (None: no member event)."""
        row = await self.db.run_interaction(
            "get_membership",
            lambda t: t.query_one(
                "SELECT membership FROM current_state_events"
                " WHERE room_id = ? AND type = 'm.room.member' AND state_key = ?",
                (room_id, user_id),
            ),
        )
        return None if row is None else row[0]

    async def joined_servers(self, room_id: str) -> set[str]:
        """The servers with a joined member in the room's current state (the servers
        "in the room", to which its events go and which may ask about it)."""
        return set(await self.db.run_interaction("joined_servers", hosts_in_room_txn, room_id))

    async def server_in_room(self, room_id: str, server_name: str) -> bool:
        """Whether a user of ``server_name`` is joined to the room (current state)."""
        return bool(
            await self.db.run_interaction(
                "server_in_room", is_host_in_room_txn, room_id, server_name
            )
        )

    async def get_rooms_for_user(self, user_id: str, membership: str = "join") -> list[str]:
        rows = await self.db.run_interaction(
            "get_rooms_for_user",
            lambda t: t.query(
                "SELECT room_id FROM current_state_events WHERE type = 'm.room.member'"
                " AND state_key = ? AND membership = ? ORDER BY room_id",
                (user_id, membership),
            ),
        )
        return [r[0] for r in rows]

    # -- state at events ---------------------------------------------------------------

    async def get_state_groups(self, event_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
        return await self.db.run_interaction("state_groups", state_groups_txn, list(event_ids))

    async def get_state_at(self, event_id: str, *, before: bool = False) -> StateMap:
        """The room state after (or before) an event. LookupError for outliers/unknown."""

        def txn(t: Transaction) -> StateMap:
            groups = state_groups_txn(t, [event_id]).get(event_id)
            if groups is None:
                raise LookupError(f"no state stored for {event_id}")
            return get_state_txn(t, groups[0] if before else groups[1])

        return await self.db.run_interaction("get_state_at", txn)

    async def get_state_entry_at(
        self, event_id: str, key: StateKey, *, before: bool = False
    ) -> str | None:
        """One (type, state_key) of the state after (or before) an event."""

        def txn(t: Transaction) -> str | None:
            groups = state_groups_txn(t, [event_id]).get(event_id)
            if groups is None:
                raise LookupError(f"no state stored for {event_id}")
            return get_state_entry_txn(t, groups[0] if before else groups[1], key)

        return await self.db.run_interaction("get_state_entry_at", txn)

    # -- walking the DAG ---------------------------------------------------------------

    async def get_backfill_events(
        self, room_id: str, from_event_ids: Sequence[str], limit: int
    ) -> list[str]:
        """Event IDs from ``from_event_ids`` back through their ancestors, newest first by
        (depth, stream ordering), at most ``limit`` (the starting events included)."""
        return await self.db.run_interaction(
            "backfill", _backfill_txn, room_id, list(from_event_ids), limit
        )

    async def get_missing_events(
        self,
        room_id: str,
        earliest_event_ids: Sequence[str],
        latest_event_ids: Sequence[str],
        limit: int,
    ) -> list[str]:
        """Walking back from ``latest_event_ids`` (excluded) without going past any of
        ``earliest_event_ids``: the newest ``limit`` events found, returned oldest first."""
        return await self.db.run_interaction(
            "missing_events_between",
            _missing_txn,
            room_id,
            list(earliest_event_ids),
            list(latest_event_ids),
            limit,
        )

    async def paginate_backwards(
        self, room_id: str, before: tuple[int, int] | None, limit: int
    ) -> list[tuple[str, int, int]]:
        """Events of a room before a (topological, stream) token, newest first.

        Returns (event_id, topological_ordering, stream_ordering); rejected, soft-failed
        and outlier events are left out.
        """
        topo, stream = before if before is not None else (2**62, 2**62)
        rows = await self.db.run_interaction(
            "paginate_backwards",
            lambda t: t.query(
                "SELECT event_id, topological_ordering, stream_ordering FROM events"
                " WHERE room_id = ? AND outlier = ? AND soft_failed = ?"
                " AND rejected_reason IS NULL"
                " AND (topological_ordering < ? OR (topological_ordering = ?"
                " AND stream_ordering < ?))"
                " ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT ?",
                (room_id, False, False, topo, topo, stream, limit),
            ),
        )
        return [(r[0], int(r[1]), int(r[2])) for r in rows]


def _depth_and_prevs(
    txn: Transaction, room_id: str, event_ids: Sequence[str]
) -> dict[str, tuple[int, int, list[str]]]:
    """event -> (depth, stream ordering, prev event IDs), for events of the room we have."""
    result: dict[str, tuple[int, int, list[str]]] = {}
    for chunk in chunks(list(event_ids)):
        marks = placeholders(len(chunk))
        rows = txn.query(
            "SELECT event_id, topological_ordering, stream_ordering FROM events"
            f" WHERE room_id = ? AND event_id IN ({marks})",
            (room_id, *chunk),
        )
        for event_id, depth, stream in rows:
            result[event_id] = (int(depth), int(stream), [])
        edges = txn.query(
            f"SELECT event_id, prev_event_id FROM event_edges WHERE event_id IN ({marks})",
            chunk,
        )
        for event_id, prev in edges:
            if event_id in result:
                result[event_id][2].append(prev)
    return result


def _backfill_txn(txn: Transaction, room_id: str, from_ids: list[str], limit: int) -> list[str]:
    result: list[str] = []
    seen: set[str] = set()
    heap: list[tuple[int, int, str]] = []  # (-depth, -stream, id): newest first

    def push(ids: Sequence[str]) -> None:
        fresh = [i for i in ids if i not in seen]
        seen.update(fresh)
        for event_id, (depth, stream, prevs) in _depth_and_prevs(txn, room_id, fresh).items():
            heapq.heappush(heap, (-depth, -stream, event_id))
            info[event_id] = prevs

    info: dict[str, list[str]] = {}
    push(from_ids)
    while heap and len(result) < limit:
        _, _, event_id = heapq.heappop(heap)
        result.append(event_id)
        push(info[event_id])
    return result


def _missing_txn(
    txn: Transaction, room_id: str, earliest: list[str], latest: list[str], limit: int
) -> list[str]:
    stop = set(earliest)
    result: list[str] = []
    seen = set(latest) | stop
    known = _depth_and_prevs(txn, room_id, latest)
    frontier = [p for _, _, prevs in known.values() for p in prevs]
    heap: list[tuple[int, int, str]] = []
    while True:
        fresh = [p for p in frontier if p not in seen]
        seen.update(fresh)
        for event_id, (depth, stream, prevs) in _depth_and_prevs(txn, room_id, fresh).items():
            heapq.heappush(heap, (-depth, -stream, event_id))
            known[event_id] = (depth, stream, prevs)
        if not heap or len(result) >= limit:
            break
        _, _, event_id = heapq.heappop(heap)
        result.append(event_id)
        frontier = known[event_id][2]
    result.reverse()
    return result


# -- which servers are in a room (current state) ------------------------------------


def server_of(user_id: str) -> str:
    """The server part of a Matrix user ID (``@local:server``; empty when malformed)."""
    if not user_id.startswith("@"):
        return ""
    _, sep, server = user_id.partition(":")
    return server if sep else ""


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def is_host_in_room_txn(txn: Transaction, room_id: str, server_name: str) -> bool:
    """Whether a user of ``server_name`` is joined to ``room_id`` now."""
    if not server_name:
        return False
    # LIKE narrows the rows; the exact test is Python's: SQLite's LIKE ignores ASCII
    # case, and "%:example.org" also matches a user of "other:example.org".
    rows = txn.query(
        "SELECT state_key FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'join'"
        " AND state_key LIKE ? ESCAPE '\\'",
        (room_id, "%:" + _like_escape(server_name)),
    )
    return any(server_of(str(row[0])) == server_name for row in rows)


def hosts_in_room_txn(txn: Transaction, room_id: str) -> list[str]:
    """The servers with a user joined to ``room_id`` now, sorted (empty: unknown room,
    or nobody joined)."""
    rows = txn.query(
        "SELECT state_key FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'join'",
        (room_id,),
    )
    return sorted({server for row in rows if (server := server_of(str(row[0])))})
