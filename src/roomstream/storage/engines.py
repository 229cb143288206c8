"""Engine specifics: how to connect, SQL dialect differences, sequences and retryable errors.

Only this module (and the migrations) knows which engine is in use; everything else speaks
the dialect-neutral subset: ``?`` placeholders, ``INSERT ... ON CONFLICT``, ``RETURNING``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg_pool import ConnectionPool

EngineName = Literal["sqlite", "postgres"]


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the data lives: ``path`` for SQLite, ``dsn`` for PostgreSQL."""

    engine: EngineName = "sqlite"
    path: str = "data/roomstream.db"
    dsn: str = "postgresql://postgres@127.0.0.1:5432/roomstream"
    pool_min: int = 2
    pool_max: int = 8
    # SQLite only: the page cache of the one connection, in MiB (SQLite's own default is
    # 2 MiB). Reads touching rows spread over a large file (search, back pagination) go to
    # the OS for each page that falls out of it: a 20,000-message room's search statement
    # took 1.6 ms with 2 MiB and 0.76 ms with 64 (docs/benchmarks.md). Pages are cached
    # as they are read, so a small database never uses the whole of it.
    sqlite_cache_mb: int = 64
    # PostgreSQL only: schema to put everything in (tests give each test its own).
    schema: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


class Cursor(Protocol):
    rowcount: int

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Engine(Protocol):
    """What differs between SQLite and PostgreSQL. Methods taking ``conn`` run on worker threads."""

    name: EngineName
    #: How many interactions may run at once (worker threads).
    concurrency: int

    def acquire(self) -> Any: ...
    def release(self, conn: Any) -> None: ...
    def begin(self, conn: Any) -> None: ...
    def commit(self, conn: Any) -> None: ...
    def rollback(self, conn: Any) -> None: ...
    def cursor(self, conn: Any) -> Cursor: ...
    def translate(self, sql: str) -> str: ...
    def is_retryable(self, exc: BaseException) -> bool: ...
    def nextval_many(self, cur: Cursor, sequence: str, count: int) -> list[int]: ...
    def insert_many(
        self, cur: Cursor, table: str, columns: Sequence[str], rows: list[Sequence[Any]]
    ) -> None: ...
    def relax_durability(self, cur: Cursor) -> None: ...
    def sequence_value(self, cur: Cursor, sequence: str) -> int: ...
    def create_sequence(self, cur: Cursor, sequence: str) -> None: ...
    def advance_sequence_to(self, cur: Cursor, sequence: str, value: int) -> None: ...
    def lock_exclusively(self, cur: Cursor, name: str) -> None: ...
    def close(self) -> None: ...


#: Seconds a SQLite connection waits for another process's write lock.
BUSY_TIMEOUT = 10.0


def _execute_past_locks(
    conn: sqlite3.Connection, sql: str, deadline_s: float = BUSY_TIMEOUT
) -> sqlite3.Cursor:
    """Run one autocommit statement, retrying "database is locked" until ``deadline_s``.

    The busy timeout is not enough while a connection opens: two connections that each
    hold a shared lock and both ask for the exclusive lock (switching a fresh file to
    WAL) or the write lock (creating a table) could deadlock, so SQLite answers one of
    them ``SQLITE_BUSY`` at once rather than calling its busy handler. Processes started
    together on one fresh file meet exactly that (CI saw it), so the loser tries again.
    """
    give_up_at = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        try:
            return conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= give_up_at:
                raise
            # A lock retry, not synchronisation: the other process's statement takes well
            # under a millisecond; backing off spreads out several contenders.
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _switch_to_wal(conn: sqlite3.Connection, deadline_s: float = BUSY_TIMEOUT) -> None:
    """Put the file in WAL mode (an in-memory database keeps its "memory" journal)."""
    mode = _execute_past_locks(conn, "PRAGMA journal_mode=WAL", deadline_s).fetchone()[0]
    if str(mode).lower() not in ("wal", "memory"):
        raise sqlite3.OperationalError(f"could not switch the {mode!r} journal to WAL")


