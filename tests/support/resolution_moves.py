"""Random room histories for the state resolution tests: moves (who does what)
played into a DAG; shared by the property tests and the comparisons with Synapse."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import strategies as st

from roomstream.errors import AuthError
from roomstream.events.room_versions import RoomVersion
from tests.support.state_dag import (
    ALICE,
    BOB,
    CHARLIE,
    END,
    EVELYN,
    INITIAL_EDGES,
    INITIAL_EVENTS,
    JOIN_RULES,
    ZARA,
    E,
    RoomDag,
    member,
    power_levels,
    topic,
)

USERS = [ALICE, BOB, CHARLIE, ZARA, EVELYN]


LEVELS = [0, 10, 50, 100]


Move = tuple[list[int], str, int, int, int]


moves = st.tuples(
    st.lists(st.integers(min_value=0, max_value=1_000), min_size=1, max_size=2),
    st.sampled_from(["topic", "power", "ban", "kick", "join", "leave", "join_rules"]),
    st.integers(min_value=0, max_value=len(USERS) - 1),
    st.integers(min_value=0, max_value=len(USERS) - 1),
    st.integers(min_value=0, max_value=len(LEVELS) - 1),
)


def spec_for(name: str, move: Move) -> E:
    _, kind, actor_i, target_i, level_i = move
    actor, target, level = USERS[actor_i], USERS[target_i], LEVELS[level_i]
    if kind == "topic":
        return topic(name, actor)
    if kind == "power":
        users = {ALICE: 100, target: level}
        return power_levels(name, actor, users)
    if kind in ("ban", "kick"):
        return member(name, actor, target, "ban" if kind == "ban" else "leave")
    if kind == "join":
        return member(name, actor, actor, "join")
    if kind == "leave":
        return member(name, actor, actor, "leave")
    rule = "public" if level_i % 2 else "invite"
    return E(name, actor, JOIN_RULES, "", {"join_rule": rule})


async def play(
    version: RoomVersion, script: Sequence[Move], *, hashed_ids: bool = False
) -> RoomDag:
    dag = RoomDag(version, hashed_ids=hashed_ids)
    prevs = {c: [p] for c, p in itertools.pairwise(INITIAL_EDGES[0])}
    for spec in INITIAL_EVENTS:
        await dag.add(spec, prevs.get(spec.name, []))
    names = ["START"]
    for i, move in enumerate(script):
        picks = list(dict.fromkeys(names[p % len(names)] for p in move[0]))
        try:
            await dag.add(spec_for(f"X{i}", move), picks)
        except AuthError:
            continue  # a server would not have sent it; leave it out of the DAG
        names.append(f"X{i}")
    # END only merges the last two branches; whoever sends it may have left by then.
    await dag.add(END, names[-2:] if len(names) > 1 else names, check=False)
    return dag
