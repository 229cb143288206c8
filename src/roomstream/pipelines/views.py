"""Derived views over the events stream (room statistics, user statistics, user directory)
and, from the ``media`` table, media statistics.

Two ways to the same tables (``0002_pipelines.sql``):

- :func:`start_views_query` keeps them up to date: a streaming query over the ``roomstream``
  source (``view=linear``, so facts arrive in token order) whose :class:`DatabaseSink`
  applies each micro-batch exactly once. Counting (events sent, messages per day, last
  activity) is aggregated by Spark; current-state changes, usually few, are applied in
  token order on the driver against the views' own copy of current state.
- :func:`rebuild_views` recomputes them from scratch with a batch job (PostgreSQL tables
  through Spark's JDBC reader; SQLite through the source's batch reader) and can replace
  the tables' contents; it returns the offset it covered, from which a new streaming query
  can continue (``startingOffsets``).

Definitions (both paths; a test checks they agree):

- counted events: ``ev`` rows that are neither outliers nor rejected;
- ``events_sent`` per sender, ``messages`` per room and UTC day (``m.room.message``),
  ``last_activity_ts`` = the latest ``origin_server_ts`` of a counted event in the room;
- current state: per (room, type, state_key) the delta with the highest stream id; a NULL
  ``event_id`` removes the entry. Membership comes from the referenced event's
  ``events.membership``; display names (``displayname``) and join rules (``join_rule``)
  from the event *content*, through a :class:`ContentLookup`;
- a user is in the directory iff joined to some room that is public (join rule
  ``public``) or has at least two joined members; their display name is the one of their
  joined membership with the highest stream id;
- ``view_media_stats``: per uploader and UTC day of ``upload_ts``, the completed uploads,
  their bytes and their media types. Uploads are on no stream, so this view is a batch
  derivation from ``media`` (see :func:`refresh_media_stats_txn`), refreshed in every
  micro-batch's transaction and recomputed whole by a rebuild.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from roomstream.events.redaction import redact
from roomstream.events.room_versions import room_version
from roomstream.events.types import EventTypes
from roomstream.pipelines.dbio import jdbc_url, options_from_config
from roomstream.pipelines.session import spark_session
from roomstream.pipelines.sinks import DatabaseSink
from roomstream.pipelines.source import (
    SOURCE_NAME,
    SourceOptions,
    output_schema,
    sorted_offset,
)
from roomstream.storage import DatabaseConfig, Transaction, connect
from roomstream.streams.registry import EVENTS

MEMBERSHIP_COLUMNS = {
    "join": "joined_members",
    "invite": "invited_members",
    "leave": "left_members",
    "ban": "banned_members",
}
DAY_MS = 86_400_000
_EPOCH = date(1970, 1, 1)

VIEW_TABLES = (
    "view_room_state",
    "view_room_stats",
    "view_room_daily_messages",
    "view_user_stats",
    "view_user_directory",
    "view_media_stats",
)


def day_of(day_number: int) -> str:
    """'YYYY-MM-DD' of a day number (days since the Unix epoch, UTC)."""
    return (_EPOCH + timedelta(days=int(day_number))).isoformat()


# -- event content ---------------------------------------------------------------------


class ContentLookup(Protocol):
    """Where event content comes from. Called on the driver inside a database transaction.

    Returns ``{event_id: content}`` for the ids it knows; unknown ids are left out (their
    display name / join rule is then NULL).
    """

    def get_contents(
        self, txn: Transaction, event_ids: Sequence[str]
    ) -> dict[str, dict[str, Any]]: ...


class EventJsonContentLookup:
    """Reads ``event_json(event_id, room_version, json)`` (the full event as JSON text or
    bytes, content under ``"content"``), the table the event persister writes (migration
    0003). An event whose redaction applied (``events.redacted_by``, set only by the
    persister, under the redaction rules) is read in its redacted form: a redacted display
    name never reaches the directories."""

    def __init__(self, table: str = "event_json", chunk: int = 500) -> None:
        self.table = table
        self.chunk = chunk

    def get_contents(self, txn: Transaction, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        ids = list(event_ids)
        for i in range(0, len(ids), self.chunk):
            part = ids[i : i + self.chunk]
            marks = ", ".join("?" * len(part))
            for event_id, raw, version, redacted_by in txn.query(
                f"SELECT j.event_id, j.json, j.room_version, e.redacted_by FROM {self.table} j"
                f" LEFT JOIN events e ON e.event_id = j.event_id WHERE j.event_id IN ({marks})",
                part,
            ):
                event = orjson.loads(raw)
                if redacted_by is not None:
                    event = redact(event, room_version(version))
                content = event.get("content")
                if isinstance(content, dict):
                    out[str(event_id)] = content
        return out


class MappingContentLookup:
    """Content from a mapping (tests; or a caller that already has the contents)."""

    def __init__(self, contents: Mapping[str, dict[str, Any]]) -> None:
        self.contents = contents

    def get_contents(self, txn: Transaction, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {e: dict(self.contents[e]) for e in event_ids if e in self.contents}


def _display_name(content: dict[str, Any] | None) -> str | None:
    value = (content or {}).get("displayname")
    return value if isinstance(value, str) else None


def _join_rule(content: dict[str, Any] | None) -> str | None:
    value = (content or {}).get("join_rule")
    return value if isinstance(value, str) else None


# -- media statistics: a batch derivation from the media table -------------------------

#: (user, day) -> (uploads, bytes, {media type: uploads})
MediaStats = dict[tuple[str, str], tuple[int, int, dict[str, int]]]

#: After a sink's first refresh (every day), each refresh recomputes the days from the day
#: of (the previous refresh's start - this margin). ``upload_ts`` is the uploading
#: process's clock when it wrote the row, so a row can commit after a refresh read
#: ``media`` with an ``upload_ts`` before that refresh started; the margin bounds how late
#: (commit latency plus clock skew between processes) such a row may be and still be
#: counted by the next refresh. Later than that, it is counted by the next rebuild or the
#: next start of the views job.
MEDIA_STATS_MARGIN_MS = 3_600_000


def media_type_key(media_type: str | None) -> str:
    """The type an upload is counted under: the MIME type without parameters, lower case
    (``image/PNG; x=y`` -> ``image/png``); none given: ``application/octet-stream``, the
    type the media repository serves such content as."""
    bare = (media_type or "").split(";", 1)[0].strip().lower()
    return bare or "application/octet-stream"


def compute_media_stats_txn(txn: Transaction, since_day: int | None = None) -> MediaStats:
    """``view_media_stats``'s rows from ``media``: completed uploads (``upload_ts`` set)
    grouped by uploader and UTC day of ``upload_ts``; only days ``>= since_day`` (a day
    number) if given. One GROUP BY in the database (the table is indexed by upload time);
    media types are merged after :func:`media_type_key` here."""
    sql = (
        f"SELECT user_id, upload_ts / {DAY_MS}, media_type, COUNT(*),"
        " COALESCE(SUM(media_length), 0) FROM media WHERE upload_ts IS NOT NULL"
    )
    params: list[int] = []
    if since_day is not None:
        sql += " AND upload_ts >= ?"
        params.append(since_day * DAY_MS)
    sql += " GROUP BY 1, 2, 3"
    uploads: dict[tuple[str, str], int] = defaultdict(int)
    size: dict[tuple[str, str], int] = defaultdict(int)
    types: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for user_id, day, media_type, count, total in txn.query(sql, params):
        key = (str(user_id), day_of(int(day)))
        uploads[key] += int(count)
        size[key] += int(total)
        types[key][media_type_key(media_type)] += int(count)
    return {k: (uploads[k], size[k], dict(sorted(types[k].items()))) for k in uploads}


def _insert_media_stats_txn(txn: Transaction, stats: MediaStats) -> None:
    txn.executemany(
        "INSERT INTO view_media_stats (user_id, day, uploads, bytes, content_types)"
        " VALUES (?, ?, ?, ?, ?)",
        [(*k, n, b, json.dumps(t, sort_keys=True)) for k, (n, b, t) in sorted(stats.items())],
    )


def refresh_media_stats_txn(txn: Transaction, since_day: int | None = None) -> int:
    """Replace ``view_media_stats``'s rows for the days ``>= since_day`` (every day if
    None) with what ``media`` holds now; returns the rows written. Idempotent: running it
    again, or replaying the batch it ran in, changes nothing unless ``media`` changed.
    Invariant: afterwards those days' rows equal :func:`compute_media_stats_txn` over the
    transaction's view of ``media``."""
    stats = compute_media_stats_txn(txn, since_day)
    if since_day is None:
        txn.execute("DELETE FROM view_media_stats")
    else:
        # ISO dates (4-digit years) compare as text in date order.
        txn.execute("DELETE FROM view_media_stats WHERE day >= ?", (day_of(since_day),))
    _insert_media_stats_txn(txn, stats)
    return len(stats)


