"""The Spark side of the bulk import: key lines by room, persist each partition's rooms.

Each Spark task receives whole rooms (lines are partitioned by room ID) and runs the
*online* persistence code, :meth:`EventPersister.persist_events`, over a task-local SQLite
database in the import's work directory. Everything an event gets on the online path
(validation and hashes via :func:`parse_pdu`, auth and rejection, soft failure, outliers,
state groups, auth chain index, forward extremities, current state, redactions) is
therefore computed by the same code, by construction. The driver then copies the parts into
the target database (:mod:`roomstream.pipelines.import_load`), renumbering global IDs.

Invariants of a part database (checked before the driver loads it):

- its stream orderings are exactly ``1..n`` (``-1..-n`` for backfill) in persistence
  order, so a room's events are numbered in the order they were persisted (each after its
  prev and auth events);
- its state group and branch IDs are ``1..G`` and ``1..B``;
- every room is in exactly one part (chain IDs of the auth chain index are per room and
  need no renumbering).

Nothing here keeps a database connection on a pickled object: a task opens its own
database, uses it and closes it before returning.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import os
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import orjson
from pyspark import Broadcast

from roomstream.errors import BadEventError, Codes, EventSignatureError
from roomstream.events.format import ContentHashMismatchError, parse_pdu
from roomstream.events.hashing import compute_event_id, room_id_from_create_event_id
from roomstream.events.model import Event
from roomstream.events.room_versions import (
    KNOWN_ROOM_VERSIONS,
    ROOM_V10,
    ROOM_V12,
    RoomVersion,
    room_version,
)
from roomstream.events.signing import VerifyKeys, check_event_signatures
from roomstream.events.types import EventTypes
from roomstream.reading.index_backfill import list_rooms_txn
from roomstream.reading.relations import RelationsRecorder
from roomstream.reading.visibility import VisibilityRecorder
from roomstream.rooms.keys import KeyMap, verify_keys_of
from roomstream.rooms.persist import EventPersister, PersistedEvent, topological_order
from roomstream.rooms.store import EventStore
from roomstream.state.cooperative import set_pause
from roomstream.storage import Database, DatabaseConfig, Transaction, connect, prepare_database
from roomstream.streams import STREAMS, StreamSet

#: Key of lines whose room cannot be told (not JSON, no room ID...).
NO_ROOM = ""


@dataclass(frozen=True)
class TaskSettings:
    """What every task needs; plain values only (it is pickled to the executors)."""

    source: str
    work_dir: str
    instance_name: str
    backfill: bool = False
    #: Events per ``persist_events`` call within a room.
    chunk_events: int = 400
    #: Rooms persisted concurrently by a task (their commits are grouped).
    rooms_in_flight: int = 16
    #: The verify keys events are checked against (server -> key ID -> base64).
    verify_keys: KeyMap = field(default_factory=dict)
    #: Skip the signature checks (the operator vouches for the input).
    trust_unsigned: bool = False
    #: The target's server name: its users' redactions are judged as local ones (see
    #: ``redaction_applies``); None judges every sender as remote.
    server_name: str | None = None

    def signature_keys(self) -> VerifyKeys | None:
        """The keys to check signatures with; None when the input is trusted unsigned."""
        return None if self.trust_unsigned else verify_keys_of(self.verify_keys)


@dataclass(frozen=True)
class LineIssue:
    """An input line that was not stored as a valid event, or was stored as rejected.

    ``kind`` is ``"invalid"`` (not stored: failed parsing / validation / signatures, or
    its room has no valid create event), ``"rejected"`` (stored, rejected by the auth
    rules), ``"redacted"`` (its content hash did not match its content: stored in its
    redacted form, then processed like any event, as the spec's checks on receipt say) or
    ``"duplicate"`` (the same event as an earlier line of the input: stored once).
    """

    line: int
    kind: str
    reason: str
    event_id: str | None = None


@dataclass
class PartResult:
    """What one task persisted: a part database and its counts."""

    index: int
    path: str
    rooms: list[str] = field(default_factory=list)
    lines: int = 0
    events: int = 0
    rejected: int = 0
    soft_failed: int = 0
    outliers: int = 0
    state_groups: int = 0
    branches: int = 0
    issues: list[LineIssue] = field(default_factory=list)
    seconds: float = 0.0
    #: Lines of rooms the target already has (not persisted here; the driver adds them
    #: through the online path): a file of ``LINE<TAB>RAW`` lines, or "" if none.
    existing_path: str = ""


# -- keying --------------------------------------------------------------------------


def room_of_line(raw: bytes) -> str:
    """The room of one input line: the ``room_id`` field, except for a room version 12
    create event, whose room ID is derived from its event ID. Lines whose room cannot be
    told get :data:`NO_ROOM` (they are reported by the task that receives them)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return NO_ROOM
    if not isinstance(data, dict):
        return NO_ROOM
    room_id = data.get("room_id")
    if data.get("type") == EventTypes.CREATE and room_id is None:
        content = data.get("content")
        try:
            try:
                version = room_version(
                    content.get("room_version") if isinstance(content, dict) else None
                )
            except BadEventError:
                # Only versions whose create event has no room_id (12+) omit it: key the
                # line as version 12 would, so the task sees the room's create event and
                # can name its real problem (the room version) on every line of the room.
                version = ROOM_V12
            if version.room_id_from_create_event:
                return room_id_from_create_event_id(compute_event_id(data, version))
        except Exception:  # any malformed create event: reported by the task
            return NO_ROOM
    return room_id if isinstance(room_id, str) and room_id else NO_ROOM


def key_line(item: tuple[bytes, int]) -> tuple[str, tuple[int, bytes]]:
    """(room ID, (1-based line number, raw bytes)) for one line and its 0-based index."""
    raw, index = bytes(item[0]), item[1]
    return room_of_line(raw), (index + 1, raw)


LinePosition = tuple[int, int]
"""Where a line is before numbering: (input split, index within the split)."""


def key_split(
    index: int, lines: Iterable[bytes]
) -> Iterator[tuple[str, tuple[LinePosition, bytes]]]:
    """(room ID, ((split, offset), raw bytes)) for the lines of input split ``index``.

    Global line numbers need every earlier split's line count; :func:`split_stats` counts
    them in the same pass that counts lines per room, and :func:`number_lines` turns the
    positions into line numbers in the persisting task (no separate numbering pass over
    the input, as ``zipWithIndex`` would make).
    """
    for offset, raw in enumerate(lines):
        raw = bytes(raw)
        yield room_of_line(raw), ((index, offset), raw)


def split_stats(
    index: int, keyed: Iterable[tuple[str, tuple[LinePosition, bytes]]]
) -> Iterator[tuple[int, int, dict[str, int]]]:
    """(split index, lines in the split, lines per room) for one split."""
    rooms: dict[str, int] = defaultdict(int)
    count = 0
    for room, _ in keyed:
        rooms[room] += 1
        count += 1
    yield index, count, dict(rooms)


def split_offsets(stats: Iterable[tuple[int, int, Mapping[str, int]]]) -> dict[int, int]:
    """Lines before each split: what turns a split position into a line number."""
    offsets: dict[int, int] = {}
    total = 0
    for index, count, _ in sorted(stats, key=lambda s: s[0]):
        offsets[index] = total
        total += count
    return offsets


def number_lines(
    rows: Iterable[tuple[str, tuple[LinePosition, bytes]]], offsets: Mapping[int, int]
) -> Iterator[tuple[str, tuple[int, bytes]]]:
    """Replace split positions by 1-based line numbers of the whole input."""
    for room, ((split, offset), raw) in rows:
        yield room, (offsets[split] + offset + 1, raw)


def partition_of(room_id: str) -> int:
    """A stable hash of a room ID (Python's ``hash`` of a str differs between processes)."""
    return zlib.crc32(room_id.encode("utf-8", "surrogatepass"))


#: Persisting an event costs more the bigger its room (bigger states to copy and merge,
#: more auth chain links): about ``n ** ROOM_COST_EXPONENT`` per event in a room of ``n``
#: lines. Measured on the 1,000,000-event corpus: ~190 us per event in 100-event rooms,
#: ~820 us in the 100,000-event room (a ratio of ~4.3 for 1,000 times the size).
ROOM_COST_EXPONENT = 0.2


def room_cost(lines: int) -> float:
    """The relative cost of persisting a room of ``lines`` lines."""
    return float(lines) * math.pow(max(lines, 1), ROOM_COST_EXPONENT)


def plan_partitions(sizes: Mapping[str, int], partitions: int) -> dict[str, int]:
    """Assign rooms to partitions, balancing the cost of persisting them
    (:func:`room_cost`: largest rooms first onto the least loaded partition), and number
    the partitions costliest first: Spark starts tasks in partition order, so the longest
    task starts first (heavy-tailed room sizes otherwise leave one late task running
    alone)."""
    heap: list[tuple[float, int]] = [(0.0, i) for i in range(partitions)]
    assigned: dict[str, int] = {}
    for room, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        load, index = heapq.heappop(heap)
        assigned[room] = index
        heapq.heappush(heap, (load + room_cost(size), index))
    by_load = sorted(heap, key=lambda li: (-li[0], li[1]))
    relabel = {index: rank for rank, (_, index) in enumerate(by_load)}
    return {room: relabel[index] for room, index in assigned.items()}


def assigned_partition(room_id: str, assignment: Broadcast[dict[str, int]]) -> int:
    """The partition :func:`plan_partitions` chose (a stable hash for unplanned keys)."""
    index = assignment.value.get(room_id)
    return partition_of(room_id) if index is None else index


room_order = topological_order
"""A room's persistence order (the persister's own batch order, applied to the room)."""


def _bad_line_reason(raw: bytes) -> str:
    if not raw.strip():
        return "empty line"
    try:
        parse_pdu(raw, ROOM_V10)
    except BadEventError as exc:
        return f"{exc.errcode}: {exc.message}"
    return "M_BAD_JSON: cannot tell the event's room (no room_id)"


def _create_version(room_id: str, rows: Sequence[tuple[int, bytes]]) -> RoomVersion | None:
    """The room's version, from the first line that is a valid create event of this room."""
    for _, raw in rows:
        if b"m.room.create" not in raw:
            continue
        try:
            data = orjson.loads(raw)
            if data.get("type") != EventTypes.CREATE or data.get("state_key") != "":
                continue
            # No content.room_version: room version 1, as the spec says.
            version = room_version(data["content"].get("room_version", "1"))
            try:
                event = parse_pdu(raw, version)
            except ContentHashMismatchError as exc:
                event = exc.redacted_event  # used in its redacted form, as any event
            if event.room_id == room_id:
                return version
        except Exception:  # not a usable create event; look further
            continue
    return None


def _unusable_create(rows: Sequence[tuple[int, bytes]]) -> tuple[int, str] | None:
    """The first line that is an ``m.room.create`` event, and why it cannot be used (its
    room version, most often: unknown, mistyped or missing)."""
    for line, raw in rows:
        if b"m.room.create" not in raw:
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(data, dict) or data.get("type") != EventTypes.CREATE:
            continue
        content = data.get("content")
        known = ", ".join(sorted(KNOWN_ROOM_VERSIONS, key=lambda v: (len(v), v)))
        if not isinstance(content, dict):
            return line, "M_BAD_JSON: 'content' of the m.room.create event must be an object"
        value = content.get("room_version", "1")  # absent: room version 1
        if not isinstance(value, str):
            return line, (
                f"{Codes.UNSUPPORTED_ROOM_VERSION}: content.room_version of the m.room.create"
                f" event must be a string, not {type(value).__name__} {value!r}"
                f" (supported: {known})"
            )
        if value not in KNOWN_ROOM_VERSIONS:
            return line, (
                f"{Codes.UNSUPPORTED_ROOM_VERSION}: unknown room version {value[:40]!r} in the"
                f" m.room.create event (supported: {known})"
            )
        try:
            parse_pdu(raw, KNOWN_ROOM_VERSIONS[value])
        except BadEventError as exc:
            return line, f"{exc.errcode}: {exc.message}"  # the online path's own words
    return None


def _create_error(raw: bytes) -> str | None:
    """A create event's own error (the online path's message), if the line is a create
    event that does not parse: a v12 create event is keyed by the room ID its event ID
    names, so a broken one would otherwise be reported as a room without a create event."""
    if b"m.room.create" not in raw:
        return None
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("type") != EventTypes.CREATE:
            return None
        content = data.get("content")
        version = room_version(content.get("room_version") if isinstance(content, dict) else None)
        parse_pdu(raw, version)
    except BadEventError as exc:
        return f"{exc.errcode}: {exc.message}"
    except Exception:  # not JSON / unknown version: the generic reason says enough
        return None
    return None


# -- persisting ----------------------------------------------------------------------


class _Progress:
    """Writes ``<part>.progress`` (rooms, events) at most twice a second for the driver."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rooms = 0
        self.events = 0
        self._last = 0.0

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"rooms": self.rooms, "events": self.events}, f)
        os.replace(tmp, self.path)


def _superseded(line: int, event_id: str, stored_line: int) -> LineIssue:
    return LineIssue(
        line,
        "invalid",
        f"M_BAD_JSON: the content hash of {event_id} does not match its content;"
        f" the event is stored from line {stored_line}",
        event_id,
    )


async def persist_room(
    persister: EventPersister,
    room_id: str,
    rows: list[tuple[int, bytes]],
    settings: TaskSettings,
    issues: list[LineIssue],
    progress: _Progress | None = None,
    version: RoomVersion | None = None,
) -> list[PersistedEvent]:
    """Persist one room's lines in :func:`room_order`, in chunks; report bad, duplicate,
    redacted (content hash mismatch) and (newly) rejected lines. ``version``: the room's,
    when the target already has it (otherwise it comes from the create event among the
    lines). Signatures are checked with ``settings.signature_keys()`` unless the input is
    trusted unsigned. Returns every result."""
    verify_keys = settings.signature_keys()
    version = version or _create_version(room_id, rows)
    if version is None:
        reason = f"M_NOT_FOUND: room {room_id[:80]} has no valid m.room.create event in the input"
        unusable = _unusable_create(rows)
        if unusable is not None:
            create_line, why = unusable
            reason = f"M_NOT_FOUND: the room's m.room.create event (line {create_line}): {why}"
        issues.extend(
            LineIssue(
                line,
                "invalid",
                why if unusable and line == create_line else _create_error(raw) or reason,
            )
            for line, raw in rows
        )
        return []
    events: dict[str, Event] = {}
    line_of: dict[str, int] = {}
    #: Events held in their redacted form (content hash mismatch) -> their line.
    redacted: dict[str, int] = {}
    for line, raw in rows:
        mismatch = False
        try:
            event = parse_pdu(raw, version)
        except ContentHashMismatchError as exc:
            event, mismatch = exc.redacted_event, True
        except BadEventError as exc:
            issues.append(LineIssue(line, "invalid", f"{exc.errcode}: {exc.message}"))
            continue
        if event.room_id != room_id:  # cannot happen for keyed lines; kept as a guard
            issues.append(LineIssue(line, "invalid", "M_BAD_JSON: room ID mismatch"))
            continue
        if verify_keys is not None:
            try:
                check_event_signatures(event, verify_keys)
            except EventSignatureError as exc:
                issues.append(LineIssue(line, "invalid", f"{exc.errcode}: {exc.message}"))
                continue
        event_id = event.event_id
        if event_id in line_of:
            if mismatch:  # a tampered copy of an event the input already holds
                issues.append(_superseded(line, event_id, line_of[event_id]))
                continue
            if event_id not in redacted:
                # Persisting twice is a no-op online too; the report still names the line.
                reason = f"same event as line {line_of[event_id]}"
                issues.append(LineIssue(line, "duplicate", reason, event_id))
                continue
            # A genuine copy beats a redacted one whatever the order of the lines.
            issues.append(_superseded(redacted.pop(event_id), event_id, line))
        elif mismatch:
            redacted[event_id] = line
        line_of[event_id] = line
        events[event_id] = event
    issues.extend(
        LineIssue(
            line,
            "redacted",
            f"M_BAD_JSON: the content hash of {event_id} does not match its content;"
            " stored in its redacted form",
            event_id,
        )
        for event_id, line in redacted.items()
    )
    ordered = room_order(list(events.values()))
    size = max(1, settings.chunk_events)
    done: list[PersistedEvent] = []
    for start in range(0, len(ordered), size):
        results = await persister.persist_events(
            ordered[start : start + size], backfilled=settings.backfill
        )
        done.extend(results)
        for result in results:
            if result.new and result.rejected_reason is not None:
                issues.append(
                    LineIssue(
                        line_of[result.event_id],
                        "rejected",
                        result.rejected_reason,
                        result.event_id,
                    )
                )
        if progress is not None:
            progress.events += min(size, len(ordered) - start)
            progress.update()
    return done


def _counts_txn(txn: Transaction) -> tuple[list[str], int, int, int, int, int, int, int]:
    row = txn.query_one(
        "SELECT COUNT(*), COALESCE(MAX(ABS(stream_ordering)), 0),"
        " COALESCE(SUM(CASE WHEN rejected_reason IS NULL THEN 0 ELSE 1 END), 0),"
        " COALESCE(SUM(soft_failed), 0), COALESCE(SUM(outlier), 0) FROM events"
    )
    rooms = [r[0] for r in txn.query("SELECT DISTINCT room_id FROM events ORDER BY room_id")]
    groups = txn.query_one("SELECT COUNT(*), COALESCE(MAX(state_group), 0) FROM state_groups")
    branches = txn.query_one("SELECT COUNT(*), COALESCE(MAX(branch_id), 0) FROM state_branches")
    if int(groups[0]) != int(groups[1]) or int(branches[0]) != int(branches[1]):
        raise RuntimeError("part database: state group / branch IDs are not 1..n")
    return (
        rooms,
        int(row[0]),
        int(row[1]),
        int(row[2]),
        int(row[3]),
        int(row[4]),
        int(groups[0]),
        int(branches[0]),
    )


def _scratch_pragmas(db: Database) -> None:
    """A part database is scratch space: no fsync, rollback journal in memory.

    Durability is not needed (a failed task is retried from scratch); atomicity of each
    persist transaction still is, and the in-memory journal keeps it.
    """
    conn = db.engine.acquire()
    try:
        conn.execute("PRAGMA journal_mode=MEMORY")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA cache_size=-262144")
    finally:
        db.engine.release(conn)


async def persist_rooms(
    path: str,
    rooms: dict[str, list[tuple[int, bytes]]],
    settings: TaskSettings,
    progress_path: str | None = None,
) -> PartResult:
    """Persist ``rooms`` (room ID -> lines) into a new SQLite database at ``path``."""
    started = time.perf_counter()
    result = PartResult(index=-1, path=path)
    progress = _Progress(progress_path or path + ".progress")
    # The part database is this task's alone: no worker-thread hop per interaction.
    db: Database = connect(DatabaseConfig(engine="sqlite", path=path), inline=True)
    # Nothing else runs on this loop: long computations yield without pausing.
    set_pause(0.0)
    try:
        _scratch_pragmas(db)
        await prepare_database(db)
        writers = {name: (settings.instance_name,) for name in STREAMS}
        streams = await StreamSet.open(db, settings.instance_name, writers)
        # The read side's records, written as online (the loader copies them): visibility
        # and relations. Not the search index: the loader cannot copy an FTS5 table into
        # PostgreSQL's tsvector, so the part lists its rooms for the index rebuild
        # (roomstream.reading.index_backfill), which the import runs after the load.
        persister = EventPersister(
            EventStore(db),
            streams,
            settings.instance_name,
            server_name=settings.server_name,
            participants=(VisibilityRecorder(), RelationsRecorder()),
        )
        # Several rooms in flight: the persister's group commit then writes many rooms'
        # events per transaction (small rooms otherwise cost a commit each). The order
        # is still deterministic: one thread, rooms admitted in sorted order.
        window = asyncio.Semaphore(max(1, settings.rooms_in_flight))

        async def one_room(room_id: str) -> None:
            rows = sorted(rooms[room_id])
            result.lines += len(rows)
            if room_id == NO_ROOM:
                result.issues.extend(
                    LineIssue(line, "invalid", _bad_line_reason(raw)) for line, raw in rows
                )
                return
            async with window:
                await persist_room(persister, room_id, rows, settings, result.issues, progress)
            progress.rooms += 1
            progress.update()

        await asyncio.gather(*(one_room(room_id) for room_id in sorted(rooms)))
        await db.run_interaction(
            "import_list_rooms", list_rooms_txn, sorted(r for r in rooms if r != NO_ROOM)
        )
        (
            result.rooms,
            result.events,
            highest,
            result.rejected,
            result.soft_failed,
            result.outliers,
            result.state_groups,
            result.branches,
        ) = await db.run_interaction("import_part_counts", _counts_txn)
        if highest != result.events:
            raise RuntimeError(f"part database {path}: stream orderings are not 1..n")
    finally:
        await db.close()
    progress.update(force=True)
    result.issues.sort(key=lambda i: i.line)
    result.seconds = time.perf_counter() - started
    return result


def write_existing(path: str, rows: Iterable[tuple[int, bytes]]) -> None:
    """Write lines of rooms the target already has as ``LINE<TAB>RAW`` lines."""
    with open(path, "wb") as f:
        for line, raw in rows:
            f.write(b"%d\t%s\n" % (line, raw))


def read_existing(path: str) -> Iterator[tuple[int, bytes]]:
    """The (line number, raw line) pairs :func:`write_existing` wrote."""
    with open(path, "rb") as f:
        for record in f:
            line, _, raw = record.rstrip(b"\n").partition(b"\t")
            yield int(line), raw


def persist_partition(
    index: int,
    rows: Iterable[tuple[str, tuple[LinePosition, bytes]]],
    settings: TaskSettings,
    offsets: Broadcast[dict[int, int]],
    existing: Broadcast[frozenset[str]] | None = None,
) -> Iterator[PartResult]:
    """The Spark task: number the partition's lines, group them by room, persist them.

    Rooms in ``existing`` (the target has them) are not persisted: their lines go to a
    file for the driver (``existing_path``). Yields exactly one :class:`PartResult`; a
    partition with no new room creates no database (``path`` is empty).
    """
    rooms: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    known = existing.value if existing is not None else frozenset()
    later: list[tuple[int, bytes]] = []
    for room_id, (line, raw) in number_lines(rows, offsets.value):
        if not raw.strip():
            continue
        if room_id in known:
            later.append((line, bytes(raw)))
        else:
            rooms[room_id].append((line, bytes(raw)))
    existing_path = ""
    if later:
        existing_path = os.path.join(settings.work_dir, f"part-{index:05d}.existing")
        write_existing(existing_path, later)
    if not rooms:
        yield PartResult(index=index, path="", lines=len(later), existing_path=existing_path)
        return
    path = os.path.join(settings.work_dir, f"part-{index:05d}.db")
    for stale in (path, path + "-wal", path + "-shm"):
        if os.path.exists(stale):  # a retried task starts afresh
            os.remove(stale)
    result = asyncio.run(persist_rooms(path, rooms, settings, path + ".progress"))
    result.index = index
    result.lines += len(later)
    result.existing_path = existing_path
    yield result
