"""Exactly-once sinks for roomstream streaming queries.

- :class:`DatabaseSink`: a ``foreachBatch`` function writing into roomstream's database.
  Each micro-batch is applied in ONE transaction that also inserts
  ``pipeline_batches(sink_name, batch_id)``; a batch Spark replays after a crash (its
  offsets were logged, its commit was not) finds that row and changes nothing.
- :func:`start_parquet_stream`: Spark's own file sink, exactly-once through its
  ``_spark_metadata`` log (files of a batch that never committed are not part of the output).

Invariant for :class:`DatabaseSink`: ``sink_name`` belongs to one checkpoint. Batch ids
restart at 0 with a new checkpoint, so a new checkpoint needs a new sink name (or
:func:`forget_sink` first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from roomstream.storage import Database, DatabaseConfig, Transaction, connect

T = TypeVar("T")

Prepare = Callable[[DataFrame, int], T]
"""Turns a micro-batch DataFrame into a payload on the driver (Spark work happens here)."""
Apply = Callable[[Transaction, T], int]
"""Writes a payload inside the sink's transaction; returns how many rows it wrote."""


def batch_applied_txn(txn: Transaction, sink_name: str, batch_id: int) -> bool:
    row = txn.query_one(
        "SELECT 1 FROM pipeline_batches WHERE sink_name = ? AND batch_id = ?",
        (sink_name, batch_id),
    )
    return row is not None


def last_batch_txn(txn: Transaction, sink_name: str) -> int | None:
    row = txn.query_one(
        "SELECT MAX(batch_id) FROM pipeline_batches WHERE sink_name = ?", (sink_name,)
    )
    return None if row is None or row[0] is None else int(row[0])


def forget_sink_txn(txn: Transaction, sink_name: str) -> None:
    txn.execute("DELETE FROM pipeline_batches WHERE sink_name = ?", (sink_name,))


def forget_sink(config: DatabaseConfig, sink_name: str) -> None:
    """Drop a sink's bookkeeping (before reusing its name with a fresh checkpoint)."""
    db = connect(config)
    try:
        db.run_interaction_blocking("forget_sink", forget_sink_txn, sink_name)
    finally:
        db.close_blocking()


class DatabaseSink(Generic[T]):
    """``foreachBatch`` callable: ``prepare`` the batch, then ``apply`` it exactly once.

    Use as ``df.writeStream.foreachBatch(sink)``. Opens its :class:`Database` on first use
    (in the driver, where foreachBatch runs); call :meth:`close` when the query is over.
    """

    def __init__(
        self,
        config: DatabaseConfig,
        sink_name: str,
        prepare: Prepare[T],
        apply: Apply[T],
        after_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.sink_name = sink_name
        self._prepare = prepare
        self._apply = apply
        self._after_commit = after_commit
        self._db: Database | None = None
        #: Batches applied / skipped as replays by this sink object (for tests and logs).
        self.applied: list[int] = []
        self.skipped: list[int] = []

    @property
    def database(self) -> Database:
        if self._db is None:
            self._db = connect(self.config)
        return self._db

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        db = self.database
        if db.run_interaction_blocking(
            "sink_batch_applied", batch_applied_txn, self.sink_name, batch_id
        ):
            self.skipped.append(batch_id)  # a replay: cheap early exit, no Spark work
            return
        payload = self._prepare(df, batch_id)
        if db.run_interaction_blocking("apply_sink_batch", self._apply_txn, batch_id, payload):
            self.applied.append(batch_id)
        else:
            self.skipped.append(batch_id)
        if self._after_commit is not None:
            self._after_commit(batch_id)

    def _apply_txn(self, txn: Transaction, batch_id: int, payload: T) -> bool:
        # Checked again inside the transaction: the insert below is the real guard (a
        # concurrent duplicate fails on the primary key and rolls everything back).
        if batch_applied_txn(txn, self.sink_name, batch_id):
            return False
        written = self._apply(txn, payload)
        txn.execute(
            "INSERT INTO pipeline_batches (sink_name, batch_id, rows_written, committed_ts)"
            " VALUES (?, ?, ?, ?)",
            (self.sink_name, batch_id, written, int(time.time() * 1000)),
        )
        return True

    def close(self) -> None:
        if self._db is not None:
            self._db.close_blocking()
            self._db = None


def collect_rows(df: DataFrame, batch_id: int) -> list[Any]:
    """A ``prepare`` that brings the whole batch to the driver (small batches only)."""
    return list(df.collect())


def start_parquet_stream(
    df: DataFrame,
    path: str,
    checkpoint: str,
    *,
    available_now: bool = False,
    processing_time: str | None = None,
    partition_by: tuple[str, ...] = (),
) -> StreamingQuery:
    """Stream ``df`` into Parquet files under ``path`` (exactly-once via Spark's file sink).

    Read the output back with ``spark.read.parquet(path)``, which honours the sink's
    metadata log, never by listing the files yourself.
    """
    writer = (
        df.writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
    )
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time:
        writer = writer.trigger(processingTime=processing_time)
    return writer.start()
