"""State resolution v2 / v2.1 for room versions 2 to 12 against Synapse's
``synapse.state.v2.resolve_events_with_store``.

The same random room DAGs as ``test_resolution_properties`` (each played in a room of
the version under test, so every event passed that version's auth rules at its state),
random choices of states in them, and both implementations resolving those states from
the same events and auth chain differences: the state maps must be equal. Versions 2 to
9 share v10's algorithm but not its auth rules, which the replay consults.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Collection, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion
from roomstream.state.resolution import resolve_state
from tests.support.resolution_moves import Move, moves, play
from tests.support.state_dag import RoomDag

# (synapse.event_auth first: importing synapse.state alone hits a circular import.)
pytest.importorskip("synapse.event_auth")
synapse_versions = pytest.importorskip("synapse.api.room_versions")
synapse_events = pytest.importorskip("synapse.events")
synapse_v2 = pytest.importorskip("synapse.state.v2")
synapse_federation = pytest.importorskip("synapse.storage.databases.main.event_federation")

VERSIONS = [KNOWN_ROOM_VERSIONS[str(n)] for n in range(2, 13)]


class _Clock:
    async def sleep(self, duration: object) -> None:
        await asyncio.sleep(0)


class _SynapseStore:
    """Synapse's store protocol over the DAG's events and its chain index."""

    def __init__(self, dag: RoomDag) -> None:
        version = synapse_versions.KNOWN_ROOM_VERSIONS[dag.version.identifier]
        self.dag = dag
        self.events = {
            e.event_id: synapse_events.make_event_from_dict(
                {"hashes": {}, "signatures": {}, **copy.deepcopy(e.data)}, version
            )
            for e in dag.events.values()
        }

    async def get_events(
        self, event_ids: Collection[str], allow_rejected: bool = False
    ) -> dict[str, Any]:
        return {e: self.events[e] for e in event_ids if e in self.events}

    async def get_auth_chain_difference(
        self,
        room_id: str,
        state_sets: list[set[str]],
        conflicted_state: set[str] | None,
        additional_backwards_reachable_conflicted_events: set[str] | None,
    ) -> Any:
        difference = await self.dag.store.get_auth_chain_difference(room_id, state_sets)
        subgraph = None
        if conflicted_state is not None:
            wanted = set(conflicted_state) | set(
                additional_backwards_reachable_conflicted_events or ()
            )
            subgraph = await self.dag.store.get_conflicted_subgraph(room_id, wanted)
        return synapse_federation.StateDifference(
            auth_difference=difference, conflicted_subgraph=subgraph
        )


async def compare(version: RoomVersion, script: Sequence[Move], picks: Sequence[int]) -> None:
    dag = await play(version, script, hashed_ids=True)
    names = sorted(dag.state_after)
    states = [dag.state_after[names[p % len(names)]] for p in picks]
    ours = await resolve_state(dag.room_id, version, states, dag.store)
    theirs = await synapse_v2.resolve_events_with_store(
        _Clock(),
        dag.room_id,
        synapse_versions.KNOWN_ROOM_VERSIONS[version.identifier],
        states,
        None,
        _SynapseStore(dag),
    )
    assert ours == dict(theirs)


@pytest.mark.parametrize("version", VERSIONS, ids=[v.identifier for v in VERSIONS])
@settings(max_examples=100, deadline=None)
@given(
    script=st.lists(moves, min_size=1, max_size=9),
    picks=st.lists(st.integers(min_value=0, max_value=1_000), min_size=2, max_size=4),
)
def test_v2_matches_synapse_on_random_dags(
    version: RoomVersion, script: list[Move], picks: list[int]
) -> None:
    asyncio.run(compare(version, script, picks))
