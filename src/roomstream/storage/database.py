"""The async database interface every other package uses."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from roomstream.metrics import TRANSACTION_RETRIES, TRANSACTION_SECONDS
from roomstream.storage.engines import Cursor, DatabaseConfig, Engine, EngineName, create_engine

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: How many times an interaction is retried after a serialization failure or deadlock.
MAX_RETRIES = 8

#: A transaction taking longer than this (seconds, retries included) is logged as slow.
SLOW_TRANSACTION_SECONDS = 1.0


class Transaction:
    """One database transaction, handed to an interaction function on a worker thread.

    Invariant: every statement of one interaction runs in one transaction on one connection;
    ``after_commit`` callbacks run (on the event loop) only if that transaction committed,
    ``after_rollback`` callbacks only if it did not.
    """

    __slots__ = ("_after_commit", "_after_rollback", "_cur", "_engine", "database")

    def __init__(self, database: Database, engine: Engine, cursor: Cursor) -> None:
        self.database = database
        self._engine = engine
        self._cur = cursor
        self._after_commit: list[Callable[[], object]] = []
        self._after_rollback: list[Callable[[], object]] = []

    @property
    def engine_name(self) -> EngineName:
        return self._engine.name

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cur.execute(self._engine.translate(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self._cur.executemany(self._engine.translate(sql), rows)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Execute and return every row."""
        self.execute(sql, params)
        return self._cur.fetchall()

    def query_one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Execute and return the first row, or None."""
        self.execute(sql, params)
        return self._cur.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def nextval_many(self, sequence: str, count: int) -> list[int]:
        """Draw ``count`` increasing values from a sequence.

        Values from a committed draw are never handed out again. (A draw inside a
        transaction that fails may be reused on SQLite, where the sequence is a table.)
        """
        return self._engine.nextval_many(self._cur, sequence, count)

    def insert_many(
        self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
    ) -> None:
        """Insert rows into ``table`` (plain inserts: no conflict handling); COPY on
        PostgreSQL."""
        rows = list(rows)
        if rows:
            self._engine.insert_many(self._cur, table, columns, rows)

    def relax_durability(self) -> None:
        """Let this transaction commit without waiting for its WAL to reach disk.

        Only for transactions whose loss in a crash is harmless, such as drawing sequence
        values: any later durable commit flushes the log past them anyway.
        """
        self._engine.relax_durability(self._cur)

    def sequence_value(self, sequence: str) -> int:
        return self._engine.sequence_value(self._cur, sequence)

    def create_sequence(self, sequence: str) -> None:
        self._engine.create_sequence(self._cur, sequence)

    def advance_sequence_to(self, sequence: str, value: int) -> None:
        self._engine.advance_sequence_to(self._cur, sequence, value)

    def lock_exclusively(self, name: str) -> None:
        """Wait until no other transaction (of any process) holds the lock ``name``; hold
        it until this transaction ends. On SQLite every transaction is already exclusive."""
        self._engine.lock_exclusively(self._cur, name)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after_commit.append(callback)

    def after_rollback(self, callback: Callable[[], object]) -> None:
        self._after_rollback.append(callback)


class Database:
    """A pool of worker threads running interactions against one engine.

    With ``inline=True`` interactions run on the calling thread instead, blocking the event
    loop while they do. That is only right for a database nothing else waits on: the
    scratch database of a batch task, used by one coroutine at a time, where the hop to a
    worker thread and back would cost more than the SQL (about 0.25 ms per interaction).
    """

    def __init__(self, engine: Engine, *, inline: bool = False) -> None:
        self.engine = engine
        self.inline = inline
        self.slow_transaction_seconds = SLOW_TRANSACTION_SECONDS
        self._executor = ThreadPoolExecutor(
            max_workers=engine.concurrency, thread_name_prefix=f"db-{engine.name}"
        )

    @property
    def engine_name(self) -> EngineName:
        return self.engine.name

    def _run_sync(
        self,
        name: str,
        func: Callable[Concatenate[Transaction, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[R, list[Callable[[], object]]]:
        engine = self.engine
        started = time.perf_counter()
        try:
            for attempt in range(MAX_RETRIES + 1):
                conn = engine.acquire()
                txn: Transaction | None = None
                try:
                    engine.begin(conn)
                    txn = Transaction(self, engine, engine.cursor(conn))
                    result = func(txn, *args, **kwargs)
                    engine.commit(conn)
                    return result, txn._after_commit
                except BaseException as exc:
                    try:
                        engine.rollback(conn)
                    except Exception:  # the original error matters more
                        logger.exception("rollback failed in transaction %s", name)
                    if txn is not None:
                        for callback in txn._after_rollback:
                            callback()
                    if attempt < MAX_RETRIES and engine.is_retryable(exc):
                        TRANSACTION_RETRIES.labels(name).inc()
                        # Jittered backoff so that two retrying transactions stop colliding.
                        time.sleep(random.uniform(0, 0.002 * (2**attempt)))
                        continue
                    raise
                finally:
                    engine.release(conn)
            raise AssertionError("unreachable")
        finally:
            elapsed = time.perf_counter() - started
            TRANSACTION_SECONDS.labels(name).observe(elapsed)
            if elapsed > self.slow_transaction_seconds:
                logger.warning("slow transaction %s: %.3f s", name, elapsed)

    async def run_interaction(
        self,
        name: str,
        func: Callable[Concatenate[Transaction, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Run ``func(txn, *args, **kwargs)`` in one transaction on a worker thread.

        Committed when it returns; rolled back (leaving nothing behind) when it raises;
        retried from scratch on a serialization failure or deadlock. ``name`` says what the
        transaction is (a fixed word per call site, never data): it labels the transaction
        time histogram and the slow-transaction log.
        """
        _check_name(name)
        if self.inline:
            result, callbacks = self._run_sync(name, func, *args, **kwargs)
        else:
            loop = asyncio.get_running_loop()
            result, callbacks = await loop.run_in_executor(
                self._executor, lambda: self._run_sync(name, func, *args, **kwargs)
            )
        for callback in callbacks:
            callback()
        return result

    def run_interaction_blocking(
        self,
        name: str,
        func: Callable[Concatenate[Transaction, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """The same as :meth:`run_interaction`, for code outside an event loop (CLI, Spark)."""
        _check_name(name)
        result, callbacks = self._executor.submit(
            lambda: self._run_sync(name, func, *args, **kwargs)
        ).result()
        for callback in callbacks:
            callback()
        return result

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.close_blocking)

    def close_blocking(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.close()


def _check_name(name: object) -> None:
    # A forgotten name would shift the function into its place: fail at the call, clearly.
    if not isinstance(name, str) or not name:
        raise TypeError(f"a transaction needs a name (a non-empty str), got {name!r}")


def connect(config: DatabaseConfig, *, inline: bool = False) -> Database:
    """Open a database (without preparing its schema; see :func:`prepare_database`).

    ``inline``: run interactions on the caller's thread (see :class:`Database`).
    """
    return Database(create_engine(config), inline=inline)
