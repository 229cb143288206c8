"""The federation sender's tables (roomstream.federation.catchup, migration 0026), both
engines: positions, the catch-up records never moving back, which destinations need
catch-up, and transaction epochs never repeating."""

from __future__ import annotations

from roomstream.federation.catchup import FederationSenderStore
from roomstream.federation.destination_queue import RetryState
from roomstream.storage import Database, Transaction


async def add_events(db: Database, orderings: dict[int, str]) -> None:
    """Bare ``events`` rows (the catch-up query joins on them for the event IDs)."""

    def txn(t: Transaction) -> None:
        for ordering, room in orderings.items():
            t.execute(
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
                " type, sender, origin_server_ts, received_ts, instance_name)"
                " VALUES (?, 1, ?, ?, 'm.room.message', '@a:x', 0, 0, 'main')",
                (ordering, f"$e{ordering}", room),
            )

    await db.run_interaction("test_events", txn)


async def test_positions_per_instance_and_stream(database: Database) -> None:
    store = FederationSenderStore(database)
    assert await store.get_position("fed1", "events") is None
    await store.set_position("fed1", "events", 5)
    await store.set_position("fed2", "events", 7)
    await store.set_position("fed1", "events", 9)
    await store.record_events("fed1", [], 12)
    assert await store.get_position("fed1", "events") == 12
    assert await store.get_position("fed2", "events") == 7
    assert await store.get_position("fed1", "receipts") is None


async def test_catch_up_rows_newest_per_room_and_never_back(database: Database) -> None:
    store = FederationSenderStore(database)
    await add_events(database, {1: "!a", 2: "!b", 3: "!a", 4: "!c"})
    await store.record_events(
        "main", [("r.test", "!a", 1), ("r.test", "!b", 2), ("r.test", "!a", 3)], 3
    )
    # An older row for a room (another batch, out of order) does not move it back.
    await store.record_events("main", [("r.test", "!a", 1), ("s.test", "!c", 4)], 4)
    rows = await store.get_catch_up_rows("r.test", None, 50)
    assert [(r.room_id, r.event_id, r.stream_ordering) for r in rows] == [
        ("!b", "$e2", 2),
        ("!a", "$e3", 3),
    ]
    assert [r.room_id for r in await store.get_catch_up_rows("r.test", 2, 50)] == ["!a"]
    assert [r.room_id for r in await store.get_catch_up_rows("r.test", None, 1)] == ["!b"]
    [r, s] = await store.get_destinations()
    assert (r.destination, r.needs_catch_up, r.last_successful_stream_ordering) == (
        "r.test",
        True,
        None,
    )
    assert s.destination == "s.test" and s.needs_catch_up
    await store.record_success("r.test", 3)
    await store.record_success("r.test", 2)  # never moves back
    [r] = await store.get_destinations(["r.test"])
    assert r.last_successful_stream_ordering == 3 and not r.needs_catch_up


async def test_retry_state_round_trip_and_success_clears_it(database: Database) -> None:
    store = FederationSenderStore(database)
    await store.set_retry("r.test", RetryState(100, 200, 600_000))
    [r] = await store.get_destinations()
    assert r.retry == RetryState(100, 200, 600_000) and not r.needs_catch_up
    await store.record_success("r.test", None)
    [r] = await store.get_destinations()
    assert r.retry == RetryState() and r.last_successful_stream_ordering is None


async def test_txn_epochs_never_repeat(database: Database) -> None:
    store = FederationSenderStore(database)
    epochs = [await store.next_txn_epoch() for _ in range(3)]
    assert epochs == sorted(set(epochs)) and len(epochs) == 3
