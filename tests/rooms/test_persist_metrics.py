"""Events persisted are counted by room version and outcome, and persisting is timed."""

from __future__ import annotations

from prometheus_client import REGISTRY
from signedjson.types import SigningKey

from roomstream.rooms.engine import RoomEngine
from tests.support.rooms import ALICE, BOB, public_room, remote_event, remote_join


def _count(outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "roomstream_events_persisted_total", {"room_version": "12", "outcome": outcome}
    )
    return value or 0.0


def _snapshot() -> dict[str, float]:
    counts = {o: _count(o) for o in ("accepted", "rejected", "soft_failed")}
    counts["timed"] = REGISTRY.get_sample_value("roomstream_persist_seconds_count") or 0.0
    return counts


async def test_outcomes_are_counted(engine: RoomEngine, remote_key: SigningKey) -> None:
    room_id = await public_room(engine)
    join, version, current = await remote_join(engine, remote_key, room_id)
    pl = current[("m.room.power_levels", "")]
    before = _snapshot()
    # Before Bob's join is in the DAG: rejected by its own auth events.
    early = remote_event(
        remote_key, version, room_id, BOB, "m.room.message", {"body": "too soon"},
        join.prev_event_ids, [pl], depth=10,
    )  # fmt: skip
    await engine.persister.persist_events([join, early])
    after_join = _snapshot()
    assert after_join["accepted"] - before["accepted"] == 1
    assert after_join["rejected"] - before["rejected"] == 1
    assert after_join["timed"] - before["timed"] == 1  # one batch, one observation
    await engine.creator.create_event(
        room_id, ALICE, "m.room.member", {"membership": "ban"}, state_key=BOB
    )
    late = remote_event(
        remote_key, version, room_id, BOB, "m.room.message", {"body": "am I banned?"},
        [join.event_id], [pl, join.event_id], depth=11,
    )  # fmt: skip
    (result,) = await engine.persister.persist_events([late])
    assert result.soft_failed
    after = _snapshot()
    assert after["accepted"] - after_join["accepted"] == 1  # the ban
    assert after["soft_failed"] - after_join["soft_failed"] == 1
    assert after["rejected"] == after_join["rejected"]
    assert after["timed"] - after_join["timed"] == 2  # the ban, then Bob's message
    # Persisting the same events again stores nothing new and counts nothing.
    await engine.persister.persist_events([join, early, late])
    assert _snapshot()["accepted"] == after["accepted"]
