"""``GET /rooms/{id}/initialSync``: a member's view of a room, a peek into a
``world_readable`` one (matrix-js-sdk's room preview), a departed member's view as of
their leave, and refusals."""

from __future__ import annotations

from typing import Any

from tests.support.homeserver import Homeserver, User


async def _room_with_messages(hs: Homeserver, owner: User, count: int, **create: Any) -> str:
    room_id = str((await hs.ok("POST", "/createRoom", create, token=owner.token))["room_id"])
    for n in range(count):
        await hs.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
            {"msgtype": "m.text", "body": f"m{n}"},
            token=owner.token,
        )
    return room_id


def _bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message"]


async def test_a_member_gets_messages_state_and_room_data(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    room_id = await _room_with_messages(hs, alice, 5, preset="public_chat", visibility="public")
    await hs.ok(
        "PUT", f"/user/{alice.user_id}/rooms/{room_id}/tags/u.work", {"order": 1}, token=alice.token
    )
    last = (await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=1", token=alice.token))[
        "chunk"
    ][0]["event_id"]
    await hs.ok("POST", f"/rooms/{room_id}/receipt/m.read/{last}", {}, token=alice.token)
    body = await hs.ok("GET", f"/rooms/{room_id}/initialSync?limit=3", token=alice.token)
    assert body["room_id"] == room_id and body["membership"] == "join"
    assert body["visibility"] == "public" and body["presence"] == []
    messages = body["messages"]
    assert _bodies(messages["chunk"]) == ["m2", "m3", "m4"]  # the latest, oldest first
    state_keys = {(e["type"], e["state_key"]) for e in body["state"]}
    assert {("m.room.create", ""), ("m.room.member", alice.user_id)} <= state_keys
    assert {"type": "m.tag", "content": {"tags": {"u.work": {"order": 1}}}} in body["account_data"]
    [receipt] = body["receipts"]
    assert (receipt["type"], receipt["room_id"]) == ("m.receipt", room_id)
    assert list(receipt["content"][last]) == ["m.read"]
    assert list(receipt["content"][last]["m.read"]) == [alice.user_id]
    bob = await hs.register("bob")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await hs.ok("POST", f"/rooms/{room_id}/receipt/m.read.private/{last}", {}, token=bob.token)
    seen_by_bob = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert seen_by_bob["receipts"][0]["content"][last]["m.read.private"] == {
        bob.user_id: seen_by_bob["receipts"][0]["content"][last]["m.read.private"][bob.user_id]
    }
    again = await hs.ok("GET", f"/rooms/{room_id}/initialSync?limit=3", token=alice.token)
    assert again["receipts"] == body["receipts"]  # bob's private receipt is his alone
    # `start` continues backwards with /messages; `end` is where /events follows on.
    older = await hs.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=2&from={messages['start']}",
        token=alice.token,
    )
    assert _bodies(older["chunk"]) == ["m1", "m0"]
    quiet = await hs.ok(
        "GET", f"/events?from={again['messages']['end']}&timeout=0", token=alice.token
    )
    assert quiet["chunk"] == []
    private = await _room_with_messages(hs, alice, 0)
    assert (await hs.ok("GET", f"/rooms/{private}/initialSync", token=alice.token))[
        "visibility"
    ] == "private"


async def test_a_whole_short_room_says_there_is_nothing_before(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await _room_with_messages(homeserver, alice, 1)
    body = await homeserver.ok("GET", f"/rooms/{room_id}/initialSync", token=alice.token)
    assert body["messages"]["chunk"][0]["type"] == "m.room.create"
    before = await homeserver.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&from={body['messages']['start']}",
        token=alice.token,
    )
    assert before["chunk"] == []


async def test_peeking_into_a_world_readable_room(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await _room_with_messages(hs, alice, 0, preset="public_chat")
    status, body = await hs.call("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "world_readable"},
        token=alice.token,
    )
    await hs.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/{hs.txn()}", {"body": "hi"}, token=alice.token
    )
    body = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert "membership" not in body  # a peek (as Synapse)
    assert _bodies(body["messages"]["chunk"]) == ["hi"]
    assert ("m.room.member", alice.user_id) in {(e["type"], e["state_key"]) for e in body["state"]}
    assert body["account_data"] == []


async def test_a_departed_member_sees_the_room_as_they_left_it(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await _room_with_messages(hs, alice, 1, preset="public_chat")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"body": "before"},
        token=alice.token,
    )
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    await hs.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "after"}, token=alice.token
    )
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"body": "after"},
        token=alice.token,
    )
    body = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert body["membership"] == "leave"
    assert _bodies(body["messages"]["chunk"]) == ["m0", "before"]
    assert body["messages"]["chunk"][-1]["type"] == "m.room.member"  # their leave, last
    assert "m.room.topic" not in {e["type"] for e in body["state"]}
    own = [e for e in body["state"] if e["state_key"] == bob.user_id]
    assert own[0]["content"]["membership"] == "leave"
    # `end` is an events token here too: /events from it serves nothing of this room.
    quiet = await hs.ok("GET", f"/events?from={body['messages']['end']}&timeout=0", token=bob.token)
    assert quiet["chunk"] == []


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await _room_with_messages(homeserver, alice, 0)
    # Invited but not joined, not world_readable: refused.
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": bob.user_id}, token=alice.token
    )
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await homeserver.call(
        "GET", "/rooms/!nowhere:test.local/initialSync", token=alice.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    for query in ("limit=x", "limit=-1", "limit=99999"):
        status, body = await homeserver.call(
            "GET", f"/rooms/{room_id}/initialSync?{query}", token=alice.token
        )
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), query
    status, body = await homeserver.call("GET", "/rooms/x/initialSync", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/initialSync")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
