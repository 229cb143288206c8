"""A Spark Structured Streaming source over roomstream's table-backed streams.

Usage::

    register(spark)
    df = (spark.readStream.format("roomstream")
          .option("stream", "events").option("engine", "sqlite").option("path", db_path)
          .option("view", "linear")
          .load())

Offsets are JSON objects ``{writer: position}`` with sorted keys. Positions are *safe*:
a writer's position ``p`` comes from ``stream_positions`` and means that every fact of that
writer with a token ``<= p`` has completed (committed or rolled back) and will never change.
A micro-batch ``(start, end]`` therefore holds, for each writer ``w``, exactly the rows of
``w`` with ``start[w] < token <= end[w]``, and reading it again (a replay after a crash)
returns the same rows.

Invariants:

- ``end[w] >= start[w]`` for every writer (offsets never go back), and ``end[w]`` never
  exceeds a position that was safe when it was computed;
- ``view=linear``: every writer is at the same position, the *linear* position (the minimum
  over the writers), so a batch holds every fact with a token in ``(L_prev, L]`` and facts
  arrive in global token order batch by batch;
- ``view=per_writer``: each writer is at its own stored position (lower latency, but a batch
  may hold a fact with a token above one that a slower writer delivers later);
- writers are discovered from ``stream_positions`` on every trigger (option ``writers``
  pins them); a writer first seen later starts from token 0, which is safe because all its
  IDs are above the sequence value at its registration, which no earlier batch passed.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BooleanType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from roomstream.pipelines.dbio import ReadConnection, config_from_options, read_connection
from roomstream.storage import DatabaseConfig
from roomstream.streams.registry import StreamDefinition, StreamTable, get_stream, range_query

SOURCE_NAME = "roomstream"
VIEWS = ("linear", "per_writer")
DEFAULT_PARTITION_TOKENS = 100_000
ARROW_BATCH_ROWS = 65_536

Offset = dict[str, int]

#: Columns every stream has, in order.
COMMON_COLUMNS: tuple[tuple[str, str], ...] = (
    ("stream", "string"),
    ("instance_name", "string"),
    ("stream_id", "long"),
    ("row_json", "string"),
)

#: Typed columns of the events stream: the wire row flattened, plus columns the views need
#: that the wire row lacks (sender, origin_server_ts from ``events``; prev_event_id from
#: ``current_state_delta_stream``). ``kind`` is the wire row's type, 'ev' or 'state'.
EVENTS_TYPED: tuple[tuple[str, str], ...] = (
    ("kind", "string"),
    ("event_id", "string"),
    ("room_id", "string"),
    ("event_type", "string"),
    ("state_key", "string"),
    ("redacts", "string"),
    ("relates_to", "string"),
    ("membership", "string"),
    ("rejected", "boolean"),
    ("outlier", "boolean"),
    ("sender", "string"),
    ("origin_server_ts", "long"),
    ("prev_event_id", "string"),
)

#: Extra columns selected per (stream, table) beyond what the wire row needs.
_EXTRA_COLUMNS: dict[tuple[str, str], tuple[str, ...]] = {
    ("events", "events"): ("sender", "origin_server_ts"),
    ("events", "current_state_delta_stream"): ("prev_event_id",),
}

_SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "boolean": BooleanType(),
}
_ARROW_TYPES: dict[str, Any] = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}


def typed_columns(stream: StreamDefinition) -> tuple[tuple[str, str], ...]:
    """The typed columns of ``stream``: events get :data:`EVENTS_TYPED`; other streams one
    column per row field (``*_ts`` fields as long, everything else as string, non-string
    values JSON-encoded)."""
    if stream.name == "events":
        return EVENTS_TYPED
    return tuple((f, "long" if f.endswith("_ts") else "string") for f in stream.row_fields)


def output_columns(stream: StreamDefinition) -> tuple[tuple[str, str], ...]:
    return COMMON_COLUMNS + typed_columns(stream)


def output_schema(stream: StreamDefinition) -> StructType:
    """The DataFrame schema for ``stream``: the common columns, then the typed ones."""
    return StructType(
        [StructField(name, _SPARK_TYPES[kind], True) for name, kind in output_columns(stream)]
    )


def _table_stream(name: str) -> StreamDefinition:
    stream = get_stream(name)
    if stream.in_memory:
        raise ValueError(f"stream {name!r} is held in memory; only table-backed streams work")
    return stream


# -- offsets ---------------------------------------------------------------------------


def sorted_offset(offset: Mapping[str, int]) -> Offset:
    """``offset`` with sorted keys and int values (Spark compares offsets as JSON text)."""
    return {str(k): int(offset[k]) for k in sorted(offset)}


def writer_positions(
    conn: ReadConnection, stream: StreamDefinition, pinned: Sequence[str] | None = None
) -> Offset:
    """Every writer's stored (safe) position, positive tokens, sorted by writer.

    Discovered writers are those in ``stream_positions``. A pinned writer that has not
    registered yet gets the sequence value read *before* the positions: it reserves IDs only
    after registering, so its IDs will be above that value (the rule the ID generator uses).
    """
    sequence_value = conn.sequence_value(stream.sequence)
    stored = {
        str(w): int(p)
        for w, p in conn.query(
            "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
            (stream.name,),
        )
    }
    writers = sorted(pinned) if pinned else sorted(stored)
    return {w: stored.get(w, sequence_value) for w in writers}


def safe_target(positions: Mapping[str, int], view: str) -> Offset:
    """The furthest offset a batch may reach now: per writer, or all at the linear position."""
    if view == "per_writer":
        return sorted_offset(positions)
    if view == "linear":
        if not positions:
            return {}
        linear = min(positions.values())
        return {w: linear for w in sorted(positions)}
    raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")


def advance(start: Mapping[str, int], target: Mapping[str, int]) -> Offset:
    """``target`` merged onto ``start`` without ever moving a writer back."""
    end: dict[str, int] = {}
    for w in set(start) | set(target):
        before = int(start.get(w, 0))
        end[w] = max(before, int(target.get(w, before)))
    return sorted_offset(end)


# -- reading rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One row of a stream: its writer, token, wire row and typed column values."""

    instance_name: str
    token: int
    row: tuple[Any, ...]
    typed: tuple[Any, ...]


