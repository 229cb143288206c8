"""State group lineage: the keys it names cover every difference, and persisting with it
gives the same states as comparing whole states."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.devtools.corpus import CorpusSpec, generate_corpus
from roomstream.events.model import StateKey
from roomstream.pipelines.import_task import TaskSettings, key_line, persist_rooms
from roomstream.rooms import persist
from roomstream.rooms.keys import load_keys_file
from roomstream.rooms.persist import GroupRef, PendingGroup, _changed_keys
from roomstream.rooms.store import state_groups_txn
from roomstream.state.groups import get_state_txn
from roomstream.storage import DatabaseConfig, Transaction, connect

KEYS: list[StateKey] = [("m.room.member", f"@u{i}") for i in range(6)] + [
    ("m.room.power_levels", ""),
    ("m.room.topic", ""),
]

# One step of a random group tree: (parent pick, {key index: value or None}, stored?).
steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10_000),
        st.dictionaries(
            st.integers(min_value=0, max_value=len(KEYS) - 1),
            st.one_of(st.none(), st.sampled_from(["$a", "$b", "$c"])),
            max_size=3,
        ),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


def differing_keys(states: list[dict[StateKey, str]]) -> set[StateKey]:
    keys = set().union(*(s.keys() for s in states))
    return {k for k in keys if len({s.get(k) for s in states}) > 1}


@settings(max_examples=300, deadline=None)
@given(steps, st.lists(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=4))
def test_changed_keys_cover_every_difference(
    script: list[tuple[int, dict[int, str | None], bool]], picks: list[int]
) -> None:
    """Groups are built as parent + delta (stored ones get IDs, as after a commit); for any
    refs whose lineages meet, every key their states differ on is named."""
    original_keep = persist.LINEAGE_KEEP
    persist.LINEAGE_KEEP = 4  # trim often, so walks hit trimmed lineages too
    try:
        refs: list[GroupRef] = [None]
        states: list[dict[StateKey, str]] = [{}]
        next_id = 1
        for parent_pick, delta_spec, stored in script:
            parent_index = parent_pick % len(refs)
            parent_state = states[parent_index]
            delta = {KEYS[k]: v for k, v in delta_spec.items()}
            state = {k: v for k, v in {**parent_state, **delta}.items() if v is not None}
            group = PendingGroup(refs[parent_index], delta, parent_state, state)
            if stored:
                group.group_id = next_id
                next_id += 1
            refs.append(group)
            states.append(state)
        chosen = [p % len(refs) for p in picks]
        keys = _changed_keys([refs[i] for i in chosen])
        if keys is not None:
            assert differing_keys([states[i] for i in chosen]) <= keys
        # Untrimmed lineage always meets: every group descends from the empty state.
        if len(script) < persist.LINEAGE_KEEP:
            assert keys is not None
    finally:
        persist.LINEAGE_KEEP = original_keep


def _states_txn(txn: Transaction) -> dict[str, tuple[dict[Any, str], dict[Any, str]]]:
    event_ids = [r[0] for r in txn.query("SELECT event_id FROM events")]
    return {
        event_id: (get_state_txn(txn, before), get_state_txn(txn, after))
        for event_id, (before, after) in state_groups_txn(txn, event_ids).items()
    }


def _persist_corpus(path: Path, db_path: Path) -> dict[str, tuple[dict[Any, str], dict[Any, str]]]:
    rooms: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    with path.open("rb") as f:
        for index, raw in enumerate(f):
            room, row = key_line((raw.rstrip(b"\n"), index))
            rooms[room].append(row)
    settings = TaskSettings(
        source=str(path),
        work_dir=str(db_path.parent),
        instance_name="main",
        verify_keys=load_keys_file(f"{path}.keys.json"),
    )
    # Small chunks: merges then meet lineage that crosses committed batches.
    settings = TaskSettings(**{**settings.__dict__, "chunk_events": 37})
    asyncio.run(persist_rooms(str(db_path), dict(rooms), settings))
    db = connect(DatabaseConfig(engine="sqlite", path=str(db_path)))
    try:
        return db.run_interaction_blocking("states", _states_txn)
    finally:
        db.close_blocking()


def test_merges_with_lineage_equal_whole_state_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked corpus persisted with lineage-named keys and with whole-state comparison
    (lineage disabled) has the same state before and after every event."""
    corpus = tmp_path / "corpus.jsonl"
    stats = generate_corpus(
        corpus, CorpusSpec(events=3_000, seed=7, fork_rate=0.15, min_room_events=200), workers=1
    )
    assert stats.forks > 50  # merges happen
    with_lineage = _persist_corpus(corpus, tmp_path / "lineage.db")
    monkeypatch.setattr(persist, "_changed_keys", lambda refs: None)
    without = _persist_corpus(corpus, tmp_path / "whole.db")
    assert len(with_lineage) > 2_500
    assert with_lineage == without
