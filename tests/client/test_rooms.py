"""Room creation, membership, sending with transaction IDs, state, redactions, aliases."""

from __future__ import annotations

import asyncio

from tests.support.homeserver import Homeserver


async def state_content(hs: Homeserver, room_id: str, key: tuple[str, str]) -> dict[str, object]:
    current = await hs.engine.store.get_current_state(room_id)
    event = await hs.engine.store.get_event(current[key])
    assert event is not None
    return dict(event.data["content"])


async def test_create_room_with_options(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    created = await homeserver.ok(
        "POST",
        "/createRoom",
        {
            "preset": "trusted_private_chat",
            "name": "Lounge",
            "topic": "chat",
            "invite": [bob.user_id],
            "room_alias_name": "lounge",
            "initial_state": [{"type": "m.room.encryption", "content": {"algorithm": "x"}}],
            "power_level_content_override": {"events_default": 10},
        },
        token=alice.token,
    )
    room_id = created["room_id"]
    assert room_id.startswith("!")
    store = homeserver.engine.store
    assert (await store.get_room_version(room_id)).identifier == "12"  # type: ignore[union-attr]
    assert await state_content(homeserver, room_id, ("m.room.name", "")) == {"name": "Lounge"}
    assert await state_content(homeserver, room_id, ("m.room.topic", "")) == {"topic": "chat"}
    assert (await state_content(homeserver, room_id, ("m.room.join_rules", "")))[
        "join_rule"
    ] == "invite"
    levels = await state_content(homeserver, room_id, ("m.room.power_levels", ""))
    assert levels["events_default"] == 10 and levels["users"] == {bob.user_id: 100}  # type: ignore[comparison-overlap]
    assert (await state_content(homeserver, room_id, ("m.room.member", bob.user_id)))[
        "membership"
    ] == "invite"
    assert await state_content(homeserver, room_id, ("m.room.encryption", "")) == {"algorithm": "x"}
    alias = await homeserver.ok("GET", "/directory/room/%23lounge:test.local")
    assert alias == {"room_id": room_id, "servers": ["test.local"]}
    # bob joins by alias; joined_members and joined_rooms follow.
    assert (await homeserver.ok("POST", "/join/%23lounge:test.local", {}, token=bob.token))[
        "room_id"
    ] == room_id
    members = await homeserver.ok("GET", f"/rooms/{room_id}/joined_members", token=bob.token)
    assert set(members["joined"]) == {alice.user_id, bob.user_id}
    assert await homeserver.ok("GET", "/joined_rooms", token=bob.token) == {
        "joined_rooms": [room_id]
    }


async def test_room_versions_and_bad_create_bodies(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    for version in ("10", "11"):
        room = await homeserver.ok(
            "POST", "/createRoom", {"room_version": version}, token=alice.token
        )
        stored = await homeserver.engine.store.get_room_version(room["room_id"])
        assert stored is not None and stored.identifier == version
    status, body = await homeserver.call(
        "POST", "/createRoom", {"room_version": "13"}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_UNSUPPORTED_ROOM_VERSION")
    status, body = await homeserver.call(
        "POST", "/createRoom", {"preset": "nope"}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call("POST", "/createRoom", {"name": 5}, token=alice.token)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    status, body = await homeserver.call("POST", "/createRoom", {})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")


async def test_send_is_idempotent_per_device_and_transaction(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    path = f"/rooms/{room_id}/send/m.room.message/txn1"
    first = await homeserver.ok("PUT", path, {"msgtype": "m.text", "body": "hi"}, token=alice.token)
    again = await homeserver.ok("PUT", path, {"msgtype": "m.text", "body": "hi"}, token=alice.token)
    assert first == again
    # Another device of the same user with the same transaction ID sends a new event.
    login = await homeserver.ok(
        "POST",
        "/login",
        {"type": "m.login.password", "user": "alice", "password": "secret-password"},
    )
    other = await homeserver.ok(
        "PUT", path, {"msgtype": "m.text", "body": "hi"}, token=login["access_token"]
    )
    assert other["event_id"] != first["event_id"]
    event = await homeserver.engine.store.get_event(first["event_id"])
    assert event is not None and event.data["content"]["body"] == "hi"


async def test_membership_rules_are_enforced(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    carol = await homeserver.register("carol")
    room_id = (
        await homeserver.ok("POST", "/createRoom", {"preset": "private_chat"}, token=alice.token)
    )["room_id"]
    # Not invited: bob cannot join an invite-only room, nor send into it.
    status, body = await homeserver.call("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call(
        "PUT", f"/rooms/{room_id}/send/m.room.message/1", {"body": "x"}, token=bob.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": bob.user_id}, token=alice.token
    )
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    # bob (power 0) may not kick; alice may, and ban, and unban.
    status, body = await homeserver.call(
        "POST", f"/rooms/{room_id}/kick", {"user_id": alice.user_id}, token=bob.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await homeserver.ok(
        "POST",
        f"/rooms/{room_id}/ban",
        {"user_id": bob.user_id, "reason": "spam"},
        token=alice.token,
    )
    assert (await state_content(homeserver, room_id, ("m.room.member", bob.user_id))) == {
        "membership": "ban",
        "reason": "spam",
    }
    status, _ = await homeserver.call("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    assert status == 403
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/unban", {"user_id": bob.user_id}, token=alice.token
    )
    status, body = await homeserver.call("POST", f"/rooms/{room_id}/leave", {}, token=carol.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call("POST", "/join/!nowhere", {}, token=carol.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    # Forget needs the room left first.
    status, _ = await homeserver.call("POST", f"/rooms/{room_id}/forget", {}, token=alice.token)
    assert status == 400
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=alice.token)
    await homeserver.ok("POST", f"/rooms/{room_id}/forget", {}, token=alice.token)


async def test_state_put_get_and_redact(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    put = await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic", {"topic": "one"}, token=alice.token
    )
    same = await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "one"}, token=alice.token
    )
    assert put == same  # identical state is not sent twice
    got = await homeserver.ok("GET", f"/rooms/{room_id}/state/m.room.topic", token=alice.token)
    assert got == {"topic": "one"}
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/org.example/key%2Fslash", {"a": 1}, token=alice.token
    )
    assert await homeserver.ok(
        "GET", f"/rooms/{room_id}/state/org.example/key%2Fslash", token=alice.token
    ) == {"a": 1}
    status, body = await homeserver.call(
        "GET", f"/rooms/{room_id}/state/m.room.nothing", token=alice.token
    )
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    sent = await homeserver.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/m1", {"body": "oops"}, token=alice.token
    )
    redaction = await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/redact/{sent['event_id']}/r1",
        {"reason": "typo"},
        token=alice.token,
    )
    again = await homeserver.ok(
        "PUT", f"/rooms/{room_id}/redact/{sent['event_id']}/r1", {}, token=alice.token
    )
    assert redaction == again
    meta = await homeserver.engine.store.get_meta([sent["event_id"]])
    assert meta[sent["event_id"]].redacted_by == redaction["event_id"]


async def test_aliases(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = (await homeserver.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await homeserver.ok(
        "PUT", "/directory/room/%23a:test.local", {"room_id": room_id}, token=alice.token
    )
    status, body = await homeserver.call(
        "PUT", "/directory/room/%23a:test.local", {"room_id": room_id}, token=alice.token
    )
    assert (status, body["errcode"]) == (409, "M_UNKNOWN")
    status, body = await homeserver.call(
        "PUT", "/directory/room/%23a:elsewhere", {"room_id": room_id}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, _ = await homeserver.call("DELETE", "/directory/room/%23a:test.local", token=bob.token)
    assert status == 403
    await homeserver.ok("DELETE", "/directory/room/%23a:test.local", token=alice.token)
    status, body = await homeserver.call("GET", "/directory/room/%23a:test.local")
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_concurrent_room_creation_by_one_user(homeserver: Homeserver) -> None:
    """Version-12 room IDs hash the create event: rooms created in the same millisecond by
    one user must still be distinct rooms."""
    alice = await homeserver.register("alice")
    results = await asyncio.gather(
        *(
            homeserver.call("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token)
            for _ in range(8)
        )
    )
    assert [status for status, _ in results] == [200] * 8
    assert len({body["room_id"] for _, body in results}) == 8
