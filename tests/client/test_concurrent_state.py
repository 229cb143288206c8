"""Concurrent state events in one room (joins) through the write path, on both engines:
each is built on the state of the one before while that one may still be committing."""

from __future__ import annotations

import asyncio

from roomstream.rooms.creation import RoomPreset
from tests.support.homeserver import Homeserver


async def test_concurrent_joins_in_one_room(homeserver: Homeserver) -> None:
    creator = homeserver.engine.creator
    alice = "@alice:test.local"
    room_id, _ = await creator.create_room(alice, preset=RoomPreset.PUBLIC_CHAT)
    users = [f"@u{i}:test.local" for i in range(60)]
    await asyncio.gather(
        *(
            creator.create_event(room_id, u, "m.room.member", {"membership": "join"}, state_key=u)
            for u in users
        )
    )
    state = await homeserver.engine.store.get_current_state(room_id)
    assert {k for t, k in state if t == "m.room.member"} == {alice, *users}
