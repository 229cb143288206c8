"""Stream ID generators on both engines: the worked example of streams.md, multi-writer
positions, negative streams, and recovery at start-up."""

from __future__ import annotations

import pytest

from roomstream.storage import Database
from roomstream.streams import StreamIdGenerator
from roomstream.streams.registry import BACKFILL
from tests.support.streams import OpenReservation, caches_generator


async def _start_at(database: Database, value: int) -> None:
    def txn(t):  # type: ignore[no-untyped-def]
        t.create_sequence("cache_invalidation_stream_seq")
        t.advance_sequence_to("cache_invalidation_stream_seq", value)

    await database.run_interaction("start_at", txn)


async def test_worked_example_from_streams_md(database: Database) -> None:
    """Each row of the example table: action, then the current stream ID."""
    await _start_at(database, 1)
    gen = await caches_generator(database, "main", ["main"])
    assert gen.get_position("main") == 1

    held: dict[int, OpenReservation] = {}

    async def reserve(expected_id: int) -> None:
        r = await OpenReservation.open(gen)
        assert r.ids == [expected_id]
        held[expected_id] = r

    async def complete(stream_id: int) -> None:
        await held.pop(stream_id).commit(database, "main")

    steps = [
        (reserve, 2, 1),
        (reserve, 3, 1),
        (complete, 3, 1),  # waiting for 2
        (complete, 2, 3),  # jumps 1 -> 3
        (reserve, 4, 3),
        (reserve, 5, 3),
        (reserve, 6, 3),
        (complete, 5, 3),
        (complete, 4, 5),  # jumps 3 -> 5 although 6 is pending
        (complete, 6, 6),
    ]
    for action, stream_id, expected_current in steps:
        await action(stream_id)
        assert gen.get_position("main") == expected_current, (action.__name__, stream_id)
        # Single writer: the linear position is the writer's position.
        assert gen.get_linear_position() == expected_current


async def test_rollback_counts_as_completion(database: Database) -> None:
    gen = await caches_generator(database, "main", ["main"])
    first = await OpenReservation.open(gen)
    second = await OpenReservation.open(gen)
    await second.commit(database, "main")
    assert gen.get_position("main") == first.ids[0] - 1
    await first.rollback()
    assert gen.get_position("main") == second.ids[0]


async def test_batched_reservation_is_one_increasing_block(database: Database) -> None:
    gen = await caches_generator(database, "main", ["main"])
    async with gen.reserve_many(50) as ids:
        assert ids == sorted(ids) and len(set(ids)) == 50
        assert gen.get_position("main") == ids[0] - 1
    assert gen.get_position("main") == ids[-1]
    assert gen.get_stored_position() == ids[-1]


async def test_multi_writer_linear_position_waits_for_every_writer(database: Database) -> None:
    a = await caches_generator(database, "a", ["a", "b"])
    b = await caches_generator(database, "b", ["a", "b"])
    ra = await OpenReservation.open(a)  # a holds the lower ID
    rb = await OpenReservation.open(b)
    assert ra.ids[0] < rb.ids[0]
    await rb.commit(database, "b")
    # b is done up to its ID; a still holds an ID below it.
    a.advance("b", b.get_stored_position())
    assert b.get_position("b") >= rb.ids[0]
    assert a.get_linear_position() < ra.ids[0]
    await ra.commit(database, "a")
    b.advance("a", a.get_stored_position())
    a.advance("b", b.get_stored_position())
    assert a.get_linear_position() == b.get_linear_position() == rb.ids[0]


async def test_reader_follows_writers_positions(database: Database) -> None:
    writer = await caches_generator(database, "w", ["w"])
    reader = await caches_generator(database, "reader", ["w"])
    assert not reader.is_writer()
    async with writer.reserve() as stream_id:
        pass
    assert reader.get_linear_position() < stream_id
    assert reader.advance("w", writer.get_stored_position())
    assert not reader.advance("w", writer.get_stored_position())  # nothing new
    assert reader.get_linear_position() == stream_id
    # Positions from unconfigured writers are ignored rather than trusted.
    assert not reader.advance("stranger", 10**6)
    assert reader.get_linear_position() == stream_id


async def test_position_listener_sees_stored_positions(database: Database) -> None:
    gen = await caches_generator(database, "main", ["main"])
    seen: list[tuple[str, int]] = []
    gen.add_position_listener(lambda w, p: seen.append((w, p)))
    async with gen.reserve() as first:
        pass
    async with gen.reserve() as second:
        pass
    assert seen == [("main", first), ("main", second)]

    def stored(t):  # type: ignore[no-untyped-def]
        return t.query_one(
            "SELECT stream_id FROM stream_positions WHERE stream_name = 'caches'"
            " AND instance_name = 'main'"
        )[0]

    assert await database.run_interaction("stored", stored) == second