def _generic_typed(stream: StreamDefinition, row: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for (_, kind), value in zip(typed_columns(stream), row, strict=True):
        if value is None or (kind == "long" and isinstance(value, int)) or isinstance(value, str):
            out.append(value)
        else:
            out.append(orjson.dumps(value).decode())
    return tuple(out)


def _events_typed(row: tuple[Any, ...], extras: tuple[Any, ...]) -> tuple[Any, ...]:
    kind, data = row
    if kind == "ev":
        event_id, room_id, etype, state_key, redacts, relates_to, membership, rej, outl = data
        sender, ts = extras
        return (
            "ev", event_id, room_id, etype, state_key, redacts, relates_to, membership,
            bool(rej), bool(outl), sender, None if ts is None else int(ts), None,
        )  # fmt: skip
    room_id, etype, state_key, event_id = data
    (prev_event_id,) = extras
    return (
        "state", event_id, room_id, etype, state_key, None, None, None,
        None, None, None, None, prev_event_id,
    )  # fmt: skip


def _fetch_table(
    conn: ReadConnection,
    stream: StreamDefinition,
    table: StreamTable,
    writer: str,
    from_token: int,
    upto_token: int,
) -> list[Fact]:
    """Rows of one table, as :func:`roomstream.streams.registry.get_updates_txn` selects them
    (same range, same order, same wire row), plus the extra columns."""
    extras = _EXTRA_COLUMNS.get((stream.name, table.ref.table), ())
    sql, params = range_query(stream, table, writer, from_token, upto_token, None, extras)
    n = len(table.columns)
    to_row = table.to_row
    facts = []
    is_events = stream.name == "events"
    for r in conn.query(sql, params):
        row = to_row(tuple(r[1 : 1 + n]))
        typed = _events_typed(row, tuple(r[1 + n :])) if is_events else _generic_typed(stream, row)
        facts.append(Fact(writer, int(r[0]), row, typed))
    return facts


def fetch_facts(
    conn: ReadConnection, stream: StreamDefinition, writer: str, from_token: int, upto_token: int
) -> list[Fact]:
    """Every fact of ``writer`` with ``from_token < token <= upto_token``, by token."""
    if upto_token <= from_token:
        return []
    per_table = [
        _fetch_table(conn, stream, t, writer, from_token, upto_token) for t in stream.tables
    ]
    return list(heapq.merge(*per_table, key=lambda f: f.token))


def facts_to_arrow(stream: StreamDefinition, facts: Sequence[Fact]) -> pa.RecordBatch:
    """Facts as one Arrow record batch with the columns of :func:`output_schema`."""
    typed = typed_columns(stream)
    arrays = [
        pa.array([stream.name] * len(facts), pa.string()),
        pa.array([f.instance_name for f in facts], pa.string()),
        pa.array([f.token for f in facts], pa.int64()),
        pa.array([orjson.dumps(f.row).decode() for f in facts], pa.string()),
    ]
    for i, (_, kind) in enumerate(typed):
        arrays.append(pa.array([f.typed[i] for f in facts], _ARROW_TYPES[kind]))
    names = [name for name, _ in output_columns(stream)]
    return pa.RecordBatch.from_arrays(arrays, names=names)


class TokenRange(InputPartition):
    """One Spark task's share of a batch: ``writer``'s facts with ``lo < token <= hi``."""

    def __init__(self, writer: str, lo: int, hi: int) -> None:
        super().__init__((writer, lo, hi))
        self.writer = writer
        self.lo = lo
        self.hi = hi


def plan_ranges(start: Mapping[str, int], end: Mapping[str, int], tokens: int) -> list[TokenRange]:
    """Split ``(start, end]`` into per-writer token ranges of at most ``tokens`` tokens."""
    ranges = []
    for writer in sorted(end):
        lo, hi = int(start.get(writer, 0)), int(end[writer])
        while lo < hi:
            step = min(hi, lo + tokens)
            ranges.append(TokenRange(writer, lo, step))
            lo = step
    return ranges


def read_range(config: DatabaseConfig, stream_name: str, part: TokenRange) -> Iterator[Any]:
    """Arrow record batches of one token range (runs on an executor)."""
    stream = _table_stream(stream_name)
    with read_connection(config) as conn:
        facts = fetch_facts(conn, stream, part.writer, part.lo, part.hi)
    for i in range(0, len(facts), ARROW_BATCH_ROWS):
        yield facts_to_arrow(stream, facts[i : i + ARROW_BATCH_ROWS])


# -- Spark classes ---------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    """Parsed options of the ``roomstream`` format (all picklable plain values)."""

    stream: str
    config: DatabaseConfig
    view: str
    writers: tuple[str, ...] | None
    starting: str
    max_rows: int | None
    partition_tokens: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        stream = options.get("stream")
        if not stream:
            raise ValueError("option 'stream' is required (e.g. events, caches, receipts)")
        _table_stream(stream)
        view = options.get("view", "linear")
        if view not in VIEWS:
            raise ValueError(f"option 'view' must be one of {VIEWS}, got {view!r}")
        pinned = options.get("writers") or ""
        writers = tuple(sorted({w.strip() for w in pinned.split(",") if w.strip()}))
        max_rows = options.get("maxRowsPerBatch")
        return cls(
            stream=stream,
            config=config_from_options(options),
            view=view,
            writers=writers or None,
            starting=options.get("startingOffsets", "earliest"),
            max_rows=int(max_rows) if max_rows else None,
            partition_tokens=int(options.get("partitionTokens", DEFAULT_PARTITION_TOKENS)),
        )

    @property
    def definition(self) -> StreamDefinition:
        return _table_stream(self.stream)

    def target(self) -> Offset:
        """The safe target offset right now (opens and closes a connection)."""
        with read_connection(self.config) as conn:
            positions = writer_positions(conn, self.definition, self.writers)
        return safe_target(positions, self.view)


def cap_rows(
    options: SourceOptions, start: Mapping[str, int], end: Offset, max_rows: int
) -> Offset:
    """Lower ``end`` so that the batch holds about ``max_rows`` rows: cut at the token of the
    ``max_rows``-th row in token order (rows sharing a token are never split, so a batch may
    exceed the limit by the rows of that token, and always makes progress)."""
    stream = options.definition
    tokens: list[int] = []
    with read_connection(options.config) as conn:
        for writer, hi in end.items():
            lo = int(start.get(writer, 0))
            if hi <= lo:
                continue
            for table in stream.tables:
                ref = table.ref
                if stream.negative:
                    sql = (
                        f"SELECT -{ref.id_column} FROM {ref.table} WHERE {ref.instance_column} = ?"
                        f" AND {ref.id_column} < ? AND {ref.id_column} >= ?"
                        f" ORDER BY {ref.id_column} DESC LIMIT {int(max_rows) + 1}"
                    )
                    params: tuple[Any, ...] = (writer, -lo, -hi)
                else:
                    sql = (
                        f"SELECT {ref.id_column} FROM {ref.table} WHERE {ref.instance_column} = ?"
                        f" AND {ref.id_column} > ? AND {ref.id_column} <= ?"
                        f" ORDER BY {ref.id_column} LIMIT {int(max_rows) + 1}"
                    )
                    params = (writer, lo, hi)
                tokens.extend(int(r[0]) for r in conn.query(sql, params))
    if len(tokens) <= max_rows:
        return end
    cut = sorted(tokens)[max_rows - 1]
    return advance(start, {w: min(p, cut) for w, p in end.items()})


class RoomstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader. Holds only options (it is pickled to executors for ``read``);
    connections are opened per call."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._available_now: Offset | None = None

    def initialOffset(self) -> Offset:
        starting = self.options.starting
        if starting == "earliest":
            return {}
        if starting == "latest":
            return self.options.target()
        return sorted_offset(json.loads(starting))

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        target = self.options.target()
        if self._available_now is not None:
            bound = self._available_now
            target = {w: min(p, bound[w]) for w, p in target.items() if w in bound}
        end = advance(start or {}, target)
        if isinstance(limit, ReadMaxRows):
            end = cap_rows(self.options, start or {}, end, int(limit.max_rows))
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows:
            return ReadMaxRows(self.options.max_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.options.target()

    def partitions(self, start: Offset, end: Offset) -> list[TokenRange]:
        return plan_ranges(start or {}, end, self.options.partition_tokens)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TokenRange)
        return read_range(self.options.config, self.options.stream, partition)

    def commit(self, end: Offset) -> None:
        """Nothing to release: the database keeps every row (and replays need them)."""


class RoomstreamBatchReader(DataSourceReader):
    """Batch read of a stream: every fact up to the safe target (or option ``upto``)."""

    def __init__(self, options: SourceOptions, upto: str | None, since: str | None) -> None:
        self.options = options
        self._upto = upto
        self._since = since

    def partitions(self) -> list[TokenRange]:
        end = sorted_offset(json.loads(self._upto)) if self._upto else self.options.target()
        start = sorted_offset(json.loads(self._since)) if self._since else {}
        return plan_ranges(start, end, self.options.partition_tokens)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TokenRange)
        return read_range(self.options.config, self.options.stream, partition)


class RoomstreamDataSource(DataSource):
    """``spark.readStream.format("roomstream")`` (and ``spark.read``); see the module doc.

    Options: ``stream`` (required), ``engine`` (sqlite|postgres), ``path`` | ``dsn`` +
    ``schema``, ``view`` (linear|per_writer), ``writers`` (comma-separated pin),
    ``startingOffsets`` (earliest|latest|JSON offset), ``maxRowsPerBatch``,
    ``partitionTokens``; batch reads also take ``since`` / ``upto`` (JSON offsets).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return output_schema(_table_stream(self.options.get("stream", "")))

    def streamReader(self, schema: StructType) -> RoomstreamStreamReader:
        return RoomstreamStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> RoomstreamBatchReader:
        return RoomstreamBatchReader(
            SourceOptions.parse(self.options), self.options.get("upto"), self.options.get("since")
        )


def register(spark: SparkSession) -> None:
    """Make ``format("roomstream")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(RoomstreamDataSource)
