"""Persisting events: orderings, DAG edges, authorization, state before and after each
event, forward extremities and current state, in one transaction per batch.

Per room, persistence is serialised by a lock; different rooms proceed in parallel.
A batch may hold events of many rooms in any order: each room's events are sorted so
that every event follows its prev and auth events.

What happens to an event (the spec's checks on receipt, in order):

1. its own auth events are checked (``check_auth_events_list`` + the rules): failing that
   it is *rejected*;
2. if all its prev events are known, the state before it is computed (resolving the prev
   events' states when they differ) and it is checked against that state: failing that it
   is *rejected*; if some prev events are unknown it is stored as an *outlier* (no state);
3. a received (not local, not backfilled) event is also checked against the room's current
   state: failing that it is *soft-failed* — stored, given state, but never a forward
   extremity nor part of current state.

Rejected events are stored with their reason and no state of their own (the state after
them is the state before them).

A stored outlier whose prev events arrive later (all of them with state) is decided again
as a received event, with all three checks, and gets its state (as Synapse does when it
persists an outlier again in the timeline); it moves to the new batch's stream ordering.
Every change of a room's current state is one ``current_state_delta_stream`` row at the
stream ordering of the event that made it, and redactions apply in persistence order (the
first one persisted wins): a batch stores exactly what persisting its events one at a
time would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from roomstream.errors import AuthError, UnknownRoomError
from roomstream.events.auth import (
    auth_types_for_event,
    check_auth_events_list,
    check_auth_rules,
    redaction_applies,
)
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion, room_version
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.metrics import observe_persisted, persist_timer
from roomstream.rooms.participants import PersistParticipant, TimelineInput
from roomstream.rooms.store import (
    EventMeta,
    EventStore,
    chunks,
    current_state_txn,
    load_events_txn,
    placeholders,
    state_groups_txn,
)
from roomstream.rooms.transaction_ids import TransactionKey as TransactionKey
from roomstream.rooms.transaction_ids import record_txn as record_transaction_ids_txn
from roomstream.state.auth_chain_index import AuthChainIndex, ChainLink, ChainPosition
from roomstream.state.cooperative import cooperate, off_loop
from roomstream.state.groups import (
    StateGroupWriter,
    StateMap,
    get_state_entry_txn,
    get_state_txn,
    state_delta,
)
from roomstream.state.resolution import (
    ResolutionMemo,
    effective_auth_event_ids,
    resolve_state_detailed,
)
from roomstream.storage import Transaction
from roomstream.streams import StreamSet

logger = logging.getLogger(__name__)

CREATE_KEY: StateKey = (EventTypes.CREATE, "")


@dataclass(eq=False)
class PendingGroup:
    """A state group to create in the persist transaction: ``parent`` plus ``delta``.

    After its transaction commits the object lives on (with ``group_id`` set) wherever it
    is referenced, for its *lineage*: following ``parent`` links from two groups to their
    nearest common ancestor names every key on which their states can differ (see
    :func:`_changed_keys`). Invariant: the state of this group is exactly the state of
    ``parent`` with ``delta`` applied. Lineage is trimmed to a bounded length
    (:data:`LINEAGE_KEEP`) so a long-lived room does not keep its whole history alive.
    """

    parent: GroupRef
    delta: dict[StateKey, str | None]
    #: The parent's full state, when known in memory (saves a read if a copy is due).
    parent_state: StateMap | None = None
    #: This group's full state while it is not yet stored.
    state: StateMap | None = None
    group_id: int | None = None
    #: Steps from the first group of the lineage (only grows along parent links).
    generation: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        parent = self.parent
        self.generation = parent.generation + 1 if isinstance(parent, PendingGroup) else 1
        if self.generation % LINEAGE_KEEP == 0:
            _trim_lineage(self)


GroupRef = int | PendingGroup | None
"""An existing state group, one about to be created, or None (the empty state)."""

#: Lineage is cut every this many generations, keeping between one and two times as many.
LINEAGE_KEEP = 256


def _trim_lineage(group: PendingGroup) -> None:
    """Cut the lineage ``LINEAGE_KEEP`` steps above ``group`` where it is already stored
    (a stored parent is named by its ID instead of its object, which ends the walk)."""
    ancestor: GroupRef = group
    for _ in range(LINEAGE_KEEP):
        if not isinstance(ancestor, PendingGroup):
            return
        ancestor = ancestor.parent
    if isinstance(ancestor, PendingGroup) and ancestor.group_id is not None:
        parent = ancestor.parent
        if isinstance(parent, PendingGroup) and parent.group_id is not None:
            ancestor.parent = parent.group_id


class _Walk:
    """A walk up one group's lineage, one step at a time.

    ``nodes[i]`` is the group ``i`` steps up; ``deltas[i]`` (the keys of a delta) turns the
    state of ``nodes[i + 1]`` into that of ``nodes[i]``; ``index`` maps a node to ``i``.
    """

    __slots__ = ("deltas", "index", "nodes", "ref")

    def __init__(self, ref: GroupRef) -> None:
        self.ref = ref
        self.nodes = [_group_key(ref)]
        self.deltas: list[Iterable[StateKey]] = []
        self.index = {self.nodes[0]: 0}

    def step(self) -> bool:
        """Go one group up; False at the end of the known lineage or the walk limit."""
        ref = self.ref
        if not isinstance(ref, PendingGroup) or len(self.deltas) >= 2 * LINEAGE_KEEP:
            return False
        self.deltas.append(ref.delta.keys())
        self.ref = ref.parent
        node = _group_key(self.ref)
        self.index.setdefault(node, len(self.nodes))
        self.nodes.append(node)
        return True


def _meet(first: _Walk, other: _Walk) -> tuple[int, int] | None:
    """Steps up ``first`` and ``other`` to their nearest common group, walking both in
    turn so the cost follows the distance to it (forks are usually short)."""
    while True:
        meet = first.index.get(other.nodes[-1])
        if meet is not None:
            return meet, len(other.nodes) - 1
        meet = other.index.get(first.nodes[-1])
        if meet is not None:
            return len(first.nodes) - 1, meet
        stepped_first = first.step()
        stepped_other = other.step()
        if not (stepped_first or stepped_other):
            return None


def _changed_keys(refs: Sequence[GroupRef]) -> set[StateKey] | None:
    """A superset of the keys on which the states of ``refs`` differ, or None if their
    lineages do not meet. The keys changed on the way from a common ancestor to each: any
    other key has the ancestor's value in every one of them."""
    first = _Walk(refs[0])
    changed: set[StateKey] = set()
    top = 0  # the common ancestor of all is first.nodes[top]
    for ref in refs[1:]:
        other = _Walk(ref)
        meet = _meet(first, other)
        if meet is None:
            return None
        on_first, on_other = meet
        changed.update(*other.deltas[:on_other])
        top = max(top, on_first)
    changed.update(*first.deltas[:top])
    return changed


@dataclass(frozen=True, slots=True)
class PersistedEvent:
    """The outcome of persisting one event."""

    event_id: str
    stream_ordering: int
    rejected_reason: str | None = None
    soft_failed: bool = False
    outlier: bool = False
    #: False if the event was already stored (persisting twice is a no-op).
    new: bool = True
    #: Its content hash did not match, so its redacted form was stored (set by the
    #: receive path, which makes that decision; see ``RoomEngine.receive_pdus``).
    redacted_on_receipt: bool = False


