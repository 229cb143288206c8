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

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
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
#: A Spark task reads at most this many tokens of one writer (option ``partitionTokens``).
DEFAULT_PARTITION_TOKENS = 1_000_000
#: A batch is split into at least this many tasks (option ``minPartitions``), one per core of
#: ``local[2]``: fewer, larger tasks cost less than many small ones, but all cores work.
DEFAULT_MIN_PARTITIONS = 2
#: ``minPartitions`` never makes a task smaller than this many tokens (small batches, the
#: latency case, stay one task per writer).
MIN_SPLIT_TOKENS = 16_384
#: A task reads its range in chunks of this many tokens and yields one record batch per
#: chunk: memory stays bounded and Spark converts a chunk while the next one is read.
READ_CHUNK_TOKENS = 65_536

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


def arrow_schema(stream: StreamDefinition) -> pa.Schema:
    """:func:`output_schema` in Arrow terms: the schema of every record batch a task yields."""
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in output_columns(stream)])


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
#
# A task turns the cursor's rows into Arrow columns directly, without an object per fact.
# For the hot tables (the events stream) one ``pa.array`` call converts the row tuples into
# a struct array whose fields are the typed columns; only the wire-row JSON needs Python per
# row (``orjson.dumps`` of what ``StreamTable.to_row`` returns).

_STR = pa.string()

#: A table's rows as output columns: the tokens, then one array per typed column
#: (:func:`typed_columns` order). Input rows are ``(token, *table.columns, *extras)`` as
#: :func:`range_query` selects them.
Columns = tuple[pa.Array, list[pa.Array]]
#: Builds :data:`Columns` from the rows and the engine (``sqlite`` or ``postgres``).
ColumnBuilder = Callable[[list[tuple[Any, ...]], str], Columns]


def _dumps_all(rows: Iterable[Any]) -> list[str]:
    dumps = orjson.dumps
    return [dumps(row).decode() for row in rows]


def _events_ev_struct(engine: str) -> pa.DataType:
    # BOOLEAN columns come back as bool from PostgreSQL, as 0/1 from SQLite.
    flag = pa.bool_() if engine == "postgres" else pa.int64()
    names = ("event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership")
    return pa.struct(
        [("token", pa.int64()), *((n, _STR) for n in names), ("rejected_reason", _STR),
         ("outlier", flag), ("sender", _STR), ("origin_server_ts", pa.int64())]
    )  # fmt: skip


def _events_ev_columns(rows: list[tuple[Any, ...]], engine: str) -> Columns:
    """``events`` rows: ``(token, event_id, room_id, type, state_key, redacts, relates_to,
    membership, rejected_reason, outlier, sender, origin_server_ts)``."""
    n = len(rows)
    f = pa.array(rows, type=_events_ev_struct(engine)).flatten()
    outlier = pc.fill_null(pc.cast(f[9], pa.bool_()), False)
    typed = [
        pa.repeat("ev", n),
        *f[1:8],  # event_id, room_id, event_type, state_key, redacts, relates_to, membership
        pc.is_valid(f[8]),  # rejected
        outlier,
        f[10],  # sender
        f[11],  # origin_server_ts
        pa.nulls(n, _STR),  # prev_event_id
    ]
    return f[0], typed


_STATE_STRUCT = pa.struct(
    [("token", pa.int64())]
    + [(n, _STR) for n in ("room_id", "type", "state_key", "event_id", "prev_event_id")]
)


def _events_state_columns(rows: list[tuple[Any, ...]], engine: str) -> Columns:
    """``current_state_delta_stream`` rows: ``(token, room_id, type, state_key, event_id,
    prev_event_id)``."""
    n = len(rows)
    f = pa.array(rows, type=_STATE_STRUCT).flatten()
    typed = [
        pa.repeat("state", n),
        f[4],  # event_id
        f[1],  # room_id
        f[2],  # event_type
        f[3],  # state_key
        *(pa.nulls(n, _STR) for _ in range(3)),  # redacts, relates_to, membership
        *(pa.nulls(n, pa.bool_()) for _ in range(2)),  # rejected, outlier
        pa.nulls(n, _STR),  # sender
        pa.nulls(n, pa.int64()),  # origin_server_ts
        f[5],  # prev_event_id
    ]
    return f[0], typed


#: Column builders for the hot tables: typed columns straight from the rows, column-wise.
_COLUMN_BUILDERS: dict[tuple[str, str], ColumnBuilder] = {
    ("events", "events"): _events_ev_columns,
    ("events", "current_state_delta_stream"): _events_state_columns,
}


