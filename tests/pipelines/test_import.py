"""Bulk import on Spark, on both engines, against the online path as the reference.

The reference persists the same events one at a time with ``persist_events`` in
``room_order`` (a valid topological order). The import must leave the same rows in every
table (:func:`_canonical`): stream tables up to the numbering of stream IDs (an event's
stream ordering becomes its rank within its room; a delta row names the event whose
ordering it carries), state groups up to their numbering (each group is its content).
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from roomstream.devtools.corpus import CorpusSpec, CorpusStats, generate_corpus
from roomstream.errors import BadEventError
from roomstream.events.format import parse_pdu
from roomstream.events.hashing import compute_event_id
from roomstream.events.model import Event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, room_version
from roomstream.pipelines.import_load import NOT_COPIED, TABLES
from roomstream.pipelines.import_task import (
    NO_ROOM,
    key_line,
    plan_partitions,
    room_cost,
    room_order,
)
from roomstream.pipelines.importer import ImportSpaceError, import_cli, import_events
from roomstream.reading import read_side_participants
from roomstream.rooms.keys import KeyMap, load_keys_file
from roomstream.rooms.persist import EventPersister
from roomstream.rooms.store import EventStore, state_groups_txn
from roomstream.state.auth_chain_index import AuthChainIndex, ChainLink, ChainPosition
from roomstream.state.groups import get_state_txn
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.streams import StreamSet

pytestmark = pytest.mark.spark

SPEC = CorpusSpec(events=700, seed=21, fork_rate=0.08, reject_rate=0.03, min_room_events=15)

Snapshot = dict[str, Any]
Rows = dict[str, list[tuple[Any, ...]]]


# -- reading a database back ---------------------------------------------------------


def _snapshot_txn(txn: Transaction) -> Snapshot:
    events = {
        r[0]: {
            "room": r[1],
            "rejected": r[2],
            "soft_failed": bool(r[3]),
            "outlier": bool(r[4]),
            "so": int(r[5]),
            "redacted_by": r[6],
        }
        for r in txn.query(
            "SELECT event_id, room_id, rejected_reason, soft_failed, outlier,"
            " stream_ordering, redacted_by FROM events"
        )
    }
    cache: dict[int, dict[Any, str]] = {}

    def state(group: int) -> dict[Any, str]:
        if group not in cache:
            cache[group] = get_state_txn(txn, group)
        return cache[group]

    states = {
        event_id: (state(before), state(after))
        for event_id, (before, after) in state_groups_txn(txn, list(events)).items()
    }
    current: dict[str, dict[Any, str]] = defaultdict(dict)
    for room, etype, key, event_id in txn.query(
        "SELECT room_id, type, state_key, event_id FROM current_state_events"
    ):
        current[room][(etype, key)] = event_id
    extremities: dict[str, set[str]] = defaultdict(set)
    for room, event_id in txn.query("SELECT room_id, event_id FROM event_forward_extremities"):
        extremities[room].add(event_id)
    edges = txn.query("SELECT event_id, prev_event_id FROM event_edges")
    return {
        "events": events,
        "states": states,
        "current": dict(current),
        "extremities": dict(extremities),
        "edges": [(r[0], r[1]) for r in edges],
    }


def _read(config: DatabaseConfig) -> Snapshot:
    db = connect(config)
    try:
        return db.run_interaction_blocking("snapshot", _snapshot_txn)
    finally:
        db.close_blocking()


def _tables(config: DatabaseConfig) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table the import writes (sorted), to compare before/after."""
    db = connect(config)

    def txn(t: Transaction) -> dict[str, list[tuple[Any, ...]]]:
        return {
            c.table: sorted((tuple(r) for r in t.query(f"SELECT * FROM {c.table}")), key=repr)
            for c in TABLES
        }

    try:
        return db.run_interaction_blocking("tables", txn)
    finally:
        db.close_blocking()


