"""A room whose merge costs seconds of CPU, and a quiet room whose sends are timed while
it merges: the scenario of "one room never stalls the others" (Synapse #16633), shared by
``tests/rooms/test_independence.py`` and ``bench/bench_independence.py``.

The slow room forks into two branches of power levels changes: branch A is persisted as
ordinary history, branch B as backfill (so it never touches the room's current state),
then one event lists both tips as prev events. Its state before is a full state
resolution over every power levels event of both branches (see :func:`build_slow_merge`):
seconds of CPU in one ``persist_events`` call.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from signedjson.types import SigningKey

from roomstream.events.model import Event
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.rooms.persist import EventPersister
from tests.support.rooms import remote_event

ALICE = "@alice:local.test"
#: Longest wait for an announcement (a bound for a broken build, never reached otherwise).
WAIT_SECONDS = 120.0


@dataclass
class SlowMerge:
    room_id: str
    merge: Event


async def build_slow_merge(
    engine: RoomEngine, remote_key: SigningKey, branch_events: int, users: int = 1_500
) -> SlowMerge:
    """Persist the slow room up to (not including) its merge event, and return that.

    Each branch is ``branch_events`` power levels changes by the room's creator, each
    listing ``users`` users: the merge resolves the power levels over every one of them
    (they are all in the auth chain difference), and an auth check of a power levels
    change compares the whole ``users`` map, so the merge costs about
    ``2 * branch_events * users`` steps while building the room costs about
    ``2 * branch_events`` events.
    """
    room_id, _ = await engine.creator.create_room(
        ALICE, version="11", preset=RoomPreset.PUBLIC_CHAT
    )
    version, extremities, current = await engine.persister.get_room_state(room_id)
    (base,) = extremities
    base_depth = (await engine.persister.get_events([base]))[base].depth
    create = current[("m.room.create", "")]
    member = current[("m.room.member", ALICE)]
    levels_at_base = current[("m.room.power_levels", "")]
    listed = {f"@user{i:05d}:remote.test": 50 for i in range(users)}

    def branch(name: str) -> list[Event]:
        events: list[Event] = []
        for i in range(branch_events):
            previous = events[-1].event_id if events else base
            levels = events[-1].event_id if events else levels_at_base
            content = {"users": {**listed, ALICE: 100, f"@{name}{i}:remote.test": 10}}
            events.append(
                remote_event(
                    remote_key,
                    version,
                    room_id,
                    ALICE,
                    "m.room.power_levels",
                    content,
                    [previous],
                    [create, levels, member],
                    base_depth + i + 1,
                    state_key="",
                )
            )
        return events

    first, second = branch("a"), branch("b")
    await engine.persister.persist_events(first)
    await engine.persister.persist_events(second, backfilled=True)
    merge = remote_event(
        remote_key,
        version,
        room_id,
        ALICE,
        "m.room.message",
        {"msgtype": "m.text", "body": "merge"},
        sorted([first[-1].event_id, second[-1].event_id]),
        [create, first[-1].event_id, member],
        base_depth + branch_events + 1,
    )
    return SlowMerge(room_id, merge)


def signalling_resolve(persister: EventPersister, resolving: asyncio.Event) -> Any:
    """``persister._resolve`` wrapped to set ``resolving`` as a state resolution starts:
    install it in the persister's place to know when a merge is inside its resolution."""
    resolve = persister._resolve

    async def traced_resolve(*args: Any, **kwargs: Any) -> Any:
        resolving.set()
        return await resolve(*args, **kwargs)

    return traced_resolve


@dataclass
class Send:
    """One timed send: when it was called, returned, and its position announced."""

    started: float
    returned: float
    announced: float
    stream_ordering: int

    @property
    def latency(self) -> float:
        """From the call to the announcement of its position on the events stream."""
        return self.announced - self.started


class Announcements:
    """Records when each position of the local ``events`` writer is announced (what the
    replication writer sends as ``POSITION``/``RDATA``), and waits for one."""

    def __init__(self, engine: RoomEngine) -> None:
        self.position = 0
        self.seen: list[tuple[float, int]] = []
        self._changed = asyncio.Event()
        engine.streams.generator("events").add_position_listener(self._on_position)

    def _on_position(self, instance: str, position: int) -> None:
        self.seen.append((time.perf_counter(), position))
        self.position = max(self.position, position)
        self._changed.set()

    async def wait_for(self, position: int) -> float:
        """The time ``position`` was announced (waiting for it, bounded)."""
        async with asyncio.timeout(WAIT_SECONDS):
            while self.position < position:
                self._changed.clear()
                await self._changed.wait()
        return next(t for t, p in self.seen if p >= position)


async def timed_sends(
    engine: RoomEngine, room_id: str, count: int, announcements: Announcements
) -> list[Send]:
    """``count`` messages into ``room_id``, one after another, each timed."""
    sends: list[Send] = []
    for i in range(count):
        content: dict[str, Any] = {"msgtype": "m.text", "body": f"quiet {i}"}
        started = time.perf_counter()
        created = await engine.creator.create_event(room_id, ALICE, "m.room.message", content)
        returned = time.perf_counter()
        announced = await announcements.wait_for(created.stream_ordering)
        sends.append(Send(started, returned, announced, created.stream_ordering))
    return sends
