"""The corpus generator: deterministic, shuffled, heavy-tailed, with forks, rejections,
mixed room versions and (on request) malformed lines; its events pass the online path as
intended."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from roomstream.devtools.corpus import CorpusSpec, CorpusStats, generate_corpus
from roomstream.errors import BadEventError
from roomstream.events.format import parse_pdu
from roomstream.events.model import Event
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, room_version
from roomstream.events.signing import check_event_signatures
from roomstream.pipelines.import_task import key_line
from roomstream.rooms.keys import load_keys_file, verify_keys_of
from roomstream.rooms.persist import EventPersister
from roomstream.rooms.store import EventStore
from roomstream.storage import DatabaseConfig, connect, prepare_database
from roomstream.streams import StreamSet

SPEC = CorpusSpec(events=3000, seed=11, fork_rate=0.06, reject_rate=0.03, malformed=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CorpusStats]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    return path, generate_corpus(path, SPEC, workers=2)


def _events(path: Path) -> dict[str, list[Event]]:
    """Well-formed events by room, parsed as a receiver would."""
    rows: dict[str, list[bytes]] = defaultdict(list)
    for index, raw in enumerate(path.read_bytes().splitlines()):
        room, (_, raw) = key_line((raw, index))
        rows[room].append(raw)
    rooms: dict[str, list[Event]] = {}
    for room, raws in rows.items():
        creates = [orjson.loads(r) for r in raws if b'"m.room.create"' in r]
        versions = [
            c["content"]["room_version"] for c in creates if c.get("type") == "m.room.create"
        ]
        if not room or not versions:
            continue
        version = room_version(versions[0])
        events = []
        for raw in raws:
            try:
                events.append(parse_pdu(raw, version))
            except BadEventError:
                continue
        rooms[room] = events
    return rooms


def test_deterministic_and_independent_of_workers(tmp_path: Path) -> None:
    spec = CorpusSpec(events=600, seed=5, malformed=2)
    one = generate_corpus(tmp_path / "a.jsonl", spec, workers=1)
    two = generate_corpus(tmp_path / "b.jsonl", spec, workers=2)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert one.intended_rejections == two.intended_rejections
    other = generate_corpus(tmp_path / "c.jsonl", CorpusSpec(events=600, seed=6), workers=1)
    assert (tmp_path / "c.jsonl").read_bytes() != (tmp_path / "a.jsonl").read_bytes()
    assert other.events == 600


def test_shape_sizes_versions_forks_and_shuffling(corpus: tuple[Path, CorpusStats]) -> None:
    path, stats = corpus
    lines = path.read_bytes().splitlines()
    assert stats.events == SPEC.events and len(lines) == SPEC.events + SPEC.malformed
    assert sum(stats.room_sizes) == SPEC.events
    # Heavy tail: the largest rooms are many times the typical one.
    sizes = sorted(stats.room_sizes)
    assert sizes[-1] >= 8 * statistics.median(sizes)
    assert set(stats.versions) == {"10", "11", "12"}
    rooms = _events(path)
    assert len(rooms) == stats.rooms
    forks = merges = 0
    for events in rooms.values():
        children: dict[str, int] = defaultdict(int)
        for event in events:
            for prev in event.prev_event_ids:
                children[prev] += 1
            merges += len(event.prev_event_ids) > 1
        forks += sum(1 for n in children.values() if n > 1)
    assert forks >= stats.forks > 10 and merges >= 10
    # Shuffled: some event comes before one of its prev events in the file.
    by_raw = {e.raw: e for events in rooms.values() for e in events}
    order = {by_raw[raw].event_id: i for i, raw in enumerate(lines) if raw in by_raw}
    assert any(
        order[p] > order[e.event_id]
        for e in by_raw.values()
        for p in e.prev_event_ids
        if p in order
    )


def test_malformed_lines_are_where_the_stats_say(corpus: tuple[Path, CorpusStats]) -> None:
    path, stats = corpus
    lines = path.read_bytes().splitlines()
    assert len(stats.malformed_lines) == SPEC.malformed
    for number in stats.malformed_lines:
        for version in KNOWN_ROOM_VERSIONS.values():
            with pytest.raises(BadEventError):
                parse_pdu(lines[number - 1], version)


async def test_online_path_rejects_and_soft_fails_exactly_the_intended_events(
    corpus: tuple[Path, CorpusStats], tmp_path: Path
) -> None:
    path, stats = corpus
    db = connect(DatabaseConfig(engine="sqlite", path=str(tmp_path / "online.db")))
    try:
        await prepare_database(db)
        streams = await StreamSet.open(db, "main", {})
        persister = EventPersister(EventStore(db), streams, "main", server_name=None)
        rejected: set[str] = set()
        soft_failed: set[str] = set()
        for events in _events(path).values():
            for result in await persister.persist_events(events):
                if result.rejected_reason is not None:
                    rejected.add(result.event_id)
                if result.soft_failed:
                    soft_failed.add(result.event_id)
                assert not result.outlier
        assert rejected == set(stats.intended_rejections)
        assert len(rejected) >= 20
        # Messages of members banned on a concurrent branch: soft-failed, and only they.
        assert soft_failed == set(stats.intended_soft_failures)
        assert len(soft_failed) >= 5
    finally:
        await db.close()


def test_every_event_is_signed_by_keys_written_next_to_the_corpus(
    corpus: tuple[Path, CorpusStats],
) -> None:
    """An import of a generated corpus can check every signature: the generator writes the
    verify keys of its servers as ``<path>.keys.json``."""
    path, stats = corpus
    keys = verify_keys_of(load_keys_file(f"{path}.keys.json"))
    checked = 0
    for events in _events(path).values():
        for event in events:
            check_event_signatures(event, keys)
            checked += 1
    assert checked == stats.events
