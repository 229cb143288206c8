"""State resolution v1 (room version 1) against Synapse's ``synapse.state.v1``.

Random room DAGs (the moves of ``test_resolution_properties``, played in a room of
version 1, so each event's state is itself resolved with v1) and random choices of the
states in them: roomstream's :func:`resolve_state` and Synapse's
``resolve_events_with_store`` must give the same state map, key for key. Then the
classic scenarios, where v1's known weaknesses show (it is not v2).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Collection, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.model import StateKey
from roomstream.events.room_versions import ROOM_V1, ROOM_V2
from roomstream.state.resolution import resolve_state, resolve_state_detailed
from tests.support.resolution_moves import Move, moves, play
from tests.support.state_dag import (
    ALICE,
    BOB,
    INITIAL_EDGES,
    INITIAL_EVENTS,
    JOIN_RULES,
    E,
    RoomDag,
    member,
    power_levels,
    topic,
)

synapse_versions = pytest.importorskip("synapse.api.room_versions")
synapse_events = pytest.importorskip("synapse.events")
# (synapse.event_auth first: importing synapse.state alone hits a circular import.)
pytest.importorskip("synapse.event_auth")
synapse_v1 = pytest.importorskip("synapse.state.v1")


async def synapse_resolve(dag: RoomDag, states: Sequence[dict[StateKey, str]]) -> dict[Any, str]:
    version = synapse_versions.KNOWN_ROOM_VERSIONS[dag.version.identifier]
    theirs = {
        e.event_id: synapse_events.make_event_from_dict(
            {"hashes": {}, "signatures": {}, **copy.deepcopy(e.data)}, version
        )
        for e in dag.events.values()
    }

    async def factory(event_ids: Collection[str]) -> dict[str, Any]:
        return {e: theirs[e] for e in event_ids if e in theirs}

    result = await synapse_v1.resolve_events_with_store(dag.room_id, version, states, None, factory)
    return dict(result)


async def compare(script: Sequence[Move], picks: Sequence[int]) -> None:
    dag = await play(ROOM_V1, script)
    names = sorted(dag.state_after)
    states = [dag.state_after[names[p % len(names)]] for p in picks]
    ours = await resolve_state(dag.room_id, ROOM_V1, states, dag.store)
    assert ours == await synapse_resolve(dag, states)
    # Outside the decided keys, the result holds what every state set agreed on.
    detailed = await resolve_state_detailed(dag.room_id, ROOM_V1, states, dag.store)
    for state in states:
        for key in state.keys() | ours.keys():
            if key not in detailed.decided:
                assert ours.get(key) == state.get(key)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(moves, min_size=1, max_size=10),
    st.lists(st.integers(min_value=0, max_value=1_000), min_size=2, max_size=4),
)
def test_v1_matches_synapse_on_random_dags(script: list[Move], picks: list[int]) -> None:
    asyncio.run(compare(script, picks))


async def _room(version: Any) -> RoomDag:
    dag = RoomDag(version)
    chain = INITIAL_EDGES[0]
    prevs = {child: [parent] for child, parent in itertools.pairwise(chain)}
    for spec in INITIAL_EVENTS:
        await dag.add(spec, prevs.get(spec.name, []))
    return dag


async def test_v1_takes_the_newest_allowed_topic_and_agrees_with_synapse() -> None:
    dag = await _room(ROOM_V1)
    await dag.add(topic("T1", ALICE), ["START"])
    await dag.add(topic("T2", ALICE), ["T1"])
    await dag.add(topic("T3", ALICE, "other"), ["START"])
    states = [dag.state_after["T2"], dag.state_after["T3"]]
    ours = await resolve_state(dag.room_id, ROOM_V1, states, dag.store)
    # T2 is deeper than T3: v1 prefers the deepest event that passes the auth rules.
    assert ours[("m.room.topic", "")] == "$T2"
    assert ours == await synapse_resolve(dag, states)


async def test_v1_ban_against_power_change_follows_depth() -> None:
    """Alice demotes Bob (depth d) while Bob, still powerful on his branch, bans someone:
    the conflicted power levels replay oldest first, the ban is judged afterwards."""
    dag = await _room(ROOM_V1)
    await dag.add(power_levels("PA", ALICE, {ALICE: 100, BOB: 50}), ["START"])
    await dag.add(member("MB", BOB, "@zara:example.com", "ban"), ["PA"])
    await dag.add(power_levels("PB", ALICE, {ALICE: 100, BOB: 0}), ["PA"])
    await dag.add(E("JR", ALICE, JOIN_RULES, "", {"join_rule": "invite"}), ["PB"])
    states = [dag.state_after["MB"], dag.state_after["JR"]]
    ours = await resolve_state(dag.room_id, ROOM_V1, states, dag.store)
    assert ours == await synapse_resolve(dag, states)
    assert ours[("m.room.power_levels", "")] == "$PB"
    assert ours[("m.room.join_rules", "")] == "$JR"


async def test_v1_key_missing_from_one_state_is_not_conflicted() -> None:
    dag = await _room(ROOM_V1)
    await dag.add(topic("T1", ALICE), ["START"])
    states = [dag.state_after["T1"], dag.state_after["START"]]
    ours = await resolve_state_detailed(dag.room_id, ROOM_V1, states, dag.store)
    assert ours.state[("m.room.topic", "")] == "$T1"
    assert ours.decided == frozenset({("m.room.topic", "")})
    assert ours.state == await synapse_resolve(dag, states)


async def test_room_version_2_resolves_with_v2() -> None:
    """Version 2 shares version 1's event format but resolves state with v2: a key one
    state set lacks is conflicted there, and here the topic stays (v2 replays it)."""
    dag = await _room(ROOM_V2)
    await dag.add(topic("T1", ALICE), ["START"])
    states = [dag.state_after["T1"], dag.state_after["START"]]
    resolved = await resolve_state(dag.room_id, ROOM_V2, states, dag.store)
    assert resolved[("m.room.topic", "")] == "$T1"
