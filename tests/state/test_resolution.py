"""State resolution v2 / v2.1 on the classic conflict scenarios.

Each scenario is a small room DAG written as a list of events and chains of
``prev_events`` edges (``["END", "B", "A"]`` means END follows B, B follows A), on top of
the same initial room: Alice creates it, sets power levels and public join rules, and Bob,
Charlie and Zara join. The builder walks the DAG in the order the events are listed,
computes the state before each event by resolving the states after its ``prev_events``
(with the room version under test), gives it the ``auth_events`` that state selects and a
timestamp one millisecond after the previous event, and checks every event is allowed at
that state (so the DAG is one a real server could have produced). The assertion is on the
full state at ``END``.

Events have readable IDs: ``$<NAME>``; in room version 12 the room ID is derived from
``$CREATE``. Room version 12 makes the creator (Alice) infinitely powerful and forbids
listing creators in ``users``, so power-levels contents drop Alice there; the scenarios
are otherwise identical in both versions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from roomstream.errors import AuthError
from roomstream.events.model import StateKey
from roomstream.events.room_versions import ROOM_V10, ROOM_V12, RoomVersion
from roomstream.state.resolution import (
    InMemoryStateResolutionStore,
    effective_auth_event_ids,
    resolve_state,
)
from tests.support.state_dag import (
    ALICE,
    BOB,
    CHARLIE,
    END,
    EVELYN,
    INITIAL_EDGES,
    INITIAL_EVENTS,
    JOIN_RULES,
    MEMBER,
    MESSAGE,
    POWER_LEVELS,
    TOPIC,
    ZARA,
    E,
    RoomDag,
    member,
    power_levels,
    topic,
)

BOTH_VERSIONS = pytest.mark.parametrize("version", [ROOM_V10, ROOM_V12], ids=["v10", "v12"])


async def build(
    version: RoomVersion, events: Sequence[E], edges: Sequence[Sequence[str]]
) -> RoomDag:
    """The initial room, then ``events`` and END, each after its edges' targets."""
    prevs: dict[str, list[str]] = {}
    for chain in [*INITIAL_EDGES, *edges]:
        for child, parent in itertools.pairwise(chain):
            prevs.setdefault(child, [])
            if parent not in prevs[child]:
                prevs[child].append(parent)
    prevs.setdefault("END", ["START"])
    dag = RoomDag(version)
    for spec in [*INITIAL_EVENTS, *events, END]:
        parents = prevs.get(spec.name, [])
        missing = [p for p in parents if p not in dag.events]
        assert not missing, f"{spec.name} listed before its prev events {missing}"
        await dag.add(spec, parents)
    return dag


def expected_state(
    dag: RoomDag, *names: str, remove: Sequence[StateKey] = ()
) -> dict[StateKey, str]:
    """The state at START with the named events applied (and ``remove`` keys dropped)."""
    state = dict(dag.state_after["START"])
    for name in names:
        event = dag.events[name]
        state[event.state_tuple] = event.event_id
    for key in remove:
        state.pop(key, None)
    return state


def state_at_end(dag: RoomDag) -> dict[StateKey, str]:
    return dag.state_after["END"]


# -- trivial cases --------------------------------------------------------------------------


@BOTH_VERSIONS
async def test_no_state_sets_resolve_to_nothing(version: RoomVersion) -> None:
    assert await resolve_state("!r:example.com", version, [], InMemoryStateResolutionStore()) == {}


@BOTH_VERSIONS
async def test_one_state_set_resolves_to_itself(version: RoomVersion) -> None:
    dag = await build(version, [], [])
    start = dag.state_after["START"]
    assert await resolve_state(dag.room_id, version, [start], dag.store) == start


@BOTH_VERSIONS
async def test_identical_state_sets_have_no_conflict(version: RoomVersion) -> None:
    dag = await build(version, [], [])
    start = dag.state_after["START"]
    assert await resolve_state(dag.room_id, version, [start, dict(start), start], dag.store) == (
        start
    )


@BOTH_VERSIONS
async def test_independent_changes_merge(version: RoomVersion) -> None:
    """Two branches change different keys: nothing is conflicted, both survive."""
    dag = await build(
        version,
        [topic("T1", ALICE), member("ME", EVELYN, EVELYN, "join")],
        [["END", "T1", "START"], ["END", "ME", "START"]],
    )
    assert state_at_end(dag) == expected_state(dag, "T1", "ME")


# -- the classic scenarios --------------------------------------------------------------------


@BOTH_VERSIONS
async def test_ban_vs_power_levels(version: RoomVersion) -> None:
    """Alice bans Bob while Bob, concurrently, re-issues the power levels.

    Alice's events sort first (higher power); once Bob is banned his power levels event is
    no longer allowed, so the ban and Alice's power levels win.
    """
    events = [
        power_levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        member("MA", ALICE, ALICE, "join"),
        member("MB", ALICE, BOB, "ban"),
        power_levels("PB", BOB, {ALICE: 100, BOB: 50}),
    ]
    edges = [["END", "MB", "MA", "PA", "START"], ["END", "PB", "PA"]]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "PA", "MA", "MB")