@dataclass(eq=False)
class _Context:
    event: Event
    outlier: bool
    rejected_reason: str | None = None
    soft_failed: bool = False
    before: GroupRef = None
    after: GroupRef = None
    state_after: StateMap | None = None
    chain: tuple[ChainPosition, list[ChainLink]] | None = None
    #: Chains of stored events this event's auth events named that were not indexed when
    #: stored (out-of-band memberships: see :meth:`EventPersister._index_stored`), added
    #: to the index for this event and committed with it.
    stored_chains: list[tuple[ChainPosition, list[ChainLink]]] = field(default_factory=list)
    #: A stored outlier decided again now that its prev events have state.
    revisit: bool = False
    #: An out-of-band membership (see ``persist_events``).
    out_of_band: bool = False
    #: How this event changed the room's current state: key -> (new, previous) event ID.
    #: One entry per change, in persistence order (the delta stream's rows).
    current_delta: dict[StateKey, tuple[str | None, str | None]] | None = None


@dataclass
class _Room:
    """What the persister keeps in memory about a room between batches."""

    room_id: str
    version: RoomVersion
    #: Forward extremity -> the state group after it (None for outliers, never stored).
    extremities: dict[str, GroupRef]
    current: StateMap
    current_group: GroupRef
    index: AuthChainIndex
    #: Set when a batch built on this in-memory state failed to commit.
    poisoned: bool = False
    memo: ResolutionMemo = field(default_factory=ResolutionMemo)


@dataclass(eq=False)
class _Pending:
    """Events of one room, decided and waiting for the committer."""

    room: _Room
    contexts: list[_Context]
    backfilled: bool
    new_extremities: set[str] | None
    new_current: tuple[GroupRef, StateMap] | None
    old_current: StateMap
    results: dict[str, PersistedEvent]
    future: asyncio.Future[dict[str, PersistedEvent]]
    #: Event ID -> (user, device, transaction ID) of a client send, recorded in the
    #: event's own transaction (see ``prepare_room_locked``).
    transaction_ids: Mapping[str, TransactionKey] = field(default_factory=dict)


#: Most events the committer writes in one transaction (``persist_events`` cuts bigger
#: batches of a room into parts of at most this many).
MAX_COMMIT_EVENTS = 1000
#: Most work (:func:`_commit_work`: events plus state rows) the committer puts in one
#: transaction; a single batch above it is committed alone. This bounds how long the
#: commits of other rooms wait behind one expensive batch.
MAX_COMMIT_WORK = 4000


def _commit_work(p: _Pending) -> int:
    """Roughly the rows committing ``p`` writes: one per event, plus one per key of each
    new state group's delta (a merge in a big room can change thousands of keys)."""
    work = len(p.contexts)
    seen: set[int] = set()
    for ctx in p.contexts:
        for ref in (ctx.before, ctx.after):
            if isinstance(ref, PendingGroup) and ref.group_id is None and id(ref) not in seen:
                seen.add(id(ref))
                work += len(ref.delta)
    return work


_GroupKey = tuple[str, int | None]


def _group_key(ref: GroupRef) -> _GroupKey:
    """Identifies a state group, stored or not, within one batch."""
    if isinstance(ref, PendingGroup):
        if ref.group_id is not None:
            return ("group", ref.group_id)
        return ("pending", id(ref))  # alive for the whole batch, so the id is stable
    return ("group", ref)


def _group_id(ref: GroupRef) -> int | None:
    if isinstance(ref, PendingGroup):
        if ref.group_id is None:
            raise RuntimeError("state group used before it was created")
        return ref.group_id
    return ref


def _relates_to(event: Event) -> str | None:
    relation = event.content.get("m.relates_to")
    if isinstance(relation, dict):
        target = relation.get("event_id")
        if isinstance(target, str):
            return target
    return None


