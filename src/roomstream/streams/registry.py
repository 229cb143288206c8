"""The named streams roomstream defines, their row formats, and how to read their updates.

Row fields and their order follow Synapse's replication rows for the same streams, so an
RDATA line for a stream carries the same JSON in both systems. ``docs/streams.md`` lists
every format.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roomstream import exactjson
from roomstream.storage import Transaction
from roomstream.streams.id_generator import StreamTableRef

StreamRow = tuple[Any, ...]
"""A row as sent on the wire: a JSON-serialisable tuple (a list in the RDATA JSON)."""

Update = tuple[int, StreamRow]
"""(stream token, row). Several updates may share one token."""


@dataclass(frozen=True)
class StreamTable:
    """One table behind a stream: which columns make a row, and how to shape it.

    ``columns`` are selected in order and handed to ``to_row``. For a negative stream the
    table stores negative IDs and tokens are their negation.
    """

    ref: StreamTableRef
    columns: tuple[str, ...]
    to_row: Callable[[tuple[Any, ...]], StreamRow]


@dataclass(frozen=True)
class StreamDefinition:
    """A named stream.

    Invariants: tokens are positive and grow with the facts; ``tables`` is empty exactly
    for in-memory streams (typing), whose updates come from their writer's memory.
    """

    name: str
    #: Field names of a row, in wire order (documentation and Spark schemas).
    row_fields: tuple[str, ...]
    sequence: str
    tables: tuple[StreamTable, ...] = ()
    #: True when the backing tables hold negative IDs (backfill).
    negative: bool = False
    description: str = ""
    #: Default writers when the configuration names none.
    default_writers: tuple[str, ...] = field(default=("main",))

    @property
    def in_memory(self) -> bool:
        return not self.tables

    @property
    def table_refs(self) -> list[StreamTableRef]:
        return [t.ref for t in self.tables]


def _bool(value: Any) -> bool:
    return bool(value)


def _json_or_none(value: Any) -> Any:
    return None if value is None else exactjson.loads(value)


EVENTS = StreamDefinition(
    name="events",
    row_fields=("type", "data"),
    sequence="events_stream_seq",
    description=(
        "New events and changes to rooms' current state. Rows are [type, data]: type 'ev' "
        "with data [event_id, room_id, type, state_key, redacts, relates_to, membership, "
        "rejected, outlier], or type 'state' with data [room_id, type, state_key, event_id]."
    ),
    tables=(
        StreamTable(
            StreamTableRef("events", "stream_ordering"),
            (
                "event_id",
                "room_id",
                "type",
                "state_key",
                "redacts",
                "relates_to",
                "membership",
                "rejected_reason",
                "outlier",
            ),
            lambda r: ("ev", (*r[:7], r[7] is not None, _bool(r[8]))),
        ),
        StreamTable(
            StreamTableRef("current_state_delta_stream"),
            ("room_id", "type", "state_key", "event_id"),
            lambda r: ("state", tuple(r)),
        ),
    ),
)

BACKFILL = StreamDefinition(
    name="backfill",
    row_fields=("event_id", "room_id", "type", "state_key", "redacts", "relates_to"),
    sequence="events_backfill_stream_seq",
    negative=True,
    description="Historical events fetched from other servers; stored with negative IDs.",
    tables=(
        StreamTable(
            StreamTableRef("events", "stream_ordering"),
            ("event_id", "room_id", "type", "state_key", "redacts", "relates_to"),
            tuple,
        ),
    ),
)

CACHES = StreamDefinition(
    name="caches",
    row_fields=("cache_func", "keys", "invalidation_ts"),
    sequence="cache_invalidation_stream_seq",
    description="Cache invalidations; keys null means the whole cache.",
    tables=(
        StreamTable(
            StreamTableRef("cache_invalidations"),
            ("cache_func", "keys", "invalidation_ts"),
            lambda r: (r[0], _json_or_none(r[1]), r[2]),
        ),
    ),
)

ACCOUNT_DATA = StreamDefinition(
    name="account_data",
    row_fields=("user_id", "room_id", "data_type"),
    sequence="account_data_sequence",
    description="Changes to users' account data: global (room_id null) and per room.",
    tables=(
        StreamTable(
            StreamTableRef("account_data"),
            ("user_id", "account_data_type"),
            lambda r: (r[0], None, r[1]),
        ),
        StreamTable(
            StreamTableRef("room_account_data"),
            ("user_id", "room_id", "account_data_type"),
            tuple,
        ),
    ),
)

RECEIPTS = StreamDefinition(
    name="receipts",
    row_fields=("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data"),
    sequence="receipts_sequence",
    description="Read receipts.",
    tables=(
        StreamTable(
            StreamTableRef("receipts"),
            ("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data"),
            lambda r: (*r[:5], exactjson.loads(r[5])),
        ),
    ),
)

TO_DEVICE = StreamDefinition(
    name="to_device",
    row_fields=("entity",),
    sequence="device_inbox_sequence",
    description="To-device messages: entity is a local user ID or a remote server name.",
    tables=(
        StreamTable(StreamTableRef("device_inbox"), ("user_id",), tuple),
        StreamTable(StreamTableRef("device_federation_outbox"), ("destination",), tuple),
    ),
)

DEVICE_LISTS = StreamDefinition(
    name="device_lists",
    row_fields=("user_id",),
    sequence="device_lists_sequence",
    description=(
        "Users whose devices or keys changed (device added, deleted or renamed; device "
        "keys or cross-signing keys uploaded; signatures added)."
    ),
    tables=(StreamTable(StreamTableRef("device_lists_stream"), ("user_id",), tuple),),
)

TYPING = StreamDefinition(
    name="typing",
    row_fields=("room_id", "user_ids"),
    sequence="typing_stream_seq",
    description="Who is typing in a room; held in the writer's memory, not in tables.",
)

PRESENCE = StreamDefinition(
    name="presence",
    row_fields=(
        "user_id",
        "state",
        "last_active_ts",
        "last_federation_update_ts",
        "last_user_sync_ts",
        "status_msg",
        "currently_active",
    ),
    sequence="presence_stream_sequence",
    description=(
        "Users' presence (online, unavailable, offline), each row the user's whole state; "
        "a user's older rows are deleted when a newer one is written, as in Synapse."
    ),
    tables=(
        StreamTable(
            StreamTableRef("presence_stream"),
            (
                "user_id",
                "state",
                "last_active_ts",
                "last_federation_update_ts",
                "last_user_sync_ts",
                "status_msg",
                "currently_active",
            ),
            lambda r: (*r[:6], _bool(r[6])),
        ),
    ),
)

PUSHERS = StreamDefinition(
    name="pushers",
    row_fields=("user_id", "app_id", "pushkey", "deleted"),
    sequence="pushers_sequence",
    description=(
        "Pushers added, changed or deleted; its one writer also delivers every pusher's "
        "notifications (roomstream.client.pushers)."
    ),
    tables=(
        StreamTable(
            StreamTableRef("pushers"),
            ("user_id", "app_id", "pushkey"),
            lambda r: (*r, False),
        ),
        StreamTable(
            StreamTableRef("deleted_pushers"),
            ("user_id", "app_id", "pushkey"),
            lambda r: (*r, True),
        ),
    ),
)

PUSH_RULES = StreamDefinition(
    name="push_rules",
    row_fields=("user_id",),
    sequence="push_rules_stream_sequence",
    description=(
        "Users whose push rules changed (Synapse's push_rules stream): every process "
        "forgets its cached rules of that user (roomstream.client.push_store)."
    ),
    tables=(StreamTable(StreamTableRef("push_rules"), ("user_id",), tuple),),
)

STREAMS: dict[str, StreamDefinition] = {
    s.name: s
    for s in (
        EVENTS,
        BACKFILL,
        CACHES,
        ACCOUNT_DATA,
        RECEIPTS,
        TO_DEVICE,
        DEVICE_LISTS,
        TYPING,
        PRESENCE,
        PUSHERS,
        PUSH_RULES,
    )
}


def get_stream(name: str) -> StreamDefinition:
    try:
        return STREAMS[name]
    except KeyError:
        raise KeyError(f"unknown stream {name!r}; known: {', '.join(sorted(STREAMS))}") from None


def get_updates_txn(
    txn: Transaction,
    stream: StreamDefinition,
    writer: str,
    from_token: int,
    upto_token: int,
    limit: int,
) -> tuple[list[Update], int, bool]:
    """Rows written by ``writer`` with tokens in ``(from_token, upto_token]``, ascending.

    Returns ``(updates, new_upto, limited)``. When ``limited``, the caller should ask again
    from ``new_upto``: every row with a token ``<= new_upto`` is included, and rows sharing
    one token are never split (a single token with more than ``limit`` rows is returned
    whole, so progress is always made).
    """
    if stream.in_memory:
        raise ValueError(f"stream {stream.name} is held in memory, not in tables")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if upto_token <= from_token:
        return [], upto_token, False
    per_table: list[list[Update]] = []
    new_upto = upto_token
    for table in stream.tables:
        # Later tables only need rows up to what earlier tables already capped at.
        rows = _fetch(txn, stream, table, writer, from_token, new_upto, limit + 1)
        if len(rows) > limit:
            first_excluded = rows[limit][0]
            cap = first_excluded - 1
            if cap <= from_token:
                # One token holds more than `limit` rows: take all of that token.
                cap = first_excluded
                rows = _fetch(txn, stream, table, writer, from_token, cap, None)
            new_upto = min(new_upto, cap)
        per_table.append(rows)
    merged = [
        update for update in heapq.merge(*per_table, key=lambda u: u[0]) if update[0] <= new_upto
    ]
    return merged, new_upto, new_upto < upto_token


def range_query(
    stream: StreamDefinition,
    table: StreamTable,
    writer: str,
    from_token: int,
    upto_token: int,
    limit: int | None = None,
    extra_columns: Sequence[str] = (),
) -> tuple[str, tuple[Any, ...]]:
    """SQL (``?`` placeholders) and parameters selecting ``writer``'s rows of one table with
    tokens in ``(from_token, upto_token]``, ascending: the token, ``table.columns``, then
    ``extra_columns``. Shared by :func:`get_updates_txn` and the Spark source."""
    ref = table.ref
    columns = ", ".join((*table.columns, *extra_columns))
    limit_sql = f" LIMIT {int(limit)}" if limit is not None else ""
    if stream.negative:
        return (
            f"SELECT -{ref.id_column}, {columns} FROM {ref.table}"
            f" WHERE {ref.instance_column} = ? AND {ref.id_column} < ? AND {ref.id_column} >= ?"
            f" ORDER BY {ref.id_column} DESC{limit_sql}",
            (writer, -from_token, -upto_token),
        )
    return (
        f"SELECT {ref.id_column}, {columns} FROM {ref.table}"
        f" WHERE {ref.instance_column} = ? AND {ref.id_column} > ? AND {ref.id_column} <= ?"
        f" ORDER BY {ref.id_column}{limit_sql}",
        (writer, from_token, upto_token),
    )


def _fetch(
    txn: Transaction,
    stream: StreamDefinition,
    table: StreamTable,
    writer: str,
    from_token: int,
    upto_token: int,
    limit: int | None,
) -> list[Update]:
    sql, params = range_query(stream, table, writer, from_token, upto_token, limit)
    to_row = table.to_row
    return [(int(r[0]), to_row(tuple(r[1:]))) for r in txn.query(sql, params)]
