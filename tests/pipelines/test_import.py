"""Bulk import on Spark, on both engines, against the online path as the reference.

The reference persists the same events one at a time with ``persist_events`` in
``room_order`` (a valid topological order). The import must store the same events, the
same rejections / soft failures / outliers, the same state before and after every event,
the same current state and forward extremities, and stream orderings in the same order
within each room.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from roomstream.corpus import CorpusSpec, CorpusStats, generate_corpus
from roomstream.errors import BadEventError
from roomstream.events.format import parse_pdu
from roomstream.events.hashing import compute_event_id
from roomstream.events.model import Event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, room_version
from roomstream.pipelines.import_load import TABLES, ImportConflictError
from roomstream.pipelines.import_task import (
    NO_ROOM,
    key_line,
    plan_partitions,
    room_cost,
    room_order,
)
from roomstream.pipelines.importer import import_events
from roomstream.rooms.persist import EventPersister
from roomstream.rooms.store import EventStore, state_groups_txn
from roomstream.state.groups import get_state_txn
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.streams import StreamSet

pytestmark = pytest.mark.spark

SPEC = CorpusSpec(events=700, seed=21, fork_rate=0.08, reject_rate=0.03, min_room_events=15)

Snapshot = dict[str, Any]


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
        return db.run_interaction_blocking(_snapshot_txn)
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
        return db.run_interaction_blocking(txn)
    finally:
        db.close_blocking()


def _room_orders(snapshot: Snapshot) -> dict[str, list[str]]:
    rooms: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for event_id, meta in snapshot["events"].items():
        rooms[meta["room"]].append((meta["so"], event_id))
    return {room: [e for _, e in sorted(pairs)] for room, pairs in rooms.items()}


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
        persister = EventPersister(EventStore(db), streams, "main")
        for events in _parse_file(path).values():
            for event in events:
                await persister.persist_events([event], backfilled=backfilled)
    finally:
        await db.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CorpusStats]:
    path = tmp_path_factory.mktemp("import") / "corpus.jsonl"
    return path, generate_corpus(path, SPEC, workers=2)


@pytest.fixture(scope="module")
def reference(
    corpus: tuple[Path, CorpusStats], tmp_path_factory: pytest.TempPathFactory
) -> Snapshot:
    db_path = tmp_path_factory.mktemp("reference") / "online.db"
    asyncio.run(_persist_one_by_one(corpus[0], db_path, backfilled=False))
    return _read(DatabaseConfig(engine="sqlite", path=str(db_path)))


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


def test_corpus_has_forks_and_rejections(
    corpus: tuple[Path, CorpusStats], reference: Snapshot
) -> None:
    _, stats = corpus
    assert stats.forks >= 5
    rejected = {e for e, m in reference["events"].items() if m["rejected"]}
    assert rejected == set(stats.intended_rejections) and rejected
    # Merges: events with several prev events, all of them given state.
    merges = Counter(event_id for event_id, _ in reference["edges"])
    assert sum(1 for n in merges.values() if n > 1) >= 5
    assert all(e in reference["states"] for e, n in merges.items() if n > 1)


def test_import_equals_online_path(
    spark: SparkSession,
    db_config: DatabaseConfig,
    corpus: tuple[Path, CorpusStats],
    reference: Snapshot,
) -> None:
    path, stats = corpus
    report = import_events(path, db_config, spark=spark, partitions=4)
    assert report.events == stats.events and report.invalid == 0
    assert report.rejected == len(stats.intended_rejections)
    assert {i.event_id for i in report.issues if i.kind == "rejected"} == set(
        stats.intended_rejections
    )
    imported = _read(db_config)
    _assert_same_outcome(imported, ref=reference)
    assert imported["current"] == reference["current"]
    assert imported["extremities"] == reference["extremities"]
    # Orderings: a block of the target's events stream, same order within every room.
    orderings = sorted(m["so"] for m in imported["events"].values())
    assert report.stream_orderings == (orderings[0], orderings[-1])
    assert orderings == list(range(orderings[0], orderings[0] + len(orderings)))
    assert _room_orders(imported) == _room_orders(reference)
    for event_id, prev in imported["edges"]:
        assert imported["events"][prev]["so"] < imported["events"][event_id]["so"]


def test_backfill_import_counts_down_and_keeps_state(
    spark: SparkSession,
    tmp_path: Path,
    corpus: tuple[Path, CorpusStats],
    reference: Snapshot,
) -> None:
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "backfill.db"))
    report = import_events(corpus[0], target, spark=spark, backfill=True, partitions=3)
    imported = _read(target)
    _assert_same_outcome(imported, ref=reference)
    assert report.stream_orderings is not None and report.stream_orderings[0] == -1
    assert all(m["so"] < 0 for m in imported["events"].values())
    # As online: backfilled events move neither forward extremities nor current state.
    assert imported["current"] == {} and imported["extremities"] == {}
    # Online backfill numbers a batch downwards in persistence order: children lower.
    for event_id, prev in imported["edges"]:
        assert imported["events"][prev]["so"] > imported["events"][event_id]["so"]


def test_malformed_lines_are_reported_and_the_rest_imports(
    spark: SparkSession, tmp_path: Path
) -> None:
    spec = CorpusSpec(events=250, seed=4, malformed=4)
    path = tmp_path / "bad.jsonl"
    stats = generate_corpus(path, spec, workers=1)
    # Plus: an event of a room whose create event is not in the file, and a blank line.
    orphan = (
        b'{"auth_events":[],"content":{},"depth":3,"hashes":{"sha256":"x"},'
        b'"origin_server_ts":1,"prev_events":[],"room_id":"!nowhere:x.test",'
        b'"sender":"@a:x.test","signatures":{},"type":"m.room.message"}'
    )
    with path.open("ab") as f:
        f.write(orphan + b"\n\n")
    target = DatabaseConfig(engine="sqlite", path=str(tmp_path / "t.db"))
    report = import_events(path, target, spark=spark, partitions=2)
    invalid = {i.line: i.reason for i in report.issues if i.kind == "invalid"}
    orphan_line = stats.lines + 1
    assert set(invalid) == {*stats.malformed_lines, orphan_line}
    assert "no valid m.room.create" in invalid[orphan_line]
    assert any("content hash" in r for r in invalid.values())
    assert any("M_NOT_JSON" in r for r in invalid.values())
    assert report.path == str(path)
    assert report.events == spec.events
    assert len(_read(target)["events"]) == spec.events
    rejected_lines = [i for i in report.issues if i.kind == "rejected"]
    assert {i.event_id for i in rejected_lines} == set(stats.intended_rejections)
    lines = path.read_bytes().splitlines()
    for issue in rejected_lines:  # the line number points at the event's own line
        data = orjson.loads(lines[issue.line - 1])
        ids = {compute_event_id(data, v) for v in KNOWN_ROOM_VERSIONS.values()}
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
    import_events(first, db_config, spark=spark, partitions=2)
    before = _tables(db_config)
    assert len(before["events"]) == 200

    def fault(part: int) -> None:
        raise RuntimeError(f"injected failure after part {part}")

    with pytest.raises(RuntimeError, match="injected failure after part 0"):
        import_events(second, db_config, spark=spark, partitions=2, fault=fault)
    assert _tables(db_config) == before
    # Importing rooms the target already has is refused, also leaving it unchanged.
    with pytest.raises(ImportConflictError):
        import_events(first, db_config, spark=spark, partitions=2)
    assert _tables(db_config) == before
    # The failed import left nothing behind that would get in the way of a retry.
    report = import_events(second, db_config, spark=spark, partitions=2)
    assert report.events == 200
    after = _read(db_config)
    assert len(after["events"]) == 400
    orderings = sorted(m["so"] for m in after["events"].values())
    assert len(set(orderings)) == 400 and orderings[0] > 0