def day_number(ts_ms: int) -> int:
    """The UTC day number (days since the Unix epoch) of a timestamp in milliseconds."""
    return ts_ms // DAY_MS


# -- snapshots -------------------------------------------------------------------------


@dataclass
class ViewSnapshot:
    """Every view table's contents, keyed by primary key (compare two with ``==``)."""

    #: (room, type, state_key) -> (event_id, stream_id, membership, display_name, join_rule)
    room_state: dict[tuple[str, str, str], tuple[Any, ...]] = field(default_factory=dict)
    #: room -> (joined, invited, left, banned, current_state_events, is_public, last_ts)
    room_stats: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    daily_messages: dict[tuple[str, str], int] = field(default_factory=dict)
    #: user -> (rooms_joined, events_sent)
    user_stats: dict[str, tuple[int, int]] = field(default_factory=dict)
    directory: dict[str, str | None] = field(default_factory=dict)
    #: (user, day) -> (uploads, bytes, {media type: uploads})
    media_stats: MediaStats = field(default_factory=dict)


def read_snapshot_txn(txn: Transaction) -> ViewSnapshot:
    snap = ViewSnapshot()
    for r in txn.query(
        "SELECT room_id, type, state_key, event_id, stream_id, membership, display_name,"
        " join_rule FROM view_room_state"
    ):
        snap.room_state[(r[0], r[1], r[2])] = (r[3], int(r[4]), r[5], r[6], r[7])
    for r in txn.query(
        "SELECT room_id, joined_members, invited_members, left_members, banned_members,"
        " current_state_events, is_public, last_activity_ts FROM view_room_stats"
    ):
        snap.room_stats[r[0]] = (*(int(x) for x in r[1:6]), bool(r[6]), _int_or_none(r[7]))
    for r in txn.query("SELECT room_id, day, messages FROM view_room_daily_messages"):
        snap.daily_messages[(r[0], r[1])] = int(r[2])
    for r in txn.query("SELECT user_id, rooms_joined, events_sent FROM view_user_stats"):
        snap.user_stats[r[0]] = (int(r[1]), int(r[2]))
    for r in txn.query("SELECT user_id, display_name FROM view_user_directory"):
        snap.directory[r[0]] = r[1]
    for r in txn.query("SELECT user_id, day, uploads, bytes, content_types FROM view_media_stats"):
        snap.media_stats[(r[0], r[1])] = (int(r[2]), int(r[3]), json.loads(r[4]))
    return snap