async def test_negative_stream_counts_down(database: Database) -> None:
    gen = await StreamIdGenerator.create(
        database,
        BACKFILL.name,
        BACKFILL.sequence,
        BACKFILL.table_refs,
        ["main"],
        "main",
        positive=False,
    )
    assert gen.get_position("main") == 0
    r1 = await OpenReservation.open(gen)
    r2 = await OpenReservation.open(gen)
    assert (r1.ids, r2.ids) == ([-1], [-2])
    await r2.rollback()
    assert gen.get_position("main") == 0  # -1 still in flight
    await r1.rollback()
    assert gen.get_position("main") == -2
    assert gen.get_linear_position() == -2
    async with gen.reserve_many(3) as ids:
        assert ids == [-3, -4, -5]
    assert gen.get_position("main") == -5


async def test_restart_recovers_rows_committed_after_last_stored_position(
    database: Database,
) -> None:
    """A crash between commit and storing the position loses nothing."""
    gen = await caches_generator(database, "main", ["main"])
    async with gen.reserve():
        pass
    crashed = await OpenReservation.open(gen)
    await database.run_interaction(
        "test_query",
        lambda t: t.execute(
            "INSERT INTO cache_invalidations VALUES (?, 'main', 'f', NULL, 0)", (crashed.ids[0],)
        ),
    )
    # The process dies here: the reservation is never left, the position never stored.
    restarted = await caches_generator(database, "main", ["main"])
    assert restarted.get_position("main") >= crashed.ids[0]
    reader = await caches_generator(database, "reader", ["main"])
    assert reader.get_linear_position() >= crashed.ids[0]
    async with restarted.reserve() as next_id:
        assert next_id > crashed.ids[0]


async def test_restart_with_sequence_behind_the_table(database: Database) -> None:
    """IDs already in the table are never handed out again, even if the sequence lags."""
    await database.run_interaction(
        "test_query",
        lambda t: t.execute("INSERT INTO cache_invalidations VALUES (40, 'main', 'f', NULL, 0)"),
    )
    gen = await caches_generator(database, "main", ["main"])
    assert gen.get_position("main") == 40
    async with gen.reserve() as stream_id:
        assert stream_id == 41


async def test_writer_added_to_configuration(database: Database) -> None:
    old = await caches_generator(database, "a", ["a"])
    async with old.reserve_many(3):
        pass
    # b joins; it has never written. Readers must not wait on it, nor trust it blindly.
    reader = await caches_generator(database, "reader", ["a", "b"])
    assert reader.get_position("b") == 3
    assert reader.get_linear_position() == 3
    b = await caches_generator(database, "b", ["a", "b"])
    held = await OpenReservation.open(b)
    late_reader = await caches_generator(database, "reader2", ["a", "b"])
    # b registered its position before reserving, so a later reader sees it below the ID.
    assert late_reader.get_position("b") < held.ids[0]
    assert late_reader.get_linear_position() < held.ids[0]
    await held.commit(database, "b")


async def test_writer_removed_from_configuration(database: Database) -> None:
    a = await caches_generator(database, "a", ["a", "b"])
    await caches_generator(database, "b", ["a", "b"])  # b registers, then goes away
    async with a.reserve_many(5):
        pass
    reader = await caches_generator(database, "reader", ["a"])
    assert reader.writers == ["a"]
    assert reader.get_linear_position() == a.get_stored_position()


async def test_completing_an_unknown_id_is_refused(database: Database) -> None:
    from roomstream.streams import UnknownIdError

    gen = await caches_generator(database, "main", ["main"])
    with pytest.raises(UnknownIdError):
        gen.tracker.complete([999])


async def test_reserve_many_validates_count(database: Database) -> None:
    gen = await caches_generator(database, "main", ["main"])
    with pytest.raises(ValueError):
        async with gen.reserve_many(0):
            pass


async def test_run_with_ids_stores_only_safe_positions(database: Database) -> None:
    """run_with_ids completes its IDs with the transaction; the stored (announceable)
    position never covers an ID another reservation still holds."""
    gen = await caches_generator(database, "main", ["main"])
    announced: list[int] = []
    gen.add_position_listener(lambda w, p: announced.append(p))

    def write(txn, ids):  # type: ignore[no-untyped-def]
        txn.executemany(
            "INSERT INTO cache_invalidations VALUES (?, 'main', 'f', NULL, 0)",
            [(i,) for i in ids],
        )
        return len(ids)

    ids, written = await gen.run_with_ids("test_write", 3, write)
    assert written == 3 and ids == sorted(ids)
    await gen.flush()
    assert gen.get_stored_position() == gen.get_position("main") == ids[-1]
    held = await OpenReservation.open(gen)  # an ID in flight below the next draw
    more, _ = await gen.run_with_ids("test_write", 2, write)
    assert more[0] > held.ids[0]
    await gen.flush()
    assert gen.get_stored_position() < held.ids[0]
    assert all(p < held.ids[0] for p in announced if p > ids[-1])
    await held.commit(database, "main")
    await gen.flush()
    assert gen.get_stored_position() == more[-1]
    # A failing body completes its IDs without rows and without announcing them.
    with pytest.raises(RuntimeError):
        await gen.run_with_ids(
            "test_write", 1, lambda txn, ids: (_ for _ in ()).throw(RuntimeError("x"))
        )
    await gen.flush()
    assert not gen.tracker.has_in_flight()
    assert gen.get_stored_position() >= more[-1]