#: Bookkeeping of the database itself, not facts: positions, sequences, migrations, and
#: SQLite's FTS5 shadow tables of the search index (PostgreSQL has none).
_BOOKKEEPING = set(NOT_COPIED)
#: How states are stored: groups and their layout (branches of versioned entries). Which
#: states get a group of their own depends on batching (persisting one event at a time
#: stores the room's current state after every event; a batch, after the last), so they
#: are compared through what refers to them: every event's state before and after
#: (``event_state``, by content) and the current state (``current_state_events``).
_GROUP_LAYOUT = {"state_groups", "state_branches", "state_entries"}


def _columns_txn(txn: Transaction) -> dict[str, list[str]]:
    if txn.engine_name == "sqlite":
        names = [
            r[0]
            for r in txn.query("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not str(r[0]).startswith("sqlite_")
        ]
        return {n: [c[1] for c in txn.query(f'PRAGMA table_info("{n}")')] for n in names}
    columns: dict[str, list[str]] = defaultdict(list)
    for table, column in txn.query(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
    ):
        columns[table].append(column)
    return dict(columns)


def _value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def _auth_chains_txn(txn: Transaction) -> list[dict[str, Any]]:
    """Every indexed event's auth chain, as the chain index tables answer it."""
    positions: dict[str, list[ChainPosition]] = defaultdict(list)
    links: dict[str, list[ChainLink]] = defaultdict(list)
    for event_id, room_id, chain, seq in txn.query(
        "SELECT event_id, room_id, chain_id, sequence_number FROM event_auth_chains"
    ):
        positions[room_id].append(ChainPosition(event_id, int(chain), int(seq)))
    for room_id, *ids in txn.query(
        "SELECT room_id, origin_chain_id, origin_sequence_number, target_chain_id,"
        " target_sequence_number FROM event_auth_chain_links"
    ):
        links[room_id].append(ChainLink(*(int(i) for i in ids)))
    rows = []
    for room_id, room_positions in positions.items():
        index = AuthChainIndex.load(room_positions, links[room_id])
        for position in room_positions:
            chain = tuple(sorted(index.auth_chain([position.event_id])))
            rows.append({"event_id": position.event_id, "room_id": room_id, "chain": chain})
    return rows


def _canonical_txn(txn: Transaction, with_order: bool) -> Rows:
    """Every table's rows, engine-neutral and independent of how IDs were numbered.

    ``events``: without ``stream_ordering`` and ``received_ts``; with ``with_order``, the
    event's rank among its room's events by stream ordering instead. Delta stream rows:
    the event carrying the stream ID instead of the ID. ``event_state``: the states
    themselves. Without ``with_order``, the auth chain index (whose chain and sequence
    numbers follow the order events were indexed in) as every event's auth chain.
    """
    columns = _columns_txn(txn)
    out: Rows = {}
    by_ordering: dict[int, str] = {}
    ranks: dict[str, int] = {}
    per_room: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for event_id, room_id, ordering in txn.query(
        "SELECT event_id, room_id, stream_ordering FROM events"
    ):
        by_ordering[int(ordering)] = event_id
        per_room[room_id].append((int(ordering), event_id))
    for pairs in per_room.values():
        for rank, (_, event_id) in enumerate(sorted(pairs)):
            ranks[event_id] = rank
    cache: dict[int, tuple[Any, ...]] = {}

    def content(group: int) -> tuple[Any, ...]:
        if group not in cache:
            cache[group] = tuple(sorted(get_state_txn(txn, int(group)).items()))
        return cache[group]

    for table, names in sorted(columns.items()):
        if table in _BOOKKEEPING or table in _GROUP_LAYOUT:
            continue
        if not with_order and table.startswith("event_auth_chain"):
            if table == "event_auth_chains":
                out[table] = sorted(
                    (tuple(sorted(r.items())) for r in _auth_chains_txn(txn)), key=repr
                )
            continue
        if table == "event_search":
            # Its text is stored per engine (FTS5 text, PostgreSQL tsvector).
            names = ["event_id", "room_id", "key"]
        rows = [
            dict(zip(names, map(_value, r), strict=True))
            for r in txn.query(f"SELECT {', '.join(names)} FROM {table}")
        ]
        if table == "events":
            for row in rows:
                ordering = row.pop("stream_ordering")
                row.pop("received_ts")
                if with_order:
                    row["rank"] = ranks[by_ordering[ordering]]
        elif table == "current_state_delta_stream":
            for row in rows:
                row["stream_id"] = by_ordering.get(row["stream_id"], "?")
        elif table == "event_state":
            for row in rows:
                row["before_group"] = content(row["before_group"])
                row["after_group"] = content(row["after_group"])
        elif table in ("timeline_events", "event_relations", "threads"):
            for row in rows:
                row.pop("stream_ordering")
        elif table == "visibility_memberships":
            rows = _membership_steps(txn)
        out[table] = sorted((tuple(sorted(r.items())) for r in rows), key=repr)
    return out


def _membership_steps(txn: Transaction) -> list[dict[str, Any]]:
    """Membership intervals as the step function they encode: rows at events (not
    stream orderings), leaving out rows that repeat the membership before them. Which
    redundant rows exist depends on the order events arrived in, not what they mean."""
    at = {
        (int(r[0]), int(r[1]), r[2]): r[3]
        for r in txn.query(
            "SELECT topological_ordering, stream_ordering, room_id, event_id FROM timeline_events"
        )
    }
    steps: list[dict[str, Any]] = []
    previous: dict[tuple[str, str], Any] = {}
    for room_id, user_id, topo, stream, membership in sorted(
        txn.query(
            "SELECT room_id, user_id, topological_ordering, stream_ordering, membership"
            " FROM visibility_memberships"
        ),
        key=lambda r: (r[0], r[1], int(r[2]), int(r[3])),
    ):
        if previous.get((room_id, user_id)) == membership:
            continue
        previous[(room_id, user_id)] = membership
        steps.append(
            {
                "room_id": room_id,
                "user_id": user_id,
                "event_id": at[(int(topo), int(stream), room_id)],
                "membership": membership,
            }
        )
    return steps


def _canonical(config: DatabaseConfig, with_order: bool = True) -> Rows:
    db = connect(config)
    try:
        return db.run_interaction_blocking("canonical", _canonical_txn, with_order)
    finally:
        db.close_blocking()


def _assert_same_rows(got: Rows, expected: Rows) -> None:
    assert sorted(got) == sorted(expected)
    for table, rows in expected.items():
        if got[table] != rows:
            extra = set(got[table]) - set(rows)
            missing = set(rows) - set(got[table])
            raise AssertionError(
                f"{table}: {len(got[table])} rows against {len(rows)};"
                f" e.g. extra {sorted(extra, key=repr)[:2]},"
                f" missing {sorted(missing, key=repr)[:2]}"
            )


def _room_orders(snapshot: Snapshot) -> dict[str, list[str]]:
    rooms: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for event_id, meta in snapshot["events"].items():
        rooms[meta["room"]].append((meta["so"], event_id))
    return {room: [e for _, e in sorted(pairs)] for room, pairs in rooms.items()}


def _keys(corpus_path: Path) -> KeyMap:
    """The verify keys ``generate_corpus`` wrote next to the corpus."""
    return load_keys_file(f"{corpus_path}.keys.json")


# -- the reference: the online path, one event at a time ------------------------------


def _parse_file(path: Path) -> dict[str, list[Event]]:
    rows: dict[str, list[bytes]] = defaultdict(list)
    for index, raw in enumerate(path.read_bytes().splitlines()):
        room, (_, raw) = key_line((raw, index))
        if room != NO_ROOM:
            rows[room].append(raw)
    rooms: dict[str, list[Event]] = {}
    for room, raws in rows.items():
        creates = [orjson.loads(r) for r in raws if b'"m.room.create"' in r]
        version = room_version(
            next(c["content"]["room_version"] for c in creates if c["type"] == "m.room.create")
        )
        events = []
        for raw in raws:
            try:
                events.append(parse_pdu(raw, version))
            except BadEventError:
                continue
        rooms[room] = room_order(events)
    return rooms


async def _persist_one_by_one(path: Path, db_path: Path, backfilled: bool) -> None:
    db: Database = connect(DatabaseConfig(engine="sqlite", path=str(db_path)))
    try:
        await prepare_database(db)
        streams = await StreamSet.open(db, "main", {})
        persister = EventPersister(
            EventStore(db), streams, "main", server_name=None, participants=read_side_participants()
        )
        for events in _parse_file(path).values():
            for event in events:
                await persister.persist_events([event], backfilled=backfilled)
    finally:
        await db.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CorpusStats]:
    path = tmp_path_factory.mktemp("import") / "corpus.jsonl"
    return path, generate_corpus(path, SPEC, workers=2)


