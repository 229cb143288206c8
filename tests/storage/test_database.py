"""The database layer behaves the same on both engines."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import psycopg
import pytest
from prometheus_client import REGISTRY

from roomstream.storage import Database, Transaction, connect, prepare_database
from roomstream.storage.engines import DatabaseConfig, _switch_to_wal
from roomstream.storage.migrations import load_migrations, split_statements


def _create_kv(txn: Transaction) -> None:
    txn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")


async def test_commit_and_read_back(database: Database) -> None:
    await database.run_interaction("create_kv", _create_kv)

    def write(txn: Transaction) -> None:
        txn.executemany("INSERT INTO kv (k, v) VALUES (?, ?)", [("a", 1), ("b", 2)])

    await database.run_interaction("write", write)
    rows = await database.run_interaction(
        "test_query", lambda t: t.query("SELECT k, v FROM kv ORDER BY k")
    )
    assert [tuple(r) for r in rows] == [("a", 1), ("b", 2)]


async def test_failed_transaction_leaves_nothing(database: Database) -> None:
    await database.run_interaction("create_kv", _create_kv)

    def half_then_fail(txn: Transaction) -> None:
        txn.execute("INSERT INTO kv (k, v) VALUES ('x', 1)")
        raise RuntimeError("boom")

    committed: list[str] = []

    def with_callbacks(txn: Transaction) -> None:
        txn.after_commit(lambda: committed.append("commit"))
        half_then_fail(txn)

    with pytest.raises(RuntimeError, match="boom"):
        await database.run_interaction("with_callbacks", with_callbacks)
    assert committed == []
    assert await database.run_interaction("test_query", lambda t: t.query("SELECT * FROM kv")) == []


async def test_constraint_violation_rolls_back_whole_transaction(database: Database) -> None:
    await database.run_interaction("create_kv", _create_kv)

    def dup(txn: Transaction) -> None:
        txn.execute("INSERT INTO kv (k, v) VALUES ('a', 1)")
        txn.execute("INSERT INTO kv (k, v) VALUES ('a', 2)")

    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        await database.run_interaction("dup", dup)
    assert await database.run_interaction("test_query", lambda t: t.query("SELECT * FROM kv")) == []


async def test_after_commit_runs_on_the_loop_after_commit(database: Database) -> None:
    await database.run_interaction("create_kv", _create_kv)
    seen: list[int] = []
    loop_thread = threading.get_ident()

    def write(txn: Transaction) -> None:
        txn.execute("INSERT INTO kv (k, v) VALUES ('a', 1)")
        txn.after_commit(lambda: seen.append(threading.get_ident()))

    await database.run_interaction("write", write)
    assert seen == [loop_thread]


async def test_sequences_hand_out_each_value_once(database: Database) -> None:
    await database.run_interaction("test_query", lambda t: t.create_sequence("test_seq"))

    async def draw(n: int) -> list[int]:
        return await database.run_interaction("test_query", lambda t: t.nextval_many("test_seq", n))

    batches = await asyncio.gather(*(draw(n) for n in (1, 5, 3, 10, 1)))
    values = [v for batch in batches for v in batch]
    assert sorted(values) == list(range(1, 21))
    for batch in batches:
        assert batch == sorted(batch)
    assert (
        await database.run_interaction("test_query", lambda t: t.sequence_value("test_seq")) == 20
    )


async def test_sequence_draws_in_a_failed_transaction(database: Database) -> None:
    """Values drawn in a transaction that fails were never seen by anyone else.

    PostgreSQL sequences skip them (nextval is not transactional); SQLite's table-backed
    sequence rolls back with the transaction. Either way no value is returned twice by
    draws that succeeded, which is what ID generators rely on.
    """
    await database.run_interaction("test_query", lambda t: t.create_sequence("test_seq"))

    def draw_and_fail(txn: Transaction) -> None:
        txn.nextval_many("test_seq", 3)
        raise RuntimeError("rollback")

    with pytest.raises(RuntimeError):
        await database.run_interaction("draw_and_fail", draw_and_fail)
    after = await database.run_interaction("test_query", lambda t: t.nextval_many("test_seq", 2))
    assert after == ([4, 5] if database.engine_name == "postgres" else [1, 2])


async def test_advance_sequence_never_moves_back(database: Database) -> None:
    await database.run_interaction("test_query", lambda t: t.create_sequence("test_seq"))
    await database.run_interaction("test_query", lambda t: t.advance_sequence_to("test_seq", 50))
    await database.run_interaction("test_query", lambda t: t.advance_sequence_to("test_seq", 10))
    assert await database.run_interaction(
        "test_query", lambda t: t.nextval_many("test_seq", 1)
    ) == [51]


async def test_migrations_are_idempotent_and_versioned(db_config: DatabaseConfig) -> None:
    newest = load_migrations()[-1].version
    for _ in range(2):
        db = connect(db_config)
        try:
            assert await prepare_database(db) == newest
            rows = await db.run_interaction(
                "test_query",
                lambda t: t.query("SELECT version FROM schema_version ORDER BY version"),
            )
            assert [r[0] for r in rows] == [m.version for m in load_migrations()]
        finally:
            await db.close()


async def test_every_migration_applies_on_its_own(db_config: DatabaseConfig) -> None:
    """Apply migrations one by one, checking each version is recorded in its transaction."""
    from roomstream.storage.migrations import _applied_versions, _apply

    db = connect(db_config)
    try:
        for migration in load_migrations():
            await db.run_interaction("test_every_migration_applies_on_its_own", _apply, migration)
            assert (
                max(await db.run_interaction("applied_versions", _applied_versions))
                == migration.version
            )
    finally:
        await db.close()


def test_split_statements_handles_comments_and_multiline() -> None:
    script = "-- header\nCREATE TABLE a (\n  x INT -- note\n);\n\nCREATE INDEX i ON a (x);\n"
    assert split_statements(script) == ["CREATE TABLE a (\n  x INT\n)", "CREATE INDEX i ON a (x)"]


async def test_sqlite_work_does_not_block_the_event_loop(tmp_path: object) -> None:
    """While an interaction holds the database, the loop keeps running other tasks."""
    db = connect(DatabaseConfig(engine="sqlite", path=f"{tmp_path}/x.db"))
    release = threading.Event()
    ticks = 0

    def slow(txn: Transaction) -> None:
        # Only the loop's other task can release it: a blocked loop fails here (after a
        # deadline generous enough for a loaded machine) instead of passing slowly.
        assert release.wait(60), "the event loop was blocked"

    async def ticker() -> None:
        nonlocal ticks
        for _ in range(5):
            ticks += 1
            await asyncio.sleep(0)
        release.set()

    try:
        await asyncio.gather(db.run_interaction("slow", slow), ticker())
        assert ticks == 5
    finally:
        await db.close()


async def test_sqlite_page_cache_is_the_configured_size(tmp_path: object) -> None:
    """The connection's page cache is ``sqlite_cache_mb`` (SQLite's own 2 MiB would send
    reads over a large file to the OS page by page)."""
    for mib in (64, 3):
        db = connect(
            DatabaseConfig(engine="sqlite", path=f"{tmp_path}/c{mib}.db", sqlite_cache_mb=mib)
        )
        try:
            rows = await db.run_interaction("cache_size", lambda t: t.query("PRAGMA cache_size"))
            assert rows[0][0] == -mib * 1024  # negative: KiB, not pages
        finally:
            await db.close()


async def test_inline_database_runs_on_the_callers_thread_and_rolls_back(
    tmp_path: object,
) -> None:
    """An inline database (a batch task's scratch space) runs interactions on the calling
    thread, with the same transaction guarantees."""
    db = connect(DatabaseConfig(engine="sqlite", path=f"{tmp_path}/inline.db"), inline=True)
    try:
        await db.run_interaction("create_kv", _create_kv)
        ran_on = await db.run_interaction("test_query", lambda t: threading.get_ident())
        assert ran_on == threading.get_ident()

        def half_then_fail(txn: Transaction) -> None:
            txn.execute("INSERT INTO kv (k, v) VALUES ('x', 1)")
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await db.run_interaction("half_then_fail", half_then_fail)
        assert await db.run_interaction("test_query", lambda t: t.query("SELECT * FROM kv")) == []
    finally:
        await db.close()


async def test_insert_many_round_trips_types(database: Database) -> None:
    def create(txn: Transaction) -> None:
        txn.execute(
            "CREATE TABLE things (id BIGINT, name TEXT, flag BOOLEAN, note TEXT, raw "
            + ("BYTEA" if txn.engine_name == "postgres" else "BLOB")
            + ")"
        )

    await database.run_interaction("create", create)
    rows = [
        (1, "caf\u00e9 \t tab", True, None, b"\x00\xff{}"),
        (2**40, "back\\slash, comma", False, "x", b""),
    ]
    await database.run_interaction(
        "test_query", lambda t: t.insert_many("things", ("id", "name", "flag", "note", "raw"), rows)
    )
    back = await database.run_interaction(
        "test_query", lambda t: t.query("SELECT id, name, flag, note, raw FROM things ORDER BY id")
    )
    assert [(r[0], r[1], bool(r[2]), r[3], bytes(r[4])) for r in back] == rows


async def test_insert_many_refuses_odd_identifiers(database: Database) -> None:
    with pytest.raises(ValueError, match="identifier"):
        await database.run_interaction(
            "test_query", lambda t: t.insert_many("kv; DROP TABLE x", ("k",), [("a",)])
        )


def test_sqlite_connection_that_fails_to_open_releases_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several processes starting on one fresh file race to switch it to WAL; a failed open
    must release the engine's lock, or ``close`` (and every later interaction) waits forever
    (seen as a hung ``roomstream migrate`` among six started together)."""
    import sqlite3

    from roomstream.storage.engines import SqliteEngine

    engine = SqliteEngine(DatabaseConfig(engine="sqlite", path=str(tmp_path / "x.db")))
    real_open = engine._open
    failures = iter([sqlite3.OperationalError("database is locked")])

    def flaky_open() -> sqlite3.Connection:
        for exc in failures:
            raise exc
        return real_open()

    monkeypatch.setattr(engine, "_open", flaky_open)
    with pytest.raises(sqlite3.OperationalError):
        engine.acquire()
    conn = engine.acquire()  # the lock was released: this neither hangs nor fails
    engine.release(conn)
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive()


class _LockedOnce:
    """A real connection whose first statement meets a real lock held by ``blocker``;
    the blocker lets go as soon as that first attempt has failed."""

    def __init__(self, conn: sqlite3.Connection, blocker: sqlite3.Connection) -> None:
        self.conn = conn
        self.blocker: sqlite3.Connection | None = blocker
        self.attempts = 0

    def execute(self, sql: str) -> sqlite3.Cursor:
        self.attempts += 1
        try:
            return self.conn.execute(sql)
        finally:
            if self.blocker is not None:
                self.blocker.execute("ROLLBACK")
                self.blocker.close()
                self.blocker = None


def test_wal_switch_retries_a_lock_the_busy_handler_does_not_cover(tmp_path: Path) -> None:
    """SQLite answers SQLITE_BUSY at once, past the busy timeout, when waiting could
    deadlock; processes opening one fresh file together meet that (CI saw it)."""
    path = str(tmp_path / "fresh.db")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=0")
    locked_once = _LockedOnce(conn, blocker)

    _switch_to_wal(locked_once, deadline_s=5.0)  # type: ignore[arg-type]

    assert locked_once.attempts == 2
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_wal_switch_gives_up_at_its_deadline(tmp_path: Path) -> None:
    path = str(tmp_path / "held.db")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=0")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _switch_to_wal(conn, deadline_s=0.0)
    finally:
        blocker.execute("ROLLBACK")


def _samples(metric: str, name: str) -> float:
    value = REGISTRY.get_sample_value(metric, {"name": name})
    return 0.0 if value is None else value


async def test_transactions_are_timed_and_retried_by_name(database: Database) -> None:
    """Each transaction lands in the histogram under its name, failed ones too, and a
    retry after a retryable failure is counted under that name."""
    count = "roomstream_db_transaction_seconds_count"
    before = _samples(count, "test_named")
    await database.run_interaction("test_named", lambda t: t.query("SELECT 1"))
    with pytest.raises(ZeroDivisionError):
        await database.run_interaction("test_named", lambda t: 1 // 0)
    assert _samples(count, "test_named") == before + 2

    retryable = (
        sqlite3.OperationalError("database is locked")
        if database.engine_name == "sqlite"
        else psycopg.errors.SerializationFailure("could not serialize access")
    )
    attempts: list[int] = []

    def fails_once(t: Transaction) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise retryable
        return "done"

    retries = "roomstream_db_transaction_retries_total"
    retried_before = _samples(retries, "test_retried")
    timed_before = _samples(count, "test_retried")
    assert await database.run_interaction("test_retried", fails_once) == "done"
    assert len(attempts) == 2
    assert _samples(retries, "test_retried") == retried_before + 1
    # One transaction, however many attempts.
    assert _samples(count, "test_retried") == timed_before + 1


async def test_slow_transactions_are_logged_by_name(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    database.slow_transaction_seconds = 3600.0
    with caplog.at_level(logging.WARNING, logger="roomstream.storage.database"):
        await database.run_interaction("test_quick", lambda t: t.query("SELECT 1"))
    assert "test_quick" not in caplog.text
    database.slow_transaction_seconds = -1.0  # every transaction counts as slow
    with caplog.at_level(logging.WARNING, logger="roomstream.storage.database"):
        await database.run_interaction("test_slow", lambda t: t.query("SELECT 1"))
    assert "slow transaction test_slow" in caplog.text


async def test_a_transaction_needs_a_name(database: Database) -> None:
    ran: list[int] = []
    with pytest.raises(TypeError, match="needs a name"):
        # The old call shape, function first: the function is not taken for a name.
        await database.run_interaction(lambda t, x: ran.append(x), 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a name"):
        await database.run_interaction("", lambda t: ran.append(1))
    assert ran == []