def _generic_typed(stream: StreamDefinition, row: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for (_, kind), value in zip(typed_columns(stream), row, strict=True):
        if value is None or (kind == "long" and isinstance(value, int)) or isinstance(value, str):
            out.append(value)
        else:
            out.append(orjson.dumps(value).decode())
    return tuple(out)


def _generic_columns(
    stream: StreamDefinition, rows: list[tuple[Any, ...]], wire_rows: list[Any]
) -> Columns:
    """Any other table: the typed columns are the wire row's fields."""
    values = list(zip(*(_generic_typed(stream, row) for row in wire_rows), strict=True))
    typed = [
        pa.array(values[i], _ARROW_TYPES[kind]) for i, (_, kind) in enumerate(typed_columns(stream))
    ]
    return pa.array([r[0] for r in rows], pa.int64()), typed


def _table_batch(
    conn: ReadConnection,
    stream: StreamDefinition,
    table: StreamTable,
    writer: str,
    from_token: int,
    upto_token: int,
) -> pa.RecordBatch | None:
    """Rows of one table as :func:`roomstream.streams.registry.get_updates_txn` selects them
    (same range, same order, same wire row), plus the extra columns; ``None`` if none."""
    extras = _EXTRA_COLUMNS.get((stream.name, table.ref.table), ())
    sql, params = range_query(stream, table, writer, from_token, upto_token, None, extras)
    rows = conn.query(sql, params)
    if not rows:
        return None
    n_columns, to_row = len(table.columns), table.to_row
    wire_rows = [to_row(tuple(r[1 : 1 + n_columns])) for r in rows]
    builder = _COLUMN_BUILDERS.get((stream.name, table.ref.table))
    if builder is None:
        tokens, typed = _generic_columns(stream, rows, wire_rows)
    else:
        tokens, typed = builder(rows, conn.engine)
    n = len(rows)
    arrays = [
        pa.repeat(stream.name, n),
        pa.repeat(writer, n),
        tokens,
        pa.array(_dumps_all(wire_rows), _STR),
        *typed,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(stream))


def fetch_batch(
    conn: ReadConnection, stream: StreamDefinition, writer: str, from_token: int, upto_token: int
) -> pa.RecordBatch:
    """Every fact of ``writer`` with ``from_token < token <= upto_token`` as one record batch
    (columns of :func:`output_schema`), ordered by token; rows of different tables sharing a
    token keep the tables' order (the same order as ``get_updates_txn``'s merge)."""
    schema = arrow_schema(stream)
    parts = [
        b
        for t in (stream.tables if upto_token > from_token else ())
        if (b := _table_batch(conn, stream, t, writer, from_token, upto_token)) is not None
    ]
    if not parts:
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(parts) == 1:
        return parts[0]
    merged = pa.Table.from_batches(parts, schema=schema)
    # Each part is sorted; a stable sort keeps the table order among equal tokens.
    order = pc.sort_indices(merged, sort_keys=[("stream_id", "ascending")])
    return merged.take(order).combine_chunks().to_batches()[0]


class TokenRange(InputPartition):
    """One Spark task's share of a batch: ``writer``'s facts with ``lo < token <= hi``."""

    def __init__(self, writer: str, lo: int, hi: int) -> None:
        super().__init__((writer, lo, hi))
        self.writer = writer
        self.lo = lo
        self.hi = hi


def plan_ranges(
    start: Mapping[str, int],
    end: Mapping[str, int],
    tokens: int,
    min_partitions: int = 1,
) -> list[TokenRange]:
    """Split ``(start, end]`` into per-writer token ranges of at most ``tokens`` tokens.

    The ranges cover every writer's ``(start[w], end[w]]`` exactly once, without overlap.
    With ``min_partitions > 1`` the step shrinks so that the batch's total span (over all
    writers) makes about ``min_partitions`` ranges, but never below
    :data:`MIN_SPLIT_TOKENS` (a small batch stays one range per writer).
    """
    spans = [(w, int(start.get(w, 0)), int(end[w])) for w in sorted(end)]
    step = max(1, tokens)
    if min_partitions > 1:
        total = sum(hi - lo for _, lo, hi in spans if hi > lo)
        share = -(-total // min_partitions)  # ceil
        step = min(step, max(MIN_SPLIT_TOKENS, share))
    ranges = []
    for writer, lo, hi in spans:
        while lo < hi:
            upto = min(hi, lo + step)
            ranges.append(TokenRange(writer, lo, upto))
            lo = upto
    return ranges


def read_range(config: DatabaseConfig, stream_name: str, part: TokenRange) -> Iterator[Any]:
    """Arrow record batches of one token range (runs on an executor).

    One connection for the whole range, read in consecutive chunks of
    :data:`READ_CHUNK_TOKENS` tokens: chunks are token ranges, so a token's rows are never
    split, and the batches together are exactly ``fetch_batch(part.lo, part.hi)`` in order.
    Chunks without rows yield nothing."""
    stream = _table_stream(stream_name)
    with read_connection(config) as conn:
        lo = part.lo
        while lo < part.hi:
            upto = min(part.hi, lo + READ_CHUNK_TOKENS)
            batch = fetch_batch(conn, stream, part.writer, lo, upto)
            if batch.num_rows:
                yield batch
            lo = upto


# -- Spark classes ---------------------------------------------------------------------


def _positive(options: Mapping[str, str], name: str, default: int) -> int:
    value = int(options.get(name, default))
    if value < 1:
        raise ValueError(f"option {name!r} must be at least 1, got {value}")
    return value


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
    min_partitions: int = DEFAULT_MIN_PARTITIONS

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
            partition_tokens=_positive(options, "partitionTokens", DEFAULT_PARTITION_TOKENS),
            min_partitions=_positive(options, "minPartitions", DEFAULT_MIN_PARTITIONS),
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
        opts = self.options
        return plan_ranges(start or {}, end, opts.partition_tokens, opts.min_partitions)

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
        opts = self.options
        return plan_ranges(start, end, opts.partition_tokens, opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TokenRange)
        return read_range(self.options.config, self.options.stream, partition)


class RoomstreamDataSource(DataSource):
    """``spark.readStream.format("roomstream")`` (and ``spark.read``); see the module doc.

    Options: ``stream`` (required), ``engine`` (sqlite|postgres), ``path`` | ``dsn`` +
    ``schema``, ``view`` (linear|per_writer), ``writers`` (comma-separated pin),
    ``startingOffsets`` (earliest|latest|JSON offset), ``maxRowsPerBatch``,
    ``partitionTokens``, ``minPartitions``; batch reads also take ``since`` / ``upto``
    (JSON offsets).
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
