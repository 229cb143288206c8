"""State resolution v1 (room version 1), v2 (room versions 2-11) and v2.1 (room version
12, MSC4297).

Given the room states at several forward extremities (or at the ``prev_events`` of an
event), :func:`resolve_state` computes the one state they resolve to, following the
"State resolution" section of the room version pages of the Matrix specification. Step
numbers in comments ("step 1" ... "step 5") are the spec's *Algorithm* steps; terms in
*italics* in the spec (unconflicted state map, auth difference, full conflicted set,
reverse topological power ordering, mainline ordering, iterative auth checks) have
functions of the same name here.

v2.1 differs from v2 in exactly two places (MSC4297):

1. the first iterative auth checks (step 2) start from an **empty** state map instead of
   the unconflicted state map, so conflicted power events are replayed on top of their own
   ``auth_events`` rather than on unrelated state; and
2. the *full conflicted set* also includes the *conflicted state subgraph*: every event on
   an ``auth_events`` path between two conflicted events.

Step 5 (the unconflicted state map overrides the result) is unchanged in v2.1.

Room version 12 also stops listing the create event in ``auth_events`` (MSC4291): the room
ID is the create event's ID. Everywhere the algorithm reads an event's ``auth_events`` we
therefore use :func:`effective_auth_event_ids`, which adds the create event back for v12
(Synapse does the same), so power levels of creators (MSC4289: infinite) and the auth
rules see the create event.

State resolution v1 (the spec's room version 1 page; Synapse's ``synapse/state/v1.py``)
is a different algorithm, in :func:`_resolve_v1`: it never looks at auth chains, only at
the conflicted events and the auth events the unconflicted state gives them. A key is
*conflicted* only when the state sets that have it disagree (a key some sets lack is
not). Conflicted power levels, then join rules, then memberships are each resolved by
replaying the candidates oldest first (depth ascending) while each passes the auth rules
against the one before; every other conflicted key takes the newest candidate (depth
descending) that passes against the state resolved so far. Ties break on the SHA-1 of
the event ID.

Authorization itself is delegated to :mod:`roomstream.events.auth`; nothing here decides
whether an event is allowed.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from roomstream.errors import AuthError
from roomstream.events.auth import (
    auth_types_for_event,
    check_auth_rules,
    get_user_power_level,
)
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import RoomVersion, StateResolutionAlgorithm
from roomstream.events.types import EventTypes
from roomstream.state.auth_chain_index import AuthChainIndex
from roomstream.state.cooperative import cooperate

__all__ = [
    "ConflictedSubgraphStore",
    "InMemoryStateResolutionStore",
    "Resolution",
    "ResolutionMemo",
    "StateDifferenceStore",
    "StateResolutionStore",
    "create_event_id_for_room",
    "effective_auth_event_ids",
    "is_power_event",
    "resolve_state",
    "resolve_state_detailed",
    "separate_state_sets",
]

logger = logging.getLogger(__name__)

_CREATE_KEY: StateKey = (EventTypes.CREATE, "")
_POWER_LEVELS_KEY: StateKey = (EventTypes.POWER_LEVELS, "")
_JOIN_RULES_KEY: StateKey = (EventTypes.JOIN_RULES, "")


# --------------------------------------------------------------------------------------
# What the algorithm needs from storage
# --------------------------------------------------------------------------------------


@runtime_checkable
class StateResolutionStore(Protocol):
    """Read access to the events of a room, for :func:`resolve_state`.

    ``get_events`` returns the events it has among those asked for (missing ones are
    simply absent from the result). ``get_auth_chain_difference`` returns the *auth
    difference* of the state sets: union minus intersection of the auth chains of each
    set, where a set's auth chain includes the set's own events (Synapse's definition; it
    keeps events present in every state set out of the difference).
    """

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]: ...

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Sequence[set[str]]
    ) -> set[str]: ...


@runtime_checkable
class StateDifferenceStore(Protocol):
    """Optional extra: the auth difference of state sets given as the unconflicted state
    map (events in every set, by key) and each set's other events. Cheaper than
    ``get_auth_chain_difference`` when the sets are big and differ little; same answer."""

    async def get_auth_chain_difference_of_states(
        self, room_id: str, shared: Mapping[StateKey, str], differing: Sequence[set[str]]
    ) -> set[str]: ...


@runtime_checkable
class ConflictedSubgraphStore(Protocol):
    """Optional extra a store may offer to compute the v2.1 conflicted state subgraph
    from an index; without it :func:`resolve_state` walks the auth DAG itself."""

    async def get_conflicted_subgraph(
        self, room_id: str, conflicted_event_ids: set[str]
    ) -> set[str]: ...


# --------------------------------------------------------------------------------------
# Small definitions
# --------------------------------------------------------------------------------------


def create_event_id_for_room(room_id: str) -> str:
    """Room version 12: the create event's ID is the room ID with ``$`` for ``!``."""
    return "$" + room_id[1:]