class EventPersister:
    """Persists events for the local instance (a writer of the ``events`` stream).

    ``server_name`` is this server's name, which decides how redactions of its own users'
    events are judged (:func:`roomstream.events.auth.redaction_applies`); a bulk import of
    another server's history passes None (no sender is local). Required, so that no
    caller judges its own users as remote by forgetting it."""

    def __init__(
        self,
        store: EventStore,
        streams: StreamSet,
        instance_name: str,
        *,
        participants: Sequence[PersistParticipant] = (),
        server_name: str | None,
        room_cache_size: int = 512,
        state_cache_size: int = 64,
    ) -> None:
        self.store = store
        self.db = store.db
        self.streams = streams
        self.instance_name = instance_name
        #: This server's name: its users' redactions apply only to their own events (or
        #: with the redact level); None (an import of events received from elsewhere):
        #: every sender is judged as a remote one (see ``redaction_applies``).
        self.server_name = server_name
        # Only rooms being written hold a lock: every holder and waiter references it, so
        # mutual exclusion is kept, and it goes once the last of them lets go (a lock per
        # room ever written would grow with the rooms forever).
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._rooms: LruCache[str, _Room] = LruCache("persist_rooms", room_cache_size)
        #: str(state group ID) -> its state map
        self._states: LruCache[str, StateMap] = LruCache("persist_states", state_cache_size)
        # Decided but not yet committed: the queue, and its events by ID (later events
        # are built on top of them before they are stored).
        self._queue: list[_Pending] = []
        self._uncommitted: dict[str, Event] = {}
        self._committer: asyncio.Task[None] | None = None
        #: What else records in each batch's transaction (see rooms.participants).
        self.participants: tuple[PersistParticipant, ...] = tuple(participants)

    def room_lock(self, room_id: str) -> asyncio.Lock:
        lock = self._locks.get(room_id)
        if lock is None:
            lock = self._locks[room_id] = asyncio.Lock()
        return lock

    # -- public API ------------------------------------------------------------------

    async def persist_events(
        self,
        events: Sequence[Event],
        *,
        backfilled: bool = False,
        local: bool = False,
        outliers: bool = False,
        state_before: Mapping[str, Sequence[StateMap]] | None = None,
        out_of_band: bool = False,
        redecide: Sequence[Event] = (),
    ) -> list[PersistedEvent]:
        """Persist events of any rooms, in any order; results follow the input order.

        ``out_of_band``: membership events of local users in rooms this server does not
        hold (an invite from another server): stored as outliers without any check but
        the caller's (signatures), and, when the room is not held here (no create event
        stored), made the user's membership in the room's current state, so that the
        read side sees the invite (as Synapse's out-of-band memberships). The room gets
        a ``rooms`` row (creator unknown: empty). In a room held here, a plain outlier.

        ``outliers``: store every event as an outlier, whatever its prev events (events
        fetched for their own sake, e.g. the state at a gap: the spec's outliers).
        ``state_before``: event ID -> the room's states after its prev events that are
        not known here, as another server vouched for them (the state at a gap in the
        DAG): such an event is then not an outlier but gets the resolution of those
        states and of the states after its known prev events, and is checked against it
        like any other. The state events named must be stored (as outliers, say).
        ``redecide``: stored outliers (of the rooms of ``events``, or alone) to decide
        again with the batch, as those whose prev events arrive are (and their outlier
        descendants): backfill reaching events stored as outliers before (the state
        ``send_join`` gave, down to the create event). Those still without state stay
        as stored; they have no result.
        """
        by_room: dict[str, list[Event]] = defaultdict(list)
        for event in events:
            by_room[event.room_id].append(event)
        redecide_by_room: dict[str, list[Event]] = defaultdict(list)
        for event in redecide:
            redecide_by_room[event.room_id].append(event)
            by_room.setdefault(event.room_id, [])
        results: dict[str, PersistedEvent] = {}

        async def one_room(room_id: str, room_events: list[Event]) -> None:
            # A big batch is cut into consecutive parts (which changes nothing, see
            # topological_order) so that no one commit of it is unbounded.
            parts = [room_events]
            if len(room_events) > MAX_COMMIT_EVENTS:
                ordered = topological_order(room_events)
                parts = [
                    ordered[i : i + MAX_COMMIT_EVENTS]
                    for i in range(0, len(ordered), MAX_COMMIT_EVENTS)
                ]
            async with self.room_lock(room_id):
                waiting = [
                    await self.prepare_room_locked(
                        room_id,
                        part,
                        backfilled,
                        local,
                        outliers=outliers,
                        state_before=state_before,
                        out_of_band=out_of_band,
                        redecide=redecide_by_room.get(room_id, ()) if n == 0 else (),
                    )
                    for n, part in enumerate(parts)
                ]
            for future in waiting:
                results.update(await future)

        await asyncio.gather(*(one_room(r, evs) for r, evs in by_room.items()))
        return [results[e.event_id] for e in events]

    async def persist_room_locked(
        self, room_id: str, events: Sequence[Event], backfilled: bool, local: bool
    ) -> dict[str, PersistedEvent]:
        """Persist events of one room and wait for the commit; the caller holds the lock."""
        return await (await self.prepare_room_locked(room_id, events, backfilled, local))

    async def prepare_room_locked(
        self,
        room_id: str,
        events: Sequence[Event],
        backfilled: bool,
        local: bool,
        *,
        transaction_ids: Mapping[str, TransactionKey] | None = None,
        outliers: bool = False,
        state_before: Mapping[str, Sequence[StateMap]] | None = None,
        out_of_band: bool = False,
        redecide: Sequence[Event] = (),
    ) -> asyncio.Future[dict[str, PersistedEvent]]:
        """Decide the fate and state of events of one room and queue them for commit.
        (``redecide``: see :meth:`persist_events`.)

        ``transaction_ids``: event ID -> (user, device, transaction ID) of local events
        sent by a client; each is stored in ``event_txn_ids`` in the same transaction as
        its event, so an event is never stored without the record that makes a retry of
        its send find it.

        The caller holds :meth:`room_lock` and may release it before awaiting the returned
        future: the room's in-memory state already includes these events, so the next
        events of the room can be built on top of them while they commit. If their commit
        fails, the future raises, and so does every later queued batch of the room.
        """
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        unique = list({e.event_id: e for e in events}.values())
        results: dict[str, PersistedEvent] = {}
        queued = {e.event_id for e in unique if e.event_id in self._uncommitted}
        if not local:
            # Local events were just built: their IDs hash prev events that only now exist.
            for event_id, meta in (await self.store.get_meta([e.event_id for e in unique])).items():
                results[event_id] = PersistedEvent(
                    event_id,
                    meta.stream_ordering,
                    meta.rejected_reason,
                    meta.soft_failed,
                    meta.outlier,
                    new=False,
                )
        fresh = [e for e in unique if e.event_id not in results and e.event_id not in queued]
        future: asyncio.Future[dict[str, PersistedEvent]] = loop.create_future()
        if queued:
            # Already on its way to the database from another caller: wait for that.
            others = [
                p.future for p in self._queue if queued & {c.event.event_id for c in p.contexts}
            ]
            for other in others:
                done = await asyncio.shield(other)
                results.update((k, v) for k, v in done.items() if k in queued)
        if not fresh and not redecide:
            future.set_result(results)
            return future
        room = await self._load_room(room_id, fresh, out_of_band=out_of_band)
        # Stored outliers whose prev events arrive now are decided again, with state.
        revisits = [] if local else await self._outliers_to_revisit(room_id, fresh)
        if redecide and not local:
            # Only what is stored as an outlier now (a stored timeline event is never
            # decided twice), and the outliers below it.
            stored = await self.store.get_meta([e.event_id for e in redecide])
            redecide = [e for e in redecide if e.event_id in stored and stored[e.event_id].outlier]
            below = await self._outliers_to_revisit(room_id, redecide) if redecide else []
            unique_revisits = {e.event_id: e for e in [*revisits, *redecide, *below]}
            revisits = list(unique_revisits.values())
        try:
            contexts, new_extremities, new_current = await self._compute_contexts(
                room,
                topological_order(fresh + revisits),
                backfilled,
                local,
                {e.event_id for e in revisits},
                outliers=outliers,
                given_states=state_before or {},
                out_of_band=out_of_band,
            )
        except BaseException:
            # The chain index may hold part of the batch: reload the room next time.
            self._forget_room(room)
            raise
        if not contexts:
            # Only outliers to decide again, all still without state: nothing to commit.
            future.set_result(results)
            return future
        if room.poisoned:
            raise RuntimeError(f"an earlier batch of {room_id} failed to commit; retry")
        pending = _Pending(
            room,
            contexts,
            backfilled,
            None if new_extremities is None else set(new_extremities),
            new_current,
            room.current,
            results,
            future,
            dict(transaction_ids or {}),
        )
        # The room now includes these events, for whatever is built on it next.
        if new_extremities is not None:
            room.extremities = new_extremities
        if new_current is not None:
            room.current_group, room.current = new_current
        for ctx in contexts:
            self._uncommitted[ctx.event.event_id] = ctx.event
        self._queue.append(pending)
        if self._committer is None or self._committer.done():
            self._committer = loop.create_task(self._commit_loop())
        future.add_done_callback(persist_timer(started))
        return future

    async def _outliers_to_revisit(self, room_id: str, fresh: Sequence[Event]) -> list[Event]:
        """Stored outliers of the room that descend from ``fresh`` through prev events.

        As Synapse does when an outlier is later persisted in the timeline, they are
        decided again as received events (auth, state, soft failure) once all their prev
        events have state; the walk follows outliers only (an event below an outlier is
        an outlier too).
        """
        for p in list(self._queue):
            # Outliers of this room still queued are not in the database yet: let them land.
            if p.room.room_id == room_id and any(c.outlier for c in p.contexts):
                with contextlib.suppress(Exception):
                    await asyncio.shield(p.future)
        ids = await self.db.run_interaction(
            "outlier_descendants", _outlier_descendants_txn, room_id, [e.event_id for e in fresh]
        )
        if not ids:
            return []
        found = await self.store.get_events(ids)
        return [found[i] for i in ids if i in found]

    def _forget_room(self, room: _Room) -> None:
        room.poisoned = True
        if self._rooms.peek(room.room_id) is room:
            self._rooms.pop(room.room_id)

    async def _commit_loop(self) -> None:
        """Commit queued batches, many at once, in queue order."""
        while self._queue:
            backfilled = self._queue[0].backfilled
            batch: list[_Pending] = []
            count = work = 0
            # Bounded transactions: other rooms' commits wait for at most one of them.
            while self._queue and self._queue[0].backfilled == backfilled:
                next_work = _commit_work(self._queue[0])
                if batch and (
                    count + len(self._queue[0].contexts) > MAX_COMMIT_EVENTS
                    or work + next_work > MAX_COMMIT_WORK
                ):
                    break
                batch.append(self._queue.pop(0))
                count += len(batch[-1].contexts)
                work += next_work
            generator = self.streams.generator("backfill" if backfilled else "events")
            try:
                orderings, _ = await generator.run_with_ids(
                    "persist_events", count, self._commit_txn, batch
                )
            except BaseException as exc:
                failed_rooms = {p.room.room_id for p in batch}
                dependents = [p for p in self._queue if p.room.room_id in failed_rooms]
                self._queue = [p for p in self._queue if p.room.room_id not in failed_rooms]
                for p in batch + dependents:
                    self._forget_room(p.room)
                    for ctx in p.contexts:
                        self._uncommitted.pop(ctx.event.event_id, None)
                    if not p.future.done():
                        p.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            offset = 0
            for p in batch:
                self._after_commit(p, orderings[offset : offset + len(p.contexts)])
                offset += len(p.contexts)

    def _commit_txn(self, txn: Transaction, orderings: list[int], batch: list[_Pending]) -> None:
        offset = 0
        for p in batch:
            n = len(p.contexts)
            self._persist_txn(txn, orderings[offset : offset + n], p)
            offset += n

    def _after_commit(self, p: _Pending, orderings: list[int]) -> None:
        for ctx in p.contexts:
            self._uncommitted.pop(ctx.event.event_id, None)
            if isinstance(ctx.after, PendingGroup):
                # Stored now: keep its state in the group cache, not on the group object.
                ctx.after.parent_state = None
                if ctx.after.state is not None and ctx.after.group_id is not None:
                    self._states.set(str(ctx.after.group_id), ctx.after.state)
                ctx.after.state = None
        self.store.cache_events(ctx.event for ctx in p.contexts)
        for ctx, ordering in zip(p.contexts, orderings, strict=True):
            p.results[ctx.event.event_id] = PersistedEvent(
                ctx.event.event_id, ordering, ctx.rejected_reason, ctx.soft_failed, ctx.outlier
            )
            observe_persisted(p.room.version.identifier, bool(ctx.rejected_reason), ctx.soft_failed)
        if not p.future.done():
            p.future.set_result(p.results)

    async def get_room_state(self, room_id: str) -> tuple[RoomVersion, set[str], StateMap]:
        """The room's version, forward extremities and current state (from memory)."""
        room = await self._load_room(room_id, [])
        return room.version, set(room.extremities), room.current

    # -- loading ---------------------------------------------------------------------

    async def _load_room(
        self, room_id: str, batch: Sequence[Event], *, out_of_band: bool = False
    ) -> _Room:
        room: _Room | None = self._rooms.get(room_id)
        if room is not None:
            return room
        loaded = await self.db.run_interaction("load_room", _load_room_txn, room_id)
        if loaded is None:
            create = next((e for e in batch if e.type == EventTypes.CREATE), None)
            if create is None and out_of_band and batch:
                create = batch[0]  # only its room version is used
            if create is None:
                raise UnknownRoomError(room_id, " (and no create event in the batch)")
            version = create.room_version
            room = _Room(room_id, version, {}, {}, None, AuthChainIndex())
        else:
            version_id, extremities, current, positions, links = loaded
            index = await off_loop(
                len(positions) + len(links), AuthChainIndex.load, positions, links
            )
            room = _Room(room_id, room_version(version_id), {}, current, None, index)
            groups = await self.store.get_state_groups(extremities)
            room.extremities = {e: groups[e][1] if e in groups else None for e in extremities}
            if len(extremities) == 1:
                room.current_group = next(iter(room.extremities.values()))
        self._rooms.set(room_id, room)
        return room

    async def _state_of(self, ref: GroupRef, contexts: Mapping[str, _Context]) -> StateMap:
        if ref is None:
            return {}
        if isinstance(ref, PendingGroup):
            # Its state stays in memory until its batch has committed: a group ID is drawn
            # inside the commit transaction, and on PostgreSQL another connection cannot
            # read the group before that transaction commits.
            if ref.state is not None:
                return ref.state
            if ref.group_id is None:
                raise RuntimeError("pending state group without its state")
            ref = ref.group_id  # created and committed by an earlier batch
        cached: StateMap | None = self._states.get(str(ref))
        if cached is None:
            cached = await self.db.run_interaction("get_state", get_state_txn, ref)
            self._states.set(str(ref), cached)
        return cached

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        """Events by ID, including those queued for commit but not yet stored."""
        return await self._events(event_ids, {})

    async def _events(
        self, ids: Iterable[str], contexts: Mapping[str, _Context]
    ) -> dict[str, Event]:
        ids = list(ids)
        found = {i: contexts[i].event for i in ids if i in contexts}
        found.update((i, self._uncommitted[i]) for i in ids if i in self._uncommitted)
        rest = [i for i in ids if i not in found]
        if rest:
            found.update(await self.store.get_events(rest))
        return found

    # -- contexts --------------------------------------------------------------------

    async def _compute_contexts(
        self,
        room: _Room,
        events: list[Event],
        backfilled: bool,
        local: bool,
        revisits: Set[str] = frozenset(),
        *,
        outliers: bool = False,
        given_states: Mapping[str, Sequence[StateMap]] | None = None,
        out_of_band: bool = False,
    ) -> tuple[list[_Context], dict[str, GroupRef] | None, tuple[GroupRef, StateMap] | None]:
        """Decide each event's fate and state, in order, as if persisted one by one.

        Returns the contexts, and the room's new forward extremities and current state
        (None when unchanged). Backfilled events never change either. ``revisits`` are
        stored outliers decided again: those that still lack state are left as stored
        (no context), the others are decided as if received now.
        """
        contexts: dict[str, _Context] = {}
        ids = [e.event_id for e in events]
        referenced = {p for e in events for p in e.prev_event_ids} | {
            a for e in events for a in effective_auth_event_ids(e)
        }
        # Revisited outliers stay in: as long as they lack state, their stored verdict holds.
        referenced -= {i for i in ids if i not in revisits}
        # What the room's in-memory extremities answer needs no query; a local event's
        # auth events come from the current state, which holds no rejected events.
        prev_ids = {p for e in events for p in e.prev_event_ids} - set(ids)
        known_groups: dict[str, tuple[GroupRef, GroupRef]] = {
            e: (g, g) for e, g in room.extremities.items() if e in prev_ids and g is not None
        }
        rest = [r for r in prev_ids if r not in known_groups]
        if rest:
            known_groups.update(await self.store.get_state_groups(rest))
        rejected: set[str] = set()
        known_meta: dict[str, EventMeta] = {}
        if not local:
            known_meta = await self.store.get_meta(referenced)
            rejected = {i for i, m in known_meta.items() if m.rejected_reason is not None}
        # Events that a stored event with state, accepted, names as a prev can never be
        # extremities (as in Synapse, outliers, rejected and soft-failed events don't count:
        # they never take their prev events' place).
        named_as_prev: set[str] = (
            set() if local else await self.db.run_interaction("referenced", _referenced_txn, ids)
        )
        extremities: dict[str, GroupRef] = dict(room.extremities)
        current, current_group = room.current, room.current_group
        current_key: frozenset[_GroupKey] | None = None
        memo: dict[frozenset[_GroupKey], tuple[GroupRef, StateMap]] = {}
        changed = False

        room_unheld = CREATE_KEY not in room.current
        for event in events:
            await cooperate()  # a big batch must not hold the loop (other rooms wait)
            if out_of_band:
                # No checks (see persist_events); the membership becomes current state only
                # in a room not held here.
                ctx = _Context(event, outlier=True, out_of_band=True)
                contexts[event.event_id] = ctx
                if room_unheld and event.type == EventTypes.MEMBER and event.is_state():
                    member_key = event.state_tuple
                    new_state = dict(current)
                    new_state[member_key] = event.event_id
                    ctx.current_delta = {member_key: (event.event_id, current.get(member_key))}
                    current_group = PendingGroup(
                        current_group, {member_key: event.event_id}, current, new_state
                    )
                    current = new_state
                    changed = True
                continue
            revisit = event.event_id in revisits
            if revisit and not all(
                (p in contexts and not contexts[p].outlier) or p in known_groups
                for p in event.prev_event_ids
            ):
                continue  # still without state: its stored row stands
            ctx = _Context(event, outlier=False, revisit=revisit)
            contexts[event.event_id] = ctx
            # 1. The event's own auth events.
            auth_ids = effective_auth_event_ids(event)
            auth_by_id = await self._events(auth_ids, contexts)
            batch_rejected = {
                i
                for i in auth_ids
                if (contexts[i].rejected_reason if i in contexts else i in rejected)
            }
            # The event passed the rules with exactly these auth events (key -> event ID).
            passed_with: dict[StateKey, str] | None = None
            try:
                auth_map = check_auth_events_list(
                    event, auth_by_id, rejected_event_ids=batch_rejected
                )
                check_auth_rules(event, auth_map)
                passed_with = {k: e.event_id for k, e in auth_map.items()}
            except AuthError as exc:
                ctx.rejected_reason = exc.message
            # Only state events can be auth events, so only they need the auth chain
            # index; one chain per (type, state_key) keeps chains long and links few.
            if event.is_state() and event.event_id not in room.index:
                unindexed = [a for a in auth_ids if a not in room.index and a not in contexts]
                if unindexed:
                    await self._index_stored(room, unindexed, contexts, ctx.stored_chains)
            if (
                event.is_state()
                and event.event_id not in room.index
                and all(a in room.index for a in auth_ids)
            ):
                ctx.chain = room.index.add_event(
                    event.event_id, auth_ids, chain_key=event.state_tuple
                )

            if outliers and not revisit:
                ctx.outlier = True  # fetched for its own sake: no state (see persist_events)
                continue
            # 2. The state before it, if every prev event has state.
            prevs = event.prev_event_ids
            prev_groups: list[GroupRef] = []
            for prev in prevs:
                if prev in contexts and not contexts[prev].outlier:
                    prev_groups.append(contexts[prev].after)
                elif prev in known_groups:
                    prev_groups.append(known_groups[prev][1])
            given = None if given_states is None else given_states.get(event.event_id)
            at_gap = False
            if event.type == EventTypes.CREATE and not prevs:
                state_before: StateMap = {}
            elif given and prevs and len(prev_groups) < len(prevs):
                # A gap: the states after the missing prev events come from elsewhere
                # (fresh groups), resolved with the states after the known ones.
                gaps: list[GroupRef] = [PendingGroup(None, dict(g), {}, dict(g)) for g in given]
                at_gap = True
                ctx.before, state_before = await self._state_before(
                    room, [*gaps, *prev_groups], contexts, memo
                )
            elif not prevs or len(prev_groups) < len(prevs):
                ctx.outlier = True
                continue
            else:
                ctx.before, state_before = await self._state_before(
                    room, prev_groups, contexts, memo
                )
            # Local events were authorized against this very state by their creator (under
            # the room lock); everything else is checked against the state before it.
            if ctx.rejected_reason is None and not (local and state_before is current):
                ctx.rejected_reason = await self._auth_against(
                    room, event, state_before, contexts, passed_with
                )
            # 3. Soft failure against the current state, for events from elsewhere.
            # (Against the same state it would repeat the check above.)
            if (
                ctx.rejected_reason is None
                and not local
                and not backfilled
                and state_before is not current
            ):
                against = current
                if at_gap:
                    # The state at a gap holds what happened on the other side of it: the
                    # room's state is that resolved with the current one (as Synapse's
                    # soft-failure check does), else an event after a membership change
                    # we never saw would always fail.
                    _, against = await self._state_before(
                        room, [current_group, ctx.before], contexts, memo
                    )
                reason = await self._auth_against(room, event, against, contexts, passed_with)
                ctx.soft_failed = reason is not None

            # The state after it.
            if event.is_state() and ctx.rejected_reason is None:
                ctx.state_after = dict(state_before)
                ctx.state_after[event.state_tuple] = event.event_id
                ctx.after = PendingGroup(
                    ctx.before, {event.state_tuple: event.event_id}, state_before, ctx.state_after
                )
            else:
                ctx.after = ctx.before
                ctx.state_after = state_before

            # The room's extremities and current state after this event.
            if backfilled or ctx.rejected_reason or ctx.soft_failed:
                continue
            for prev in prevs:
                extremities.pop(prev, None)
            if not local:
                await self._drop_behind_failed(prevs, contexts, known_meta, extremities)
            if event.event_id not in named_as_prev:
                extremities[event.event_id] = ctx.after
            changed = True
            previous = current
            if len(extremities) == 1 and event.event_id in extremities:
                current_group, current = ctx.after, ctx.state_after
                current_key = frozenset([_group_key(ctx.after)])
            else:
                refs = await self._extremity_groups(extremities, contexts)
                key = frozenset(_group_key(r) for r in refs)
                # A message on one side of an open fork leaves every extremity's state as
                # it was, and so the resolved current state: don't resolve again.
                if key != current_key:
                    current_group, current = await self._state_before(room, refs, contexts, memo)
                    current_key = key
            if current is not previous:
                ctx.current_delta = _current_change(previous, current, state_before, ctx)
        if not changed:
            return list(contexts.values()), None, None
        return list(contexts.values()), extremities, (current_group, current)

    async def _index_stored(
        self,
        room: _Room,
        event_ids: Sequence[str],
        contexts: Mapping[str, _Context],
        added: list[tuple[ChainPosition, list[ChainLink]]],
    ) -> None:
        """Add stored state events of the room among ``event_ids`` that the auth chain
        index lacks (with the stored auth events they need, first) to it, their chains
        appended to ``added`` for the caller's commit.

        An out-of-band membership (an invite from another server, stored before this
        server held the room) is stored without checks, so without a chain: its auth
        events were unknown then. Once the room is joined they are known, and an event
        naming the membership as an auth event (the join, then every state event of that
        user) must be indexed, else state resolution cannot compare its auth chain.
        Events still missing an auth event are left out, as before."""
        seen: set[str] = set()
        stack: list[tuple[str, bool]] = [(i, False) for i in reversed(event_ids)]
        while stack:
            event_id, expanded = stack.pop()
            if event_id in room.index or event_id in contexts:
                continue
            found = (await self._events([event_id], contexts)).get(event_id)
            if found is None or not found.is_state() or found.room_id != room.room_id:
                continue
            parents = effective_auth_event_ids(found)
            if expanded:
                if all(p in room.index for p in parents):
                    added.append(
                        room.index.add_event(event_id, parents, chain_key=found.state_tuple)
                    )
                continue
            if event_id in seen:
                continue
            seen.add(event_id)
            stack.append((event_id, True))
            stack.extend((p, False) for p in parents if p not in room.index and p not in seen)

    async def _drop_behind_failed(
        self,
        prevs: Sequence[str],
        contexts: Mapping[str, _Context],
        known_meta: Mapping[str, EventMeta],
        extremities: dict[str, GroupRef],
    ) -> None:
        """As Synapse does: an accepted event that names soft-failed or rejected events as
        prev events also replaces *their* prev events as extremities (recursively through
        soft-failed and rejected ones), so a branch whose tip was soft-failed does not
        stay a forward extremity once something builds on that tip."""
        stack = list(prevs)
        seen: set[str] = set()
        while stack:
            event_id = stack.pop()
            if event_id in seen:
                continue
            seen.add(event_id)
            ctx = contexts.get(event_id)
            if ctx is not None:
                if not (ctx.soft_failed or ctx.rejected_reason is not None):
                    continue
                parents = ctx.event.prev_event_ids
            else:
                meta = known_meta.get(event_id)
                if meta is None:
                    meta = (await self.store.get_meta([event_id])).get(event_id)
                if meta is None or not (meta.soft_failed or meta.rejected_reason is not None):
                    continue
                found = await self._events([event_id], contexts)
                parents = found[event_id].prev_event_ids if event_id in found else []
            for parent in parents:
                extremities.pop(parent, None)
                stack.append(parent)

    async def _extremity_groups(
        self, extremities: Mapping[str, GroupRef], contexts: Mapping[str, _Context]
    ) -> list[GroupRef]:
        return [g for _, g in sorted(extremities.items()) if g is not None]

    async def _state_before(
        self,
        room: _Room,
        prev_groups: list[GroupRef],
        contexts: Mapping[str, _Context],
        memo: dict[frozenset[_GroupKey], tuple[GroupRef, StateMap]] | None = None,
    ) -> tuple[GroupRef, StateMap]:
        """The state after all of ``prev_groups``: shared, or resolved when they differ.

        ``memo`` (one per batch) remembers resolutions: a merge event's state before is
        usually the resolution that made the room's current state a moment earlier.
        """
        distinct = {_group_key(ref): ref for ref in prev_groups}
        refs = list(distinct.values())
        if not refs:
            return None, {}
        if len(refs) == 1:
            return refs[0], await self._state_of(refs[0], contexts)
        memo_key = frozenset(distinct)
        if memo is not None and memo_key in memo:
            return memo[memo_key]
        result = await self._resolve(room, refs, contexts)
        if memo is not None:
            memo[memo_key] = result
        return result

    async def _resolve(
        self, room: _Room, refs: list[GroupRef], contexts: Mapping[str, _Context]
    ) -> tuple[GroupRef, StateMap]:
        states = [await self._state_of(ref, contexts) for ref in refs]
        resolution = await resolve_state_detailed(
            room.room_id,
            room.version,
            states,
            _ResolutionStore(self, room, contexts),
            room.memo,
            candidate_keys=_changed_keys(refs),
        )
        resolved = resolution.state
        # Only decided keys can differ from any of the states (see Resolution).
        decided = sorted(resolution.decided)
        deltas = [
            {k: resolved.get(k) for k in decided if state.get(k) != resolved.get(k)}
            for state in states
        ]
        # Store the merge as a delta from the parent it differs least from.
        best = min(range(len(refs)), key=lambda i: len(deltas[i]))
        if not deltas[best]:
            return refs[best], states[best]
        return PendingGroup(refs[best], deltas[best], states[best], resolved), resolved

    async def _auth_against(
        self,
        room: _Room,
        event: Event,
        state: Mapping[StateKey, str],
        contexts: Mapping[str, _Context],
        passed_with: Mapping[StateKey, str] | None = None,
    ) -> str | None:
        """None if ``event`` passes the rules against ``state``, else the reason.

        ``passed_with``: auth events (key -> event ID) the event is known to pass with; when
        ``state`` selects exactly those, the rules would see the same input, so they are
        not run again (the usual case: a sender picks auth events from the state it has).
        """
        if event.type == EventTypes.CREATE:
            return None
        keys = auth_types_for_event(
            room.version, event.type, event.state_key, event.sender, event.content
        )
        keys.append(CREATE_KEY)
        wanted = {k: state[k] for k in keys if k in state}
        if passed_with is not None and wanted == passed_with:
            return None
        events = await self._events(wanted.values(), contexts)
        auth_events = {k: events[v] for k, v in wanted.items() if v in events}
        try:
            check_auth_rules(event, auth_events)
        except AuthError as exc:
            return exc.message
        return None

    # -- the transaction -------------------------------------------------------------

    def _persist_txn(self, txn: Transaction, orderings: list[int], p: _Pending) -> None:
        room, contexts = p.room, p.contexts
        new_extremities, new_current = p.new_extremities, p.new_current
        now = int(time.time() * 1000)
        # State groups, parents first (pending groups reference earlier ones).
        pending: list[PendingGroup] = []
        for ctx in contexts:
            for ref in (ctx.before, ctx.after):
                _collect_pending(ref, pending)
        if new_current is not None:
            _collect_pending(new_current[0], pending)
        groups = StateGroupWriter(txn, expected_groups=len(pending))
        for group in pending:
            group.group_id = groups.create(
                room.room_id, _group_id(group.parent), group.delta, group.parent_state
            )
        groups.finish()

        event_rows: list[tuple[Any, ...]] = []
        json_rows: list[tuple[str, str, str, bytes]] = []
        edge_rows: list[tuple[str, str]] = []
        auth_rows: list[tuple[str, str]] = []
        state_rows: list[tuple[str, int, int]] = []
        chain_rows: list[tuple[str, str, int, int]] = []
        link_rows: list[tuple[str, int, int, int, int]] = []
        redaction_rows: list[tuple[str, str]] = []
        revisit_rows: list[tuple[Any, ...]] = []
        unredactions: list[tuple[str]] = []
        for ctx, ordering in zip(contexts, orderings, strict=True):
            event = ctx.event
            if ctx.revisit:
                # An ex-outlier moves to this stream ordering, so that stream readers see
                # it again, now with state (its JSON, edges and auth edges are stored).
                revisit_rows.append(
                    (
                        ordering,
                        ctx.rejected_reason,
                        ctx.soft_failed,
                        now,
                        self.instance_name,
                        event.event_id,
                    )
                )
                if ctx.rejected_reason is not None and event.redacts is not None:
                    unredactions.append((event.event_id,))
            else:
                event_rows.append(
                    (
                        ordering,
                        event.depth,
                        event.event_id,
                        room.room_id,
                        event.type,
                        event.state_key,
                        event.sender,
                        event.redacts,
                        _relates_to(event),
                        event.membership,
                        ctx.outlier,
                        ctx.rejected_reason,
                        ctx.soft_failed,
                        event.origin_server_ts,
                        now,
                        self.instance_name,
                    )
                )
                json_rows.append((event.event_id, room.room_id, room.version.identifier, event.raw))
                edge_rows.extend((event.event_id, p) for p in event.prev_event_ids)
                auth_rows.extend((event.event_id, a) for a in event.auth_event_ids)
            if not ctx.outlier:
                before, after = _group_id(ctx.before), _group_id(ctx.after)
                if after is not None:
                    state_rows.append(
                        (event.event_id, before if before is not None else after, after)
                    )
            for position, links in [
                *ctx.stored_chains,
                *([] if ctx.chain is None else [ctx.chain]),
            ]:
                chain_rows.append(
                    (position.event_id, room.room_id, position.chain_id, position.sequence_number)
                )
                link_rows.extend(
                    (
                        room.room_id,
                        link.origin_chain_id,
                        link.origin_sequence_number,
                        link.target_chain_id,
                        link.target_sequence_number,
                    )
                    for link in links
                )
            if event.redacts is not None and ctx.rejected_reason is None:
                redaction_rows.append((event.event_id, event.redacts))
            if ctx.out_of_band:
                txn.execute(
                    "INSERT INTO rooms (room_id, room_version, creator) VALUES (?, ?, ?)"
                    " ON CONFLICT (room_id) DO NOTHING",
                    (room.room_id, room.version.identifier, ""),
                )
            if event.type == EventTypes.CREATE and ctx.rejected_reason is None:
                creator = event.content.get("creator", event.sender)
                txn.execute(
                    "INSERT INTO rooms (room_id, room_version, creator) VALUES (?, ?, ?)"
                    " ON CONFLICT (room_id) DO NOTHING",
                    (room.room_id, room.version.identifier, str(creator)),
                )

        txn.insert_many(
            "events",
            (
                "stream_ordering", "topological_ordering", "event_id", "room_id", "type",
                "state_key", "sender", "redacts", "relates_to", "membership", "outlier",
                "rejected_reason", "soft_failed", "origin_server_ts", "received_ts",
                "instance_name",
            ),
            event_rows,
        )  # fmt: skip
        txn.executemany(
            "UPDATE events SET stream_ordering = ?, outlier = FALSE, rejected_reason = ?,"
            " soft_failed = ?, received_ts = ?, instance_name = ? WHERE event_id = ?",
            revisit_rows,
        )
        # An outlier redaction never redacted anything (no state to check it against).
        txn.executemany("DELETE FROM redactions WHERE event_id = ?", unredactions)
        txn.insert_many("event_json", ("event_id", "room_id", "room_version", "json"), json_rows)
        txn.insert_many("event_edges", ("event_id", "prev_event_id"), edge_rows)
        txn.insert_many("event_auth", ("event_id", "auth_id"), auth_rows)
        txn.insert_many("event_state", ("event_id", "before_group", "after_group"), state_rows)
        txn.insert_many(
            "event_auth_chains", ("event_id", "room_id", "chain_id", "sequence_number"), chain_rows
        )
        txn.insert_many(
            "event_auth_chain_links",
            (
                "room_id", "origin_chain_id", "origin_sequence_number", "target_chain_id",
                "target_sequence_number",
            ),
            link_rows,
        )  # fmt: skip
        self._apply_redactions_txn(txn, room, contexts, redaction_rows)
        if p.transaction_ids:
            # A conflict can only come from a send of the same transaction persisted by
            # another writer (ownership moved mid-flight): keep the first record.
            record_transaction_ids_txn(txn, room.room_id, p.transaction_ids, now)

        if new_extremities is not None:
            txn.execute("DELETE FROM event_forward_extremities WHERE room_id = ?", (room.room_id,))
            txn.executemany(
                "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
                [(room.room_id, e) for e in sorted(new_extremities)],
            )
        if new_current is not None:
            self._update_current_state_txn(
                txn, room, p.old_current, new_current[1], contexts, orderings
            )
        if self.participants:
            items = [self._timeline_input(c, o) for c, o in zip(contexts, orderings, strict=True)]
            for participant in self.participants:
                participant.record_txn(txn, room.room_id, items)

    def _timeline_input(self, ctx: _Context, ordering: int) -> TimelineInput:
        """What participants are told of a persisted event (see rooms.participants)."""
        before = ctx.state_after
        if isinstance(ctx.after, PendingGroup) and ctx.after is not ctx.before:
            before = ctx.after.parent_state
        return TimelineInput(
            ctx.event,
            ordering,
            self.instance_name,
            not ctx.outlier and ctx.rejected_reason is None and not ctx.soft_failed,
            None if ctx.outlier else before,
            None if ctx.outlier else ctx.state_after,
        )

    def _apply_redactions_txn(
        self,
        txn: Transaction,
        room: _Room,
        contexts: list[_Context],
        redaction_rows: list[tuple[str, str]],
    ) -> None:
        txn.executemany(
            "INSERT INTO redactions (event_id, redacts) VALUES (?, ?)"
            " ON CONFLICT (event_id) DO NOTHING",
            redaction_rows,
        )
        # Redactions that arrived before the events they redact, in persistence order
        # (forward stream orderings ascending, then backfilled ones as they were numbered).
        batch = {c.event.event_id for c in contexts}
        earlier: list[tuple[tuple[int, int], str, str]] = []
        for chunk in chunks(sorted(batch)):
            for event_id, redacts, ordering in txn.query(
                "SELECT r.event_id, r.redacts, e.stream_ordering FROM redactions AS r"
                " JOIN events AS e ON e.event_id = r.event_id"
                f" WHERE r.redacts IN ({placeholders(len(chunk))})",
                chunk,
            ):
                if event_id not in batch:
                    ordering = int(ordering)
                    order = (0, ordering) if ordering > 0 else (1, -ordering)
                    earlier.append((order, event_id, redacts))
        # The first redaction persisted wins: the earlier ones, then this batch's in order.
        pairs = [(r, t) for _, r, t in sorted(earlier)]
        pairs.extend(redaction_rows)
        pairs = list(dict.fromkeys(pairs))
        if not pairs:
            return
        ids = [p for pair in pairs for p in pair]
        by_id = {c.event.event_id: c.event for c in contexts}
        missing = [i for i in ids if i not in by_id]
        if missing:
            by_id.update(load_events_txn(txn, missing))
        # Each pair is judged when its second half is persisted, by the state at the
        # redaction: a redaction stored before its target applies only if authorised then.
        for redaction_id, target_id in pairs:
            redaction, target = by_id.get(redaction_id), by_id.get(target_id)
            if redaction is None or target is None or target.room_id != redaction.room_id:
                continue  # never across rooms (redaction_applies says so too)
            groups = state_groups_txn(txn, [redaction_id]).get(redaction_id)
            if groups is None:
                continue
            keys = [
                (EventTypes.POWER_LEVELS, ""),
                CREATE_KEY,
                (EventTypes.MEMBER, redaction.sender),
            ]
            wanted = {}
            for key in keys:
                value = get_state_entry_txn(txn, groups[0], key)
                if value is not None:
                    wanted[key] = value
            loaded = {
                **by_id,
                **load_events_txn(txn, [v for v in wanted.values() if v not in by_id]),
            }
            auth_events = {k: loaded[v] for k, v in wanted.items() if v in loaded}
            if redaction_applies(redaction, target, auth_events, local_server=self.server_name):
                txn.execute(
                    "UPDATE events SET redacted_by = ? WHERE event_id = ? AND redacted_by IS NULL",
                    (redaction_id, target_id),
                )

    def _update_current_state_txn(
        self,
        txn: Transaction,
        room: _Room,
        old_state: StateMap,
        new_state: StateMap,
        contexts: list[_Context],
        orderings: list[int],
    ) -> None:
        # Every change is a fact of the stream: one row per change, at the stream ordering
        # of the event that made it (as persisting the events one at a time records them).
        txn.insert_many(
            "current_state_delta_stream",
            (
                "stream_id", "instance_name", "room_id", "type", "state_key", "event_id",
                "prev_event_id",
            ),
            [
                (ordering, self.instance_name, room.room_id, k[0], k[1], new, old)
                for ctx, ordering in zip(contexts, orderings, strict=True)
                if ctx.current_delta
                for k, (new, old) in sorted(ctx.current_delta.items())
            ],
        )  # fmt: skip
        delta = state_delta(old_state, new_state)
        if not delta:
            return
        members = {c.event.event_id: c.event.membership for c in contexts if c.event.membership}
        missing_members = [
            v
            for k, v in delta.items()
            if v is not None and k[0] == EventTypes.MEMBER and v not in members
        ]
        if missing_members:
            for chunk in chunks(missing_members):
                members.update(
                    txn.query(
                        "SELECT event_id, membership FROM events"
                        f" WHERE event_id IN ({placeholders(len(chunk))})",
                        chunk,
                    )
                )
        removed = [(room.room_id, k[0], k[1]) for k, v in sorted(delta.items()) if v is None]
        txn.executemany(
            "DELETE FROM current_state_events WHERE room_id = ? AND type = ? AND state_key = ?",
            removed,
        )
        txn.executemany(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE SET"
            " event_id = excluded.event_id, membership = excluded.membership",
            [
                (room.room_id, k[0], k[1], v, members.get(v))
                for k, v in sorted(delta.items())
                if v is not None
            ],
        )