@BOTH_VERSIONS
async def test_join_rule_evasion(version: RoomVersion) -> None:
    """Evelyn joins on a branch that has not seen Alice make the room invite-only.

    The join rules change is a power event and is applied first; Evelyn's join is then
    re-checked against it and refused.
    """
    events = [
        E("JR", ALICE, JOIN_RULES, "", {"join_rule": "invite"}),
        member("ME", EVELYN, EVELYN, "join"),
    ]
    edges = [["END", "JR", "START"], ["END", "ME", "START"]]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "JR")
    assert (MEMBER, EVELYN) not in state_at_end(dag)


@BOTH_VERSIONS
async def test_offtopic_power_levels(version: RoomVersion) -> None:
    """A chain of power levels changes on one branch against the old one on the other:
    Charlie's last change, authorised through Bob's, stands."""
    events = [
        power_levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        power_levels("PB", BOB, {ALICE: 100, BOB: 50, CHARLIE: 50}),
        power_levels("PC", CHARLIE, {ALICE: 100, BOB: 50, CHARLIE: 0}),
    ]
    edges = [["END", "PC", "PB", "PA", "START"], ["END", "PA"]]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "PC")


@BOTH_VERSIONS
async def test_topic_basic(version: RoomVersion) -> None:
    """Alice demotes Bob (PA2) while Bob sets a topic (T3). Bob's power levels PB is
    refused after PA2; T3 then fails the auth checks against PA2, so Alice's T2 stays."""
    events = [
        topic("T1", ALICE),
        power_levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        power_levels("PA2", ALICE, {ALICE: 100, BOB: 0}),
        power_levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
    ]
    edges = [["END", "PA2", "T2", "PA1", "T1", "START"], ["END", "T3", "PB", "PA1"]]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "PA2", "T2")


@BOTH_VERSIONS
async def test_topic_reset(version: RoomVersion) -> None:
    """Bob sets a topic and is then banned by Alice; the other branch still has the old
    topic. Bob's topic fails against his ban, so the topic resets to Alice's T1."""
    events = [
        topic("T1", ALICE),
        power_levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", BOB),
        member("MB", ALICE, BOB, "ban"),
    ]
    edges = [["END", "MB", "T2", "PA", "T1", "START"], ["END", "T1"]]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "T1", "MB", "PA")


@BOTH_VERSIONS
async def test_topic_with_message_between(version: RoomVersion) -> None:
    """Synapse's ``test_topic``: the branches merge at a message (MZ1) and Alice then sets
    T4, which is the topic at END; PA2 is the power levels."""
    events = [
        topic("T1", ALICE),
        power_levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        power_levels("PA2", ALICE, {ALICE: 100, BOB: 0}),
        power_levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
        E("MZ1", ZARA, MESSAGE, None, {"body": "merge"}),
        topic("T4", ALICE),
    ]
    edges = [
        ["END", "T4", "MZ1", "PA2", "T2", "PA1", "T1", "START"],
        ["END", "MZ1", "T3", "PB", "PA1"],
    ]
    dag = await build(version, events, edges)
    assert state_at_end(dag) == expected_state(dag, "T4", "PA2")


@BOTH_VERSIONS
async def test_mainline_ordering_decides_between_topics(version: RoomVersion) -> None:
    """T3 (Bob, after PA2) against T4 (Alice, after Bob's PB, later timestamp).

    PA2 wins the power levels (PB needs level 100 under PA2). In mainline order based on
    PA2, T4 hangs off PA1 (position 1) and T3 off PA2 (position 0): T4 sorts first and
    T3 is applied last, although T4 is the newer event. Without mainline ordering T4 would
    win on its timestamp.
    """
    events = [
        topic("T1", ALICE),
        power_levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        power_levels("PA2", ALICE, {ALICE: 100, BOB: 50}, events={"m.room.power_levels": 100}),
        power_levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
        topic("T4", ALICE),
    ]
    edges = [
        ["END", "T3", "PA2", "T2", "PA1", "T1", "START"],
        ["END", "T4", "PB", "PA1"],
    ]
    dag = await build(version, events, edges)
    assert dag.events["T4"].origin_server_ts > dag.events["T3"].origin_server_ts
    assert state_at_end(dag) == expected_state(dag, "T3", "PA2")


# -- where v2.1 and v2 differ (MSC4297) --------------------------------------------------------


async def _problem_a(version: RoomVersion) -> tuple[RoomDag, dict[StateKey, str]]:
    """MSC4297 problem A. Alice makes the room invite-only (JR2) and then leaves. One
    server's view of the state at the end (from a faulty partial sync, say) still has the
    old join rules IJR; everything else agrees, including that Alice has left."""
    dag = await build(
        version,
        [
            E("JR2", ALICE, JOIN_RULES, "", {"join_rule": "invite"}),
            member("LA", ALICE, ALICE, "leave"),
        ],
        [["END", "LA", "JR2", "START"]],
    )
    correct = dag.state_after["LA"]
    stale = {**correct, (JOIN_RULES, ""): dag.events["IJR"].event_id}
    resolved = await resolve_state(dag.room_id, version, [correct, stale], dag.store)
    return dag, resolved