def effective_auth_event_ids(event: Event) -> list[str]:
    """The event's ``auth_events``, plus (room version 12) the implied create event.

    Invariant: for v12 every event but the create event itself gets the create event,
    derived from the room ID, appended once; other versions are returned as listed.
    """
    auth_ids = event.auth_event_ids
    if event.room_version.room_id_from_create_event and event.type != EventTypes.CREATE:
        create_id = create_event_id_for_room(event.room_id)
        if create_id not in auth_ids:
            auth_ids.append(create_id)
    return auth_ids


def is_power_event(event: Event) -> bool:
    """The spec's *power event*: power levels, join rules, or a kick or ban (a ``leave``
    or ``ban`` membership whose sender is not its target): events that may take away
    someone's ability to act.

    Synapse also counts ``m.room.create`` as one; the spec does not, and we follow the
    spec. The create event is in every state set in any well-formed input, so it is never
    conflicted and the difference never shows.
    """
    if not event.is_state():
        return False
    key = event.state_tuple
    if key in (_POWER_LEVELS_KEY, _JOIN_RULES_KEY):
        return True
    return (
        event.type == EventTypes.MEMBER
        and event.membership in ("leave", "ban")
        and (event.sender != event.state_key)
    )


def separate_state_sets(
    state_sets: Sequence[Mapping[StateKey, str]],
    candidate_keys: Collection[StateKey] | None = None,
) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """Split the state sets into the *unconflicted state map* and the conflicts.

    A key is unconflicted iff every state set has it with the same event; anything else
    (different events, or missing from some set) is conflicted, and the conflicted map
    holds the events the sets that have the key give it.

    ``candidate_keys``, when the caller knows them: keys outside which every state set
    agrees (a superset of the conflicted keys, e.g. the keys changed since the sets'
    common ancestor). Only those are compared, so merging two big states that differ in a
    few keys costs a copy, not a comparison per key.
    """
    if not state_sets:
        return {}, {}
    first, *rest = state_sets
    conflicted: dict[StateKey, set[str]] = {}
    if candidate_keys is not None:
        unconflicted = dict(first)
        for key in candidate_keys:
            values = [s.get(key) for s in state_sets]
            present = {v for v in values if v is not None}
            if len(present) > 1 or (present and None in values):
                conflicted[key] = present
                unconflicted.pop(key, None)
        return unconflicted, conflicted
    # Set operations on the items views run in C: merged states share most entries.
    unconflicted = dict(set(first.items()).intersection(*(s.items() for s in rest)))
    for state in state_sets:
        for key in state.keys() - unconflicted.keys():
            conflicted.setdefault(key, set()).add(state[key])
    return unconflicted, conflicted


