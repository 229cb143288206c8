"""What clients put into created events is kept: the keys of a ``/join`` body go into the
join event (as Synapse; ``membership`` and ``join_authorised_via_users_server`` are the
server's), and ``createRoom``'s ``creation_content`` into the create event (spec; the
server sets ``creator`` and ``room_version``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.homeserver import Homeserver, User


async def member_content(hs: Homeserver, viewer: User, room_id: str, user_id: str) -> Any:
    return await hs.ok("GET", f"/rooms/{room_id}/state/m.room.member/{user_id}", token=viewer.token)


async def create_content(hs: Homeserver, viewer: User, room_id: str) -> Any:
    return await hs.ok("GET", f"/rooms/{room_id}/state/m.room.create/", token=viewer.token)


@pytest.mark.parametrize("path", ["/join/{room}", "/rooms/{room}/join"])
async def test_join_body_keys_reach_the_join_event(homeserver: Homeserver, path: str) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (
        await homeserver.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token)
    )["room_id"]
    body = {
        "reason": "hello there",
        "io.example.custom": {"n": 1, "list": [True, None]},
        "displayname": "Bob B.",
        "membership": "ban",  # never the client's to choose
        "join_authorised_via_users_server": alice.user_id,  # nor this
    }
    await homeserver.ok("POST", path.format(room=room_id), body, token=bob.token)
    content = await member_content(homeserver, alice, room_id, bob.user_id)
    assert content == {
        "membership": "join",
        "reason": "hello there",
        "io.example.custom": {"n": 1, "list": [True, None]},
        "displayname": "Bob B.",
    }
    # The timeline carries the same content.
    sync = await homeserver.ok("GET", "/sync", token=bob.token)
    joins = [
        e
        for e in sync["rooms"]["join"][room_id]["timeline"]["events"]
        if e["type"] == "m.room.member" and e["state_key"] == bob.user_id
    ]
    assert joins[-1]["content"] == content


async def test_join_with_a_bad_reason_is_refused(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (
        await homeserver.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token)
    )["room_id"]
    status, body = await homeserver.call(
        "POST", f"/rooms/{room_id}/join", {"reason": 5}, token=bob.token
    )
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    status, _ = await homeserver.call(
        "GET", f"/rooms/{room_id}/state/m.room.member/{bob.user_id}", token=alice.token
    )
    assert status == 404


@pytest.mark.parametrize("version", ["10", "11", "12"])
async def test_creation_content_reaches_the_create_event(
    homeserver: Homeserver, version: str
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    creation_content = {
        "m.federate": False,
        "type": "m.space",
        "io.example.custom": {"deep": [1, 2]},
        "creator": bob.user_id,  # the server's to set
        "room_version": "1",  # likewise
    }
    if version == "12":
        creation_content["additional_creators"] = [bob.user_id]
    room_id = (
        await homeserver.ok(
            "POST",
            "/createRoom",
            {"room_version": version, "creation_content": creation_content},
            token=alice.token,
        )
    )["room_id"]
    content = await create_content(homeserver, alice, room_id)
    expected: dict[str, Any] = {
        "m.federate": False,
        "type": "m.space",
        "io.example.custom": {"deep": [1, 2]},
        "room_version": version,
    }
    if version == "10":
        expected["creator"] = alice.user_id
    if version == "12":
        expected["additional_creators"] = [bob.user_id]
    assert content == expected
    # The room works: its creator sends state.
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "n"}, token=alice.token
    )


@pytest.mark.parametrize(
    "creation_content",
    [
        {"m.federate": "no"},
        {"type": 7},
        {"predecessor": "!old:test.local"},
        {"additional_creators": ["not a user"]},
        {"additional_creators": "@bob:test.local"},
        {"additional_creators": [5]},
    ],
)
async def test_malformed_creation_content_is_refused(
    homeserver: Homeserver, creation_content: dict[str, Any]
) -> None:
    alice = await homeserver.register("alice")
    status, body = await homeserver.call(
        "POST", "/createRoom", {"creation_content": creation_content}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    assert await homeserver.ok("GET", "/joined_rooms", token=alice.token) == {"joined_rooms": []}
