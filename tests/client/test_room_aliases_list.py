"""``GET /rooms/{id}/aliases``: the room's local aliases, for members and, in a
``world_readable`` room, anyone."""

from __future__ import annotations

from tests.support.homeserver import Homeserver


async def test_members_see_the_local_aliases(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    assert await homeserver.ok("GET", f"/rooms/{room_id}/aliases", token=alice.token) == {
        "aliases": []
    }
    for name in ("zeta", "alpha"):
        await homeserver.ok(
            "PUT", f"/directory/room/%23{name}:test.local", {"room_id": room_id}, token=alice.token
        )
    expected = {"aliases": ["#alpha:test.local", "#zeta:test.local"]}
    assert await homeserver.ok("GET", f"/rooms/{room_id}/aliases", token=alice.token) == expected
    # Not a member, room not world_readable: refused (as Synapse).
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/aliases", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "world_readable"},
        token=alice.token,
    )
    assert await homeserver.ok("GET", f"/rooms/{room_id}/aliases", token=bob.token) == expected
    await homeserver.ok("DELETE", "/directory/room/%23zeta:test.local", token=alice.token)
    assert await homeserver.ok("GET", f"/rooms/{room_id}/aliases", token=bob.token) == {
        "aliases": ["#alpha:test.local"]
    }


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=alice.token)
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/aliases", token=alice.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call(
        "GET", "/rooms/!unknown:test.local/aliases", token=alice.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call("GET", "/rooms/not-a-room/aliases", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/aliases")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