class _EventCache:
    """Events fetched from the store during one resolution, checked to be in the room."""

    def __init__(
        self, room_id: str, store: StateResolutionStore, memo: ResolutionMemo | None = None
    ) -> None:
        self._room_id = room_id
        self._store = store
        self.memo = memo
        self._events: dict[str, Event] = {}
        self._missing: set[str] = set()

    async def fetch(self, event_ids: Iterable[str]) -> None:
        wanted = [e for e in event_ids if e not in self._events and e not in self._missing]
        if not wanted:
            return
        found = await self._store.get_events(wanted)
        for event_id in wanted:
            event = found.get(event_id)
            if event is None:
                self._missing.add(event_id)
                continue
            # An event from another room would let power in one room act in another.
            if event.room_id != self._room_id:
                raise ValueError(
                    f"state resolution for room {self._room_id} was given event {event_id} "
                    f"of room {event.room_id}"
                )
            self._events[event_id] = event

    async def get(self, event_id: str) -> Event | None:
        await self.fetch((event_id,))
        return self._events.get(event_id)

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._events

    def __getitem__(self, event_id: str) -> Event:
        return self._events[event_id]

    async def auth_events(self, event: Event) -> list[Event]:
        """The event's effective auth events that we have (missing ones are skipped)."""
        auth_ids = effective_auth_event_ids(event)
        await self.fetch(auth_ids)
        return [self._events[a] for a in auth_ids if a in self._events]


# --------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------


async def resolve_state(
    room_id: str,
    room_version: RoomVersion,
    state_sets: Sequence[Mapping[StateKey, str]],
    store: StateResolutionStore,
    memo: ResolutionMemo | None = None,
) -> dict[StateKey, str]:
    """Resolve ``state_sets`` with state resolution v2 or v2.1 (per ``room_version``).

    The resolved state of :func:`resolve_state_detailed`, which documents the algorithm.
    """
    resolution = await resolve_state_detailed(room_id, room_version, state_sets, store, memo)
    return resolution.state


@dataclass(frozen=True)
class Resolution:
    """A resolved state and the keys the algorithm decided.

    Invariant: for every key not in ``decided``, ``state`` has the value every state set
    agreed on (or lacks the key, as they all do). Callers turn the result into a delta from
    any of the state sets by looking at ``decided`` alone.
    """

    state: dict[StateKey, str]
    decided: frozenset[StateKey]


async def resolve_state_detailed(
    room_id: str,
    room_version: RoomVersion,
    state_sets: Sequence[Mapping[StateKey, str]],
    store: StateResolutionStore,
    memo: ResolutionMemo | None = None,
    candidate_keys: Collection[StateKey] | None = None,
) -> Resolution:
    """Resolve ``state_sets`` with state resolution v2 or v2.1 (per ``room_version``).

    Invariants:

    * the result does not depend on the order of ``state_sets`` (every step works on
      sets and breaks ties by ``(power level, origin_server_ts, event_id)``);
    * every key of the unconflicted state map has its unconflicted value in the result;
    * every value in the result is an event from one of the state sets or from the full
      conflicted set that passed the auth rules during the iterative auth checks;
    * no state sets resolve to ``{}``; one state set resolves to itself.

    Events the store does not have are dropped from the full conflicted set (as Synapse
    does); an event from another room raises ``ValueError``. Rejection status is not
    modelled: the store is expected to hand back only events accepted against their own
    auth chains (events soft-failed against the state at them are fine and are re-authed
    here, as the spec's "Rejected events" section requires).

    ``memo``: the room's :class:`ResolutionMemo`, if the caller keeps one; and
    ``candidate_keys``: a superset of the keys the state sets disagree on, if the caller
    knows one (see :func:`separate_state_sets`). Both change the cost, never the result.
    """
    if not state_sets:
        return Resolution({}, frozenset())
    if room_version.state_resolution is StateResolutionAlgorithm.V1:
        return await _resolve_v1(room_id, room_version, state_sets, store)
    unconflicted, conflicted = separate_state_sets(state_sets, candidate_keys)
    if not conflicted:
        return Resolution(unconflicted, frozenset())

    events = _EventCache(room_id, store, memo)
    conflicted_ids: set[str] = set().union(*conflicted.values())

    # Full conflicted set = conflicted state set + auth difference ...
    if isinstance(store, StateDifferenceStore):
        # An event is in every state set iff it is an unconflicted value.
        differing = [{s[k] for k in conflicted if k in s} for s in state_sets]
        difference = await store.get_auth_chain_difference_of_states(
            room_id, unconflicted, differing
        )
    else:
        difference = await store.get_auth_chain_difference(
            room_id, [set(s.values()) for s in state_sets]
        )
    full_conflicted = conflicted_ids | difference
    v2_1 = room_version.state_resolution is StateResolutionAlgorithm.V2_1
    if v2_1:
        # ... + (v2.1, MSC4297 modification 2) the conflicted state subgraph.
        full_conflicted |= await _conflicted_state_subgraph(room_id, conflicted_ids, store, events)

    await events.fetch(full_conflicted)
    dropped = {e for e in full_conflicted if e not in events}
    if dropped:
        logger.warning("state resolution in %s: %d events missing", room_id, len(dropped))
    # Only state events can be state; auth chains never hold anything else.
    full_conflicted = {e for e in full_conflicted if e in events and events[e].is_state()}

    # Step 1: the power events of the full conflicted set and the part of their auth chains
    # inside the full conflicted set, in reverse topological power ordering.
    power_events = [e for e in full_conflicted if is_power_event(events[e])]
    power_order = await _reverse_topological_power_ordering(power_events, full_conflicted, events)

    # Step 2: iterative auth checks from the unconflicted state map (v2) or, v2.1 (MSC4297
    # modification 1), from an empty map so each power event is judged against its own
    # auth events instead of state that other forks agree on but it never saw.
    initial: dict[StateKey, str] = {} if v2_1 else dict(unconflicted)
    partial = await _iterative_auth_checks(room_version, power_order, initial, events)

    # Step 3: everything else, in mainline ordering based on the resolved power levels.
    in_power_order = set(power_order)
    others = [e for e in full_conflicted if e not in in_power_order]
    others_order = await _mainline_ordering(others, partial.get(_POWER_LEVELS_KEY), events)

    # Step 4: iterative auth checks of those on top of the partially resolved state.
    resolved = await _iterative_auth_checks(room_version, others_order, partial, events)

    # Step 5: the unconflicted state map wins over anything the replay produced.
    resolved.update(unconflicted)
    # Only conflicted keys and keys of replayed events can differ from the agreed values.
    decided = frozenset(conflicted).union(events[e].state_tuple for e in full_conflicted)
    return Resolution(resolved, decided)