def _reference(path: Path, directory: Path, backfilled: bool) -> tuple[Snapshot, DatabaseConfig]:
    db_path = directory / "online.db"
    asyncio.run(_persist_one_by_one(path, db_path, backfilled=backfilled))
    config = DatabaseConfig(engine="sqlite", path=str(db_path))
    return _read(config), config


@pytest.fixture(scope="module")
def reference(
    corpus: tuple[Path, CorpusStats], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Snapshot, DatabaseConfig]:
    return _reference(corpus[0], tmp_path_factory.mktemp("reference"), backfilled=False)


def _assert_same_outcome(imported: Snapshot, ref: Snapshot) -> None:
    assert imported["events"].keys() == ref["events"].keys()
    for event_id, meta in ref["events"].items():
        got = imported["events"][event_id]
        for key in ("room", "rejected", "soft_failed", "outlier", "redacted_by"):
            assert got[key] == meta[key], (event_id, key)
    assert imported["states"] == ref["states"]
    assert sorted(imported["edges"]) == sorted(ref["edges"])


# -- tests -----------------------------------------------------------------------------


def test_plan_partitions_balances_cost_heaviest_first() -> None:
    sizes = {"!big:x": 1000, "!mid:x": 400, **{f"!r{i}:x": 50 for i in range(20)}}
    plan = plan_partitions(sizes, 4)
    assert set(plan) == set(sizes) and set(plan.values()) == {0, 1, 2, 3}
    costs = [sum(room_cost(n) for room, n in sizes.items() if plan[room] == p) for p in range(4)]
    assert plan["!big:x"] == 0 and costs == sorted(costs, reverse=True)
    assert plan["!mid:x"] == 1 and abs(costs[2] - costs[3]) <= room_cost(50)
    # A big room's events cost more each: its partition takes fewer other lines than an
    # even split of lines would give it.
    # An even split of lines would add 75,000 lines of small rooms to the huge room's.
    big = {"!huge:x": 100_000, **{f"!s{i}:x": 100 for i in range(6_000)}}
    plan = plan_partitions(big, 4)
    lines = [sum(n for room, n in big.items() if plan[room] == p) for p in range(4)]
    assert plan["!huge:x"] == 0 and lines == [100_000, 200_000, 200_000, 200_000]