class SqliteEngine:
    """The embedded default: one file in WAL mode, one connection on one worker thread.

    SQLite allows one writer at a time anyway, so a single connection serialises writes
    without lock contention or ``SQLITE_BUSY``; sequences live in a small table.
    """

    name: EngineName = "sqlite"
    concurrency = 1

    def __init__(self, config: DatabaseConfig) -> None:
        self._path = config.path
        self._cache_mb = config.sqlite_cache_mb
        if self._path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        # The busy timeout comes first: switching a new file to WAL takes its write lock,
        # and processes starting together on one fresh database must wait for it, not fail.
        conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
        )
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        _switch_to_wal(conn)
        # NORMAL is durable against application crashes in WAL mode; FULL adds an fsync
        # per commit that only protects against power loss.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        # Negative: a size in KiB rather than in pages.
        conn.execute(f"PRAGMA cache_size=-{int(self._cache_mb) * 1024}")
        _execute_past_locks(
            conn,
            "CREATE TABLE IF NOT EXISTS roomstream_sequences"
            " (name TEXT PRIMARY KEY, last_value INTEGER NOT NULL)",
        )
        return conn

    def acquire(self) -> sqlite3.Connection:
        """The connection, held by the caller until :meth:`release`. If opening it fails,
        the lock is released before the error propagates (else ``close`` waits forever)."""
        self._lock.acquire()
        try:
            if self._conn is None:
                self._conn = self._open()
        except BaseException:
            self._lock.release()
            raise
        return self._conn

    def release(self, conn: Any) -> None:
        self._lock.release()

    def begin(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def commit(self, conn: Any) -> None:
        conn.execute("COMMIT")

    def rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def cursor(self, conn: Any) -> Cursor:
        cur: Cursor = conn.cursor()
        return cur

    def translate(self, sql: str) -> str:
        return sql

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)

    def nextval_many(self, cur: Cursor, sequence: str, count: int) -> list[int]:
        cur.execute(
            "UPDATE roomstream_sequences SET last_value = last_value + ? WHERE name = ?"
            " RETURNING last_value",
            (count, sequence),
        )
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"no sequence {sequence!r}")
        last = int(row[0])
        return list(range(last - count + 1, last + 1))

    def insert_many(
        self, cur: Cursor, table: str, columns: Sequence[str], rows: list[Sequence[Any]]
    ) -> None:
        marks = ", ".join("?" * len(columns))
        sql = f"INSERT INTO {_check_ident(table)} ({_columns(columns)}) VALUES ({marks})"
        cur.executemany(sql, rows)

    def relax_durability(self, cur: Cursor) -> None:
        pass  # synchronous=NORMAL already: commits do not wait for fsync

    def sequence_value(self, cur: Cursor, sequence: str) -> int:
        cur.execute("SELECT last_value FROM roomstream_sequences WHERE name = ?", (sequence,))
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"no sequence {sequence!r}")
        return int(row[0])

    def create_sequence(self, cur: Cursor, sequence: str) -> None:
        cur.execute(
            "INSERT INTO roomstream_sequences (name, last_value) VALUES (?, 0)"
            " ON CONFLICT (name) DO NOTHING",
            (sequence,),
        )

    def advance_sequence_to(self, cur: Cursor, sequence: str, value: int) -> None:
        cur.execute(
            "UPDATE roomstream_sequences SET last_value = MAX(last_value, ?) WHERE name = ?",
            (value, sequence),
        )

    def lock_exclusively(self, cur: Cursor, name: str) -> None:
        # Every transaction starts with BEGIN IMMEDIATE, which already holds the database
        # file's write lock until it ends: transactions of all processes are serial.
        pass

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_PLACEHOLDER = re.compile(r"\?")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def _check_ident(name: str) -> str:
    # Sequence, table and column names are interpolated into SQL; only plain identifiers.
    if not _IDENT.match(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def _columns(columns: Sequence[str]) -> str:
    return ", ".join(_check_ident(c) for c in columns)


class DatabaseUnavailableError(RuntimeError):
    """The configured database cannot be reached or does not exist; the message is one
    line saying which and what to do."""


#: Seconds to wait for the first connection before giving up (at start-up).
CONNECT_TIMEOUT = 10


def _check_postgres(dsn: str, kwargs: dict[str, Any]) -> None:
    """Connect once, so a missing database or server fails at start-up in one line
    instead of the pool retrying in the background forever."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailableError(f"database.dsn is not a PostgreSQL DSN: {exc}") from None
    where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
    dbname = params.get("dbname", params.get("user", ""))
    try:
        psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT, **kwargs).close()
    except psycopg.Error as exc:
        # Only the server's last line: the rest repeats the address or is a hint for psql.
        reason = str(exc).strip().splitlines()[0].rsplit("failed: ", 1)[-1].strip()
        if "does not exist" in reason and "database" in reason:
            raise DatabaseUnavailableError(
                f'PostgreSQL database "{dbname}" does not exist on {where}: create it first '
                f"(createdb -h {params.get('host', 'localhost')} -p {params.get('port', 5432)}"
                f" -U {params.get('user', 'postgres')} {dbname}), or fix database.dsn"
            ) from None
        raise DatabaseUnavailableError(
            f"cannot connect to PostgreSQL at {where} (database.dsn): {reason}"
        ) from None


class PostgresEngine:
    """The production engine: psycopg 3 with a connection pool, native sequences.

    Opening it connects once first: a database that does not exist, or a server that does
    not answer, raises :class:`DatabaseUnavailableError` at once.
    """

    name: EngineName = "postgres"

    def __init__(self, config: DatabaseConfig) -> None:
        kwargs: dict[str, Any] = {"autocommit": False}
        self._schema = config.schema or "public"
        if config.schema:
            kwargs["options"] = f"-c search_path={_check_ident(config.schema)}"
        self.concurrency = config.pool_max
        _check_postgres(config.dsn, kwargs)
        self._pool = ConnectionPool(
            config.dsn,
            min_size=config.pool_min,
            max_size=config.pool_max,
            kwargs=kwargs,
            open=True,
            name="roomstream",
        )
        self._translated: dict[str, str] = {}

    def acquire(self) -> psycopg.Connection[Any]:
        return self._pool.getconn()

    def release(self, conn: Any) -> None:
        self._pool.putconn(conn)

    def begin(self, conn: Any) -> None:
        # psycopg opens a transaction implicitly on the first statement.
        pass

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def cursor(self, conn: Any) -> Cursor:
        cur: Cursor = conn.cursor()
        return cur

    def translate(self, sql: str) -> str:
        cached = self._translated.get(sql)
        if cached is None:
            cached = _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))
            self._translated[sql] = cached
        return cached

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(
            exc, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected
        )

    def nextval_many(self, cur: Cursor, sequence: str, count: int) -> list[int]:
        seq = _check_ident(sequence)
        if count == 1:
            cur.execute(f"SELECT nextval('{seq}')")
            return [int(cur.fetchone()[0])]
        cur.execute(f"SELECT nextval('{seq}') FROM generate_series(1, %s)", (count,))
        return sorted(int(r[0]) for r in cur.fetchall())

    def insert_many(
        self, cur: Cursor, table: str, columns: Sequence[str], rows: list[Sequence[Any]]
    ) -> None:
        # COPY is 2-3x faster than pipelined INSERTs for batches (see docs/benchmarks.md).
        sql = f"COPY {_check_ident(table)} ({_columns(columns)}) FROM STDIN"
        with cur.copy(sql) as copy:  # type: ignore[attr-defined]
            for row in rows:
                copy.write_row(row)

    def relax_durability(self, cur: Cursor) -> None:
        cur.execute("SET LOCAL synchronous_commit = off")

    def sequence_value(self, cur: Cursor, sequence: str) -> int:
        seq = _check_ident(sequence)
        cur.execute(f"SELECT last_value, is_called FROM {seq}")
        last_value, is_called = cur.fetchone()
        return int(last_value) if is_called else int(last_value) - 1

    def create_sequence(self, cur: Cursor, sequence: str) -> None:
        # Two processes starting together may both create it; IF NOT EXISTS alone does not
        # survive that race (the catalogue's unique index fires), so serialise on a lock.
        self.lock_exclusively(cur, f"sequence:{sequence}")
        cur.execute(f"CREATE SEQUENCE IF NOT EXISTS {_check_ident(sequence)} MINVALUE 0 START 1")

    def advance_sequence_to(self, cur: Cursor, sequence: str, value: int) -> None:
        seq = _check_ident(sequence)
        if self.sequence_value(cur, seq) < value:
            cur.execute("SELECT setval(%s, %s)", (seq, value))

    def lock_exclusively(self, cur: Cursor, name: str) -> None:
        # A transaction-scoped advisory lock, keyed by schema too: advisory locks are per
        # database, and each schema (tests give every test one) has its own migrations.
        digest = hashlib.blake2b(f"{self._schema}:{name}".encode(), digest_size=8).digest()
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (int.from_bytes(digest, signed=True),))

    def close(self) -> None:
        self._pool.close()


def create_engine(config: DatabaseConfig) -> Engine:
    if config.engine == "sqlite":
        return SqliteEngine(config)
    if config.engine == "postgres":
        return PostgresEngine(config)
    raise ValueError(f"unknown database engine {config.engine!r} (expected sqlite or postgres)")