async def _conflicted_state_subgraph(
    room_id: str, conflicted_ids: set[str], store: StateResolutionStore, events: _EventCache
) -> set[str]:
    """The *conflicted state subgraph*: all ``auth_events`` paths between pairs of
    conflicted events, endpoints included (v2.1).

    Uses the store's index when it offers one; otherwise walks the auth chains of the
    conflicted events (the only place that has to) and intersects "is an ancestor of a
    conflicted event" with "descends from a conflicted event".
    """
    if isinstance(store, ConflictedSubgraphStore):
        return await store.get_conflicted_subgraph(room_id, set(conflicted_ids))

    ancestors: set[str] = set()  # in the auth chain of some conflicted event
    children: dict[str, set[str]] = {}  # reverse auth edges inside the walked region
    frontier = set(conflicted_ids)
    visited = set(conflicted_ids)
    while frontier:
        await events.fetch(frontier)
        next_frontier: set[str] = set()
        for event_id in frontier:
            await cooperate()
            if event_id not in events:
                continue
            for auth_id in effective_auth_event_ids(events[event_id]):
                children.setdefault(auth_id, set()).add(event_id)
                ancestors.add(auth_id)
                if auth_id not in visited:
                    visited.add(auth_id)
                    next_frontier.add(auth_id)
        frontier = next_frontier

    descendants: set[str] = set()  # has some conflicted event in its auth chain
    stack = [c for e in conflicted_ids for c in children.get(e, ())]
    while stack:
        event_id = stack.pop()
        if event_id not in descendants:
            descendants.add(event_id)
            stack.extend(children.get(event_id, ()))

    endpoints = {e for e in conflicted_ids if e in ancestors or e in descendants}
    return (ancestors & descendants) | endpoints


async def _sender_power_level(event: Event, events: _EventCache) -> int | float:
    """The sender's power level "when looking at their respective auth_events": from
    the power levels and create events the event cites (v12: plus its create event, so
    creators rank infinitely high)."""
    auth_state = {a.state_tuple: a for a in await events.auth_events(event) if a.is_state()}
    return get_user_power_level(event.sender, auth_state)


