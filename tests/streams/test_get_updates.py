"""get_updates on both engines: ranges, limits, shared tokens, unions of tables."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.storage import Database, Transaction
from roomstream.streams.memory import InMemoryStream, StreamTooOldError
from roomstream.streams.registry import (
    ACCOUNT_DATA,
    BACKFILL,
    CACHES,
    EVENTS,
    TO_DEVICE,
    get_updates_txn,
)


def _insert_caches(txn: Transaction, rows: list[tuple[int, str]]) -> None:
    txn.executemany(
        "INSERT INTO cache_invalidations VALUES (?, ?, ?, ?, ?)",
        [(sid, writer, f"f{sid}", f'["k{sid}"]', 1000 + sid) for sid, writer in rows],
    )


async def test_range_is_half_open_and_per_writer(database: Database) -> None:
    await database.run_interaction(
        "insert_caches", _insert_caches, [(1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "b")]
    )
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "a", 1, 4, 100
    )
    assert updates == [(3, ("f3", ["k3"], 1003)), (4, ("f4", ["k4"], 1004))]
    assert (upto, limited) == (4, False)
    updates, _, _ = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "b", 0, 10, 100
    )
    assert [t for t, _ in updates] == [2, 5]


async def test_null_keys_mean_whole_cache(database: Database) -> None:
    await database.run_interaction(
        "test_query",
        lambda t: t.execute("INSERT INTO cache_invalidations VALUES (1, 'a', 'f', NULL, 7)"),
    )
    updates, _, _ = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "a", 0, 1, 10
    )
    assert updates == [(1, ("f", None, 7))]


async def test_limit_never_splits_a_token(database: Database) -> None:
    # token 2 has three rows; a limit of 2 must stop before it, not inside it.
    await database.run_interaction(
        "insert_caches", _insert_caches, [(1, "a"), (2, "a"), (2, "a"), (2, "a"), (3, "a")]
    )
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "a", 0, 3, 2
    )
    assert [t for t, _ in updates] == [1]
    assert (upto, limited) == (1, True)
    # From there, the one token with more rows than the limit comes back whole.
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "a", 1, 3, 2
    )
    assert [t for t, _ in updates] == [2, 2, 2]
    assert (upto, limited) == (2, True)
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, CACHES, "a", 2, 3, 2
    )
    assert ([t for t, _ in updates], upto, limited) == ([3], 3, False)


async def test_union_of_tables_is_merged_in_token_order(database: Database) -> None:
    def fill(txn: Transaction) -> None:
        txn.executemany(
            "INSERT INTO account_data VALUES (?, 'a', ?, ?, '{}')",
            [(1, "@u:hs", "m.push_rules"), (4, "@v:hs", "m.direct")],
        )
        txn.executemany(
            "INSERT INTO room_account_data VALUES (?, 'a', ?, ?, ?, '{}')",
            [(2, "@u:hs", "!r:hs", "m.tag"), (3, "@u:hs", "!s:hs", "m.tag")],
        )

    await database.run_interaction("fill", fill)
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, ACCOUNT_DATA, "a", 0, 10, 100
    )
    assert updates == [
        (1, ("@u:hs", None, "m.push_rules")),
        (2, ("@u:hs", "!r:hs", "m.tag")),
        (3, ("@u:hs", "!s:hs", "m.tag")),
        (4, ("@v:hs", None, "m.direct")),
    ]
    # Limited across tables: nothing at or below new_upto may be missing.
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, ACCOUNT_DATA, "a", 0, 10, 1
    )
    assert limited and [t for t, _ in updates] == list(range(1, upto + 1))


async def test_events_stream_rows_match_synapse_layout(database: Database) -> None:
    def fill(txn: Transaction) -> None:
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " state_key, sender, membership, outlier, rejected_reason, origin_server_ts,"
            " received_ts, instance_name) VALUES"
            " (5, 3, '$e', '!r:hs', 'm.room.member', '@u:hs', '@u:hs', 'join', ?, NULL, 1, 2,"
            " 'main')",
            (False,),
        )
        txn.execute(
            "INSERT INTO current_state_delta_stream VALUES"
            " (5, 'main', '!r:hs', 'm.room.member', '@u:hs', '$e', NULL)"
        )

    await database.run_interaction("fill", fill)
    updates, _, _ = await database.run_interaction(
        "get_updates", get_updates_txn, EVENTS, "main", 0, 5, 10
    )
    assert updates == [
        (5, ("ev", ("$e", "!r:hs", "m.room.member", "@u:hs", None, None, "join", False, False))),
        (5, ("state", ("!r:hs", "m.room.member", "@u:hs", "$e"))),
    ]


async def test_backfill_stream_uses_positive_tokens_over_negative_ids(
    database: Database,
) -> None:
    def fill(txn: Transaction) -> None:
        for so in (-1, -2, -3, 4):
            txn.execute(
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
                " type, sender, outlier, origin_server_ts, received_ts, instance_name)"
                " VALUES (?, 1, ?, '!r:hs', 'm.room.message', '@u:hs', ?, 0, 0, 'main')",
                (so, f"$e{so}", False),
            )

    await database.run_interaction("fill", fill)
    updates, upto, limited = await database.run_interaction(
        "get_updates", get_updates_txn, BACKFILL, "main", 1, 3, 10
    )
    assert [t for t, _ in updates] == [2, 3]
    assert updates[0][1][0] == "$e-2"
    assert (upto, limited) == (3, False)


async def test_to_device_entities_from_both_tables(database: Database) -> None:
    def fill(txn: Transaction) -> None:
        txn.execute("INSERT INTO device_inbox VALUES (1, 'a', '@u:hs', 'DEV', '{}')")
        txn.execute("INSERT INTO device_federation_outbox VALUES (2, 'a', 'other.hs', 'm', '{}')")

    await database.run_interaction("fill", fill)
    updates, _, _ = await database.run_interaction(
        "get_updates", get_updates_txn, TO_DEVICE, "a", 0, 2, 10
    )
    assert updates == [(1, ("@u:hs",)), (2, ("other.hs",))]


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 30), max_size=60),
    limit=st.integers(1, 8),
    start=st.integers(0, 10),
)
def test_paging_returns_every_row_once_in_order(tokens: list[int], limit: int, start: int) -> None:
    """Paging with any limit yields exactly the rows of (start, upto], in order."""
    import asyncio
    import os
    import tempfile

    from roomstream.storage import DatabaseConfig, connect, prepare_database

    async def scenario(path: str) -> None:
        db = connect(DatabaseConfig(engine="sqlite", path=path))
        try:
            await prepare_database(db)
            await db.run_interaction("insert_caches", _insert_caches, [(t, "a") for t in tokens])
            upto, seen, position = 30, [], start
            while True:
                updates, new_upto, limited = await db.run_interaction(
                    "get_updates", get_updates_txn, CACHES, "a", position, upto, limit
                )
                assert new_upto > position or not limited
                seen.extend(t for t, _ in updates)
                position = new_upto
                if not limited:
                    break
            assert position == upto
            assert seen == sorted(t for t in tokens if t > start)
        finally:
            await db.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(os.path.join(tmp, "g.db")))


def test_in_memory_stream_contract() -> None:
    stream = InMemoryStream("typing", retained=4)
    t1 = stream.append([("!r", ["@a"])])
    t2 = stream.append([("!r", ["@a", "@b"]), ("!s", ["@c"])])
    assert (t1, t2) == (1, 2)
    assert stream.get_updates(0, 10, 10) == (
        [(1, ("!r", ["@a"])), (2, ("!r", ["@a", "@b"])), (2, ("!s", ["@c"]))],
        2,
        False,
    )
    assert stream.get_updates(0, 2, 1) == ([(1, ("!r", ["@a"]))], 1, True)
    for _ in range(3):
        stream.append([("!r", [])])
    try:
        stream.get_updates(0, 10, 10)
        raise AssertionError("expected StreamTooOldError")
    except StreamTooOldError as exc:
        assert "older than the oldest held" in str(exc)
    updates, upto, limited = stream.get_updates(2, 10, 10)
    assert [t for t, _ in updates] == [3, 4, 5] and upto == 5 and not limited