def read_snapshot(config: DatabaseConfig) -> ViewSnapshot:
    """The view tables as they are now."""
    db = connect(config)
    try:
        return db.run_interaction_blocking("read_snapshot", read_snapshot_txn)
    finally:
        db.close_blocking()


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def write_snapshot_txn(txn: Transaction, snap: ViewSnapshot) -> int:
    """Replace every view table's contents with ``snap`` (one transaction)."""
    for table in VIEW_TABLES:
        txn.execute(f"DELETE FROM {table}")
    txn.executemany(
        "INSERT INTO view_room_state (room_id, type, state_key, event_id, stream_id, membership,"
        " display_name, join_rule) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(*k, *v) for k, v in snap.room_state.items()],
    )
    txn.executemany(
        "INSERT INTO view_room_stats (room_id, joined_members, invited_members, left_members,"
        " banned_members, current_state_events, is_public, last_activity_ts)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(k, *v) for k, v in snap.room_stats.items()],
    )
    txn.executemany(
        "INSERT INTO view_room_daily_messages (room_id, day, messages) VALUES (?, ?, ?)",
        [(*k, v) for k, v in snap.daily_messages.items()],
    )
    txn.executemany(
        "INSERT INTO view_user_stats (user_id, rooms_joined, events_sent) VALUES (?, ?, ?)",
        [(k, *v) for k, v in snap.user_stats.items()],
    )
    txn.executemany(
        "INSERT INTO view_user_directory (user_id, display_name) VALUES (?, ?)",
        list(snap.directory.items()),
    )
    _insert_media_stats_txn(txn, snap.media_stats)
    return sum(
        len(x)
        for x in (
            snap.room_state,
            snap.room_stats,
            snap.daily_messages,
            snap.user_stats,
            snap.directory,
            snap.media_stats,
        )
    )


def export_parquet(spark: SparkSession, snap: ViewSnapshot, path: str) -> None:
    """Write each view as Parquet under ``path/<table>`` (overwriting) for analysts."""
    tables: dict[str, tuple[str, list[tuple[Any, ...]]]] = {
        "view_room_state": (
            "room_id string, type string, state_key string, event_id string, stream_id long,"
            " membership string, display_name string, join_rule string",
            [(*k, *v) for k, v in snap.room_state.items()],
        ),
        "view_room_stats": (
            "room_id string, joined_members long, invited_members long, left_members long,"
            " banned_members long, current_state_events long, is_public boolean,"
            " last_activity_ts long",
            [(k, *v) for k, v in snap.room_stats.items()],
        ),
        "view_room_daily_messages": (
            "room_id string, day string, messages long",
            [(*k, v) for k, v in snap.daily_messages.items()],
        ),
        "view_user_stats": (
            "user_id string, rooms_joined long, events_sent long",
            [(k, *v) for k, v in snap.user_stats.items()],
        ),
        "view_user_directory": (
            "user_id string, display_name string",
            list(snap.directory.items()),
        ),
        "view_media_stats": (
            "user_id string, day string, uploads long, bytes long, content_types map<string, long>",
            [(*k, *v) for k, v in snap.media_stats.items()],
        ),
    }
    for table, (schema, rows) in tables.items():
        spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(
            os.path.join(path, table)
        )


# -- streaming: one micro-batch ----------------------------------------------------------


@dataclass
class ViewBatch:
    """What one micro-batch contributes, computed by :func:`summarize_facts`, applied by
    :func:`apply_batch_txn`."""

    events_sent: list[tuple[str, int]]
    daily: list[tuple[str, int, int]]  # room, day number, messages
    activity: list[tuple[str, int]]  # room, max ts
    #: state changes in token order: (stream_id, room, type, state_key, event_id, membership)
    state: list[tuple[int, str, str, str, str | None, str | None]]
    rooms: list[str]


def counted_events(df: DataFrame) -> DataFrame:
    return df.filter(
        (F.col("kind") == "ev") & ~F.coalesce(F.col("outlier"), F.lit(False))
        & ~F.coalesce(F.col("rejected"), F.lit(False))
    )  # fmt: skip


#: A streaming micro-batch holds about this many facts (the source's ``maxRowsPerBatch``;
#: a token's rows are never split). The sink brings a batch's facts to the driver, so this
#: bounds the driver's memory (~100 bytes a fact) during a catch-up.
VIEWS_MAX_BATCH_ROWS = 100_000

