"""The driver side of the bulk import: copy part databases into the target, atomically.

Every part is a SQLite database written by one Spark task (:mod:`import_task`). Its IDs
are local: stream orderings ``1..n`` (``-1..-n`` for backfill), state groups ``1..G``,
branches ``1..B``. The loader renumbers them into blocks reserved from the target:

- stream orderings from the target's ``events`` (or ``backfill``) stream ID generator, one
  block for the whole import, so the target's stream positions stay correct: local ``k``
  of part ``p`` becomes ``block[offset_p + k - 1]``, which keeps every room's persistence
  order (rooms live in one part; ``offset_p`` counts the events of earlier parts);
- state group and branch IDs from the target's sequences, likewise;
- auth chain IDs are per room and are copied as they are.

Invariant: the whole copy is ONE transaction on the target. Any failure (a conflicting
room, a constraint violation, an injected fault, a crash) rolls it back and leaves the
target's tables as they were; the only trace is a gap in the target's sequences (IDs that
were reserved and completed without rows, which readers skip as they skip any rolled-back
transaction).

SQLite targets are loaded with ``ATTACH`` + ``INSERT ... SELECT`` on a dedicated
connection (SQLite refuses ``ATTACH`` inside a transaction, so every part is attached
first: at most :data:`MAX_SQLITE_PARTS`). PostgreSQL targets are loaded with ``COPY`` on a
dedicated connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from roomstream.pipelines.import_task import PartResult
from roomstream.storage import DatabaseConfig

#: SQLite's default limit on attached databases.
MAX_SQLITE_PARTS = 10

#: How a column is renumbered: stream ordering, state group or branch.
SO, GROUP, BRANCH = "so", "group", "branch"


@dataclass(frozen=True)
class TableCopy:
    table: str
    columns: tuple[str, ...]
    remap: tuple[tuple[str, str], ...] = ()


#: Every table the persister writes, in an order that satisfies references.
TABLES: tuple[TableCopy, ...] = (
    TableCopy("rooms", ("room_id", "room_version", "creator", "is_public")),
    TableCopy(
        "events",
        (
            "stream_ordering",
            "topological_ordering",
            "event_id",
            "room_id",
            "type",
            "state_key",
            "sender",
            "redacts",
            "relates_to",
            "membership",
            "outlier",
            "rejected_reason",
            "soft_failed",
            "origin_server_ts",
            "received_ts",
            "instance_name",
            "redacted_by",
        ),
        (("stream_ordering", SO),),
    ),
    TableCopy("event_json", ("event_id", "room_id", "room_version", "json")),
    TableCopy("event_edges", ("event_id", "prev_event_id")),
    TableCopy("event_auth", ("event_id", "auth_id")),
    TableCopy("event_forward_extremities", ("room_id", "event_id")),
    TableCopy("redactions", ("event_id", "redacts")),
    TableCopy("event_auth_chains", ("event_id", "room_id", "chain_id", "sequence_number")),
    TableCopy(
        "event_auth_chain_links",
        (
            "room_id",
            "origin_chain_id",
            "origin_sequence_number",
            "target_chain_id",
            "target_sequence_number",
        ),
    ),
    TableCopy(
        "state_branches",
        ("branch_id", "room_id", "base_branch_id", "base_seq", "depth", "tip_seq"),
        (("branch_id", BRANCH), ("base_branch_id", BRANCH)),
    ),
    TableCopy(
        "state_groups",
        ("state_group", "room_id", "branch_id", "seq"),
        (("state_group", GROUP), ("branch_id", BRANCH)),
    ),
    TableCopy(
        "state_entries",
        ("branch_id", "type", "state_key", "event_id", "from_seq", "to_seq"),
        (("branch_id", BRANCH),),
    ),
    TableCopy(
        "event_state",
        ("event_id", "before_group", "after_group"),
        (("before_group", GROUP), ("after_group", GROUP)),
    ),
    TableCopy("current_state_events", ("room_id", "type", "state_key", "event_id", "membership")),
    TableCopy(
        "current_state_delta_stream",
        ("stream_id", "instance_name", "room_id", "type", "state_key", "event_id", "prev_event_id"),
        (("stream_id", SO),),
    ),
    # The read path's visibility records (roomstream.reading.visibility).
    TableCopy(
        "timeline_events",
        (
            "room_id",
            "topological_ordering",
            "stream_ordering",
            "event_id",
            "instance_name",
            "visibility",
            "visibility_after",
            "member_user",
            "membership",
            "replaces_state",
        ),
        (("stream_ordering", SO),),
    ),
    TableCopy(
        "visibility_memberships",
        ("room_id", "user_id", "topological_ordering", "stream_ordering", "membership"),
        (("stream_ordering", SO),),
    ),
    # The relations index (roomstream.reading.relations).
    TableCopy(
        "event_relations",
        (
            "event_id",
            "room_id",
            "relates_to_id",
            "relation_type",
            "aggregation_key",
            "event_type",
            "sender",
            "topological_ordering",
            "stream_ordering",
        ),
        (("stream_ordering", SO),),
    ),
    TableCopy(
        "threads",
        ("room_id", "thread_id", "latest_event_id", "topological_ordering", "stream_ordering"),
        (("stream_ordering", SO),),
    ),
    # The part's rooms, for the search index's rebuild (roomstream.reading.index_backfill):
    # loaded with them, so a crash after the load leaves them listed for the next start.
    TableCopy("index_backfill_rooms", ("room_id",)),
)


#: Tables of a part database that are bookkeeping of the scratch database itself.
NOT_COPIED = frozenset(
    {"stream_positions", "roomstream_sequences", "schema_version", "sqlite_sequence"}
    # SQLite's FTS5 keeps its own bookkeeping rows (configuration, structure) in these
    # shadow tables of the search index from its creation on. The import's persister
    # runs no search indexer (the rebuild indexes the loaded rooms), so the index itself
    # (``event_search``) stays empty and is checked like any table.
    | {f"event_search_{s}" for s in ("data", "idx", "content", "docsize", "config")}
)


def check_part_tables(part_path: str) -> None:
    """Refuse a part that has rows in a table the loader does not copy.

    A safety net against schema drift: if the persister starts writing a new table, the
    import fails (leaving the target unchanged) instead of silently dropping its rows.
    """
    copied = {c.table for c in TABLES} | NOT_COPIED
    conn = sqlite3.connect(f"file:{part_path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for name in names:
            if name not in copied and conn.execute(f'SELECT 1 FROM "{name}" LIMIT 1').fetchone():
                raise RuntimeError(
                    f"part {part_path} has rows in table {name!r}, which the import does not"
                    " copy; update roomstream.pipelines.import_load.TABLES"
                )
    finally:
        conn.close()


class ImportConflictError(RuntimeError):
    """The target already holds rooms the import would create."""


@dataclass(frozen=True)
class Blocks:
    """IDs reserved in the target: each list in the order local IDs are mapped onto it.

    ``so`` holds signed stream orderings (negative for backfill), ``so[i]`` for the
    ``i``-th event of the import (parts concatenated in order).
    """

    so: Sequence[int]
    groups: Sequence[int]
    branches: Sequence[int]


@dataclass(frozen=True)
class _Offsets:
    so: int
    groups: int
    branches: int


def _contiguous(ids: Sequence[int]) -> bool:
    if not ids:
        return True
    step = 1 if len(ids) < 2 or ids[1] > ids[0] else -1
    return ids[-1] - ids[0] == step * (len(ids) - 1)


def _deltas(blocks: Blocks, offsets: _Offsets) -> dict[str, int]:
    """``global = local + delta`` for contiguous blocks (local IDs are 1..n or -1..-n)."""

    def delta(ids: Sequence[int], offset: int) -> int:
        if not ids:
            return 0
        first = ids[0]
        sign = -1 if first < 0 else 1
        return sign * (abs(first) + offset - 1)

    return {
        SO: delta(blocks.so, offsets.so),
        GROUP: delta(blocks.groups, offsets.groups),
        BRANCH: delta(blocks.branches, offsets.branches),
    }


Progress = Callable[[int, PartResult], None]
"""Called after each part is copied, inside the transaction: (part number, part)."""


def _imported_rooms(parts: Sequence[PartResult]) -> list[str]:
    return sorted({r for p in parts for r in p.rooms})


# -- SQLite ----------------------------------------------------------------------------


def load_sqlite(
    target: DatabaseConfig, parts: Sequence[PartResult], blocks: Blocks, progress: Progress
) -> None:
    """Copy ``parts`` into the SQLite ``target`` in one transaction (see module doc)."""
    if len(parts) > MAX_SQLITE_PARTS:
        raise ValueError(f"at most {MAX_SQLITE_PARTS} parts can be loaded into SQLite at once")
    for ids in (blocks.so, blocks.groups, blocks.branches):
        if not _contiguous(ids):
            raise RuntimeError("SQLite sequences hand out contiguous blocks; got a gap")
    for part in parts:
        check_part_tables(part.path)
    conn = sqlite3.connect(target.path, isolation_level=None, timeout=60)
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        conn.execute("PRAGMA cache_size=-524288")
        conn.execute("PRAGMA foreign_keys=ON")
        for i, part in enumerate(parts):
            conn.execute(f"ATTACH DATABASE ? AS part{i}", (part.path,))
        conn.execute("BEGIN IMMEDIATE")
        try:
            _check_conflicts_sqlite(conn, parts)
            offsets = _Offsets(0, 0, 0)
            for i, part in enumerate(parts):
                deltas = _deltas(blocks, offsets)
                for copy in TABLES:
                    remap = dict(copy.remap)
                    select = ", ".join(
                        f"{c} + {int(deltas[remap[c]])}" if c in remap else c for c in copy.columns
                    )
                    conn.execute(
                        f"INSERT INTO main.{copy.table} ({', '.join(copy.columns)})"
                        f" SELECT {select} FROM part{i}.{copy.table}"
                    )
                offsets = _Offsets(
                    offsets.so + part.events,
                    offsets.groups + part.state_groups,
                    offsets.branches + part.branches,
                )
                progress(i, part)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        try:
            for i in range(len(parts)):
                conn.execute(f"DETACH DATABASE part{i}")
        except sqlite3.Error:
            pass
        conn.close()


def _check_conflicts_sqlite(conn: sqlite3.Connection, parts: Sequence[PartResult]) -> None:
    rooms = _imported_rooms(parts)
    for start in range(0, len(rooms), 500):
        chunk = rooms[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found = conn.execute(
            f"SELECT DISTINCT room_id FROM events WHERE room_id IN ({marks})", chunk
        ).fetchall()
        if found:
            raise ImportConflictError(
                f"the target already has events in {len(found)} of the imported rooms"
                f" (e.g. {found[0][0]}); importing into existing rooms is not supported"
            )


# -- PostgreSQL ------------------------------------------------------------------------


def _pg_connect(target: DatabaseConfig) -> psycopg.Connection[Any]:
    kwargs: dict[str, Any] = {"autocommit": False, "connect_timeout": 30}
    if target.schema:
        kwargs["options"] = f"-c search_path={target.schema}"
    return psycopg.connect(target.dsn, **kwargs)


def load_postgres(
    target: DatabaseConfig, parts: Sequence[PartResult], blocks: Blocks, progress: Progress
) -> None:
    """Copy ``parts`` into the PostgreSQL ``target`` with COPY, in one transaction."""
    for part in parts:
        check_part_tables(part.path)
    contiguous = all(_contiguous(ids) for ids in (blocks.so, blocks.groups, blocks.branches))
    with _pg_connect(target) as conn:  # commits on normal exit, rolls back on exception
        with conn.cursor() as cur:
            rooms = _imported_rooms(parts)
            cur.execute(
                "SELECT DISTINCT room_id FROM events WHERE room_id = ANY(%s) LIMIT 1", (rooms,)
            )
            found = cur.fetchone()
            if found:
                raise ImportConflictError(
                    f"the target already has events in imported room {found[0]};"
                    " importing into existing rooms is not supported"
                )
            offsets = _Offsets(0, 0, 0)
            for i, part in enumerate(parts):
                source = sqlite3.connect(f"file:{part.path}?mode=ro", uri=True)
                try:
                    for copy in TABLES:
                        _copy_table_pg(cur, source, copy, blocks, offsets, contiguous)
                finally:
                    source.close()
                offsets = _Offsets(
                    offsets.so + part.events,
                    offsets.groups + part.state_groups,
                    offsets.branches + part.branches,
                )
                progress(i, part)


def _copy_table_pg(
    cur: psycopg.Cursor[Any],
    source: sqlite3.Connection,
    copy: TableCopy,
    blocks: Blocks,
    offsets: _Offsets,
    contiguous: bool,
) -> None:
    remap = dict(copy.remap)
    columns = ", ".join(copy.columns)
    if contiguous or not remap:
        deltas = _deltas(blocks, offsets)
        select = ", ".join(
            f"{c} + {int(deltas[remap[c]])}" if c in remap else c for c in copy.columns
        )
        rows = source.execute(f"SELECT {select} FROM {copy.table}")
        mapped: Any = rows
    else:
        lists = {SO: blocks.so, GROUP: blocks.groups, BRANCH: blocks.branches}
        starts = {SO: offsets.so, GROUP: offsets.groups, BRANCH: offsets.branches}
        positions = [
            (i, lists[remap[c]], starts[remap[c]]) for i, c in enumerate(copy.columns) if c in remap
        ]

        def remap_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
            out = list(row)
            for i, ids, start in positions:
                if out[i] is not None:
                    out[i] = ids[start + abs(int(out[i])) - 1]
            return tuple(out)

        rows = source.execute(f"SELECT {columns} FROM {copy.table}")
        mapped = map(remap_row, rows)
    booleans = {"outlier", "soft_failed", "is_public"}
    bool_positions = [i for i, c in enumerate(copy.columns) if c in booleans]
    with cur.copy(f"COPY {copy.table} ({columns}) FROM STDIN") as pg_copy:
        if bool_positions:
            for row in mapped:
                values = list(row)
                for i in bool_positions:
                    values[i] = bool(values[i])
                pg_copy.write_row(values)
        else:
            for row in mapped:
                pg_copy.write_row(row)