def test_corpus_has_forks_rejections_soft_failures_and_double_redactions(
    corpus: tuple[Path, CorpusStats], reference: tuple[Snapshot, DatabaseConfig]
) -> None:
    path, stats = corpus
    ref = reference[0]
    assert stats.forks >= 5
    rejected = {e for e, m in ref["events"].items() if m["rejected"]}
    assert rejected == set(stats.intended_rejections) and rejected
    soft_failed = {e for e, m in ref["events"].items() if m["soft_failed"]}
    assert soft_failed == set(stats.intended_soft_failures) and len(soft_failed) >= 3
    # Merges: events with several prev events, all of them given state.
    merges = Counter(event_id for event_id, _ in ref["edges"])
    assert sum(1 for n in merges.values() if n > 1) >= 5
    assert all(e in ref["states"] for e, n in merges.items() if n > 1)
    # Messages redacted twice (the import must keep the first redaction, as online).
    targets = Counter(
        orjson.loads(raw).get("redacts") or orjson.loads(raw)["content"].get("redacts")
        for raw in path.read_bytes().splitlines()
        if b'"m.room.redaction"' in raw
    )
    assert sum(1 for n in targets.values() if n > 1) >= 2


def test_import_equals_online_path_in_every_table(
    spark: SparkSession,
    db_config: DatabaseConfig,
    corpus: tuple[Path, CorpusStats],
    reference: tuple[Snapshot, DatabaseConfig],
) -> None:
    path, stats = corpus
    ref, ref_config = reference
    report = import_events(path, db_config, spark=spark, partitions=4, verify_keys=_keys(path))
    assert report.events == stats.events and report.invalid == 0
    assert report.rejected == len(stats.intended_rejections)
    assert report.soft_failed == len(stats.intended_soft_failures)
    assert {i.event_id for i in report.issues if i.kind == "rejected"} == set(
        stats.intended_rejections
    )
    canonical = _canonical(db_config)
    _assert_same_rows(canonical, _canonical(ref_config))
    # The read side's records and indexes came along (the comparison is not of empty
    # tables): visibility and relations copied from the parts, the search index built
    # after the load, and no room left waiting for it.
    for table in ("timeline_events", "visibility_memberships", "event_relations", "threads"):
        assert canonical[table], table
    assert canonical["event_search"]
    assert canonical["index_backfill_rooms"] == []
    imported = _read(db_config)
    _assert_same_outcome(imported, ref=ref)
    # Orderings: a block of the target's events stream, same order within every room.
    orderings = sorted(m["so"] for m in imported["events"].values())
    assert report.stream_orderings == (orderings[0], orderings[-1])
    assert orderings == list(range(orderings[0], orderings[0] + len(orderings)))
    assert _room_orders(imported) == _room_orders(ref)
    for event_id, prev in imported["edges"]:
        assert imported["events"][prev]["so"] < imported["events"][event_id]["so"]