def _current_change(
    previous: StateMap, current: StateMap, state_before: StateMap, ctx: _Context
) -> dict[StateKey, tuple[str | None, str | None]]:
    """What ``ctx``'s event did to the room's current state: key -> (new, previous).

    The usual case, an event extending the only forward extremity, changes at most its
    own key; anything else (a fork, a merge) is compared key by key.
    """
    if previous is state_before and current is ctx.state_after:
        event = ctx.event
        if not event.is_state() or ctx.after is ctx.before:
            return {}
        key = event.state_tuple
        old = previous.get(key)
        return {} if old == event.event_id else {key: (event.event_id, old)}
    return {k: (v, previous.get(k)) for k, v in state_delta(previous, current).items()}


def _collect_pending(ref: GroupRef, out: list[PendingGroup]) -> None:
    chain: list[PendingGroup] = []
    while isinstance(ref, PendingGroup) and ref.group_id is None and ref not in out:
        chain.append(ref)
        ref = ref.parent
    out.extend(reversed(chain))


def topological_order(events: Sequence[Event]) -> list[Event]:
    """Order events so each follows those of its prev and auth events that are present.

    Otherwise by (depth, event ID), so the order does not depend on the input's. The
    persister sorts every batch this way, and the bulk importer whole rooms, so that
    cutting a room into consecutive batches changes nothing.
    """
    order = sorted(events, key=lambda e: (e.depth, e.event_id))
    by_id = {e.event_id: e for e in order}
    placed: set[str] = set()
    result: list[Event] = []
    for root in order:
        stack: list[tuple[Event, bool]] = [(root, False)]
        while stack:
            event, expanded = stack.pop()
            if event.event_id in placed:
                continue
            if expanded:
                placed.add(event.event_id)
                result.append(event)
                continue
            stack.append((event, True))
            parents = [*event.prev_event_ids, *effective_auth_event_ids(event)]
            for parent in reversed(parents):
                if parent in by_id and parent not in placed:
                    stack.append((by_id[parent], False))
    return result


