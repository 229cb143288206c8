"""State groups on both engines: contents, immutability, forks, and storage cost."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.state.groups import (
    MAX_BRANCH_DEPTH,
    create_state_group_txn,
    get_state_entry_txn,
    get_state_txn,
    state_delta,
)
from roomstream.storage import Database, Transaction

K = ("m.room.member", "@a:hs")


async def test_linear_extension_and_reads(database: Database) -> None:
    def build(txn: Transaction) -> list[int]:
        g1 = create_state_group_txn(txn, "!r", None, {("m.room.create", ""): "$c"})
        g2 = create_state_group_txn(txn, "!r", g1, {K: "$join"})
        g3 = create_state_group_txn(txn, "!r", g2, {K: "$leave"})
        return [g1, g2, g3]

    g1, g2, g3 = await database.run_interaction("build", build)
    states = [await database.run_interaction("get_state", get_state_txn, g) for g in (g1, g2, g3)]
    assert states == [
        {("m.room.create", ""): "$c"},
        {("m.room.create", ""): "$c", K: "$join"},
        {("m.room.create", ""): "$c", K: "$leave"},
    ]
    assert await database.run_interaction("get_state_entry", get_state_entry_txn, g2, K) == "$join"
    assert await database.run_interaction("get_state_entry", get_state_entry_txn, g1, K) is None
    rows = await database.run_interaction(
        "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM state_entries")[0]
    )
    assert rows == 3  # one row per state change, nothing copied


async def test_fork_from_older_version_leaves_both_sides_intact(database: Database) -> None:
    def build(txn: Transaction) -> tuple[int, int, int, int]:
        g1 = create_state_group_txn(txn, "!r", None, {("m.room.create", ""): "$c", K: "$j"})
        g2 = create_state_group_txn(txn, "!r", g1, {("m.room.topic", ""): "$t1"})
        fork = create_state_group_txn(txn, "!r", g1, {("m.room.topic", ""): "$t2", K: None})
        g3 = create_state_group_txn(txn, "!r", g2, {K: "$l"})
        return g1, g2, fork, g3

    _, g2, fork, g3 = await database.run_interaction("build", build)
    get = lambda g: database.run_interaction("get_state", get_state_txn, g)  # noqa: E731
    assert await get(g2) == {("m.room.create", ""): "$c", K: "$j", ("m.room.topic", ""): "$t1"}
    assert await get(fork) == {("m.room.create", ""): "$c", ("m.room.topic", ""): "$t2"}
    assert await get(g3) == {("m.room.create", ""): "$c", K: "$l", ("m.room.topic", ""): "$t1"}
    assert await database.run_interaction("get_state_entry", get_state_entry_txn, fork, K) is None
    assert (
        await database.run_interaction(
            "get_state_entry", get_state_entry_txn, fork, ("m.room.create", "")
        )
        == "$c"
    )


async def test_deep_forks_are_flattened(database: Database) -> None:
    def build(txn: Transaction) -> tuple[int, dict[tuple[str, str], str]]:
        group = create_state_group_txn(txn, "!r", None, {("m.room.create", ""): "$c"})
        expected = {("m.room.create", ""): "$c"}
        for i in range(MAX_BRANCH_DEPTH + 3):
            # Extend, then fork from the version before the tip: every step forks.
            tip = create_state_group_txn(txn, "!r", group, {("x", str(i)): f"$tip{i}"})
            assert tip
            group = create_state_group_txn(txn, "!r", group, {("y", str(i)): f"$y{i}"})
            expected[("y", str(i))] = f"$y{i}"
        depth = txn.query_one("SELECT MAX(depth) FROM state_branches")[0]
        assert depth <= MAX_BRANCH_DEPTH
        return group, expected

    group, expected = await database.run_interaction("build", build)
    assert await database.run_interaction("get_state", get_state_txn, group) == expected


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 60))
def test_random_histories_match_a_dict_model(seed: int, steps: int) -> None:
    import asyncio
    import os
    import tempfile

    from roomstream.storage import DatabaseConfig, connect, prepare_database

    rng = random.Random(seed)

    def build(txn: Transaction) -> dict[int, dict[tuple[str, str], str]]:
        model: dict[int, dict[tuple[str, str], str]] = {}
        first = create_state_group_txn(txn, "!r", None, {("c", ""): "$c"})
        model[first] = {("c", ""): "$c"}
        for i in range(steps):
            parent = rng.choice(list(model))
            new = dict(model[parent])
            for _ in range(rng.randint(1, 3)):
                key = ("m", f"@u{rng.randint(0, 8)}")
                if rng.random() < 0.2:
                    new.pop(key, None)
                else:
                    new[key] = f"$e{i}_{rng.random()}"
            group = create_state_group_txn(txn, "!r", parent, state_delta(model[parent], new))
            model[group] = new
        for group, expected in model.items():
            assert get_state_txn(txn, group) == expected
            for key in [("m", f"@u{u}") for u in range(9)]:
                assert get_state_entry_txn(txn, group, key) == expected.get(key)
        return model

    async def scenario(path: str) -> None:
        db = connect(DatabaseConfig(engine="sqlite", path=path))
        try:
            await prepare_database(db)
            await db.run_interaction("build", build)
        finally:
            await db.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(os.path.join(tmp, "s.db")))


async def test_churn_starts_fresh_branches_and_stays_small(database: Database) -> None:
    """Churn on a few keys closes rows; past the slack a full copy starts a new branch,
    which bounds reads, and storage stays within 2 rows per change."""
    from roomstream.state.groups import CLOSED_ROWS_SLACK, StateGroupWriter

    members = [("m.room.member", f"@u{i}:hs") for i in range(20)]

    def build(txn: Transaction) -> list[tuple[int, dict[tuple[str, str], str]]]:
        writer = StateGroupWriter(txn)
        state = {("m.room.create", ""): "$c"}
        group = writer.create("!r", None, dict(state))
        history = [(group, dict(state))]
        for i in range(CLOSED_ROWS_SLACK * 6):
            key = members[i % len(members)]
            state[key] = f"$e{i}"
            group = writer.create("!r", group, {key: f"$e{i}"}, history[-1][1])
            history.append((group, dict(state)))
        writer.finish()
        return history

    history = await database.run_interaction("build", build)
    changes = len(history)
    counts = await database.run_interaction(
        "test_query",
        lambda t: t.query_one(
            "SELECT (SELECT COUNT(*) FROM state_entries), (SELECT COUNT(*) FROM state_branches)"
        ),
    )
    entries, branches = int(counts[0]), int(counts[1])
    assert branches > 1, "churn past the slack must start a fresh branch"
    assert entries <= 2 * changes
    # Every branch keeps at most `slack` closed rows beyond its live ones.
    worst = await database.run_interaction(
        "test_query",
        lambda t: t.query_one("SELECT MAX(closed_rows - live_rows) FROM state_branches")[0],
    )
    assert worst <= CLOSED_ROWS_SLACK
    for group, expected in [*history[:: len(history) // 25], history[-1]]:
        assert await database.run_interaction("get_state", get_state_txn, group) == expected
        key = members[3]
        assert await database.run_interaction(
            "get_state_entry", get_state_entry_txn, group, key
        ) == expected.get(key)
