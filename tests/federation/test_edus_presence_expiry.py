"""Remote presence goes offline when the remote server stops telling us (Synapse's 30
minutes): the rule alone, and after an EDU, a local user's /sync sees the remote user go
offline once the sweep runs past the timeout (and not before). Both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roomstream.client.presence import OFFLINE, ONLINE, UserPresence
from roomstream.federation.remote_presence import (
    FEDERATION_PRESENCE_TIMEOUT_MS,
    RemotePresenceExpiry,
    expired_remote_states,
)
from roomstream.storage import DatabaseConfig
from tests.federation.edus_support import BOB, REMOTE, Scene, scene
from tests.support.client import sync

NOW = 1_800_000_000_000
LIMIT = FEDERATION_PRESENCE_TIMEOUT_MS


@pytest.fixture
async def s(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Scene]:
    async for one in scene(db_config, tmp_path):
        yield one


def test_only_remote_users_silent_too_long_expire() -> None:
    states = [
        UserPresence(BOB, ONLINE, NOW - 10, NOW - LIMIT, 0, "away soon", True),
        UserPresence(f"@carol:{REMOTE}", ONLINE, 0, NOW - LIMIT + 1),
        UserPresence(f"@dan:{REMOTE}", OFFLINE, 0, 0),
        UserPresence("@alice:local.test", ONLINE, 0, 0),
        UserPresence("not a user", ONLINE, 0, 0),
    ]
    (expired,) = expired_remote_states(states, "local.test", NOW)
    assert expired == UserPresence(BOB, OFFLINE, NOW - 10, NOW - LIMIT, 0, "away soon", False)


async def test_a_silent_remote_user_goes_offline_for_local_syncs(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    push = {"push": [{"user_id": BOB, "presence": "online", "currently_active": True}]}
    await s.edus.on_edu(REMOTE, "m.presence", push)
    first = await sync(hs, alice)
    assert [
        e["content"]["presence"] for e in first["presence"]["events"] if e["sender"] == BOB
    ] == ["online"]
    expiry = RemotePresenceExpiry.for_client_process(hs.process)
    assert expiry is not None
    stored = (await hs.process.presence.store.current([BOB]))[BOB]
    clock = [stored.last_federation_update_ts + LIMIT - 1]
    expiry._clock = lambda: clock[0]
    assert await expiry.sweep() == []
    clock[0] += 1
    assert [p.user_id for p in await expiry.sweep()] == [BOB]
    later = await sync(hs, alice, since=first["next_batch"])
    (event,) = [e for e in later["presence"]["events"] if e["sender"] == BOB]
    assert event["content"]["presence"] == "offline"
    assert await expiry.sweep() == []  # nothing left to expire