async def _reverse_topological_power_ordering(
    power_events: Iterable[str], full_conflicted: set[str], events: _EventCache
) -> list[str]:
    """Step 1: the power events plus their auth chains within the full conflicted set,
    in the *reverse topological power ordering*.

    The graph follows ``auth_events`` edges between members of the full conflicted set
    (as Synapse does). An auth event outside the set is in every state set's auth chain
    or in none, so events reached only through it are never needed to order these.

    Kahn's algorithm over that graph, always emitting the smallest ready event by
    ``(-sender power level, origin_server_ts, event_id)``: events with no auth events in
    the graph first, higher-powered senders first among the ready ones.
    """
    graph: dict[str, set[str]] = {}
    stack = list(power_events)
    while stack:
        await cooperate()
        event_id = stack.pop()
        if event_id in graph:
            continue
        edges: set[str] = set()
        graph[event_id] = edges
        for auth_id in effective_auth_event_ids(events[event_id]):
            if auth_id in full_conflicted:
                edges.add(auth_id)
                if auth_id not in graph:
                    stack.append(auth_id)

    keys: dict[str, tuple[int | float, int, str]] = {}
    for event_id in graph:
        await cooperate()
        event = events[event_id]
        level = await _sender_power_level(event, events)
        keys[event_id] = (-level, event.origin_server_ts, event_id)

    # Kahn's algorithm, run from the oldest end: an event is ready once all its auth
    # events in the graph have been emitted.
    waiting_on = {e: len(edges) for e, edges in graph.items()}
    dependents: dict[str, list[str]] = {e: [] for e in graph}
    for event_id, edges in graph.items():
        for auth_id in edges:
            dependents[auth_id].append(event_id)
    ready = [keys[e] for e, n in waiting_on.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        await cooperate()
        *_, event_id = heapq.heappop(ready)
        order.append(event_id)
        for dependent in dependents[event_id]:
            waiting_on[dependent] -= 1
            if waiting_on[dependent] == 0:
                heapq.heappush(ready, keys[dependent])
    if len(order) != len(graph):
        # Only a cycle in auth_events could cause this, and event IDs are hashes of their
        # content (auth_events included), so a cycle cannot be built.
        raise ValueError("the auth events of the full conflicted set contain a cycle")
    return order


async def _iterative_auth_checks(
    room_version: RoomVersion,
    event_ids: Sequence[str],
    initial_state: Mapping[StateKey, str],
    events: _EventCache,
) -> dict[StateKey, str]:
    """The *iterative auth checks algorithm*: apply each event, in order, to the state if
    the authorization rules allow it against that state; skip it otherwise.

    For each key the rules need (:func:`auth_types_for_event`) the event in the state
    being built is used; if the state lacks the key, the event's own auth event for it
    is. In v12 the create event, which no event lists, comes from the room ID, which is
    what :func:`check_auth_rules` expects under ``(EventTypes.CREATE, "")``.
    """
    state = dict(initial_state)
    for event_id in event_ids:
        await cooperate()
        event = events[event_id]
        needed = set(
            auth_types_for_event(
                room_version, event.type, event.state_key, event.sender, event.content
            )
        )
        needed.add(_CREATE_KEY)

        auth_state: dict[StateKey, Event] = {}
        for auth_event in await events.auth_events(event):
            if auth_event.is_state() and auth_event.state_tuple in needed:
                auth_state[auth_event.state_tuple] = auth_event
        for key in needed:
            # v12: the create event is never part of the auth types, and the partially
            # resolved state (which starts empty) must not replace the room's own.
            if key == _CREATE_KEY and room_version.room_id_from_create_event:
                continue
            current_id = state.get(key)
            if current_id is not None:
                current = await events.get(current_id)
                if current is not None:
                    auth_state[key] = current

        try:
            check_auth_rules(event, auth_state)
        except AuthError as e:
            logger.debug("state resolution: %s not allowed: %s", event_id, e.message)
            continue
        state[event.state_tuple] = event_id
    return state


class ResolutionMemo:
    """Facts derived from a room's events alone, kept between its resolutions.

    A room's power levels history is walked by every resolution in the room, and a long
    one made the mainline walk the slowest step of merges in big rooms. Event IDs are
    hashes of the events' content (auth events included), so what is derived from an
    event and the events its ID names never changes: a caller that persists a room keeps
    one memo for it and passes it to every :func:`resolve_state` of the room. Only facts
    derived from events that were all present are recorded (a missing event could appear
    later). Bounded: each table is emptied when it reaches its limit.
    """

    def __init__(self, max_parents: int = 100_000, max_mainlines: int = 32) -> None:
        self.max_parents = max_parents
        self.max_mainlines = max_mainlines
        #: Event ID -> the power levels event among its auth events.
        self.power_levels_parent: dict[str, str] = {}
        #: Power levels event ID -> its complete mainline (event ID -> index).
        self.mainlines: dict[str, dict[str, int]] = {}

    def remember_parent(self, event_id: str, parent_id: str) -> None:
        if len(self.power_levels_parent) >= self.max_parents:
            self.power_levels_parent.clear()
        self.power_levels_parent[event_id] = parent_id

    def remember_mainline(self, top_id: str, mainline: dict[str, int]) -> None:
        if len(self.mainlines) >= self.max_mainlines:
            self.mainlines.clear()
        self.mainlines[top_id] = mainline


async def _power_levels_auth_event(event: Event, events: _EventCache) -> str | None:
    """The ``m.room.power_levels`` event among the event's ``auth_events``, if any."""
    memo = events.memo
    if memo is not None:
        known = memo.power_levels_parent.get(event.event_id)
        if known is not None:
            return known
    for auth_event in await events.auth_events(event):
        if auth_event.is_state() and auth_event.state_tuple == _POWER_LEVELS_KEY:
            if memo is not None:
                memo.remember_parent(event.event_id, auth_event.event_id)
            return auth_event.event_id
    return None


async def _mainline(power_levels_id: str | None, events: _EventCache) -> dict[str, int]:
    """The mainline of ``power_levels_id``: each power levels event -> its index."""
    if power_levels_id is None:
        return {}
    memo = events.memo
    cached = None if memo is None else memo.mainlines.get(power_levels_id)
    if cached is not None:
        return cached
    mainline: dict[str, int] = {}
    complete = True
    current: str | None = power_levels_id
    while current is not None and current not in mainline:
        await cooperate()
        mainline[current] = len(mainline)
        current_event = await events.get(current)
        if current_event is None:
            complete = False
            break
        current = await _power_levels_auth_event(current_event, events)
    if complete and memo is not None:
        memo.remember_mainline(power_levels_id, mainline)
    return mainline


async def _mainline_ordering(
    event_ids: Sequence[str], power_levels_id: str | None, events: _EventCache
) -> list[str]:
    """Step 3: the *mainline ordering* of the events based on ``power_levels_id``.

    The mainline is ``[P0, P1, ...]``: the resolved power levels event, then the power
    levels event among its auth events, and so on. An event's *mainline position* is the
    index ``i`` of the first event of its own power-levels chain ``[e1, e2, ...]`` (``e``
    itself excluded) that is on the mainline, or infinity if none is. Events sort by
    greater position first (older power levels first), then ``origin_server_ts``, then
    event ID.
    """
    if not event_ids:
        return []

    mainline = await _mainline(power_levels_id, events)

    # Positions of power levels events already walked, shared by all events: every event's
    # chain of power levels ends on the mainline or at the room's first power levels.
    known: dict[str, int | float] = {}

    async def position(event: Event) -> int | float:
        if not mainline:
            return math.inf  # no walk can end on an empty mainline
        walked: list[str] = []
        next_id = await _power_levels_auth_event(event, events)
        result: int | float = math.inf
        while next_id is not None:
            if next_id in mainline:
                result = mainline[next_id]
                break
            if next_id in known:
                result = known[next_id]
                break
            if next_id in walked:
                break  # a cycle cannot happen with hashed IDs; be total anyway
            walked.append(next_id)
            next_event = await events.get(next_id)
            next_id = (
                None if next_event is None else await _power_levels_auth_event(next_event, events)
            )
        for walked_id in walked:
            known[walked_id] = result
        return result

    keys: dict[str, tuple[int | float, int, str]] = {}
    for event_id in event_ids:
        await cooperate()
        event = events[event_id]
        keys[event_id] = (-(await position(event)), event.origin_server_ts, event_id)
    return sorted(event_ids, key=keys.__getitem__)


# --------------------------------------------------------------------------------------
# State resolution v1 (room version 1)
# --------------------------------------------------------------------------------------


def _separate_v1(
    state_sets: Sequence[Mapping[StateKey, str]],
) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """v1's split: a key is conflicted iff the sets that have it give it different
    events; otherwise its one value is unconflicted, even if some sets lack the key."""
    values: dict[StateKey, set[str]] = {}
    for state in state_sets:
        for key, event_id in state.items():
            values.setdefault(key, set()).add(event_id)
    unconflicted = {k: next(iter(v)) for k, v in values.items() if len(v) == 1}
    conflicted = {k: v for k, v in values.items() if len(v) > 1}
    return unconflicted, conflicted


def _v1_order(events: Iterable[Event]) -> list[Event]:
    """Newest first: depth descending, then the SHA-1 hex digest of the event ID."""
    return sorted(
        events, key=lambda e: (-e.depth, hashlib.sha1(e.event_id.encode("utf-8")).hexdigest())
    )


def _v1_allowed(event: Event, auth_events: Mapping[StateKey, Event]) -> bool:
    try:
        check_auth_rules(event, auth_events)
    except AuthError:
        return False
    return True


def _v1_resolve_auth_events(
    room_version: RoomVersion, candidates: list[Event], auth_events: Mapping[StateKey, Event]
) -> Event:
    """A conflicted power levels, join rules or membership key: starting from the oldest
    candidate, each next one replaces it while the auth rules allow it against the
    previous (and the auth state the candidates need); the first refusal stops."""
    oldest_first = list(reversed(_v1_order(candidates)))
    needed = {
        key
        for e in candidates
        for key in auth_types_for_event(room_version, e.type, e.state_key, e.sender, e.content)
    }
    needed.add(_CREATE_KEY)
    state = {k: auth_events[k] for k in needed if k in auth_events}
    previous = oldest_first[0]
    for event in oldest_first[1:]:
        state[previous.state_tuple] = previous
        if not _v1_allowed(event, state):
            return previous
        previous = event
    return previous


async def _resolve_v1(
    room_id: str,
    room_version: RoomVersion,
    state_sets: Sequence[Mapping[StateKey, str]],
    store: StateResolutionStore,
) -> Resolution:
    """State resolution v1; see the module docstring. Same answer as Synapse's
    ``synapse.state.v1.resolve_events_with_store`` (the tests compare them).

    Events the store lacks are left out: a conflicted key with one known candidate
    takes it, one with none is dropped from the result. ``decided`` holds the
    conflicted keys and the keys some state set lacks.
    """
    if len(state_sets) == 1:
        return Resolution(dict(state_sets[0]), frozenset())
    unconflicted, conflicted = _separate_v1(state_sets)
    all_keys = set(unconflicted) | set(conflicted)
    decided = frozenset(k for k in all_keys if any(k not in s for s in state_sets)) | frozenset(
        conflicted
    )
    if not conflicted:
        return Resolution(unconflicted, decided)

    events = _EventCache(room_id, store)
    await events.fetch({e for ids in conflicted.values() for e in ids})
    # The auth events of the conflicted events, taken from the unconflicted state only.
    auth_ids: dict[StateKey, str] = {}
    for ids in conflicted.values():
        for event_id in ids:
            if event_id not in events:
                continue
            event = events[event_id]
            for key in auth_types_for_event(
                room_version, event.type, event.state_key, event.sender, event.content
            ):
                if key not in auth_ids and key in unconflicted:
                    auth_ids[key] = unconflicted[key]
    if _CREATE_KEY in unconflicted:
        auth_ids.setdefault(_CREATE_KEY, unconflicted[_CREATE_KEY])
    await events.fetch(auth_ids.values())
    auth_events = {k: events[v] for k, v in auth_ids.items() if v in events}

    result = dict(unconflicted)
    candidates: dict[StateKey, list[Event]] = {}
    for key, ids in conflicted.items():
        known = [events[e] for e in sorted(ids) if e in events]
        if len(known) > 1:
            candidates[key] = known
        elif known:
            result[key] = known[0].event_id

    resolved: dict[StateKey, Event] = {}
    if _POWER_LEVELS_KEY in candidates:
        resolved[_POWER_LEVELS_KEY] = _v1_resolve_auth_events(
            room_version, candidates[_POWER_LEVELS_KEY], auth_events
        )
    auth_events.update(resolved)
    # Join rules, then memberships: each group against the state resolved before it.
    for event_type in (EventTypes.JOIN_RULES, EventTypes.MEMBER):
        group = {
            key: _v1_resolve_auth_events(room_version, evs, auth_events)
            for key, evs in candidates.items()
            if key[0] == event_type
        }
        resolved.update(group)
        auth_events.update(group)
    for key, evs in candidates.items():
        if key in resolved:
            continue
        ordered = _v1_order(evs)
        # The newest allowed candidate; if none is, the oldest.
        resolved[key] = next((e for e in ordered if _v1_allowed(e, auth_events)), ordered[-1])

    for key, event in resolved.items():
        result[key] = event.event_id
    return Resolution(result, decided)


# --------------------------------------------------------------------------------------
# An in-memory store
# --------------------------------------------------------------------------------------


class InMemoryStateResolutionStore:
    """A :class:`StateResolutionStore` over events held in memory, with the auth chain
    difference and the conflicted state subgraph answered by an :class:`AuthChainIndex`.

    Invariants: every event it holds is in the index, indexed by its
    :func:`effective_auth_event_ids` (so v12 events link to their create event); events
    are only added after their auth events.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: dict[str, Event] = {}
        self.index = AuthChainIndex()
        self.add_events(events)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    def add_event(self, event: Event) -> None:
        """Add one event; its auth events must have been added already."""
        if event.event_id in self._events:
            return
        # Chains by (type, state_key) keep the index small: one chain per run of power
        # levels, per user's memberships.
        key = event.state_tuple if event.is_state() else None
        self.index.add_event(event.event_id, effective_auth_event_ids(event), key)
        self._events[event.event_id] = event

    def add_events(self, events: Iterable[Event]) -> None:
        """Add events in any order: they are sorted so each follows its auth events.

        ``ValueError`` if an auth event is neither held already nor among ``events``.
        """
        pending = {e.event_id: e for e in events if e.event_id not in self._events}
        # Depth-first, iteratively (auth chains can be far deeper than Python's stack).
        for root in pending.values():
            stack: list[tuple[Event, bool]] = [(root, False)]
            on_path: set[str] = set()
            while stack:
                event, expanded = stack.pop()
                if event.event_id in self._events:
                    continue
                if expanded:
                    on_path.discard(event.event_id)
                    self.add_event(event)
                    continue
                on_path.add(event.event_id)
                stack.append((event, True))
                for auth_id in effective_auth_event_ids(event):
                    if auth_id in self._events:
                        continue
                    auth_event = pending.get(auth_id)
                    if auth_event is None or auth_id in on_path:
                        raise ValueError(f"auth event {auth_id} of {event.event_id} is unavailable")
                    stack.append((auth_event, False))

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        return {e: self._events[e] for e in event_ids if e in self._events}

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Sequence[set[str]]
    ) -> set[str]:
        return self.index.auth_chain_difference(state_sets)

    async def get_conflicted_subgraph(
        self, room_id: str, conflicted_event_ids: set[str]
    ) -> set[str]:
        return self.index.conflicted_subgraph(conflicted_event_ids)

    async def get_auth_chain_difference_of_states(
        self, room_id: str, shared: Mapping[StateKey, str], differing: Sequence[set[str]]
    ) -> set[str]:
        return self.index.auth_chain_difference_of_states(shared, differing)