#: The columns :func:`summarize_facts` needs (``row_json``, the widest, stays behind).
BATCH_COLUMNS = (
    "stream_id", "kind", "event_id", "room_id", "event_type", "state_key", "membership",
    "rejected", "outlier", "sender", "origin_server_ts",
)  # fmt: skip


def _counted_mask(facts: pa.Table) -> pa.ChunkedArray:
    """:func:`counted_events` as a filter mask (null where Spark's filter is null: dropped)."""
    return pc.and_kleene(
        pc.and_kleene(
            pc.equal(facts["kind"], "ev"), pc.invert(pc.fill_null(facts["outlier"], False))
        ),
        pc.invert(pc.fill_null(facts["rejected"], False)),
    )


def summarize_facts(facts: pa.Table) -> ViewBatch:
    """One micro-batch's contribution from its facts (the source's columns, at least
    :data:`BATCH_COLUMNS`), computed on the driver with Arrow kernels: no Spark job, no
    shuffle. The same definitions as :func:`compute_views` (a test checks the streamed views
    equal a Spark rebuild): counts over counted events, day = ``floor(ts / DAY_MS)`` in
    floating point as Spark computes it, null group keys kept as groups."""
    counted = facts.filter(_counted_mask(facts))
    sent = counted.group_by("sender", use_threads=False).aggregate([([], "count_all")])
    messages = counted.filter(pc.equal(counted["event_type"], EventTypes.MESSAGE))
    day = pc.cast(
        pc.floor(pc.divide(pc.cast(messages["origin_server_ts"], pa.float64()), float(DAY_MS))),
        pa.int64(),
    )
    daily = (
        pa.table({"room_id": messages["room_id"], "day": day})
        .group_by(["room_id", "day"], use_threads=False)
        .aggregate([([], "count_all")])
    )
    activity = counted.group_by("room_id", use_threads=False).aggregate(
        [("origin_server_ts", "max")]
    )
    is_ev = pc.equal(facts["kind"], "ev")
    member_events = facts.filter(
        pc.and_kleene(is_ev, pc.equal(facts["event_type"], EventTypes.MEMBER))
    )
    membership_of = dict(
        zip(
            member_events["event_id"].to_pylist(),
            member_events["membership"].to_pylist(),
            strict=True,
        )
    )
    deltas = facts.filter(pc.equal(facts["kind"], "state"))
    state = [
        (int(sid), room, etype, skey, eid, None if eid is None else membership_of.get(eid))
        for sid, room, etype, skey, eid in zip(
            *(deltas[c].to_pylist() for c in ("stream_id", "room_id", "event_type", "state_key")),
            deltas["event_id"].to_pylist(),
            strict=True,
        )
    ]
    return ViewBatch(
        events_sent=[
            (u, int(n))
            for u, n in zip(sent["sender"].to_pylist(), sent["count_all"].to_pylist(), strict=True)
        ],
        daily=[
            (r, int(d), int(n))
            for r, d, n in zip(
                daily["room_id"].to_pylist(),
                daily["day"].to_pylist(),
                daily["count_all"].to_pylist(),
                strict=True,
            )
        ],
        activity=[
            (r, int(ts))
            for r, ts in zip(
                activity["room_id"].to_pylist(),
                activity["origin_server_ts_max"].to_pylist(),
                strict=True,
            )
        ],
        state=sorted(state),  # by token, then key: deterministic
        rooms=pc.unique(facts["room_id"]).to_pylist(),
    )


def prepare_batch(df: DataFrame, batch_id: int) -> ViewBatch:
    """Bring the micro-batch's facts to the driver in ONE Spark job (Arrow, only
    :data:`BATCH_COLUMNS`) and summarize them there. Batches are bounded by the source's
    ``maxRowsPerBatch`` (see :func:`start_views_query`)."""
    return summarize_facts(df.select(*BATCH_COLUMNS).toArrow())


def _ensure_rows(txn: Transaction, table: str, key: str, values: Iterable[str]) -> None:
    txn.executemany(
        f"INSERT INTO {table} ({key}) VALUES (?) ON CONFLICT ({key}) DO NOTHING",
        [(v,) for v in sorted(set(values))],
    )


def _memberships_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    ids = list(event_ids)
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        marks = ", ".join("?" * len(part))
        for event_id, membership in txn.query(
            f"SELECT event_id, membership FROM events WHERE event_id IN ({marks})", part
        ):
            out[str(event_id)] = membership
    return out


