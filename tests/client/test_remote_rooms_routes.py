"""The Client-Server API's side of joining other servers' rooms: which servers it asks,
when it asks at all, and the answers clients get (federation itself is faked here: the
RemoteRooms interface is what the client layer depends on)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roomstream.errors import RemoteServerError
from tests.support.homeserver import Homeserver


class FakeRemote:
    def __init__(self) -> None:
        self.joins: list[tuple[str, str, list[str], dict[str, Any]]] = []
        self.aliases: dict[str, tuple[str, list[str]]] = {}
        self.fail: Exception | None = None

    async def resolve_alias(self, alias: str) -> tuple[str, list[str]]:
        return self.aliases[alias]

    async def join(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        if self.fail is not None:
            raise self.fail
        self.joins.append((user_id, room_id, list(servers), dict(content)))

    async def leave(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        raise AssertionError("not expected")

    async def knock(
        self, user_id: str, room_id: str, servers: Sequence[str], content: Mapping[str, Any]
    ) -> None:
        raise AssertionError("not expected")


def _remote(homeserver: Homeserver) -> FakeRemote:
    fake = FakeRemote()
    homeserver.process.rooms.remote = fake
    return fake


async def test_joining_an_unknown_room_asks_the_servers_given_then_the_room_ids(
    homeserver: Homeserver,
) -> None:
    fake = _remote(homeserver)
    user = await homeserver.register("alice")
    answer = await homeserver.ok(
        "POST",
        "/join/!room:c.test?via=a.test&server_name=b.test&via=test.local&via=a.test",
        {"reason": "hello"},
        token=user.token,
    )
    assert answer == {"room_id": "!room:c.test"}
    # Each server once, in order, never this one; the room ID's server last.
    [(who, room, servers, content)] = fake.joins
    assert (who, room, servers) == (user.user_id, "!room:c.test", ["a.test", "b.test", "c.test"])
    assert content["membership"] == "join" and content["reason"] == "hello"


async def test_a_remote_alias_is_resolved_by_its_server_and_joined_through_its_servers(
    homeserver: Homeserver,
) -> None:
    fake = _remote(homeserver)
    fake.aliases["#hall:a.test"] = ("!r:a.test", ["a.test", "d.test"])
    user = await homeserver.register("alice")
    answer = await homeserver.ok("POST", "/join/%23hall:a.test", {}, token=user.token)
    assert answer == {"room_id": "!r:a.test"}
    assert fake.joins[0][2] == ["a.test", "d.test"]


async def test_a_local_room_is_joined_here(homeserver: Homeserver) -> None:
    fake = _remote(homeserver)
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room = await homeserver.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token)
    await homeserver.ok("POST", f"/join/{room['room_id']}?via=a.test", {}, token=bob.token)
    assert fake.joins == []
    members = await homeserver.ok(
        "GET", f"/rooms/{room['room_id']}/joined_members", token=bob.token
    )
    assert bob.user_id in members["joined"]


async def test_no_server_to_ask_is_404(homeserver: Homeserver) -> None:
    _remote(homeserver)
    user = await homeserver.register("alice")
    # A room ID of version 12 names no server; none given either.
    status, body = await homeserver.call(
        "POST", "/join/!abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG", {}, token=user.token
    )
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_when_no_server_answers_the_client_gets_a_bad_gateway(
    homeserver: Homeserver,
) -> None:
    fake = _remote(homeserver)
    fake.fail = RemoteServerError("a.test: connection refused")
    user = await homeserver.register("alice")
    status, body = await homeserver.call("POST", "/join/!r:a.test", {}, token=user.token)
    assert (status, body["errcode"]) == (502, "M_UNKNOWN")
    assert "connection refused" in body["error"]


async def test_without_federation_other_servers_aliases_are_refused_as_before(
    homeserver: Homeserver,
) -> None:
    user = await homeserver.register("alice")
    status, body = await homeserver.call("POST", "/join/%23hall:a.test", {}, token=user.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call("POST", "/join/!r:a.test", {}, token=user.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
