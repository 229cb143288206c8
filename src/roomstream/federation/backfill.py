"""Backfill on demand: older history of a room from another server in it (the spec's
``GET /backfill``; Synapse's ``maybe_backfill`` and ``FederationEventHandler.backfill``).

Where this server's knowledge of a room starts are its *backward extremities*: prev
events of stored timeline events (not outliers, not rejected) that are not stored with
state themselves (unknown, or outliers) — after a remote join, the join's prev events.
:meth:`FederationBackfill.backfill` asks one server at a time (the room creator's
server first, then the others with joined members, most members first; never this one)
for ``limit`` events back from the lowest of them, and persists what comes back as
*backfilled* events (negative stream orderings, no change to forward extremities or
current state) through the receive path: format, signatures, hashes, auth rules.

An answered event whose prev events are neither stored with state nor in the answer
(the oldest of the chunk) gets the state after each missing prev event from the same
server (``/state_ids``, the events fetched as outliers, as :mod:`roomstream.federation.gaps`
does), so that it is persisted with state and so with visibility records; an event for
which that state cannot be had (budget, time-out, failure) is left out, with every event
of the chunk above it, rather than stored without state. The events accepted before such
a fetch are persisted first (see :meth:`FederationBackfill._persist_with_state`).

Bounded: at most :data:`MAX_SERVERS` servers asked, one ``/backfill`` answer used,
:data:`MAX_STATE_FETCHES` states fetched, all within ``timeout`` seconds (every request
gets what is left of it). Extremities whose backfill brought nothing new (the server has
nothing older, or only what is stored as outliers here) are remembered per process and
not asked about again, so a client paginating at the very start of a room costs no
request per page.

Answered events this server holds as outliers (after a remote join, the state
``send_join`` gave, down to the create event) are decided again by the persister
(``redecide``) once the events below them are stored, and join the timeline as history.

Not done: gaps in the middle of a room (below an event received with ``/state_ids``
state) are not backfilled, only the lowest extremities are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from roomstream.events.model import Event
from roomstream.events.types import EventTypes
from roomstream.federation.gaps import FederationRequester, GapFiller, pdu_bytes
from roomstream.lru import LruCache
from roomstream.rooms.engine import RoomEngine
from roomstream.state.groups import StateMap
from roomstream.storage import Transaction

__all__ = ["FederationBackfill", "backward_extremities_txn"]

logger = logging.getLogger(__name__)

#: Most servers asked for one page.
MAX_SERVERS = 3
#: Most backward extremities named in one request (the lowest ones; Synapse sends 5).
MAX_EXTREMITIES = 5
#: The room's lowest timeline events whose prev events are looked at.
EXTREMITY_SCAN = 500
#: Most ``/state_ids`` states fetched below one backfilled chunk.
MAX_STATE_FETCHES = 5
#: Most events asked for in one request (the spec leaves it to the server; Synapse caps
#: its answers at 100).
MAX_LIMIT = 100
#: Rooms whose fruitless extremities are remembered.
FRUITLESS_ROOMS = 10_000


def backward_extremities_txn(
    txn: Transaction, room_id: str, limit: int, scan: int = EXTREMITY_SCAN
) -> list[str]:
    """Up to ``limit`` backward extremities of the room, those below the lowest events
    first: prev events of the room's ``scan`` lowest timeline events (topological order,
    not outliers, not rejected) that are not stored, or stored only as outliers. A
    create event stored as an outlier is no extremity (nothing lies before it)."""
    rows = txn.query(
        "SELECT g.prev_event_id, MIN(b.topological_ordering) AS lowest"
        " FROM (SELECT event_id, topological_ordering FROM events"
        "       WHERE room_id = ? AND outlier = FALSE AND rejected_reason IS NULL"
        "       ORDER BY topological_ordering, stream_ordering LIMIT ?) AS b"
        " JOIN event_edges AS g ON g.event_id = b.event_id"
        " LEFT JOIN events AS p ON p.event_id = g.prev_event_id"
        " WHERE p.event_id IS NULL OR (p.outlier AND p.type <> ?)"
        " GROUP BY g.prev_event_id"
        " ORDER BY lowest, g.prev_event_id"
        " LIMIT ?",
        (room_id, scan, EventTypes.CREATE, limit),
    )
    return [str(r[0]) for r in rows]


def _servers_txn(txn: Transaction, room_id: str) -> tuple[str | None, list[str]]:
    """The room creator (the create event's sender, from the current state) and the
    joined members now."""
    row = txn.query_one(
        "SELECT e.sender FROM current_state_events AS c"
        " JOIN events AS e ON e.event_id = c.event_id"
        " WHERE c.room_id = ? AND c.type = ? AND c.state_key = ''",
        (room_id, EventTypes.CREATE),
    )
    members = txn.query(
        "SELECT state_key FROM current_state_events"
        " WHERE room_id = ? AND type = ? AND membership = 'join'",
        (room_id, EventTypes.MEMBER),
    )
    return (None if row is None else str(row[0])), [str(r[0]) for r in members]


def _server_of(user_id: str) -> str:
    return user_id.partition(":")[2]


class _Deadline:
    """What is left of one backfill's time."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.end = clock() + seconds

    def left(self) -> float:
        return self.end - self.clock()


class _BoundedRequester:
    """The federation client with every request cut to what is left of a deadline
    (:class:`GapFiller` asks without a time-out of its own)."""

    def __init__(self, client: FederationRequester, deadline: _Deadline) -> None:
        self.client = client
        self.deadline = deadline

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (GapFiller's interface)
    ) -> Any:
        left = min(timeout, self.deadline.left())
        if left <= 0:
            raise TimeoutError(f"backfill's time is up before asking {destination}")
        return await self.client.request(
            method, destination, path, query=query, content=content, timeout=left
        )


class FederationBackfill:
    """:class:`roomstream.client.remote_history.RemoteHistory` over federation."""

    def __init__(
        self,
        engine: RoomEngine,
        client: FederationRequester,
        *,
        timeout: float = 15.0,  # a budget for all requests of one page
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.client = client
        self.timeout = timeout
        self.clock = clock
        self.server_name = engine.server_name
        #: room ID -> extremities whose backfill brought nothing new.
        self._fruitless: LruCache[str, frozenset[str]] = LruCache(
            "backfill_fruitless", FRUITLESS_ROOMS
        )
        #: room ID -> the backfill of it under way.
        self._running: dict[str, asyncio.Future[int]] = {}

    async def backward_extremities(self, room_id: str) -> list[str]:
        """The lowest backward extremities of the room not known to be fruitless."""
        found = await self.engine.db.run_interaction(
            "backward_extremities",
            backward_extremities_txn,
            room_id,
            MAX_EXTREMITIES + len(self._fruitless.get(room_id) or ()),
        )
        fruitless = self._fruitless.get(room_id) or frozenset()
        return [e for e in found if e not in fruitless][:MAX_EXTREMITIES]

    async def servers_to_ask(self, room_id: str) -> list[str]:
        """The servers in the room, this one excluded, most likely to hold its history
        first: the creator's, then by number of joined members (ties by name)."""
        creator, members = await self.engine.db.run_interaction(
            "backfill_servers", _servers_txn, room_id
        )
        counts = Counter(s for s in map(_server_of, members) if s)
        ordered = sorted(counts, key=lambda s: (-counts[s], s))
        if creator is not None and _server_of(creator):
            ordered = [_server_of(creator), *(s for s in ordered if s != _server_of(creator))]
        return [s for s in ordered if s != self.server_name]

    async def backfill(self, room_id: str, limit: int) -> int:
        """Fetch and persist up to ``limit`` events older than what is stored of the
        room; the number of events newly stored. No backward extremities: no request.
        Errors of the servers asked are logged and the next one tried; none answering
        gives 0.

        One backfill of a room at a time per process: a caller arriving while one runs
        waits for it and gets its count (many clients at the top of a room cost one
        request); a caller that gives up (its time-out) does not stop it for others."""
        running = self._running.get(room_id)
        if running is None:
            running = asyncio.ensure_future(self._backfill(room_id, limit))
            self._running[room_id] = running
            running.add_done_callback(lambda _: self._running.pop(room_id, None))
        return await asyncio.shield(running)

    async def _backfill(self, room_id: str, limit: int) -> int:
        extremities = await self.backward_extremities(room_id)
        if not extremities:
            return 0
        deadline = _Deadline(self.timeout, self.clock)
        client = _BoundedRequester(self.client, deadline)
        limit = max(1, min(limit, MAX_LIMIT))
        for server in (await self.servers_to_ask(room_id))[:MAX_SERVERS]:
            try:
                answer = await client.request(
                    "GET",
                    server,
                    f"/_matrix/federation/v1/backfill/{quote(room_id, safe='')}",
                    query={"v": extremities, "limit": str(limit)},
                )
            # Whatever one server does wrong (down, refusing, garbage), the page is
            # served from what is stored: the next server is tried, or nothing is added.
            except Exception as exc:
                logger.info("backfill of %s from %s failed: %s", room_id, server, exc)
                continue
            stored = await self._store(client, deadline, server, room_id, answer)
            if stored == 0:
                fruitless = self._fruitless.get(room_id) or frozenset()
                self._fruitless.set(room_id, fruitless | set(extremities))
            return stored
        return 0

    async def _store(
        self,
        client: _BoundedRequester,
        deadline: _Deadline,
        server: str,
        room_id: str,
        answer: Any,
    ) -> int:
        pdus = answer.get("pdus") if isinstance(answer, dict) else None
        if not isinstance(pdus, list):
            logger.info("backfill answer of %s for %s holds no pdus", server, room_id)
            return 0
        version = await self.engine.store.get_room_version(room_id)
        if version is None:
            return 0
        parsed: dict[str, Event] = {}
        for pdu in pdus:
            if not isinstance(pdu, dict):
                continue
            try:
                event = await self.engine.parse_received(pdu_bytes(pdu), version)
            except Exception:  # a malformed event is left out, as Synapse
                logger.info("skipping a malformed backfilled event from %s", server)
                continue
            # (Checked on the parsed event: a v12 create event names its room by its ID.)
            if event.room_id == room_id:
                parsed[event.event_id] = event
        if not parsed:
            return 0
        prevs = {p for e in parsed.values() for p in e.prev_event_ids}
        meta = await self.engine.store.get_meta([*parsed, *prevs])
        with_state = {i for i, m in meta.items() if not m.outlier}
        fresh = sorted(
            (e for e in parsed.values() if e.event_id not in meta),
            key=lambda e: (e.depth, e.event_id),
        )
        stored = await self._persist_with_state(client, deadline, server, fresh, with_state)
        outliers = [i for i in parsed if i in meta and meta[i].outlier]
        return stored + await self._redecide(server, outliers)

    async def _redecide(self, server: str, event_ids: Sequence[str]) -> int:
        """Answered events this server holds as outliers (after a remote join: the state
        ``send_join`` gave, down to the create event) decided again as history, with
        the events below them now stored; the number that joined the timeline."""
        if not event_ids:
            return 0
        meta = await self.engine.store.get_meta(event_ids)
        still = [i for i in event_ids if i in meta and meta[i].outlier]
        if not still:
            return 0
        stored = await self.engine.store.get_events(still)
        # The create event below them, held as an outlier too, is not always answered
        # (it lies below what was asked for): it has no prev events, so it can be.
        below = {p for e in stored.values() for p in e.prev_event_ids} - set(stored)
        below_meta = await self.engine.store.get_meta(below)
        held = await self.engine.store.get_events([i for i, m in below_meta.items() if m.outlier])
        stored.update((i, e) for i, e in held.items() if e.type == EventTypes.CREATE)
        still = list(stored)
        try:
            await self.engine.receive_pdus([], backfilled=True, redecide=list(stored.values()))
        except Exception as exc:  # as for a refused batch: served as stored
            logger.info("outliers answered by %s not decided again: %s", server, exc)
            return 0
        after = await self.engine.store.get_meta(still)
        return sum(1 for m in after.values() if not m.outlier)

    async def _persist(
        self, server: str, events: Sequence[Event], given: Mapping[str, list[StateMap]]
    ) -> int | None:
        """Persist events as history; the number new, None if the batch was refused."""
        if not events:
            return 0
        try:
            results = await self.engine.receive_pdus(
                [e.raw for e in events], backfilled=True, state_before=given
            )
        except Exception as exc:  # e.g. one bad signature refuses the batch
            logger.info("backfilled events from %s not stored: %s", server, exc)
            return None
        return sum(1 for r in results if r.new)

    async def _persist_with_state(
        self,
        client: _BoundedRequester,
        deadline: _Deadline,
        server: str,
        fresh: Sequence[Event],
        with_state: set[str],
    ) -> int:
        """Persist ``fresh`` (oldest first) as history, each with state; the number
        stored. An event is left out when a missing prev event's state cannot be had or
        a prev event was left out.

        Before a state is fetched, the events accepted so far are persisted: the state
        may name them (the state before a message names the visibility event just below
        it), and must then find them stored with state rather than fetch them as
        outliers; and persisting them may give a stored outlier above them its state
        (the persister decides it again), which spares the fetch."""
        gaps = GapFiller(self.engine, client)
        states: dict[str, StateMap] = {}
        failed: set[str] = set()
        fetches = 0
        stored = 0
        pending: list[Event] = []
        given: dict[str, list[StateMap]] = {}
        accepted_ids: set[str] = set()
        skipped: set[str] = set()
        for event in fresh:
            missing = [
                p for p in event.prev_event_ids if p not in with_state and p not in accepted_ids
            ]
            if any(p in skipped or p in failed for p in missing):
                skipped.add(event.event_id)
                continue
            if any(p not in states for p in missing) and pending:
                count = await self._persist(server, pending, given)
                if count is None:
                    return stored
                stored += count
                pending, given = [], {}
                meta = await self.engine.store.get_meta(missing)
                with_state.update(i for i, m in meta.items() if not m.outlier)
                missing = [p for p in missing if p not in with_state]
            event_states: list[StateMap] | None = []
            for prev in missing:
                if prev not in states:
                    if fetches >= MAX_STATE_FETCHES or deadline.left() <= 0:
                        event_states = None
                        break
                    fetches += 1
                    try:
                        states[prev] = await gaps.state_after(server, event.room_id, prev)
                    except Exception as exc:  # the event is left out
                        logger.info("no state at %s from %s: %s", prev, server, exc)
                        failed.add(prev)
                        event_states = None
                        break
                assert event_states is not None
                event_states.append(states[prev])
            if event_states is None:
                skipped.add(event.event_id)
                continue
            if event_states:
                given[event.event_id] = event_states
            pending.append(event)
            accepted_ids.add(event.event_id)
        count = await self._persist(server, pending, given)
        return stored + (count or 0)