def _load_room_txn(
    txn: Transaction, room_id: str
) -> tuple[str, set[str], StateMap, list[ChainPosition], list[ChainLink]] | None:
    row = txn.query_one("SELECT room_version FROM rooms WHERE room_id = ?", (room_id,))
    if row is None:
        return None
    extremities = {
        r[0]
        for r in txn.query(
            "SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,)
        )
    }
    current = current_state_txn(txn, room_id)
    positions = [
        ChainPosition(r[0], int(r[1]), int(r[2]))
        for r in txn.query(
            "SELECT event_id, chain_id, sequence_number FROM event_auth_chains WHERE room_id = ?",
            (room_id,),
        )
    ]
    links = [
        ChainLink(int(r[0]), int(r[1]), int(r[2]), int(r[3]))
        for r in txn.query(
            "SELECT origin_chain_id, origin_sequence_number, target_chain_id,"
            " target_sequence_number FROM event_auth_chain_links WHERE room_id = ?",
            (room_id,),
        )
    ]
    return str(row[0]), extremities, current, positions, links


def _outlier_descendants_txn(txn: Transaction, room_id: str, event_ids: list[str]) -> list[str]:
    """The stored outliers of ``room_id`` below ``event_ids`` through prev edges (outliers
    only), in discovery order."""
    seen = set(event_ids)
    found: list[str] = []
    frontier = list(event_ids)
    while frontier:
        below: list[str] = []
        for chunk in chunks(frontier):
            for (event_id,) in txn.query(
                "SELECT DISTINCT e.event_id FROM event_edges AS g"
                " JOIN events AS e ON e.event_id = g.event_id"
                f" WHERE g.prev_event_id IN ({placeholders(len(chunk))})"
                " AND e.room_id = ? AND e.outlier",
                (*chunk, room_id),
            ):
                if event_id not in seen:
                    seen.add(event_id)
                    below.append(event_id)
        found.extend(below)
        frontier = below
    return found


