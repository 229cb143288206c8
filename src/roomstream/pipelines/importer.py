"""Bulk import of room history (``roomstream import PATH``), on Spark.

The input is JSON lines, one federation PDU per line, in any order (what
``roomstream generate`` writes). The import:

1. reads the lines with Spark and keys each line by room ID (a v12 create event's room ID
   is derived from its event ID), in one pass that also counts lines per room and per
   input split (the split counts give the line numbers for reports);
2. repartitions by room, balancing lines per task (largest rooms
   first, heaviest task first: :func:`import_task.plan_partitions`), so each room is in
   exactly one task;
3. in each task, persists the task's rooms through the online persistence code,
   :meth:`EventPersister.persist_events`, over a task-local SQLite database (see
   :mod:`import_task`): validation and hashes, auth, rejection, soft failure, DAG
   orderings, state groups, auth chains, forward extremities and current state are the
   online path's by construction;
4. on the driver, reserves one block of stream orderings from the target's ``events``
   stream (``backfill`` with ``backfill=True``) and blocks of state group / branch IDs,
   and copies every part into the target in ONE transaction (:mod:`import_load`);
5. rooms the target already has are left out of steps 3-4: the driver persists their
   lines into the target through the online persister (:func:`_add_to_existing`), which
   skips stored events, fills gaps and decides stored outliers again when their prev
   events arrive.

Guarantees:

- all or nothing for new rooms: if anything fails (a Spark task, a conflict, the copy) the
  target's tables are as before the import (reserved IDs become a gap, like any
  rolled-back write); rooms the target had are added to batch by batch, as online, and a
  failure there keeps the committed batches (:class:`ExistingRoomsError`; importing the
  file again completes it);
- the stored result equals persisting the same events one at a time with
  ``persist_events`` in :func:`import_task.room_order` (a valid topological order): same
  events, rejections, soft failures, outliers, state before/after every event, current
  state and forward extremities. Stream orderings differ in value but keep each room's
  persistence order (a block reserved in one piece, rooms never split);
- every line that is not stored as a valid event is reported with file, line number and
  reason (``invalid``: not stored; ``rejected``: stored as rejected, as online;
  ``duplicate``: the same event as an earlier line, stored once).

The import must be the only writer of the target's ``events``/``backfill`` stream under
its instance name while it runs (as for any writer instance).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

from pyspark import RDD, StorageLevel
from pyspark.sql import SparkSession

from roomstream.errors import Codes
from roomstream.pipelines.import_load import (
    MAX_SQLITE_PARTS,
    Blocks,
    ImportConflictError,
    load_postgres,
    load_sqlite,
)
from roomstream.pipelines.import_task import (
    NO_ROOM,
    LineIssue,
    PartResult,
    TaskSettings,
    assigned_partition,
    key_split,
    persist_partition,
    persist_room,
    plan_partitions,
    read_existing,
    room_of_line,
    split_offsets,
    split_stats,
)
from roomstream.reading import read_side_participants
from roomstream.reading.index_backfill import IndexBackfill
from roomstream.rooms.keys import KeyMap, ServerKeyStore, load_keys_file, merge_key_maps
from roomstream.rooms.persist import EventPersister, PersistedEvent
from roomstream.rooms.store import EventStore
from roomstream.storage import DatabaseConfig, Transaction, connect, prepare_database
from roomstream.streams import StreamSet

__all__ = [
    "ExistingRoomsError",
    "ImportConflictError",
    "ImportReport",
    "ImportSpaceError",
    "LineIssue",
    "import_cli",
    "import_events",
]


logger = logging.getLogger(__name__)


@dataclass
class ImportReport:
    """The outcome of one import. ``issues`` holds every invalid and rejected line."""

    path: str
    engine: str
    lines: int = 0
    rooms: int = 0
    events: int = 0
    rejected: int = 0
    soft_failed: int = 0
    outliers: int = 0
    invalid: int = 0
    #: Events whose content hash did not match: stored in their redacted form.
    redacted: int = 0
    #: Lines holding an event an earlier line already holds (listed in ``issues``).
    duplicates: int = 0
    #: Rooms the target already had: their events go through the online path.
    existing_rooms: int = 0
    #: Events the target already had (skipped, as online).
    already_stored: int = 0
    #: Stored outliers that got state because their prev events arrived.
    ex_outliers: int = 0
    issues: list[LineIssue] = field(default_factory=list)
    #: First and last stream ordering given out (signed; backfill counts down).
    stream_orderings: tuple[int, int] | None = None
    partitions: int = 0
    spark_seconds: float = 0.0
    #: Of ``spark_seconds``: reading, keying and counting the lines (before the tasks).
    key_seconds: float = 0.0
    #: Each task's time persisting its rooms, by partition (the rest of ``spark_seconds``
    #: is the shuffle by room and Spark's own overhead).
    task_seconds: list[float] = field(default_factory=list)
    load_seconds: float = 0.0
    #: Adding events to rooms the target already had (online path, on the driver).
    existing_seconds: float = 0.0
    #: Indexing the loaded rooms' searchable text (``roomstream.reading.index_backfill``).
    index_seconds: float = 0.0
    #: Starting Spark, when the import started it (``import_cli`` always does).
    spark_start_seconds: float = 0.0
    #: ``import_events`` from start to end (Spark phase + load + existing rooms).
    seconds: float = 0.0
    #: Everything: Spark's start (when the import started it) plus ``seconds``.
    wall_seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def wall_events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "issues"}
        data["events_per_second"] = round(self.events_per_second, 1)
        data["wall_events_per_second"] = round(self.wall_events_per_second, 1)
        return data


def count_lines(path: str | os.PathLike[str]) -> int:
    """Lines in a file (a final line without a newline counts)."""
    count = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (0 if last == b"\n" else 1)


# -- progress ----------------------------------------------------------------------------


class _View:
    """Rich progress for both phases, or nothing when no console is given."""

    def __init__(self, console: Any, total_lines: int) -> None:
        self.progress: Any = None
        if console is None:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rooms]} rooms"),
            TextColumn("{task.fields[rate]} events/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.persist = self.progress.add_task(
            "persisting (Spark)", total=total_lines, rooms=0, rate="-"
        )
        self.load = self.progress.add_task(
            "loading target", total=None, rooms=0, rate="-", visible=False
        )
        self.started = time.monotonic()

    def __enter__(self) -> _View:
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def spark(self, rooms: int, events: int) -> None:
        if self.progress is None:
            return
        rate = events / max(time.monotonic() - self.started, 1e-9)
        self.progress.update(
            self.persist, completed=events, rooms=f"{rooms:,}", rate=f"{rate:,.0f}"
        )

    def start_load(self, events: int, rooms: int) -> None:
        if self.progress is None:
            return
        self.progress.update(self.persist, completed=self.progress.tasks[0].total)
        self.load_started = time.monotonic()
        self.progress.update(self.load, total=events, visible=True, rooms=f"{rooms:,}")

    def loaded(self, events: int) -> None:
        if self.progress is None:
            return
        rate = events / max(time.monotonic() - self.load_started, 1e-9)
        self.progress.update(self.load, completed=events, rate=f"{rate:,.0f}")


def _read_progress(work_dir: str) -> tuple[int, int]:
    rooms = events = 0
    for name in os.listdir(work_dir):
        if name.endswith(".progress"):
            try:
                with open(os.path.join(work_dir, name), encoding="utf-8") as f:
                    data = json.load(f)
                rooms += int(data["rooms"])
                events += int(data["events"])
            except (OSError, ValueError, KeyError):
                continue
    return rooms, events


# -- the import --------------------------------------------------------------------------


def _run_spark(
    spark: SparkSession,
    path: str,
    settings: TaskSettings,
    partitions: int,
    view: _View,
    report: ImportReport,
    target: DatabaseConfig,
) -> list[PartResult]:
    started = time.perf_counter()
    sc = spark.sparkContext
    uri = Path(path).resolve().as_uri()
    # use_unicode=False: the raw bytes of each line (the stubs only know the str form).
    lines = cast("RDD[bytes]", sc.textFile(uri, minPartitions=partitions, use_unicode=False))
    # One pass keys the lines and counts them per room and per input split (the counts
    # number the lines later, in the tasks); no shuffle until the repartition by room.
    keyed = lines.mapPartitionsWithIndex(key_split).persist(StorageLevel.MEMORY_AND_DISK)
    stats = keyed.mapPartitionsWithIndex(split_stats).collect()
    sizes: dict[str, int] = defaultdict(int)
    for _, _, per_room in stats:
        for room, count in per_room.items():
            sizes[room] += count
    existing_rooms = asyncio.run(_existing_rooms(target, [r for r in sizes if r != NO_ROOM]))
    report.existing_rooms = len(existing_rooms)
    report.key_seconds = time.perf_counter() - started
    assignment = sc.broadcast(plan_partitions(sizes, partitions))
    offsets = sc.broadcast(split_offsets(stats))
    existing = sc.broadcast(existing_rooms)
    by_room = keyed.partitionBy(partitions, partial(assigned_partition, assignment=assignment))
    job = by_room.mapPartitionsWithIndex(
        partial(persist_partition, settings=settings, offsets=offsets, existing=existing)
    )
    outcome: dict[str, Any] = {}
    group = f"roomstream-import-{os.getpid()}-{time.monotonic_ns()}"

    def collect() -> None:
        sc.setJobGroup(group, f"import {path}")
        try:
            outcome["parts"] = job.collect()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=collect, name="roomstream-import-spark", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
            view.spark(*_read_progress(settings.work_dir))
    except BaseException:  # e.g. Ctrl-C: stop the tasks before the scratch dir goes
        sc.cancelJobGroup(group)
        thread.join(30)
        raise
    finally:
        keyed.unpersist()
        assignment.destroy()
        offsets.destroy()
        existing.destroy()
    if "error" in outcome:
        raise RuntimeError(f"the import's Spark job failed: {outcome['error']}") from outcome[
            "error"
        ]
    parts: list[PartResult] = outcome["parts"]
    return sorted(parts, key=lambda p: p.index)


def _existing_rooms_txn(txn: Transaction, rooms: list[str]) -> frozenset[str]:
    found: set[str] = set()
    for start in range(0, len(rooms), 500):
        chunk = rooms[start : start + 500]
        found.update(
            r[0]
            for r in txn.query(
                "SELECT DISTINCT room_id FROM events"
                f" WHERE room_id IN ({','.join('?' * len(chunk))})",
                chunk,
            )
        )
    return frozenset(found)


async def _existing_rooms(target: DatabaseConfig, rooms: list[str]) -> frozenset[str]:
    """The rooms of the input that the target already has events of."""
    db = connect(target)
    try:
        await prepare_database(db)
        return await db.run_interaction("existing_rooms", _existing_rooms_txn, sorted(rooms))
    finally:
        await db.close()


def _outliers_txn(txn: Transaction, rooms: list[str]) -> int:
    count = 0
    for start in range(0, len(rooms), 500):
        chunk = rooms[start : start + 500]
        count += int(
            txn.query_one(
                "SELECT COUNT(*) FROM events WHERE outlier"
                f" AND room_id IN ({','.join('?' * len(chunk))})",
                chunk,
            )[0]
        )
    return count


async def _add_to_existing(
    target: DatabaseConfig,
    parts: list[PartResult],
    settings: TaskSettings,
    stream_writers: Mapping[str, tuple[str, ...]],
    report: ImportReport,
) -> None:
    """Persist the lines of rooms the target already has through the online path.

    Events the target has are skipped; new ones fill their gaps; stored outliers whose
    prev events arrive are decided again and get state (the persister does that). Each
    batch commits on its own, as online: a failure keeps the batches committed so far,
    and importing the same file again completes the work (stored events are skipped).
    """
    rooms: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    for part in parts:
        if part.existing_path:
            for line, raw in read_existing(part.existing_path):
                rooms[room_of_line(raw)].append((line, raw))
    if not rooms:
        return
    db = connect(target)
    try:
        await prepare_database(db)
        streams = await StreamSet.open(db, settings.instance_name, stream_writers)
        store = EventStore(db)
        # The target's own rooms: persisted as online, every read-side record included.
        persister = EventPersister(
            store,
            streams,
            settings.instance_name,
            server_name=settings.server_name,
            participants=read_side_participants(),
        )
        room_ids = sorted(rooms)
        outliers_before = await db.run_interaction("import_outliers", _outliers_txn, room_ids)
        window = asyncio.Semaphore(max(1, settings.rooms_in_flight))
        results: list[PersistedEvent] = []

        async def one_room(room_id: str) -> None:
            async with window:
                version = await store.get_room_version(room_id)
                results.extend(
                    await persist_room(
                        persister,
                        room_id,
                        sorted(rooms[room_id]),
                        settings,
                        report.issues,
                        version=version,
                    )
                )

        await asyncio.gather(*(one_room(r) for r in room_ids))
        outliers_after = await db.run_interaction("import_outliers", _outliers_txn, room_ids)
    finally:
        await db.close()
    new = [r for r in results if r.new]
    report.events += len(new)
    report.already_stored += len(results) - len(new)
    report.rejected += sum(1 for r in new if r.rejected_reason is not None)
    report.soft_failed += sum(1 for r in new if r.soft_failed)
    new_outliers = sum(1 for r in new if r.outlier)
    report.outliers += new_outliers
    report.ex_outliers = outliers_before + new_outliers - outliers_after
    report.rooms += len(rooms)


async def _index_loaded_rooms(target: DatabaseConfig) -> None:
    """Index the loaded rooms' searchable text (the load listed them): the import returns
    with every event searchable. Stopped midway, the rooms stay listed and the target's
    next start-up (or ``roomstream migrate``) finishes them."""
    db = connect(target)
    try:
        await IndexBackfill(db).run_pending()
    except Exception:
        # The import itself is committed: this is no reason to report it failed.
        logger.exception("indexing the imported rooms failed; the next start-up does it")
    finally:
        await db.close()


def _reserve_ids_txn(txn: Transaction, groups: int, branches: int) -> tuple[list[int], list[int]]:
    return (
        txn.nextval_many("state_group_id_seq", groups) if groups else [],
        txn.nextval_many("state_branch_id_seq", branches) if branches else [],
    )


async def _load(
    target: DatabaseConfig,
    parts: list[PartResult],
    instance_name: str,
    stream_writers: Mapping[str, tuple[str, ...]],
    backfill: bool,
    view: _View,
    fault: Callable[[int], None] | None,
) -> tuple[int, int] | None:
    total = sum(p.events for p in parts)
    db = connect(target)
    try:
        await prepare_database(db)
        if total == 0:
            return None
        streams = await StreamSet.open(db, instance_name, stream_writers)
        generator = streams.generator("backfill" if backfill else "events")
        groups, branches = await db.run_interaction(
            "reserve_ids",
            _reserve_ids_txn,
            sum(p.state_groups for p in parts),
            sum(p.branches for p in parts),
        )
        done = 0

        def progress(i: int, part: PartResult) -> None:
            nonlocal done
            done += part.events
            view.loaded(done)
            if fault is not None:
                fault(i)

        loader = load_sqlite if target.engine == "sqlite" else load_postgres
        async with generator.reserve_many(total) as orderings:
            blocks = Blocks(orderings, groups, branches)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, loader, target, parts, blocks, progress)
        return orderings[0], orderings[-1]
    finally:
        await db.close()


#: Scratch space per byte of input: the part databases hold every event's JSON, its rows,
#: state, auth chains and indexes (measured: 4.0 bytes per input byte on a generated
#: corpus; the rest is margin).
SCRATCH_BYTES_PER_INPUT_BYTE = 5.0
#: Growth of a SQLite target per byte of input: the same rows (~4x), and until the load's
#: single transaction is checkpointed, its WAL holds them once more.
TARGET_BYTES_PER_INPUT_BYTE = 8.0


class ExistingRoomsError(RuntimeError):
    """Adding events to rooms the target already had failed part way (see the message)."""


class ImportSpaceError(RuntimeError):
    """Not enough free space for the scratch copy (or a SQLite target); nothing was done."""


async def _stored_keys(target: DatabaseConfig) -> KeyMap:
    """The verify keys an operator stored in the target (``roomstream keys add``)."""
    db = connect(target)
    try:
        await prepare_database(db)
        return await ServerKeyStore(db).key_map()
    finally:
        await db.close()


def check_space(path: str, scratch_parent: str, target: DatabaseConfig) -> None:
    """Refuse to start when a filesystem lacks the room the import will need on it."""
    size = os.path.getsize(path)
    needs: dict[int, tuple[str, float, list[str]]] = {}

    def need(directory: str, amount: float, what: str) -> None:
        # A directory created later (a fresh data_dir) lands on its nearest existing parent.
        while not os.path.exists(directory) and os.path.dirname(directory) != directory:
            directory = os.path.dirname(directory)
        device = os.stat(directory).st_dev
        where, total, whats = needs.get(device, (directory, 0.0, []))
        needs[device] = (where, total + amount, [*whats, what])

    need(scratch_parent, size * SCRATCH_BYTES_PER_INPUT_BYTE, "scratch copy")
    if target.engine == "sqlite" and target.path not in ("", ":memory:"):
        target_dir = os.path.dirname(os.path.abspath(target.path))
        need(target_dir, size * TARGET_BYTES_PER_INPUT_BYTE, "SQLite target")
    for where, amount, whats in needs.values():
        free = shutil.disk_usage(where).free
        if free < amount:
            raise ImportSpaceError(
                f"not enough free space in {where} for the {' and '.join(whats)}: about"
                f" {amount / 1e6:,.0f} MB needed for {size / 1e6:,.0f} MB of input,"
                f" {free / 1e6:,.0f} MB free (choose the scratch directory with --work-dir)"
            )


def import_events(
    path: str | os.PathLike[str],
    target: DatabaseConfig,
    *,
    spark: SparkSession | None = None,
    instance_name: str = "main",
    stream_writers: Mapping[str, tuple[str, ...]] | None = None,
    backfill: bool = False,
    partitions: int | None = None,
    chunk_events: int = 400,
    work_dir: str | os.PathLike[str] | None = None,
    console: Any = None,
    fault: Callable[[int], None] | None = None,
    verify_keys: KeyMap | None = None,
    trust_unsigned: bool = False,
    server_name: str | None = None,
) -> ImportReport:
    """Import the PDUs in ``path`` into ``target``; see the module docstring.

    Every event must carry valid signatures of the servers the spec names (the sender's,
    and a restricted join's authorising server) by keys in ``verify_keys`` or among those
    stored in the target (``roomstream keys add``); lines that do not are reported
    ``invalid``. ``trust_unsigned`` skips that check, for input the caller vouches for.
    ``server_name``: the target's; redactions by its users apply only to their own events
    (or with the redact level), those of other servers' users by the spec's server rule
    (``redaction_applies``). None judges every sender as remote.

    ``partitions`` defaults to 4x Spark's default parallelism (at most
    :data:`MAX_SQLITE_PARTS` for a SQLite target). ``work_dir`` (default: the system's
    temporary directory) holds the scratch copy, the part databases (deleted afterwards);
    executors and driver must share it (true for ``local[N]``). The free space there (and
    next to a SQLite target) is checked before anything starts (:func:`check_space`).
    ``console`` (a rich Console) shows progress. ``fault(part_number)`` is called inside
    the load transaction after each part (tests use it to inject failures).
    """
    wall_started = time.perf_counter()
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    scratch_parent = str(work_dir) if work_dir is not None else tempfile.gettempdir()
    check_space(path, scratch_parent, target)
    report = ImportReport(path=path, engine=target.engine)
    if spark is None:
        from roomstream.pipelines.session import spark_session

        spark = spark_session()
        report.spark_start_seconds = time.perf_counter() - wall_started
    started = time.perf_counter()
    report.lines = count_lines(path)
    if partitions is None:
        partitions = 4 * spark.sparkContext.defaultParallelism
    if target.engine == "sqlite":
        partitions = min(partitions, MAX_SQLITE_PARTS)
    report.partitions = partitions = max(1, partitions)
    keys = (
        {}
        if trust_unsigned
        else merge_key_maps(verify_keys or {}, asyncio.run(_stored_keys(target)))
    )
    scratch = tempfile.mkdtemp(prefix="roomstream-import-", dir=scratch_parent)
    try:
        settings = TaskSettings(
            source=path,
            work_dir=scratch,
            instance_name=instance_name,
            backfill=backfill,
            chunk_events=chunk_events,
            verify_keys=keys,
            trust_unsigned=trust_unsigned,
            server_name=server_name,
        )
        with _View(console, report.lines) as view:
            parts = _run_spark(spark, path, settings, partitions, view, report, target)
            report.spark_seconds = time.perf_counter() - started
            report.task_seconds = [round(p.seconds, 2) for p in parts]
            stored = [p for p in parts if p.path]
            for part in parts:
                report.issues.extend(part.issues)
                report.events += part.events
                report.rooms += len(part.rooms)
                report.rejected += part.rejected
                report.soft_failed += part.soft_failed
                report.outliers += part.outliers
            view.start_load(report.events, report.rooms)
            load_started = time.perf_counter()
            report.stream_orderings = asyncio.run(
                _load(
                    target,
                    stored,
                    instance_name,
                    stream_writers or {},
                    backfill,
                    view,
                    fault,
                )
            )
            report.load_seconds = time.perf_counter() - load_started
            existing_started = time.perf_counter()
            try:
                asyncio.run(_add_to_existing(target, parts, settings, stream_writers or {}, report))
            except Exception as exc:
                raise ExistingRoomsError(
                    f"the new rooms are loaded, but adding to the rooms the target already had"
                    f" failed: {exc}; the batches committed so far stay, importing the file"
                    f" again completes it (stored events are skipped)"
                ) from exc
            report.existing_seconds = time.perf_counter() - existing_started
            index_started = time.perf_counter()
            asyncio.run(_index_loaded_rooms(target))
            report.index_seconds = time.perf_counter() - index_started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.issues.sort(key=lambda i: i.line)
    report.invalid = sum(1 for i in report.issues if i.kind == "invalid")
    report.duplicates = sum(1 for i in report.issues if i.kind == "duplicate")
    report.redacted = sum(1 for i in report.issues if i.kind == "redacted")
    report.seconds = time.perf_counter() - started
    report.wall_seconds = time.perf_counter() - wall_started
    return report


def import_cli(
    path: str,
    target: DatabaseConfig,
    *,
    instance_name: str = "main",
    stream_writers: Mapping[str, tuple[str, ...]] | None = None,
    backfill: bool = False,
    master: str = "local[2]",
    partitions: int | None = None,
    report_path: str | None = None,
    show_issues: int = 20,
    quiet: bool = True,
    work_dir: str | None = None,
    keys_files: Sequence[str] = (),
    local_keys: Mapping[str, Mapping[str, str]] | None = None,
    trust_unsigned: bool = False,
    server_name: str | None = None,
) -> int:
    """``roomstream import PATH``: import with a progress display, then print a summary.

    Prints the counts (lines, rooms, events, rejected, soft-failed, outliers, invalid),
    the stream orderings used, the time and rate, and the first ``show_issues`` issues as
    ``PATH:LINE: kind: reason``; with ``report_path`` every issue is written there as JSON
    lines. Returns 0 on success (even with invalid or rejected lines), 1 if the import
    failed (the target is then unchanged), 2 for an unreadable keys file.

    Signatures are checked against the keys in ``keys_files``, ``local_keys`` (this
    server's own) and those stored in the target, unless ``trust_unsigned``.
    """
    from rich.console import Console
    from rich.text import Text

    from roomstream.pipelines.session import spark_session

    console = Console()
    try:
        verify_keys = merge_key_maps(local_keys or {}, *map(load_keys_file, keys_files))
    except ValueError as exc:
        console.print(Text("error: ", style="red") + Text(str(exc)))
        return 2
    wall_started = time.perf_counter()
    try:
        scratch_parent = work_dir if work_dir is not None else tempfile.gettempdir()
        check_space(path, scratch_parent, target)  # before Spark's start, to fail fast
    except (OSError, ImportSpaceError) as exc:
        console.print(Text("import not started: ", style="red") + Text(str(exc)))
        return 1
    spark = spark_session(master, app_name="roomstream-import", quiet=quiet)
    spark_start = time.perf_counter() - wall_started
    try:
        report = import_events(
            path,
            target,
            spark=spark,
            instance_name=instance_name,
            stream_writers=stream_writers,
            backfill=backfill,
            partitions=partitions,
            work_dir=work_dir,
            console=console,
            verify_keys=verify_keys,
            trust_unsigned=trust_unsigned,
            server_name=server_name,
        )
    except ExistingRoomsError as exc:
        console.print(Text("import failed: ", style="red") + Text(str(exc)))
        return 1
    except Exception as exc:
        console.print(
            Text("import failed; the target is unchanged: ", style="red") + Text(str(exc))
        )
        return 1
    report.spark_start_seconds = spark_start
    report.wall_seconds = spark_start + report.seconds
    console.print(
        f"imported {report.events:,} events in {report.rooms:,} rooms from {report.lines:,}"
        f" lines into {report.engine}: wall time {report.wall_seconds:.1f} s"
        f" ({report.wall_events_per_second:,.0f} events/s) = Spark start"
        f" {report.spark_start_seconds:.1f} s + Spark phase {report.spark_seconds:.1f} s"
        f" + load {report.load_seconds:.1f} s + existing rooms {report.existing_seconds:.1f} s"
        f" + search index {report.index_seconds:.1f} s"
    )
    console.print(
        f"rejected {report.rejected:,}, soft-failed {report.soft_failed:,},"
        f" outliers {report.outliers:,} (ex-outliers {report.ex_outliers:,}),"
        f" invalid lines {report.invalid:,}, duplicate lines {report.duplicates:,},"
        f" stored redacted (content hash mismatch) {report.redacted:,};"
        f" rooms already in the target {report.existing_rooms:,}, events already stored"
        f" {report.already_stored:,}; stream orderings {report.stream_orderings}"
    )
    unsigned = sum(1 for i in report.issues if i.reason.startswith(Codes.UNAUTHORIZED))
    if unsigned:
        hint = f"{unsigned:,} lines lack a signature by a known key"
        sibling = path + ".keys.json"
        if os.path.isfile(sibling) and sibling not in keys_files:
            hint += f"; if you trust {sibling}, pass --keys {sibling}"
        console.print(hint, markup=False)
    for issue in report.issues[:show_issues]:
        console.print(f"{path}:{issue.line}: {issue.kind}: {issue.reason}", markup=False)
    if len(report.issues) > show_issues:
        console.print(f"... and {len(report.issues) - show_issues:,} more issues")
    if report_path is not None:
        with open(report_path, "w", encoding="utf-8") as f:
            for issue in report.issues:
                f.write(json.dumps({"file": path, **issue.__dict__}) + "\n")
    return 0
