"""The chain cover index against a naive graph walk, on fixed and random auth DAGs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.state.auth_chain_index import AuthChainIndex, ChainKey, ChainLink, ChainPosition

Dag = dict[str, list[str]]
"""event ID -> auth event IDs, in insertion (topological) order."""


# -- naive reference -----------------------------------------------------------------


def naive_auth_chain(dag: Mapping[str, Sequence[str]], event_ids: Iterable[str]) -> set[str]:
    """Strict ancestors, by walking every auth edge."""
    seen: set[str] = set()
    stack = [a for e in event_ids for a in dag[e]]
    while stack:
        event_id = stack.pop()
        if event_id not in seen:
            seen.add(event_id)
            stack.extend(dag[event_id])
    return seen


def naive_difference(dag: Mapping[str, Sequence[str]], state_sets: Sequence[set[str]]) -> set[str]:
    chains = [naive_auth_chain(dag, s) | s for s in state_sets]
    return set[str]().union(*chains) - chains[0].intersection(*chains[1:])


def naive_subgraph(dag: Mapping[str, Sequence[str]], conflicted: set[str]) -> set[str]:
    """Events on an auth path between two conflicted events, endpoints included."""
    ancestors = naive_auth_chain(dag, conflicted)
    result = set()
    for event_id in dag:
        below = naive_auth_chain(dag, [event_id])
        is_descendant = bool(below & conflicted)
        if (event_id in ancestors and is_descendant) or (
            event_id in conflicted and (event_id in ancestors or is_descendant)
        ):
            result.add(event_id)
    return result


def key_of(event_id: str, nkeys: int) -> ChainKey | None:
    """A chain key for the event: none at all, or one of ``nkeys`` kinds of state."""
    return ("m.kind", str(int(event_id[2:]) % nkeys)) if nkeys else None


def build(dag: Dag, nkeys: int = 0) -> AuthChainIndex:
    index = AuthChainIndex()
    for event_id, auth_ids in dag.items():
        index.add_event(event_id, auth_ids, key_of(event_id, nkeys))
    return index


# -- random DAGs -----------------------------------------------------------------------


@st.composite
def auth_dags(draw: st.DrawFn, max_events: int = 30) -> Dag:
    """A random DAG: each event cites a random subset of the earlier ones (at least the
    root, as real events cite the create event)."""
    n = draw(st.integers(min_value=1, max_value=max_events))
    dag: Dag = {"$e0": []}
    for i in range(1, n):
        earlier = [f"$e{j}" for j in range(i)]
        cited = draw(st.lists(st.sampled_from(earlier), max_size=4, unique=True))
        # Sometimes omit the root to get several components / unrelated chains.
        if draw(st.booleans()) and "$e0" not in cited:
            cited.append("$e0")
        dag[f"$e{i}"] = cited
    return dag


@st.composite
def dag_and_sets(draw: st.DrawFn) -> tuple[Dag, list[set[str]], int]:
    """A DAG, some sets of its events, and how many chain keys to index it with."""
    dag = draw(auth_dags())
    ids = sorted(dag)
    sets = draw(
        st.lists(st.sets(st.sampled_from(ids), max_size=6), min_size=1, max_size=4),
    )
    return dag, sets, draw(st.integers(min_value=0, max_value=3))


@settings(max_examples=300, deadline=None)
@given(dag_and_sets())
def test_auth_chain_matches_naive_walk(case: tuple[Dag, list[set[str]], int]) -> None:
    dag, sets, nkeys = case
    index = build(dag, nkeys)
    for event_ids in sets:
        assert index.auth_chain(event_ids) == naive_auth_chain(dag, event_ids)
    for event_id in dag:
        assert index.auth_chain([event_id]) == naive_auth_chain(dag, [event_id])


@settings(max_examples=300, deadline=None)
@given(dag_and_sets())
def test_auth_chain_difference_matches_naive_walk(
    case: tuple[Dag, list[set[str]], int],
) -> None:
    dag, sets, nkeys = case
    index = build(dag, nkeys)
    assert index.auth_chain_difference(sets) == naive_difference(dag, sets)


@st.composite
def dag_and_overlapping_sets(draw: st.DrawFn) -> tuple[Dag, list[set[str]], int]:
    """A DAG and state sets that share most of their events, as the states of a fork's
    sides do (the case the difference computes from the differing events only)."""
    dag = draw(auth_dags(max_events=40))
    ids = sorted(dag)
    common = draw(st.sets(st.sampled_from(ids), max_size=20))
    extras = draw(
        st.lists(st.sets(st.sampled_from(ids), max_size=4), min_size=1, max_size=4),
    )
    return dag, [common | extra for extra in extras], draw(st.integers(min_value=0, max_value=3))


@settings(max_examples=300, deadline=None)
@given(dag_and_overlapping_sets())
def test_auth_chain_difference_of_overlapping_sets_matches_naive_walk(
    case: tuple[Dag, list[set[str]], int],
) -> None:
    dag, sets, nkeys = case
    index = build(dag, nkeys)
    assert index.auth_chain_difference(sets) == naive_difference(dag, sets)
    # The same after a round trip through the stored rows (the reverse links are rebuilt).
    reloaded = AuthChainIndex.load(index.positions(), index.links(), index.chain_keys())
    assert reloaded.auth_chain_difference(sets) == naive_difference(dag, sets)


@st.composite
def dag_and_state_maps(draw: st.DrawFn) -> tuple[Dag, list[dict[ChainKey, str]], int]:
    """A DAG and state maps over it (one event per key, keys as the index chains them),
    sharing a base map and each changing or dropping a few keys."""
    dag = draw(auth_dags(max_events=40))
    nkeys = draw(st.integers(min_value=0, max_value=4))

    def key(event_id: str) -> ChainKey:
        # Unkeyed chains (nkeys == 0): every event is its own key.
        return key_of(event_id, nkeys) or ("m.event", event_id)

    by_key: dict[ChainKey, list[str]] = {}
    for event_id in dag:
        by_key.setdefault(key(event_id), []).append(event_id)
    keys = sorted(by_key)
    base = {k: draw(st.sampled_from(by_key[k])) for k in draw(st.sets(st.sampled_from(keys)))}
    maps = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        state = dict(base)
        for k in draw(st.sets(st.sampled_from(keys), max_size=3)):
            if draw(st.booleans()):
                state[k] = draw(st.sampled_from(by_key[k]))
            else:
                state.pop(k, None)
        maps.append(state)
    return dag, maps, nkeys


@settings(max_examples=300, deadline=None)
@given(dag_and_state_maps())
def test_auth_chain_difference_of_states_matches_naive_walk(
    case: tuple[Dag, list[dict[ChainKey, str]], int],
) -> None:
    dag, maps, nkeys = case
    index = build(dag, nkeys)
    first, *rest = maps
    shared = {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}
    differing = [{v for k, v in m.items() if shared.get(k) != v} for m in maps]
    expected = naive_difference(dag, [set(m.values()) for m in maps])
    assert index.auth_chain_difference_of_states(shared, differing) == expected


@settings(max_examples=200, deadline=None)
@given(dag_and_sets())
def test_conflicted_subgraph_matches_naive_walk(case: tuple[Dag, list[set[str]], int]) -> None:
    dag, sets, nkeys = case
    index = build(dag, nkeys)
    conflicted = set().union(*sets)
    assert index.conflicted_subgraph(conflicted) == naive_subgraph(dag, conflicted)


@settings(max_examples=150, deadline=None)
@given(dag_and_sets(), st.integers(min_value=0, max_value=30))
def test_persisted_rows_round_trip(case: tuple[Dag, list[set[str]], int], split: int) -> None:
    """Index part of the DAG, persist it as rows, load it back, index the rest: the result
    answers like an index built in one go, and the rows are the same."""
    dag, sets, nkeys = case
    items = list(dag.items())
    first = AuthChainIndex()
    rows: list[ChainPosition] = []
    link_rows: list[ChainLink] = []
    for event_id, auth_ids in items[:split]:
        position, links = first.add_event(event_id, auth_ids, key_of(event_id, nkeys))
        rows.append(position)
        link_rows.extend(links)
    # The incremental rows are exactly the full dump.
    assert sorted(rows) == first.positions()
    assert sorted(link_rows) == first.links()

    reloaded = AuthChainIndex.load(rows, link_rows, first.chain_keys())
    for event_id, auth_ids in items[split:]:
        reloaded.add_event(event_id, auth_ids, key_of(event_id, nkeys))
    whole = build(dag, nkeys)
    assert reloaded.chain_keys() == whole.chain_keys()
    assert reloaded.positions() == whole.positions()
    assert reloaded.links() == whole.links()
    assert reloaded.auth_chain_difference(sets) == naive_difference(dag, sets)


# -- fixed examples --------------------------------------------------------------------

# The example of Synapse's design note, shaped as a room: create, Alice's and Bob's
# memberships, two power levels. Chains group linear runs of auth edges.
ROOM: Dag = {
    "$create": [],
    "$alice_join": ["$create"],
    "$pl1": ["$create", "$alice_join"],
    "$bob_join1": ["$create", "$pl1"],
    "$pl2": ["$create", "$alice_join", "$pl1"],
    "$bob_join2": ["$create", "$pl2", "$bob_join1"],
    "$alice_invite": ["$create", "$pl1", "$alice_join"],
    "$alice_join2": ["$create", "$pl2", "$alice_invite"],
}


def test_fixed_room_queries() -> None:
    index = build(ROOM)
    assert index.auth_chain(["$bob_join2"]) == {
        "$create",
        "$alice_join",
        "$pl1",
        "$pl2",
        "$bob_join1",
    }
    assert index.is_in_auth_chain("$pl1", "$alice_join2")
    assert not index.is_in_auth_chain("$bob_join1", "$alice_join2")
    assert not index.is_in_auth_chain("$alice_join2", "$alice_join2")
    s1 = {"$alice_invite", "$bob_join2"}
    s2 = {"$alice_join2", "$bob_join1"}
    assert index.auth_chain_difference([s1, s2]) == naive_difference(ROOM, [s1, s2])
    # $pl2 and $alice_invite are reached from both sets; Bob's first join from both.
    assert index.auth_chain_difference([s1, s2]) == {"$alice_join2", "$bob_join2"}
    assert index.auth_chain_difference([s1, {"$alice_invite", "$bob_join1"}]) == {
        "$bob_join2",
        "$pl2",
    }
    assert index.auth_chain_difference([s1]) == set()
    assert index.auth_chain_difference([]) == set()


def test_linear_history_is_one_chain() -> None:
    dag = {f"$e{i}": ([f"$e{i - 1}"] if i else []) for i in range(10)}
    index = build(dag)
    assert {p.chain_id for p in index.positions()} == {1}
    assert index.links() == []
    assert index.auth_chain(["$e5"]) == {f"$e{i}" for i in range(5)}


def test_readding_is_a_no_op_and_order_is_enforced() -> None:
    index = build(ROOM)
    before = (index.positions(), index.links())
    position, links = index.add_event("$pl2", ["$create"])
    assert position == index.position("$pl2")
    assert links == []
    assert (index.positions(), index.links()) == before
    with pytest.raises(ValueError, match="topological order"):
        index.add_event("$late", ["$unknown"])
    with pytest.raises(KeyError):
        index.auth_chain(["$unknown"])


def test_load_rejects_gaps() -> None:
    with pytest.raises(ValueError, match="gaps"):
        AuthChainIndex.load([ChainPosition("$a", 1, 2)], [])
    with pytest.raises(ValueError, match="unknown chain"):
        AuthChainIndex.load([ChainPosition("$a", 1, 1)], [ChainLink(1, 1, 2, 1)])


def test_chain_keys_group_runs_of_state() -> None:
    """Keyed by (type, state_key), each run of the same state shares one chain even when
    events cite other state first."""
    index = AuthChainIndex()
    pl, member = ("m.room.power_levels", ""), ("m.room.member", "@a:hs")
    index.add_event("$create", [], ("m.room.create", ""))
    index.add_event("$join", ["$create"], member)
    index.add_event("$pl1", ["$create", "$join"], pl)
    index.add_event("$join2", ["$create", "$pl1", "$join"], member)
    index.add_event("$pl2", ["$create", "$pl1", "$join2"], pl)
    chains = {p.event_id: p.chain_id for p in index.positions()}
    assert chains["$join"] == chains["$join2"]
    assert chains["$pl1"] == chains["$pl2"]
    assert len(set(chains.values())) == 3
    assert index.position("$pl2").sequence_number == 2