def test_backfill_import_counts_down_and_keeps_state(
    spark: SparkSession,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    corpus: tuple[Path, CorpusStats],
) -> None:
    ref, ref_config = _reference(corpus[0], tmp_path_factory.mktemp("ref-bf"), backfilled=True)
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "backfill.db"))
    report = import_events(
        corpus[0], target, spark=spark, backfill=True, partitions=3, verify_keys=_keys(corpus[0])
    )
    _assert_same_rows(_canonical(target), _canonical(ref_config))
    imported = _read(target)
    _assert_same_outcome(imported, ref=ref)
    assert report.stream_orderings is not None and report.stream_orderings[0] == -1
    assert all(m["so"] < 0 for m in imported["events"].values())
    # As online: backfilled events move neither forward extremities nor current state,
    # and are never soft-failed.
    assert imported["current"] == {} and imported["extremities"] == {}
    assert report.soft_failed == 0
    # Online backfill numbers a batch downwards in persistence order: children lower.
    for event_id, prev in imported["edges"]:
        assert imported["events"][prev]["so"] > imported["events"][event_id]["so"]


def test_split_import_equals_the_whole(
    spark: SparkSession,
    db_config: DatabaseConfig,
    tmp_path: Path,
    corpus: tuple[Path, CorpusStats],
    reference: tuple[Snapshot, DatabaseConfig],
) -> None:
    """Day-by-day loading: every create event and half the other lines (drawn at random,
    seeded) on day 1, the rest on day 2. (A room's events cannot be read before its create
    event names the room version: an export starts a room with it.)"""
    path, stats = corpus
    lines = path.read_bytes().splitlines()
    creates = [i for i, line in enumerate(lines) if b'"type":"m.room.create"' in line]
    others = sorted(set(range(len(lines))) - set(creates))
    rng = random.Random(13)
    first = sorted([*creates, *rng.sample(others, len(others) // 2)])
    chosen = set(first)
    parts = tmp_path / "day1.jsonl", tmp_path / "day2.jsonl"
    parts[0].write_bytes(b"\n".join(lines[i] for i in first) + b"\n")
    parts[1].write_bytes(
        b"\n".join(line for i, line in enumerate(lines) if i not in chosen) + b"\n"
    )
    one = import_events(parts[0], db_config, spark=spark, partitions=3, verify_keys=_keys(path))
    assert one.existing_rooms == 0 and one.outliers > 0
    two = import_events(parts[1], db_config, spark=spark, partitions=3, verify_keys=_keys(path))
    # Every room of day 2 with a create event in day 1 is added to, through the online path.
    assert two.existing_rooms > 0 and two.already_stored == 0
    assert two.ex_outliers == one.outliers  # every gap filled
    assert one.events + two.events == stats.events
    ref, ref_config = reference
    got, expected = _canonical(db_config, False), _canonical(ref_config, False)
    # The delta stream records how current state got where it is, which depends on the
    # order the events arrived in; every other table must be the same.
    got_deltas, expected_deltas = (
        got.pop("current_state_delta_stream"),
        expected.pop("current_state_delta_stream"),
    )
    _assert_same_rows(got, expected)
    assert got_deltas and expected_deltas
    imported = _read(db_config)
    _assert_same_outcome(imported, ref=ref)
    assert imported["current"] == ref["current"]
    assert imported["extremities"] == ref["extremities"]
    assert _replayed_deltas(db_config) == imported["current"]
    # Importing a file again adds nothing.
    before = _tables(db_config)
    again = import_events(parts[1], db_config, spark=spark, partitions=2, verify_keys=_keys(path))
    assert again.events == 0 and again.already_stored == two.events
    assert _tables(db_config) == before


def _replayed_deltas(config: DatabaseConfig) -> dict[str, dict[Any, str]]:
    """Current state as a consumer of the delta stream rebuilds it, in stream order."""
    db = connect(config)

    def txn(t: Transaction) -> list[tuple[Any, ...]]:
        return [
            tuple(r)
            for r in t.query(
                "SELECT stream_id, room_id, type, state_key, event_id"
                " FROM current_state_delta_stream ORDER BY stream_id, type, state_key"
            )
        ]

    try:
        rows = db.run_interaction_blocking("replayed_deltas", txn)
    finally:
        db.close_blocking()
    state: dict[str, dict[Any, str]] = defaultdict(dict)
    for _, room, etype, key, event_id in rows:
        if event_id is None:
            state[room].pop((etype, key), None)
        else:
            state[room][(etype, key)] = event_id
    return {room: s for room, s in state.items() if s}


def test_malformed_duplicate_and_broken_create_lines_are_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    spec = CorpusSpec(events=250, seed=4, malformed=4, versions=(("11", 0.5), ("12", 0.5)))
    path = tmp_path / "bad.jsonl"
    stats = generate_corpus(path, spec, workers=1)
    lines = path.read_bytes().splitlines()
    # Plus: an event of a room whose create event is not in the file, a blank line, a
    # duplicate of an event line, and a v12 create event without a sender.
    orphan = (
        b'{"auth_events":[],"content":{},"depth":3,"hashes":{"sha256":"x"},'
        b'"origin_server_ts":1,"prev_events":[],"room_id":"!nowhere:x.test",'
        b'"sender":"@a:x.test","signatures":{},"type":"m.room.message"}'
    )
    malformed = set(stats.malformed_lines)
    original = next(
        i + 1 for i, raw in enumerate(lines) if i + 1 not in malformed and b"m.room.message" in raw
    )
    create = next(
        orjson.loads(raw)
        for raw in lines
        if b'"m.room.create"' in raw and b'"room_version":"12"' in raw
    )
    del create["sender"]
    with path.open("ab") as f:
        f.write(orphan + b"\n\n" + lines[original - 1] + b"\n" + orjson.dumps(create) + b"\n")
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "t.db"))
    report = import_events(path, target, spark=spark, partitions=2, verify_keys=_keys(path))
    orphan_line, duplicate_line, create_line = (
        stats.lines + 1,
        stats.lines + 3,
        stats.lines + 4,
    )
    invalid = {i.line: i.reason for i in report.issues if i.kind == "invalid"}
    assert set(invalid) == {*stats.malformed_lines, orphan_line, create_line}
    assert "no valid m.room.create" in invalid[orphan_line]
    assert invalid[create_line] == "M_BAD_JSON: 'sender' must be a string"
    assert any("content hash" in r for r in invalid.values())
    assert any("M_NOT_JSON" in r for r in invalid.values())
    duplicates = [i for i in report.issues if i.kind == "duplicate"]
    assert [(i.line, i.reason) for i in duplicates] == [
        (duplicate_line, f"same event as line {original}")
    ]
    assert report.duplicates == 1
    assert report.path == str(path)
    assert report.events == spec.events
    assert len(_read(target)["events"]) == spec.events
    rejected_lines = [i for i in report.issues if i.kind == "rejected"]
    assert {i.event_id for i in rejected_lines} == set(stats.intended_rejections)
    lines = path.read_bytes().splitlines()
    for issue in rejected_lines:  # the line number points at the event's own line
        data = orjson.loads(lines[issue.line - 1])
        ids = {
            compute_event_id(data, v)
            for v in KNOWN_ROOM_VERSIONS.values()
            if not v.event_ids_in_pdu  # (v1, v2: the ID is a field of the line)
        }
        assert issue.event_id in ids


@pytest.fixture
def small_corpora(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    generate_corpus(first, CorpusSpec(events=200, seed=31), workers=1)
    generate_corpus(second, CorpusSpec(events=200, seed=32), workers=1)
    yield first, second


def test_failure_mid_load_leaves_the_target_unchanged(
    spark: SparkSession, db_config: DatabaseConfig, small_corpora: tuple[Path, Path]
) -> None:
    first, second = small_corpora
    import_events(first, db_config, spark=spark, partitions=2, verify_keys=_keys(first))
    before = _tables(db_config)
    assert len(before["events"]) == 200

    def fault(part: int) -> None:
        raise RuntimeError(f"injected failure after part {part}")

    with pytest.raises(RuntimeError, match="injected failure after part 0"):
        import_events(
            second, db_config, spark=spark, partitions=2, fault=fault, verify_keys=_keys(second)
        )
    assert _tables(db_config) == before
    # Importing rooms the target already has skips what it has, leaving it unchanged.
    again = import_events(first, db_config, spark=spark, partitions=2, verify_keys=_keys(first))
    assert again.events == 0 and again.already_stored == 200
    assert _tables(db_config) == before
    # The failed import left nothing behind that would get in the way of a retry.
    report = import_events(second, db_config, spark=spark, partitions=2, verify_keys=_keys(second))
    assert report.events == 200
    after = _read(db_config)
    assert len(after["events"]) == 400
    orderings = sorted(m["so"] for m in after["events"].values())
    assert len(set(orderings)) == 400 and orderings[0] > 0


def test_import_checks_signatures_and_keeps_hash_mismatches_redacted(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As the online receive path: a line without a valid signature by a known key is
    refused (unless the caller vouches for the input), and an event whose content hash
    does not match is stored in its redacted form and reported."""
    path = tmp_path / "signed.jsonl"
    stats = generate_corpus(path, CorpusSpec(events=150, seed=8), workers=1)
    lines = path.read_bytes().splitlines()
    intended = set(stats.intended_rejections)
    messages = [
        n
        for n, raw in enumerate(lines)
        if (data := orjson.loads(raw))["type"] == "m.room.message"
        and compute_event_id(data, room_version("11")) not in intended
    ]
    tampered_at, forged_at = messages[0], messages[1]
    tampered = orjson.loads(lines[tampered_at])
    tampered["content"] = {"msgtype": "m.text", "body": "changed after signing"}
    lines[tampered_at] = orjson.dumps(tampered)
    forged = orjson.loads(lines[forged_at])
    forged["signatures"] = {s: {k: "A" * 86 for k in ks} for s, ks in forged["signatures"].items()}
    lines[forged_at] = orjson.dumps(forged)
    path.write_bytes(b"\n".join(lines) + b"\n")

    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "checked.db"))
    report = import_events(path, target, spark=spark, partitions=2, verify_keys=_keys(path))
    by_line = {i.line: i for i in report.issues if i.kind != "rejected"}
    assert set(by_line) == {tampered_at + 1, forged_at + 1}
    assert by_line[forged_at + 1].kind == "invalid"
    assert by_line[forged_at + 1].reason.startswith("M_UNAUTHORIZED: ")
    redacted = by_line[tampered_at + 1]
    assert redacted.kind == "redacted" and "content hash" in redacted.reason
    assert report.redacted == 1 and report.invalid == 1 and report.events == 149
    db = connect(target)
    try:
        stored = db.run_interaction_blocking(
            "test_query",
            lambda t: t.query_one(
                "SELECT json FROM event_json WHERE event_id = ?", (redacted.event_id,)
            )[0],
        )
    finally:
        db.close_blocking()
    assert orjson.loads(bytes(stored))["content"] == {}

    # Nothing is taken on trust by default: no keys, every line is refused...
    bare = DatabaseConfig(engine="sqlite", path=str(tmp_path / "bare.db"))
    refused = import_events(path, bare, spark=spark, partitions=2)
    assert refused.events == 0 and refused.invalid == 150
    # ... unless the caller says the input is trusted.
    trusted = DatabaseConfig(engine="sqlite", path=str(tmp_path / "trusted.db"))
    report = import_events(path, trusted, spark=spark, partitions=2, trust_unsigned=True)
    assert report.events == 150 and report.invalid == 0 and report.redacted == 1


def test_not_enough_scratch_space_refuses_before_starting(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"{}\n" * 1000)
    work = tmp_path / "work"
    work.mkdir()
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "t.db"))
    real = shutil.disk_usage

    def tiny(where: str) -> Any:
        usage = real(where)
        return type(usage)(usage.total, usage.total - 1000, 1000)

    monkeypatch.setattr(shutil, "disk_usage", tiny)
    with pytest.raises(ImportSpaceError, match="--work-dir"):
        import_events(path, target, spark=spark, work_dir=work)
    assert list(work.iterdir()) == [] and not Path(target.path).exists()


def test_cli_without_space_says_so_in_one_line_before_starting_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from roomstream.pipelines import session

    path = tmp_path / "c.jsonl"
    path.write_bytes(b"{}\n" * 1000)
    real = shutil.disk_usage

    def tiny(where: str) -> Any:
        usage = real(where)
        return type(usage)(usage.total, usage.total - 10, 10)

    def no_spark(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark must not start")

    monkeypatch.setattr(shutil, "disk_usage", tiny)
    monkeypatch.setattr(session, "spark_session", no_spark)
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "t.db"))
    assert import_cli(str(path), target, work_dir=str(tmp_path)) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("import not started: not enough free space in") and "--work-dir" in out