async def test_problem_a_v2_loses_the_join_rules() -> None:
    """v2 replays both join rules on top of the unconflicted state, where Alice is gone:
    both fail and the room is left with no join rules at all (a state reset)."""
    dag, resolved = await _problem_a(ROOM_V10)
    assert (JOIN_RULES, "") not in resolved
    assert resolved == {k: v for k, v in dag.state_after["LA"].items() if k != (JOIN_RULES, "")}


async def test_problem_a_v2_1_keeps_the_latest_join_rules() -> None:
    """v2.1 replays them from an empty state, each against its own auth events (Alice
    was joined then): JR2 is the result."""
    dag, resolved = await _problem_a(ROOM_V12)
    assert resolved == dag.state_after["LA"]
    assert resolved[(JOIN_RULES, "")] == dag.events["JR2"].event_id


async def _problem_b(version: RoomVersion) -> tuple[RoomDag, dict[StateKey, str]]:
    """MSC4297 problem B. Alice promotes Bob (P1), Bob promotes Charlie (P2), Charlie
    changes the power levels (P3), and Zara re-joins citing P3. A stale view of the state
    at ZJ has the initial power levels IPOWER, but its auth chain (through ZJ) still
    reaches P3: P1 and P2 are in every auth chain, hence not in the auth difference."""
    dag = await build(
        version,
        [
            power_levels("P1", ALICE, {ALICE: 100, BOB: 50}),
            power_levels("P2", BOB, {ALICE: 100, BOB: 50, CHARLIE: 50}),
            power_levels("P3", CHARLIE, {ALICE: 100, BOB: 50, CHARLIE: 50, ZARA: 10}),
            member("ZJ", ZARA, ZARA, "join"),
        ],
        [["END", "ZJ", "P3", "P2", "P1", "START"]],
    )
    correct = dag.state_after["ZJ"]
    stale = {**correct, (POWER_LEVELS, ""): dag.events["IPOWER"].event_id}
    resolved = await resolve_state(dag.room_id, version, [correct, stale], dag.store)
    return dag, resolved


async def test_problem_b_v2_resets_the_power_levels() -> None:
    """v2 only replays IPOWER and P3; P3 fails against IPOWER (Charlie has no power
    there), so the power levels reset to IPOWER."""
    dag, resolved = await _problem_b(ROOM_V10)
    assert resolved == {**dag.state_after["ZJ"], (POWER_LEVELS, ""): "$IPOWER"}


async def test_problem_b_v2_1_replays_the_conflicted_subgraph() -> None:
    """v2.1 adds P1 and P2 (on the auth path from P3 to IPOWER) to the full conflicted
    set; replayed in order they authorise P3, which stands."""
    dag, resolved = await _problem_b(ROOM_V12)
    assert resolved == dag.state_after["ZJ"]
    assert resolved[(POWER_LEVELS, "")] == "$P3"
    subgraph = dag.store.index.conflicted_subgraph({"$IPOWER", "$P3"})
    assert {"$P1", "$P2"} <= subgraph


# -- details ----------------------------------------------------------------------------------


async def test_v12_auth_events_imply_the_create_event() -> None:
    dag = await build(ROOM_V12, [], [])
    join = dag.events["IMB"]
    assert "$CREATE" not in join.auth_event_ids
    assert effective_auth_event_ids(join)[-1] == "$CREATE"
    assert effective_auth_event_ids(dag.events["CREATE"]) == []
    assert dag.room_id == "!CREATE"


@BOTH_VERSIONS
async def test_missing_key_in_one_state_set_is_conflicted(version: RoomVersion) -> None:
    """A key only some state sets have is conflicted, not unconflicted: a topic set on one
    branch survives only if it passes auth, which Alice's does."""
    dag = await build(version, [topic("T1", ALICE)], [["END", "T1", "START"]])
    start, after = dag.state_after["START"], dag.state_after["T1"]
    assert (TOPIC, "") not in start
    assert await resolve_state(dag.room_id, version, [start, after], dag.store) == after


@BOTH_VERSIONS
async def test_events_from_another_room_are_refused(version: RoomVersion) -> None:
    dag = await build(version, [topic("T1", ALICE)], [["END", "T1", "START"]])
    start, after = dag.state_after["START"], dag.state_after["T1"]
    with pytest.raises(ValueError, match="of room"):
        await resolve_state("!elsewhere:example.com", version, [start, after], dag.store)


async def test_builder_refuses_unauthorised_events() -> None:
    """The scenario builder really checks the DAG: Evelyn cannot set the topic."""
    dag = await build(ROOM_V10, [], [])
    with pytest.raises(AuthError):
        await dag.add(topic("TE", EVELYN), ["START"])
