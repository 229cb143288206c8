"""Backfill on demand (``federation/backfill.py``, ``client/remote_history.py``) with a
fake outbound client: where the room's stored history starts (backward extremities),
no request without one, a server down (nothing stored, the page served as it is), what
a ``/backfill`` answer becomes (backfilled events with state, negative stream orderings,
no change to the room's extremities), and a fruitless extremity asked about once.
Both engines."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from signedjson.types import SigningKey

from roomstream.client.remote_history import fetch_older_history
from roomstream.errors import FederationUnreachableError
from roomstream.events.model import Event
from roomstream.federation.backfill import FederationBackfill
from roomstream.federation.gaps import GapFiller
from roomstream.rooms.engine import RoomEngine
from tests.support.federation import FakeFederationClient, joined_room, remote_member_event
from tests.support.federation import engine as engine  # fixture
from tests.support.federation import remote_key as remote_key  # fixture
from tests.support.rooms import REMOTE
from tests.support.wait import wait_for

CAROL = "@carol:remote.test"


@dataclass
class BackfillingClient(FakeFederationClient):
    """The fake remote also answering ``/backfill`` (newest first, as servers do)."""

    backfill: list[Event] = field(default_factory=list)
    #: Every request fails as an unreachable server's would.
    down: bool = False
    #: Answered as ``pdus`` instead of ``backfill`` (a bad answer).
    raw_pdus: list[Any] | None = None
    #: When set, ``/backfill`` answers only once it is set.
    hold: asyncio.Event | None = None

    async def request(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: Mapping[str, str | Sequence[str]] | None = None,
        content: object | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 (the interface's)
    ) -> Any:
        if self.down:
            self.requests.append((method, destination, path))
            raise FederationUnreachableError(destination, "connection refused")
        if "/backfill/" in path:
            self.requests.append((method, destination, path))
            self.contents.append(dict(query or {}))
            if self.hold is not None:
                await self.hold.wait()
            pdus = self.raw_pdus
            if pdus is None:
                pdus = [dict(e.data) for e in self.backfill]
            return {"origin": REMOTE, "origin_server_ts": 1, "pdus": pdus}
        return await super().request(
            method, destination, path, query=query, content=content, timeout=timeout
        )


@dataclass
class GapRoom:
    room_id: str
    carol_join: Event
    m1: Event
    m2: Event
    m3: Event
    after_join: dict[tuple[str, str], str]


async def gap_room(engine: RoomEngine, key: SigningKey, client: BackfillingClient) -> GapRoom:
    """A room where the remote server's Carol joined and said m1, m2, m3; this server
    received only m3 and, at the gap, the state after m2 (m2 and Carol's join stored as
    outliers): m3 is the lowest event of its branch, m2 a backward extremity."""
    room_id = await joined_room(engine, key)
    before_carol = await engine.store.get_current_state(room_id)
    carol_join = await remote_member_event(
        engine, key, room_id, CAROL, "m.room.member", {"membership": "join"}, state_key=CAROL
    )
    after_join = dict(before_carol)
    after_join[("m.room.member", CAROL)] = carol_join.event_id
    chain: list[Event] = []
    prev = carol_join
    for body in ("m1", "m2", "m3"):
        prev = await remote_member_event(
            engine,
            key,
            room_id,
            CAROL,
            "m.room.message",
            {"msgtype": "m.text", "body": body},
            prev_events=[prev.event_id],
            depth=prev.depth + 1,
            auth_state=after_join,
        )
        chain.append(prev)
    m1, m2, m3 = chain
    client.add(carol_join, m1, m2, *(await engine.store.get_events(before_carol.values())).values())
    client.states[carol_join.event_id] = sorted(before_carol.values())
    client.states[m1.event_id] = sorted(after_join.values())
    client.states[m2.event_id] = sorted(after_join.values())
    client.missing = []
    await GapFiller(engine, client).receive_with_gap(REMOTE, m3)
    client.requests.clear()
    client.contents.clear()
    return GapRoom(room_id, carol_join, m1, m2, m3, after_join)


async def test_no_backward_extremities_no_request(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    room_id = await joined_room(engine, remote_key)
    client = BackfillingClient()
    backfill = FederationBackfill(engine, client)
    assert await backfill.backward_extremities(room_id) == []
    assert await backfill.backfill(room_id, 10) == 0
    assert client.requests == []


async def test_the_missing_prev_event_of_the_lowest_event_is_an_extremity(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    backfill = FederationBackfill(engine, client)
    # m2 is stored, but as an outlier (no state): history resumes below it.
    assert await backfill.backward_extremities(room.room_id) == [room.m2.event_id]
    # Only other servers are asked; the room's creator is local.
    assert await backfill.servers_to_ask(room.room_id) == [REMOTE]


async def test_a_server_down_stores_nothing_and_is_asked_again_later(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    client.down = True
    backfill = FederationBackfill(engine, client)
    assert await backfill.backfill(room.room_id, 10) == 0
    assert [(m, d) for m, d, _ in client.requests] == [("GET", REMOTE)]
    assert (await engine.store.get_meta([room.m1.event_id])) == {}
    # Down is not "nothing older there": the next page asks again.
    assert await backfill.backfill(room.room_id, 10) == 0
    assert len(client.requests) == 2
    assert await backfill.backward_extremities(room.room_id) == [room.m2.event_id]


async def test_a_backfilled_chunk_is_stored_with_state_below_the_room(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    extremities = sorted(await engine.store.get_forward_extremities(room.room_id))
    current = await engine.store.get_current_state(room.room_id)
    client.backfill = [room.m2, room.m1]  # m1's prev event (Carol's join) not among them
    backfill = FederationBackfill(engine, client)
    assert await backfill.backfill(room.room_id, 5) == 1
    paths = [p for _, _, p in client.requests]
    assert "/backfill/" in paths[0]
    assert client.contents[0] == {"v": [room.m2.event_id], "limit": "5"}
    # m1 needed the state after Carol's join: asked for, from the same server.
    assert any("/state_ids/" in p for p in paths[1:])
    meta = await engine.store.get_meta([room.m1.event_id, room.m2.event_id])
    # m1 is in the timeline as history (negative stream ordering), with the state the
    # remote vouched for; m2, an outlier until now, is decided again with state.
    assert not meta[room.m1.event_id].outlier
    assert meta[room.m1.event_id].rejected_reason is None
    assert meta[room.m1.event_id].stream_ordering < 0
    assert await engine.store.get_state_at(room.m1.event_id, before=True) == room.after_join
    assert not meta[room.m2.event_id].outlier
    # History changes neither the room's extremities nor its current state.
    assert sorted(await engine.store.get_forward_extremities(room.room_id)) == extremities
    assert await engine.store.get_current_state(room.room_id) == current
    # The room's stored history now starts below m1.
    assert await backfill.backward_extremities(room.room_id) == [room.carol_join.event_id]


async def test_an_extremity_with_nothing_older_is_asked_about_once(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    client.backfill = [room.m2]  # already stored: nothing new
    backfill = FederationBackfill(engine, client)
    assert await backfill.backfill(room.room_id, 10) == 0
    assert len(client.requests) == 1
    assert await backfill.backfill(room.room_id, 10) == 0
    assert len(client.requests) == 1
    assert await backfill.backward_extremities(room.room_id) == []


async def test_a_bad_backfill_answer_stores_nothing(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    forged = dict(room.m1.data)
    forged["content"] = {"msgtype": "m.text", "body": "forged"}
    forged["hashes"] = {"sha256": "AAAA"}
    forged["signatures"] = {}
    client.raw_pdus = [forged, "x", 3, {**dict(room.m1.data), "room_id": "!other:x"}]
    backfill = FederationBackfill(engine, client)
    assert await backfill.backfill(room.room_id, 10) == 0
    assert (await engine.store.get_meta([room.m1.event_id])) == {}


async def test_concurrent_pages_share_one_backfill(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    client.backfill = [room.m2, room.m1]
    client.hold = asyncio.Event()
    backfill = FederationBackfill(engine, client)
    first = asyncio.create_task(backfill.backfill(room.room_id, 5))
    await wait_for(lambda: _asked_backfill(client), 10, "the first /backfill")
    # (Scheduled before the answer is let go: the loop runs it first, so it finds the
    # first backfill under way.)
    second = asyncio.create_task(backfill.backfill(room.room_id, 5))
    client.hold.set()
    assert await first == 1
    assert await second == 1
    assert sum("/backfill/" in p for _, _, p in client.requests) == 1


async def _asked_backfill(client: BackfillingClient) -> bool:
    return any("/backfill/" in p for _, _, p in client.requests)


class _FailingHistory:
    async def backfill(self, room_id: str, limit: int) -> int:
        raise FederationUnreachableError("remote.test", "connection refused")


class _HangingHistory:
    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def backfill(self, room_id: str, limit: int) -> int:
        await self.never.wait()
        return 1


@pytest.mark.parametrize("history", [_FailingHistory(), _HangingHistory()])
async def test_the_page_is_served_whatever_other_servers_do(history: Any) -> None:
    # (No engine needed: the client layer's wrapper alone.)
    assert await fetch_older_history(history, "!r:x", 10, timeout=0.2) is False


async def test_the_wrapper_says_when_history_arrived(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    client.backfill = [room.m2, room.m1, room.carol_join]
    backfill = FederationBackfill(engine, client)
    assert await fetch_older_history(backfill, room.room_id, 3) is True
    meta = await engine.store.get_meta([room.carol_join.event_id, room.m1.event_id])
    # Carol's join, stored as an outlier at the gap (the state after m2) and answered
    # again, is decided again: history too, like m1.
    for event in (room.carol_join, room.m1):
        assert not meta[event.event_id].outlier
        assert meta[event.event_id].rejected_reason is None
        assert meta[event.event_id].stream_ordering < 0
    # Below Carol's join, the room's own timeline: history is complete.
    assert await backfill.backward_extremities(room.room_id) == []


async def test_redecide_only_turns_outliers_with_state_into_history(
    engine: RoomEngine, remote_key: SigningKey
) -> None:
    """The persister's ``redecide`` (what backfill uses for answered outliers)."""
    client = BackfillingClient()
    room = await gap_room(engine, remote_key, client)
    ids = [room.carol_join.event_id, room.m2.event_id, room.m3.event_id]
    stored = await engine.store.get_events(ids)
    before = await engine.store.get_meta(ids)
    # m2's prev event (m1) is unknown: it stays as stored; m3 is in the timeline already:
    # never decided twice. Nothing to commit is no error.
    assert (
        await engine.receive_pdus(
            [], backfilled=True, redecide=[stored[room.m2.event_id], stored[room.m3.event_id]]
        )
        == []
    )
    assert await engine.store.get_meta(ids) == before
    # Carol's join follows a timeline event: decided again, as history, with its state.
    await engine.receive_pdus([], backfilled=True, redecide=[stored[room.carol_join.event_id]])
    after = await engine.store.get_meta(ids)
    assert not after[room.carol_join.event_id].outlier
    assert after[room.carol_join.event_id].stream_ordering < 0
    assert after[room.m2.event_id] == before[room.m2.event_id]
    state = await engine.store.get_state_at(room.carol_join.event_id)
    assert state == room.after_join
