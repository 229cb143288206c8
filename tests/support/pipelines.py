"""Writing facts to the events stream the way a writer would: reserve IDs from a stream ID
generator, insert the rows in a transaction, complete the IDs (leave the block)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from roomstream.pipelines.dbio import options_from_config
from roomstream.pipelines.sinks import DatabaseSink, collect_rows
from roomstream.storage import Database, DatabaseConfig, Transaction
from roomstream.streams import StreamIdGenerator
from roomstream.streams.registry import EVENTS, get_updates_txn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

DAY_MS = 86_400_000
BASE_TS = 1_700_000_000_000


@dataclass(frozen=True)
class Ev:
    """One event (and, when ``state_key`` is set, its current-state change)."""

    room_id: str
    type: str
    sender: str
    state_key: str | None = None
    membership: str | None = None
    ts: int = BASE_TS
    outlier: bool = False
    rejected: bool = False
    prev_event_id: str | None = None
    #: For a state event: False means it does not change current state (no delta row).
    changes_state: bool = True
    #: Event content, stored in ``event_json`` (migration 0003) when set.
    content: dict[str, Any] | None = None
    #: A current-state change without a new event (state reset / removal): only a delta
    #: row pointing at ``delta_event`` (None removes the entry).
    delta_only: bool = False
    delta_event: str | None = None


async def events_generator(db: Database, instance: str, writers: list[str]) -> StreamIdGenerator:
    return await StreamIdGenerator.create(
        db, EVENTS.name, EVENTS.sequence, EVENTS.table_refs, writers, instance
    )


def event_id_for(stream_id: int, instance: str) -> str:
    return f"$ev{stream_id}_{instance}"


def insert_events_txn(
    txn: Transaction, instance: str, items: Iterable[tuple[int, Ev]]
) -> list[str]:
    ids = []
    for sid, ev in items:
        if ev.delta_only:
            txn.execute(
                "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id,"
                " type, state_key, event_id, prev_event_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, instance, ev.room_id, ev.type, ev.state_key, ev.delta_event, None),
            )
            continue
        event_id = event_id_for(sid, instance)
        ids.append(event_id)
        if ev.content is not None:
            txn.execute(
                "INSERT INTO event_json (event_id, room_id, room_version, json)"
                " VALUES (?, ?, ?, ?)",
                (event_id, ev.room_id, "10", orjson.dumps({"content": ev.content})),
            )
        txn.execute(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " state_key, sender, membership, outlier, rejected_reason, origin_server_ts,"
            " received_ts, instance_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sid, sid, event_id, ev.room_id, ev.type, ev.state_key, ev.sender,
                ev.membership, ev.outlier, "spam" if ev.rejected else None, ev.ts, ev.ts,
                instance,
            ),
        )  # fmt: skip
        if ev.state_key is not None and ev.changes_state and not ev.outlier and not ev.rejected:
            txn.execute(
                "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id,"
                " type, state_key, event_id, prev_event_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, instance, ev.room_id, ev.type, ev.state_key, event_id, ev.prev_event_id),
            )
    return ids


async def write_events(db: Database, gen: StreamIdGenerator, evs: list[Ev]) -> list[int]:
    """Reserve one ID per event, insert them in one transaction, complete. Returns the IDs."""
    async with gen.reserve_many(len(evs)) as ids:
        await db.run_interaction(
            "insert_events", insert_events_txn, gen.instance_name, list(zip(ids, evs, strict=True))
        )
    return ids


def message(room: str, sender: str, ts: int = BASE_TS) -> Ev:
    return Ev(room, "m.room.message", sender, ts=ts)


def member(
    room: str,
    user: str,
    membership: str,
    sender: str | None = None,
    ts: int = BASE_TS,
    name: str | None = None,
) -> Ev:
    content: dict[str, Any] = {"membership": membership}
    if name is not None:
        content["displayname"] = name
    return Ev(
        room, "m.room.member", sender or user, state_key=user, membership=membership, ts=ts,
        content=content,
    )  # fmt: skip


# -- reading what a sink delivered -------------------------------------------------------

DELIVERED_DDL = (
    "CREATE TABLE delivered (instance_name TEXT NOT NULL, stream_id BIGINT NOT NULL,"
    " row_json TEXT NOT NULL)"
)


def create_delivered_txn(txn: Transaction) -> None:
    txn.execute(DELIVERED_DDL)


def facts_sink(config: DatabaseConfig, name: str, **kwargs: Any) -> DatabaseSink[list[Any]]:
    """A sink copying every fact into the test's ``delivered`` table (no unique key, so a
    duplicate delivery would show)."""

    def apply(txn: Transaction, rows: list[Any]) -> int:
        txn.executemany(
            "INSERT INTO delivered (instance_name, stream_id, row_json) VALUES (?, ?, ?)",
            [(r["instance_name"], r["stream_id"], r["row_json"]) for r in rows],
        )
        return len(rows)

    return DatabaseSink(config, name, collect_rows, apply, **kwargs)


def delivered_txn(txn: Transaction) -> list[tuple[str, int, str]]:
    return sorted(
        (str(r[0]), int(r[1]), str(r[2]))
        for r in txn.query("SELECT instance_name, stream_id, row_json FROM delivered")
    )


def expected_txn(
    txn: Transaction, writers: Iterable[str], upto: int = 10**12
) -> list[tuple[str, int, str]]:
    """Every fact of the events stream, as get_updates_txn returns it (the reference)."""
    out = []
    for writer in writers:
        updates, _, _ = get_updates_txn(txn, EVENTS, writer, 0, upto, 10**9)
        out.extend((writer, token, orjson.dumps(row).decode()) for token, row in updates)
    return sorted(out)


def contents_txn(txn: Transaction) -> dict[str, dict[str, object]]:
    import orjson

    return {
        r[0]: orjson.loads(r[1])["content"]
        for r in txn.query("SELECT event_id, json FROM event_json")
    }


def start_facts_query(
    spark: SparkSession,
    config: DatabaseConfig,
    checkpoint: Path,
    sink: DatabaseSink[Any],
    **opts: str,
) -> StreamingQuery:
    reader = spark.readStream.format("roomstream").option("stream", "events")
    for key, value in {**options_from_config(config), **opts}.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
