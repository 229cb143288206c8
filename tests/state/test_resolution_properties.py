"""Properties of state resolution on random room DAGs.

Hypothesis draws a script of moves (who does what, after which earlier events); the
script is played on top of the scenarios' initial room, keeping only the moves the auth
rules allow at the state they would be sent in. Then random states of that DAG are
resolved:

* in any order of the state sets, with the same result;
* with the conflicted state subgraph from the chain index or from the fallback walk of a
  store without an index, with the same result;
* keeping the unconflicted state map, and only naming known events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import ROOM_V10, ROOM_V12, RoomVersion
from roomstream.state.resolution import (
    ConflictedSubgraphStore,
    InMemoryStateResolutionStore,
    ResolutionMemo,
    _conflicted_state_subgraph,
    _EventCache,
    resolve_state,
    resolve_state_detailed,
    separate_state_sets,
)
from tests.support.resolution_moves import Move, moves, play

"""(prev event picks, kind, actor, target, level): indices wrap around what exists."""


class NoIndexStore:
    """The same events, without ``get_conflicted_subgraph``: forces the fallback walk."""

    def __init__(self, inner: InMemoryStateResolutionStore) -> None:
        self._inner = inner

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        return await self._inner.get_events(event_ids)

    async def get_auth_chain_difference(
        self, room_id: str, state_sets: Sequence[set[str]]
    ) -> set[str]:
        return await self._inner.get_auth_chain_difference(room_id, state_sets)


def test_no_index_store_uses_the_fallback() -> None:
    assert isinstance(InMemoryStateResolutionStore(), ConflictedSubgraphStore)
    assert not isinstance(NoIndexStore(InMemoryStateResolutionStore()), ConflictedSubgraphStore)


async def check_properties(
    version: RoomVersion, script: Sequence[Move], picks: Sequence[int], order: Sequence[int]
) -> None:
    dag = await play(version, script)
    names = sorted(dag.state_after)
    chosen = [names[p % len(names)] for p in picks]
    states: list[dict[StateKey, str]] = [dag.state_after[n] for n in chosen]

    resolved = await resolve_state(dag.room_id, version, states, dag.store)

    permuted = [states[i % len(states)] for i in order]
    # A permutation of the same multiset of states (``order`` may repeat or drop indices,
    # so rebuild a true permutation from it).
    seen: list[int] = []
    for i in order:
        if i % len(states) not in seen:
            seen.append(i % len(states))
    seen += [i for i in range(len(states)) if i not in seen]
    permuted = [states[i] for i in seen]
    assert await resolve_state(dag.room_id, version, permuted, dag.store) == resolved

    if version.state_resolution.value == "v2.1":
        fallback = await resolve_state(dag.room_id, version, states, NoIndexStore(dag.store))
        assert fallback == resolved

    # What the persister passes changes nothing: a superset of the differing keys (here
    # the keys of every set plus one no set has) and a memo shared across resolutions.
    candidates = set().union(*(s.keys() for s in states)) | {("m.room.topic", "unused")}
    memo = ResolutionMemo()
    for _ in range(2):  # the second run answers from the memo
        detailed = await resolve_state_detailed(
            dag.room_id, version, states, dag.store, memo, candidate_keys=candidates
        )
        assert detailed.state == resolved
    # Outside the decided keys, the result holds what every state set agreed on.
    for state in states:
        for key in state.keys() | resolved.keys():
            if key not in detailed.decided:
                assert resolved.get(key) == state.get(key)

    unconflicted, conflicted = separate_state_sets(states)
    assert separate_state_sets(states, candidates) == (unconflicted, conflicted)
    assert separate_state_sets(states, set(conflicted)) == (unconflicted, conflicted)
    assert {k: resolved.get(k) for k in unconflicted} == unconflicted
    assert all(event_id in dag.store for event_id in resolved.values())
    assert all(dag.store_event(v).state_tuple == k for k, v in resolved.items())


scripts = st.lists(moves, min_size=1, max_size=9)
pick_lists = st.lists(st.integers(min_value=0, max_value=1_000), min_size=2, max_size=4)
orders = st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=4)


@settings(max_examples=150, deadline=None)
@given(scripts, pick_lists, orders)
def test_v2_order_independent_and_consistent(
    script: list[Move], picks: list[int], order: list[int]
) -> None:
    asyncio.run(check_properties(ROOM_V10, script, picks, order))


@settings(max_examples=150, deadline=None)
@given(scripts, pick_lists, orders)
def test_v2_1_order_independent_and_consistent(
    script: list[Move], picks: list[int], order: list[int]
) -> None:
    asyncio.run(check_properties(ROOM_V12, script, picks, order))


async def compare_subgraphs(script: Sequence[Move], picks: Sequence[int]) -> None:
    dag = await play(ROOM_V12, script)
    names = sorted(dag.events)
    conflicted = {dag.events[names[p % len(names)]].event_id for p in picks}
    conflicted = {e for e in conflicted if dag.store_event(e).is_state()}
    from_index = await dag.store.get_conflicted_subgraph(dag.room_id, conflicted)
    walked = await _conflicted_state_subgraph(
        dag.room_id, conflicted, NoIndexStore(dag.store), _EventCache(dag.room_id, dag.store)
    )
    assert walked == from_index


@settings(max_examples=150, deadline=None)
@given(scripts, pick_lists)
def test_fallback_subgraph_walk_matches_the_index(script: list[Move], picks: list[int]) -> None:
    asyncio.run(compare_subgraphs(script, picks))
