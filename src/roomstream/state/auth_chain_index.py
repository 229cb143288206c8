"""A chain cover index over a room's auth DAG.

Answers "which events are in the auth chain of these events" and "what is the auth chain
difference of these state sets" from a compact index instead of walking the DAG event by
event. The design follows the one Synapse documents in ``auth_chain_difference_algorithm.md``
(the transitive-closure variant); the code here is our own.

Model
-----
Every event gets a position ``(chain_id, sequence_number)``. Events on one chain form a
path through the auth DAG: the event at sequence ``n + 1`` has the event at sequence ``n``
among its auth events, so **within a chain a lower sequence number is always an ancestor of
a higher one**. Reachability between chains is recorded by *links*::

    ChainLink(origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number)

meaning "every event on ``origin_chain_id`` at sequence ``>= origin_sequence_number`` has
every event on ``target_chain_id`` at sequence ``<= target_sequence_number`` in its auth
chain". Links are stored transitively closed (a chain links directly to every chain it can
reach, so queries never recurse) and only when they raise the reach: for a given
``(origin_chain_id, target_chain_id)`` pair, links sorted by origin sequence have strictly
increasing target sequences. Hence the reach of an event into another chain is the target
sequence of the last link at or below its own sequence, found by bisection.

Persistence
-----------
:meth:`AuthChainIndex.positions` and :meth:`AuthChainIndex.links` are plain rows (one per
event, one per link) that a storage layer can write as they are; :meth:`AuthChainIndex.load`
rebuilds an equal index from them, which can then keep accepting new events.
:meth:`AuthChainIndex.add_event` returns exactly the rows the new event added, so storage
can persist incrementally.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["AuthChainIndex", "ChainKey", "ChainLink", "ChainPosition"]

#: How far up a chain :meth:`AuthChainIndex.auth_chain_difference` looks for a common
#: event before computing the common events' reach.
_COVER_SCAN = 8

ChainKey = tuple[str, str]
"""What a chain is a run of, e.g. the ``(type, state_key)`` of its events; optional."""


@dataclass(frozen=True, slots=True, order=True)
class ChainPosition:
    """Where one event sits in the index: a row of the ``event_auth_chains`` kind."""

    event_id: str
    chain_id: int
    sequence_number: int


@dataclass(frozen=True, slots=True, order=True)
class ChainLink:
    """Events on ``origin_chain_id`` from ``origin_sequence_number`` on reach the events on
    ``target_chain_id`` up to and including ``target_sequence_number``."""

    origin_chain_id: int
    origin_sequence_number: int
    target_chain_id: int
    target_sequence_number: int


class _TargetLinks:
    """The links from one chain to one other chain, in increasing origin order.

    Invariant: ``origins`` and ``targets`` are both strictly increasing and equally long.
    """

    __slots__ = ("origins", "targets")

    def __init__(self) -> None:
        self.origins: list[int] = []
        self.targets: list[int] = []

    def reach(self, sequence_number: int) -> int:
        """The highest target sequence reachable from ``sequence_number`` (0: none)."""
        i = bisect.bisect_right(self.origins, sequence_number)
        return self.targets[i - 1] if i else 0


class AuthChainIndex:
    """An in-memory chain cover index for one or more rooms' auth DAGs.

    Invariants:

    * events are added after all of their auth events (topological order), so every
      event's position and reach are final when it is added;
    * ``_chains[c][s - 1]`` is the event at ``(c, s)``; sequence numbers start at 1;
    * within a chain, the event at ``s`` is in the auth chain of the event at ``s + 1``;
    * ``_links[c][t]`` holds the transitively closed, reach-increasing links from chain
      ``c`` to chain ``t`` (never ``c == t``);
    * ``_incoming[t]`` is exactly the set of chains ``c`` with ``_links[c][t]``.
    """

    def __init__(self) -> None:
        self._positions: dict[str, tuple[int, int]] = {}
        self._chains: dict[int, list[str]] = {}
        self._links: dict[int, dict[int, _TargetLinks]] = {}
        self._incoming: dict[int, set[int]] = {}
        self._chain_keys: dict[int, ChainKey] = {}
        self._next_chain_id = 1

    # -- building -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._positions)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._positions

    def add_event(
        self, event_id: str, auth_event_ids: Iterable[str], chain_key: ChainKey | None = None
    ) -> tuple[ChainPosition, list[ChainLink]]:
        """Index ``event_id``, whose auth events must all be indexed already.

        Returns the position given to the event and the links it added (the rows storage
        should persist). Adding an event that is already indexed changes nothing and
        returns its position with no links: event IDs are content hashes, so the auth
        events cannot differ.

        Which chain the event joins only affects the index's size, never its answers
        (any chain stays a path of auth edges). With a ``chain_key`` (callers pass the
        event's ``(type, state_key)``, as Synapse chains by it) the event extends the chain
        of an auth event with the same key that is its chain's last event, or starts a new
        chain with that key: one chain per run of power levels, per user's memberships.
        Without one it extends the first unkeyed chain it can, or starts a new one.
        """
        existing = self._positions.get(event_id)
        if existing is not None:
            return ChainPosition(event_id, *existing), []

        auth_ids = list(dict.fromkeys(auth_event_ids))
        missing = [a for a in auth_ids if a not in self._positions]
        if missing:
            raise ValueError(
                f"auth events {missing} of {event_id} are not indexed; "
                "add events in topological order"
            )
        if event_id in auth_ids:
            raise ValueError(f"event {event_id} lists itself as an auth event")

        # Reach of the new event into every chain: the union of each auth event's own
        # position and its reach (all of which is transitively closed already).
        reach = self._upper_bounds(auth_ids, inclusive=True)

        chain_id, seq = self._place(auth_ids, chain_key)
        self._positions[event_id] = (chain_id, seq)
        self._chains.setdefault(chain_id, []).append(event_id)
        if chain_key is not None:
            self._chain_keys[chain_id] = chain_key

        # Same-chain ancestry is implied by sequence numbers, not stored as a link.
        reach.pop(chain_id, None)
        new_links: list[ChainLink] = []
        chain_links = self._links.setdefault(chain_id, {})
        for target, target_seq in sorted(reach.items()):
            links = chain_links.get(target)
            if links is None:
                links = chain_links[target] = _TargetLinks()
                self._incoming.setdefault(target, set()).add(chain_id)
            # Only store a link when it extends what the chain already reaches from below:
            # this keeps the per-pair target sequences strictly increasing. (The new event
            # is the chain's highest, so what lies below reaches the last link's target.)
            if not links.targets or links.targets[-1] < target_seq:
                links.origins.append(seq)
                links.targets.append(target_seq)
                new_links.append(ChainLink(chain_id, seq, target, target_seq))
        return ChainPosition(event_id, chain_id, seq), new_links

    def _place(self, auth_ids: Sequence[str], chain_key: ChainKey | None) -> tuple[int, int]:
        for auth_id in auth_ids:
            chain_id, seq = self._positions[auth_id]
            if len(self._chains[chain_id]) == seq and self._chain_keys.get(chain_id) == chain_key:
                return chain_id, seq + 1
        chain_id = self._next_chain_id
        self._next_chain_id += 1
        return chain_id, 1

    # -- persistence ----------------------------------------------------------------

    def position(self, event_id: str) -> ChainPosition:
        """The position of one indexed event (``KeyError`` if it is not indexed)."""
        chain_id, seq = self._positions[event_id]
        return ChainPosition(event_id, chain_id, seq)

    def positions(self) -> list[ChainPosition]:
        """Every event's ``(chain_id, sequence_number)``, as rows, sorted."""
        return sorted(ChainPosition(e, c, s) for e, (c, s) in self._positions.items())

    def chain_keys(self) -> dict[int, ChainKey]:
        """The key of every keyed chain (see :meth:`add_event`), for persisting."""
        return dict(self._chain_keys)

    def links(self) -> list[ChainLink]:
        """Every stored link, as rows, sorted."""
        return sorted(
            ChainLink(chain_id, origin, target, target_seq)
            for chain_id, by_target in self._links.items()
            for target, links in by_target.items()
            for origin, target_seq in zip(links.origins, links.targets, strict=True)
        )

    @classmethod
    def load(
        cls,
        positions: Iterable[ChainPosition],
        links: Iterable[ChainLink],
        chain_keys: Mapping[int, ChainKey] | None = None,
    ) -> AuthChainIndex:
        """Rebuild an index from rows previously returned by :meth:`positions`,
        :meth:`links` or :meth:`add_event`, and :meth:`chain_keys` (without which the
        reloaded index answers the same but places new events on new chains).

        Checks that every chain's sequence numbers are exactly ``1..n`` and that links only
        name indexed chains; it cannot check that the rows describe a real DAG.
        """
        index = cls()
        by_chain: dict[int, dict[int, str]] = {}
        for row in positions:
            if row.event_id in index._positions:
                raise ValueError(f"event {row.event_id} has two positions")
            index._positions[row.event_id] = (row.chain_id, row.sequence_number)
            by_chain.setdefault(row.chain_id, {})[row.sequence_number] = row.event_id
        for chain_id, members in by_chain.items():
            if sorted(members) != list(range(1, len(members) + 1)):
                raise ValueError(f"chain {chain_id} has gaps in its sequence numbers")
            index._chains[chain_id] = [members[s] for s in range(1, len(members) + 1)]
        index._next_chain_id = max(by_chain, default=0) + 1
        index._chain_keys = {c: k for c, k in (chain_keys or {}).items() if c in by_chain}

        for link in sorted(links):
            if (
                link.origin_chain_id not in index._chains
                or link.target_chain_id not in index._chains
                or link.origin_chain_id == link.target_chain_id
            ):
                raise ValueError(f"link {link} names an unknown chain or links a chain to itself")
            by_target = index._links.setdefault(link.origin_chain_id, {})
            pair = by_target.get(link.target_chain_id)
            if pair is None:
                pair = by_target[link.target_chain_id] = _TargetLinks()
                index._incoming.setdefault(link.target_chain_id, set()).add(link.origin_chain_id)
            # Rows that do not raise the reach are redundant; dropping them keeps the
            # strictly-increasing invariant that bisection relies on.
            if pair.reach(link.origin_sequence_number) < link.target_sequence_number:
                if pair.origins and pair.origins[-1] == link.origin_sequence_number:
                    pair.targets[-1] = link.target_sequence_number
                else:
                    pair.origins.append(link.origin_sequence_number)
                    pair.targets.append(link.target_sequence_number)
        return index

    # -- queries --------------------------------------------------------------------

    def _upper_bounds(self, event_ids: Iterable[str], *, inclusive: bool) -> dict[int, int]:
        """Per chain, the highest sequence number in the (inclusive) auth chain of the
        events. Everything at or below the bound on that chain is in the set."""
        # Only the highest of the events on each chain matters: it reaches everything the
        # lower ones do.
        highest = self._highest(event_ids)
        bounds: dict[int, int] = {}
        for chain_id, seq in highest.items():
            own = seq if inclusive else seq - 1
            if bounds.get(chain_id, 0) < own:
                bounds[chain_id] = own
            for target, links in self._links.get(chain_id, {}).items():
                # Most events asked about are their chain's latest: skip the bisection.
                origins = links.origins
                target_seq = links.targets[-1] if seq >= origins[-1] else links.reach(seq)
                if bounds.get(target, 0) < target_seq:
                    bounds[target] = target_seq
        return bounds

    def _expand(self, ranges: Mapping[int, tuple[int, int]]) -> set[str]:
        """The events with ``low < sequence_number <= high`` on each chain."""
        result: set[str] = set()
        for chain_id, (low, high) in ranges.items():
            if high > low:
                result.update(self._chains[chain_id][low:high])
        return result

    def auth_chain(self, event_ids: Iterable[str]) -> set[str]:
        """The auth chain of the events: their auth events, recursively.

        The given events themselves are excluded unless one is in another's auth chain
        (the spec's definition). ``KeyError`` for an event that is not indexed.
        """
        bounds = self._upper_bounds(event_ids, inclusive=False)
        return self._expand({c: (0, high) for c, high in bounds.items()})

    def is_in_auth_chain(self, ancestor_id: str, event_id: str) -> bool:
        """Whether ``ancestor_id`` is in the auth chain of ``event_id``."""
        chain_id, seq = self._positions[ancestor_id]
        return self._upper_bounds([event_id], inclusive=False).get(chain_id, 0) >= seq

    def _highest(self, event_ids: Iterable[str]) -> dict[int, int]:
        """Per chain, the highest sequence number among the events."""
        highest: dict[int, int] = {}
        positions = self._positions
        for event_id in event_ids:
            try:
                chain_id, seq = positions[event_id]
            except KeyError:
                raise KeyError(f"event {event_id} is not in the auth chain index") from None
            if highest.get(chain_id, 0) < seq:
                highest[chain_id] = seq
        return highest

    def _difference(
        self,
        per_set: Sequence[Mapping[int, int]],
        shared_top: Callable[[int], int] | None,
        covered: Callable[[int, int], bool] | None = None,
    ) -> set[str]:
        """The auth difference from each set's bounds over its *differing* events and the
        events every set shares, given per chain by ``shared_top(chain)`` (the highest
        shared sequence number on it, 0 if none).

        With ``X`` the inclusive auth chain of the shared events and ``Yᵢ`` that of set
        ``i``'s other events, ``Cᵢ = X | Yᵢ``, so the difference is
        ``(union(Yᵢ) - intersection(Yᵢ)) - X``. Per chain the first part is the range
        between the lowest and highest bound; ``X`` then covers the range up to the shared
        events' reach into the chain, found through the links *into* the chain (a reverse
        map), stopping once the whole range is covered. ``covered(chain, high)`` may answer
        "the shared events reach ``high`` on the chain" cheaply first. ``shared_top`` is
        None when the sets share nothing.
        """
        ranges: dict[int, tuple[int, int]] = {}
        for chain_id in set().union(*per_set):
            bounds = [b.get(chain_id, 0) for b in per_set]
            low, high = min(bounds), max(bounds)
            if high > low:
                ranges[chain_id] = (low, high)
        if shared_top is None:
            return self._expand(ranges)
        for chain_id, (low, high) in list(ranges.items()):
            if covered is not None and covered(chain_id, high):
                del ranges[chain_id]
                continue
            bound = shared_top(chain_id)
            if bound < high:
                for origin in self._incoming.get(chain_id, ()):
                    origin_seq = shared_top(origin)
                    if origin_seq:
                        reach = self._links[origin][chain_id].reach(origin_seq)
                        if reach > bound:
                            bound = reach
                            if bound >= high:
                                break
            ranges[chain_id] = (max(low, bound), high)
        return self._expand(ranges)

    def auth_chain_difference(self, state_sets: Sequence[Iterable[str]]) -> set[str]:
        """The auth chain difference (union minus intersection of the ``Cᵢ``) of the state sets.

        ``Cᵢ`` is the auth chain of the events in state set ``i`` **including those events
        themselves**, as Synapse computes it: an event present in every state set is then
        never in the difference, while one that only some sets contain is. Per chain, the
        union is everything up to the highest bound of any set and the intersection
        everything up to the lowest bound of all sets, so the difference is the range
        between the two: no event-by-event walk. State sets being merged mostly share their
        events: the ranges come from the events that differ (see :meth:`_difference`).
        """
        if not state_sets:
            return set()
        sets = [s if isinstance(s, (set, frozenset)) else set(s) for s in state_sets]
        common: set[str] = set(sets[0]).intersection(*sets[1:])
        per_set = [self._upper_bounds(s - common, inclusive=True) for s in sets]
        highest: dict[int, int] | None = None

        def shared_top(chain_id: int) -> int:
            nonlocal highest
            if highest is None:  # one pass over the shared events, only if needed
                highest = self._highest(common)
            return highest.get(chain_id, 0)

        def covered(chain_id: int, high: int) -> bool:
            # A shared event at or a few steps above the range's top covers it: usually
            # the state's latest event of the chain's key.
            return not common.isdisjoint(self._chains[chain_id][high - 1 : high - 1 + _COVER_SCAN])

        return self._difference(per_set, shared_top if common else None, covered)

    def auth_chain_difference_of_states(
        self, shared: Mapping[ChainKey, str], differing: Sequence[Iterable[str]]
    ) -> set[str]:
        """:meth:`auth_chain_difference` of state sets given as what they share and what
        they do not: state set ``i`` is ``shared.values() | differing[i]``.

        ``shared`` is a state map (one event per key: the unconflicted state map) whose
        events are in every set. Because chains are keyed by ``(type, state_key)`` and
        ``shared`` holds one event per key, the shared event on any keyed chain is found
        by its key, so the shared events' reach into a chain comes from the links into
        that chain without going over the shared events at all: a merge costs what
        differs, however big the room's state. (Unkeyed chains fall back to a pass over
        the shared events.) Shared events not in the index contribute nothing.
        """
        per_set = [self._upper_bounds(d, inclusive=True) for d in differing]
        if not per_set:
            return set()
        positions, chain_keys = self._positions, self._chain_keys
        fallback: dict[int, int] | None = None

        def shared_top(chain_id: int) -> int:
            nonlocal fallback
            key = chain_keys.get(chain_id)
            if key is None:
                if fallback is None:
                    fallback = self._highest(e for e in shared.values() if e in positions)
                return fallback.get(chain_id, 0)
            event_id = shared.get(key)
            position = positions.get(event_id) if event_id is not None else None
            return position[1] if position is not None and position[0] == chain_id else 0

        return self._difference(per_set, shared_top if shared else None)

    def conflicted_subgraph(self, conflicted_event_ids: Iterable[str]) -> set[str]:
        """The conflicted state subgraph (state resolution v2.1, MSC4297).

        The union of all auth-event paths between pairs of the given events, endpoints
        included. With ``A(Y)``: "``Y`` is in the auth chain of a conflicted event" and
        ``D(Y)``: "a conflicted event is in the auth chain of ``Y``", an event is in the
        subgraph iff ``A(Y) and D(Y)`` (an inner event of a path) or it is conflicted and
        ``A(Y) or D(Y)`` (an endpoint). A conflicted event on no path is not returned.

        Computed per chain without walking events: the events satisfying ``A`` form a
        prefix of each chain (sequence ``<= high``) and those satisfying ``D`` a suffix
        (sequence ``>= low``), where ``low`` is one above the chain's lowest conflicted
        event, or the origin of the first link reaching a conflicted event on another
        chain, whichever is lower.
        """
        conflicted = set(conflicted_event_ids)
        highs = self._upper_bounds(conflicted, inclusive=False)

        # Lowest conflicted sequence number per chain.
        lowest_conflicted: dict[int, int] = {}
        for event_id in conflicted:
            chain_id, seq = self._positions[event_id]
            if seq < lowest_conflicted.get(chain_id, seq + 1):
                lowest_conflicted[chain_id] = seq

        def descendant_low(chain_id: int) -> int:
            """Lowest sequence on the chain with a conflicted event in its auth chain."""
            low = lowest_conflicted.get(chain_id, len(self._chains[chain_id])) + 1
            chain_links = self._links.get(chain_id, {})
            # Few chains hold conflicted events: look those up rather than scan every link.
            for target, target_low in lowest_conflicted.items():
                links = chain_links.get(target)
                if links is None:
                    continue
                # The first link from this chain that reaches the target's lowest
                # conflicted event: every later sequence on this chain reaches it too.
                i = bisect.bisect_left(links.targets, target_low)
                if i < len(links.origins) and links.origins[i] < low:
                    low = links.origins[i]
            return low

        lows = {chain_id: descendant_low(chain_id) for chain_id in highs.keys() | lowest_conflicted}
        result = self._expand({c: (lows[c] - 1, high) for c, high in highs.items()})
        for event_id in conflicted:
            chain_id, seq = self._positions[event_id]
            if seq <= highs.get(chain_id, 0) or seq >= lows[chain_id]:
                result.add(event_id)
        return result