def _referenced_txn(txn: Transaction, event_ids: list[str]) -> set[str]:
    """Those of ``event_ids`` that a stored event, neither outlier, rejected nor
    soft-failed, names as a prev event."""
    found: set[str] = set()
    for chunk in chunks(event_ids):
        found.update(
            r[0]
            for r in txn.query(
                "SELECT g.prev_event_id FROM event_edges AS g"
                " JOIN events AS e ON e.event_id = g.event_id"
                f" WHERE g.prev_event_id IN ({placeholders(len(chunk))})"
                " AND NOT e.outlier AND NOT e.soft_failed AND e.rejected_reason IS NULL",
                chunk,
            )
        )
    return found


class _ResolutionStore:
    """State resolution's view of a room: stored events plus the batch being persisted."""

    def __init__(self, persister: EventPersister, room: _Room, contexts: Mapping[str, _Context]):
        self._persister = persister
        self._room = room
        self._contexts = contexts

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        return await self._persister._events(event_ids, self._contexts)

    # The index's set algebra is synchronous; over big rooms it runs off the loop (the
    # room lock, held by the resolving task, keeps the index unchanged meanwhile).

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Sequence[set[str]]
    ) -> set[str]:
        size = sum(len(s) for s in state_sets)
        return await off_loop(size, self._room.index.auth_chain_difference, state_sets)

    async def get_conflicted_subgraph(
        self, room_id: str, conflicted_event_ids: set[str]
    ) -> set[str]:
        size = len(conflicted_event_ids)
        return await off_loop(size, self._room.index.conflicted_subgraph, conflicted_event_ids)

    async def get_auth_chain_difference_of_states(
        self, room_id: str, shared: Mapping[StateKey, str], differing: Sequence[set[str]]
    ) -> set[str]:
        size = len(shared) + sum(len(d) for d in differing)
        index = self._room.index
        return await off_loop(size, index.auth_chain_difference_of_states, shared, differing)


def set_room_public_txn(txn: Transaction, room_id: str, public: bool) -> None:
    """Publish the room in the room directory, or withdraw it (``rooms.is_public``).
    Here because this module is the one writer of ``rooms`` (``roomstream.storage.owners``):
    it creates the row when the room's create event is persisted."""
    txn.execute("UPDATE rooms SET is_public = ? WHERE room_id = ?", (public, room_id))
