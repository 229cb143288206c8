"""Which servers are in a room (federation.membership): exact server names from the
joined members of the current state, never a LIKE pattern's looser match (``_`` and
``%`` in a name, ASCII case, a server name that ends with another's), invites and
leaves not counting. Both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roomstream.federation.membership import RoomServers, server_of
from roomstream.storage import DatabaseConfig
from tests.federation.edus_support import REMOTE, Scene, join_remote, scene
from tests.support.client import room_with
from tests.support.homeserver import SERVER_NAME


@pytest.fixture
async def s(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Scene]:
    async for one in scene(db_config, tmp_path):
        yield one


def test_server_of() -> None:
    assert server_of("@a:b.test") == "b.test"
    assert server_of("@a:b.test:8448") == "b.test:8448"
    assert server_of("@a:[::1]:8448") == "[::1]:8448"
    for bad in ("a:b", "@ab", "", "#a:b", "!a:b"):
        assert server_of(bad) == ""


async def test_hosts_in_room_are_exact(s: Scene) -> None:
    hs = s.hs
    servers = RoomServers(hs.engine.db)
    room = await room_with(hs, s.alice)
    await join_remote(hs, room, "@c:axb.test")
    await join_remote(hs, room, "@d:x.remote.test")
    assert await servers.hosts_in_room(room) == sorted([SERVER_NAME, "axb.test", "x.remote.test"])
    assert await servers.is_host_in_room(room, "axb.test")
    for other in (
        "a_b.test",
        "AXB.TEST",
        "a%b.test",
        "a%",
        "%",
        "",
        "b.test",
        REMOTE,
        "remote.test",
    ):
        assert not await servers.is_host_in_room(room, other), other
    assert await servers.is_host_in_room(s.room_id, REMOTE)
    assert await servers.hosts_in_room("!unknown:x") == []


async def test_a_server_whose_users_left_is_not_in_the_room(s: Scene) -> None:
    hs = s.hs
    servers = RoomServers(hs.engine.db)
    assert await servers.is_host_in_room(s.room_id, SERVER_NAME)
    await hs.ok("POST", f"/rooms/{s.room_id}/leave", {}, token=s.alice.token)
    assert not await servers.is_host_in_room(s.room_id, SERVER_NAME)
    assert await servers.hosts_in_room(s.room_id) == [REMOTE]