def apply_batch_txn(txn: Transaction, batch: ViewBatch, lookup: ContentLookup) -> int:
    """Apply one batch's contribution. Not idempotent by itself: :class:`DatabaseSink`
    calls it at most once per batch id (same transaction as the bookkeeping row)."""
    written = 0
    rooms = set(batch.rooms) | {s[1] for s in batch.state}
    _ensure_rows(txn, "view_room_stats", "room_id", rooms)
    users = {u for u, _ in batch.events_sent} | {
        s[3] for s in batch.state if s[2] == EventTypes.MEMBER
    }
    _ensure_rows(txn, "view_user_stats", "user_id", users)
    txn.executemany(
        "UPDATE view_user_stats SET events_sent = events_sent + ? WHERE user_id = ?",
        [(n, u) for u, n in batch.events_sent],
    )
    txn.executemany(
        "INSERT INTO view_room_daily_messages (room_id, day, messages) VALUES (?, ?, ?)"
        " ON CONFLICT (room_id, day) DO UPDATE SET messages ="
        " view_room_daily_messages.messages + excluded.messages",
        [(room, day_of(day), n) for room, day, n in batch.daily],
    )
    txn.executemany(
        "UPDATE view_room_stats SET last_activity_ts = ? WHERE room_id = ?"
        " AND (last_activity_ts IS NULL OR last_activity_ts < ?)",
        [(ts, room, ts) for room, ts in batch.activity],
    )
    written += len(batch.events_sent) + len(batch.daily) + len(batch.activity)
    if batch.state:
        written += _apply_state_txn(txn, batch.state, lookup)
    return written


def _apply_state_txn(
    txn: Transaction,
    changes: list[tuple[int, str, str, str, str | None, str | None]],
    lookup: ContentLookup,
) -> int:
    # Membership of member events not in this batch, and contents we need.
    missing = [
        c[4] for c in changes if c[2] == EventTypes.MEMBER and c[4] is not None and c[5] is None
    ]
    known = _memberships_txn(txn, missing) if missing else {}
    wanted = [
        c[4]
        for c in changes
        if c[2] in (EventTypes.MEMBER, EventTypes.JOIN_RULES) and c[4] is not None
    ]
    contents = lookup.get_contents(txn, sorted(set(wanted))) if wanted else {}

    current: dict[tuple[str, str, str], tuple[Any, ...] | None] = {}
    room_deltas: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    user_deltas: dict[str, int] = defaultdict(int)
    public: dict[str, bool] = {}
    changed_users: set[str] = set()
    changed_rooms: set[str] = set()
    for stream_id, room, etype, state_key, event_id, membership in changes:
        key = (room, etype, state_key)
        if key not in current:
            row = txn.query_one(
                "SELECT event_id, stream_id, membership, display_name, join_rule"
                " FROM view_room_state WHERE room_id = ? AND type = ? AND state_key = ?",
                key,
            )
            current[key] = None if row is None else tuple(row)
        old = current[key]
        new: tuple[Any, ...] | None = None
        if event_id is not None:
            content = contents.get(event_id)
            if etype == EventTypes.MEMBER:
                m = membership if membership is not None else known.get(event_id)
                new = (event_id, stream_id, m, _display_name(content), None)
            elif etype == EventTypes.JOIN_RULES:
                new = (event_id, stream_id, None, None, _join_rule(content))
            else:
                new = (event_id, stream_id, None, None, None)
        current[key] = new
        deltas = room_deltas[room]
        deltas["current_state_events"] += (new is not None) - (old is not None)
        if etype == EventTypes.MEMBER:
            changed_users.add(state_key)
            changed_rooms.add(room)
            for entry, sign in ((old, -1), (new, 1)):
                if entry is not None and entry[2] in MEMBERSHIP_COLUMNS:
                    deltas[MEMBERSHIP_COLUMNS[entry[2]]] += sign
                    if entry[2] == "join":
                        user_deltas[state_key] += sign
        elif etype == EventTypes.JOIN_RULES and state_key == "":
            changed_rooms.add(room)
            public[room] = new is not None and new[4] == "public"

    for key, entry in current.items():
        if entry is None:
            txn.execute(
                "DELETE FROM view_room_state WHERE room_id = ? AND type = ? AND state_key = ?",
                key,
            )
        else:
            txn.execute(
                "INSERT INTO view_room_state (room_id, type, state_key, event_id, stream_id,"
                " membership, display_name, join_rule) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id ="
                " excluded.event_id, stream_id = excluded.stream_id, membership ="
                " excluded.membership, display_name = excluded.display_name, join_rule ="
                " excluded.join_rule",
                (*key, *entry),
            )
    for room, deltas in room_deltas.items():
        cols = sorted(c for c, d in deltas.items() if d)
        if cols:
            sets = ", ".join(f"{c} = {c} + ?" for c in cols)
            txn.execute(
                f"UPDATE view_room_stats SET {sets} WHERE room_id = ?",
                (*(deltas[c] for c in cols), room),
            )
    for room, is_public in public.items():
        txn.execute("UPDATE view_room_stats SET is_public = ? WHERE room_id = ?", (is_public, room))
    txn.executemany(
        "UPDATE view_user_stats SET rooms_joined = rooms_joined + ? WHERE user_id = ?",
        [(d, u) for u, d in user_deltas.items() if d],
    )
    # Directory: users whose membership changed, and everyone joined to a room whose
    # membership or join rule changed (sharing a room can start or stop for them).
    affected = set(changed_users)
    for room in sorted(changed_rooms):
        affected.update(
            r[0]
            for r in txn.query(
                "SELECT state_key FROM view_room_state WHERE room_id = ? AND type = ?"
                " AND membership = 'join'",
                (room, EventTypes.MEMBER),
            )
        )
    for user in sorted(affected):
        _refresh_directory_txn(txn, user)
    return len(current) + len(affected)


def _refresh_directory_txn(txn: Transaction, user: str) -> None:
    eligible = txn.query_one(
        "SELECT 1 FROM view_room_state m JOIN view_room_stats r ON r.room_id = m.room_id"
        " WHERE m.type = ? AND m.state_key = ? AND m.membership = 'join'"
        " AND (r.is_public OR r.joined_members >= 2) LIMIT 1",
        (EventTypes.MEMBER, user),
    )
    if eligible is None:
        txn.execute("DELETE FROM view_user_directory WHERE user_id = ?", (user,))
        return
    name = txn.query_one(
        "SELECT display_name FROM view_room_state WHERE type = ? AND state_key = ?"
        " AND membership = 'join' ORDER BY stream_id DESC, room_id LIMIT 1",
        (EventTypes.MEMBER, user),
    )
    txn.execute(
        "INSERT INTO view_user_directory (user_id, display_name) VALUES (?, ?)"
        " ON CONFLICT (user_id) DO UPDATE SET display_name = excluded.display_name",
        (user, name[0] if name else None),
    )


class ViewsSink(DatabaseSink[ViewBatch]):
    """The views' exactly-once sink (optionally exporting Parquet after each commit)."""

    def __init__(
        self,
        config: DatabaseConfig,
        sink_name: str = "views",
        lookup: ContentLookup | None = None,
        parquet_path: str | None = None,
        parquet_every: int = 1,
        after_commit: Callable[[int], None] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.lookup: ContentLookup = lookup or EventJsonContentLookup()
        self.parquet_path = parquet_path
        self.parquet_every = max(1, parquet_every)
        self._user_after_commit = after_commit
        #: Milliseconds since the epoch (tests pass a fixed clock).
        self._clock = clock or (lambda: int(time.time() * 1000))
        #: When the last committed media refresh started (None: none yet, the next one
        #: recomputes every day: the job may have been down while uploads went on).
        self.media_refreshed_ms: int | None = None
        self._media_pending: int | None = None
        super().__init__(config, sink_name, prepare_batch, self._apply_views, self._committed)
        self._spark: SparkSession | None = None

    def media_since_day(self) -> int | None:
        """The first day the next media refresh recomputes (None: every day)."""
        if self.media_refreshed_ms is None:
            return None
        return day_number(self.media_refreshed_ms - MEDIA_STATS_MARGIN_MS)

    def _apply_views(self, txn: Transaction, batch: ViewBatch) -> int:
        written = apply_batch_txn(txn, batch, self.lookup)
        # Read before ``media`` is: a row committed after the read has an upload_ts from
        # about now or later, within the next refresh's days (MEDIA_STATS_MARGIN_MS).
        started = self._clock()
        written += refresh_media_stats_txn(txn, self.media_since_day())
        self._media_pending = started
        return written

    def refresh_media_stats(self) -> int:
        """Refresh ``view_media_stats`` outside a micro-batch (its own transaction), as a
        batch does; ``run_views(once=True)`` ends with it, so a run with no new events
        still counts the uploads."""
        started = self._clock()
        written = self.database.run_interaction_blocking(
            "refresh_media_stats", refresh_media_stats_txn, self.media_since_day()
        )
        self.media_refreshed_ms = started
        return written

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self._spark = df.sparkSession
        super().__call__(df, batch_id)

    def _committed(self, batch_id: int) -> None:
        if self._media_pending is not None:  # this call applied the batch (not a replay)
            self.media_refreshed_ms, self._media_pending = self._media_pending, None
        if self.parquet_path and self._spark is not None and batch_id % self.parquet_every == 0:
            snap = self.database.run_interaction_blocking("read_snapshot", read_snapshot_txn)
            export_parquet(self._spark, snap, self.parquet_path)
        if self._user_after_commit is not None:
            self._user_after_commit(batch_id)


def events_stream(
    spark: SparkSession,
    config: DatabaseConfig,
    starting_offsets: str | Mapping[str, int] = "earliest",
    extra_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The events stream (``view=linear``) as a streaming DataFrame."""
    reader = (
        spark.readStream.format(SOURCE_NAME).option("stream", "events").option("view", "linear")
    )
    for key, value in options_from_config(config).items():
        reader = reader.option(key, value)
    if not isinstance(starting_offsets, str):
        starting_offsets = json.dumps(sorted_offset(starting_offsets))
    reader = reader.option("startingOffsets", starting_offsets)
    for key, value in (extra_options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


def start_views_query(
    spark: SparkSession,
    config: DatabaseConfig,
    checkpoint: str,
    *,
    sink: ViewsSink | None = None,
    processing_time: str | None = "1 second",
    available_now: bool = False,
    starting_offsets: str | Mapping[str, int] = "earliest",
    query_name: str | None = None,
    max_rows_per_batch: int = VIEWS_MAX_BATCH_ROWS,
) -> tuple[StreamingQuery, ViewsSink]:
    """Start the streaming job that maintains the view tables. Stop the query (and
    ``sink.close()``) when done; restarting with the same ``checkpoint`` continues exactly
    where it left off.

    Each micro-batch holds about ``max_rows_per_batch`` facts at most (the sink summarizes
    a batch on the driver); the views do not depend on how the stream is cut into batches.
    """
    if max_rows_per_batch < 1:
        raise ValueError("max_rows_per_batch must be at least 1")
    sink = sink or ViewsSink(config)
    writer = (
        events_stream(
            spark,
            config,
            starting_offsets,
            extra_options={"maxRowsPerBatch": str(max_rows_per_batch)},
        )
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
    )
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time:
        writer = writer.trigger(processingTime=processing_time)
    return writer.start(), sink


def run_views(
    config: DatabaseConfig,
    checkpoint: str,
    *,
    master: str = "local[2]",
    lookup: ContentLookup | None = None,
    parquet_path: str | None = None,
    once: bool = True,
    processing_time: str = "1 second",
    quiet: bool = True,
) -> None:
    """CLI entry point: run the views job on ``master``. ``once`` processes everything
    available now and returns; otherwise it runs until interrupted."""
    spark = spark_session(master, app_name="roomstream-views", quiet=quiet)
    sink = ViewsSink(config, lookup=lookup, parquet_path=parquet_path)
    query, _ = start_views_query(
        spark, config, checkpoint, sink=sink, available_now=once, processing_time=processing_time
    )
    try:
        query.awaitTermination()
        if once:
            sink.refresh_media_stats()
    finally:
        query.stop()
        sink.close()


# -- rebuild from the tables ---------------------------------------------------------


@dataclass(frozen=True)
class RebuildResult:
    snapshot: ViewSnapshot
    #: The source offset the rebuild covered (every writer at the linear position).
    offset: dict[str, int]


def _events_facts_jdbc(spark: SparkSession, config: DatabaseConfig, upto: int) -> DataFrame:
    """The events stream's facts up to ``upto`` read with Spark's JDBC reader, in the same
    shape (columns) as the streaming source."""
    url = jdbc_url(config)

    def table(query: str) -> DataFrame:
        return (
            spark.read.format("jdbc")
            .option("url", url)
            .option("driver", "org.postgresql.Driver")
            .option("query", query)
            .load()
        )

    events = table(
        "SELECT stream_ordering AS stream_id, instance_name, event_id, room_id, type AS"
        " event_type, state_key, redacts, relates_to, membership, rejected_reason IS NOT NULL"
        " AS rejected, outlier, sender, origin_server_ts FROM events"
        f" WHERE stream_ordering > 0 AND stream_ordering <= {int(upto)}"
    ).withColumn("kind", F.lit("ev"))
    deltas = table(
        "SELECT stream_id, instance_name, event_id, room_id, type AS event_type, state_key,"
        " prev_event_id FROM current_state_delta_stream"
        f" WHERE stream_id > 0 AND stream_id <= {int(upto)}"
    ).withColumn("kind", F.lit("state"))
    columns = [f.name for f in output_schema(EVENTS).fields if f.name not in ("stream", "row_json")]
    return events.unionByName(deltas, allowMissingColumns=True).select(*columns)


def _events_facts_source(
    spark: SparkSession, config: DatabaseConfig, upto: dict[str, int]
) -> DataFrame:
    reader = spark.read.format(SOURCE_NAME).option("stream", "events")
    for key, value in options_from_config(config).items():
        reader = reader.option(key, value)
    return reader.option("upto", json.dumps(upto)).load()


def compute_views(
    spark: SparkSession, facts: DataFrame, config: DatabaseConfig, lookup: ContentLookup
) -> ViewSnapshot:
    """The views from scratch from a DataFrame of events-stream facts (source columns)."""
    snap = ViewSnapshot()
    counted = counted_events(facts)
    for r in counted.groupBy("sender").count().collect():
        snap.user_stats[r["sender"]] = (0, int(r["count"]))
    for r in (
        counted.filter(F.col("event_type") == EventTypes.MESSAGE)
        .groupBy("room_id", F.floor(F.col("origin_server_ts") / DAY_MS).alias("day"))
        .count()
        .collect()
    ):
        snap.daily_messages[(r["room_id"], day_of(r["day"]))] = int(r["count"])
    activity = {
        r["room_id"]: int(r["ts"])
        for r in counted.groupBy("room_id").agg(F.max("origin_server_ts").alias("ts")).collect()
    }
    rooms = {r[0] for r in facts.select("room_id").distinct().collect()}

    deltas = facts.filter(F.col("kind") == "state")
    latest = (
        deltas.withColumn(
            "rn",
            F.row_number().over(
                Window.partitionBy("room_id", "event_type", "state_key").orderBy(
                    F.col("stream_id").desc()
                )
            ),
        )
        .filter((F.col("rn") == 1) & F.col("event_id").isNotNull())
        .select("room_id", "event_type", "state_key", "event_id", "stream_id")
    )
    memberships = facts.filter(F.col("kind") == "ev").select(
        "event_id", F.col("membership").alias("ev_membership")
    )
    current = latest.join(memberships, on="event_id", how="left").collect()
    member_users = {
        r[0]
        for r in deltas.filter(F.col("event_type") == EventTypes.MEMBER)
        .select("state_key")
        .distinct()
        .collect()
    }

    wanted = sorted(
        r["event_id"]
        for r in current
        if r["event_type"] in (EventTypes.MEMBER, EventTypes.JOIN_RULES)
    )
    db = connect(config)
    try:
        contents = (
            db.run_interaction_blocking("get_contents", lookup.get_contents, wanted)
            if wanted
            else {}
        )
        # Media statistics come from the media table as it is now (uploads have no
        # stream position to cut them at the events offset).
        snap.media_stats = db.run_interaction_blocking(
            "compute_media_stats", compute_media_stats_txn
        )
    finally:
        db.close_blocking()

    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    public: dict[str, bool] = {}
    for r in current:
        key = (r["room_id"], r["event_type"], r["state_key"])
        content = contents.get(r["event_id"])
        membership = r["ev_membership"] if r["event_type"] == EventTypes.MEMBER else None
        name = _display_name(content) if r["event_type"] == EventTypes.MEMBER else None
        rule = _join_rule(content) if r["event_type"] == EventTypes.JOIN_RULES else None
        snap.room_state[key] = (r["event_id"], int(r["stream_id"]), membership, name, rule)
        counts[key[0]]["current_state_events"] += 1
        if membership in MEMBERSHIP_COLUMNS:
            counts[key[0]][MEMBERSHIP_COLUMNS[membership]] += 1
        if r["event_type"] == EventTypes.JOIN_RULES and r["state_key"] == "":
            public[key[0]] = rule == "public"
    for room in rooms:
        c = counts[room]
        snap.room_stats[room] = (
            c["joined_members"], c["invited_members"], c["left_members"], c["banned_members"],
            c["current_state_events"], public.get(room, False), activity.get(room),
        )  # fmt: skip
    joined: dict[str, list[tuple[int, str, str | None]]] = defaultdict(list)
    for (room, etype, user), v in snap.room_state.items():
        if etype == EventTypes.MEMBER and v[2] == "join":
            joined[user].append((int(v[1]), room, v[3]))
    for user in member_users:
        rooms_joined = len(joined.get(user, ()))
        sent = snap.user_stats.get(user, (0, 0))[1]
        snap.user_stats[user] = (rooms_joined, sent)
    for user, entries in joined.items():
        if any(public.get(room, False) or snap.room_stats[room][0] >= 2 for _, room, _ in entries):
            # highest stream id, then smallest room id (the streaming path's ORDER BY)
            best = min(entries, key=lambda e: (-e[0], e[1]))
            snap.directory[user] = best[2]
    return snap


def rebuild_views(
    spark: SparkSession,
    config: DatabaseConfig,
    *,
    lookup: ContentLookup | None = None,
    write: bool = True,
    parquet_path: str | None = None,
) -> RebuildResult:
    """Recompute every view from the tables, up to the current linear position.

    PostgreSQL is read with Spark's JDBC reader, SQLite with the source's batch reader.
    With ``write`` the view tables are replaced in one transaction. Continue streaming with
    ``start_views_query(..., starting_offsets=result.offset)`` on a fresh checkpoint.
    """
    lookup = lookup or EventJsonContentLookup()
    target = SourceOptions.parse({"stream": "events", **options_from_config(config)}).target()
    upto = min(target.values()) if target else 0
    if config.engine == "postgres":
        facts = _events_facts_jdbc(spark, config, upto)
    else:
        facts = _events_facts_source(spark, config, target)
    snap = compute_views(spark, facts, config, lookup)
    if write:
        db = connect(config)
        try:
            db.run_interaction_blocking("write_snapshot", write_snapshot_txn, snap)
        finally:
            db.close_blocking()
    if parquet_path:
        export_parquet(spark, snap, parquet_path)
    return RebuildResult(snap, target)


def rebuild_views_cli(
    config: DatabaseConfig,
    *,
    master: str = "local[2]",
    parquet_path: str | None = None,
    quiet: bool = True,
) -> dict[str, int]:
    """CLI entry point for :func:`rebuild_views`; returns the offset covered."""
    spark = spark_session(master, app_name="roomstream-rebuild-views", quiet=quiet)
    return rebuild_views(spark, config, parquet_path=parquet_path).offset


@dataclass(frozen=True)
class ViewsSummary:
    """What the view tables hold, for the command line."""

    #: table -> rows
    rows: dict[str, int]
    rooms: int
    users: int
    messages: int
    #: (day, messages) of the busiest day, if any
    busiest_day: tuple[str, int] | None


def views_summary_txn(txn: Transaction) -> ViewsSummary:
    rows = {t: int(txn.query_one(f"SELECT COUNT(*) FROM {t}")[0]) for t in VIEW_TABLES}
    messages = txn.query_one("SELECT COALESCE(SUM(messages), 0) FROM view_room_daily_messages")
    busiest = txn.query_one(
        "SELECT day, SUM(messages) AS n FROM view_room_daily_messages GROUP BY day"
        " ORDER BY n DESC, day LIMIT 1"
    )
    return ViewsSummary(
        rows=rows,
        rooms=rows["view_room_stats"],
        users=rows["view_user_stats"],
        messages=int(messages[0]),
        busiest_day=None if busiest is None else (str(busiest[0]), int(busiest[1])),
    )


def parquet_paths(parquet_path: str) -> dict[str, str]:
    """Where :func:`export_parquet` writes each view under ``parquet_path``."""
    return {table: os.path.join(parquet_path, table) for table in VIEW_TABLES}
