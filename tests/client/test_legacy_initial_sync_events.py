"""The legacy global ``GET /initialSync`` and the old event stream ``GET /events`` (with
``GET /events/{eventId}``)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.homeserver import Homeserver, User, signal_waits


async def _send(hs: Homeserver, user: User, room_id: str, text: str) -> str:
    result = await hs.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
        {"msgtype": "m.text", "body": text},
        token=user.token,
    )
    return str(result["event_id"])


def _by_room(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {room["room_id"]: room for room in body["rooms"]}


async def test_initial_sync_lists_joined_invited_and_archived_rooms(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    joined = (await hs.ok("POST", "/createRoom", {"visibility": "public"}, token=bob.token))[
        "room_id"
    ]
    for n in range(4):
        await _send(hs, bob, joined, f"m{n}")
    invited = (await hs.ok("POST", "/createRoom", {"invite": [bob.user_id]}, token=alice.token))[
        "room_id"
    ]
    left = (await hs.ok("POST", "/createRoom", {}, token=bob.token))["room_id"]
    await hs.ok("POST", f"/rooms/{left}/leave", {}, token=bob.token)
    await hs.ok("PUT", f"/user/{bob.user_id}/account_data/org.example", {"a": 1}, token=bob.token)

    body = await hs.ok("GET", "/initialSync?limit=2", token=bob.token)
    rooms = _by_room(body)
    assert set(rooms) == {joined, invited}
    room = rooms[joined]
    assert (room["membership"], room["visibility"]) == ("join", "public")
    assert [e["content"]["body"] for e in room["messages"]["chunk"]] == ["m2", "m3"]
    older = await hs.ok(
        "GET",
        f"/rooms/{joined}/messages?dir=b&limit=1&from={room['messages']['start']}",
        token=bob.token,
    )
    assert older["chunk"][0]["content"]["body"] == "m1"
    assert ("m.room.create", "") in {(e["type"], e["state_key"]) for e in room["state"]}
    assert room["account_data"] == []
    invite = rooms[invited]
    assert (invite["membership"], invite["visibility"]) == ("invite", "private")
    assert invite["inviter"] == alice.user_id
    assert invite["invite"]["content"]["membership"] == "invite"
    assert "messages" not in invite
    assert {"type": "org.example", "content": {"a": 1}} in body["account_data"]
    assert body["presence"] == []

    archived = _by_room(await hs.ok("GET", "/initialSync?archived=true", token=bob.token))
    assert set(archived) == {joined, invited, left}
    assert archived[left]["membership"] == "leave"
    own = [e for e in archived[left]["state"] if e["state_key"] == bob.user_id]
    assert own[0]["content"]["membership"] == "leave"

    # `end` is where /events follows on: nothing yet, then what comes next.
    quiet = await hs.ok("GET", f"/events?from={body['end']}&timeout=0", token=bob.token)
    assert quiet["chunk"] == [] and quiet["start"] == body["end"]
    new_id = await _send(hs, bob, joined, "next")
    later = await hs.ok("GET", f"/events?from={body['end']}&timeout=0", token=bob.token)
    assert [e["event_id"] for e in later["chunk"]] == [new_id]


async def test_events_long_polls_and_shows_only_what_the_user_may_see(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    shared = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    await hs.ok("POST", f"/rooms/{shared}/join", {}, token=bob.token)
    elsewhere = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    start = (await hs.ok("GET", "/events?timeout=0", token=bob.token))["end"]

    # A long poll, waiting (registered with the notifier) before the sends, is woken.
    waiting = signal_waits(hs)
    poll = asyncio.create_task(hs.ok("GET", f"/events?from={start}&timeout=60000", token=bob.token))
    await waiting.wait()
    await _send(hs, alice, elsewhere, "not for bob")
    sent = await _send(hs, alice, shared, "for bob")
    woken = await asyncio.wait_for(poll, 30)
    ids = [e["event_id"] for e in woken["chunk"]]
    assert sent in ids and all(e["room_id"] == shared for e in woken["chunk"])
    after = await hs.ok("GET", f"/events?from={woken['end']}&timeout=0", token=bob.token)
    assert after["chunk"] == []

    # An invite reaches the invitee through the stream; a /sync token is accepted as `from`.
    since = (await hs.ok("GET", "/sync", token=bob.token))["next_batch"]
    await hs.ok("POST", f"/rooms/{elsewhere}/invite", {"user_id": bob.user_id}, token=alice.token)
    invites = await hs.ok("GET", f"/events?from={since}&timeout=0", token=bob.token)
    assert [(e["type"], e["state_key"]) for e in invites["chunk"]] == [
        ("m.room.member", bob.user_id)
    ]

    # Single events: visible ones, else 404.
    event = await hs.ok("GET", f"/events/{sent}", token=bob.token)
    assert event["content"]["body"] == "for bob"
    hidden = await _send(hs, alice, elsewhere, "private")
    carol = await hs.register("carol")
    status, body = await hs.call("GET", f"/events/{hidden}", token=carol.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    status, body = await hs.call("GET", "/events/$nope", token=bob.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_events_of_one_room_for_a_peeker(homeserver: Homeserver) -> None:
    """``/events?room_id=``: matrix-js-sdk's peek follows a ``world_readable`` room the
    user is not in so; a room it may not read is refused."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    other = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    status, body = await hs.call("GET", f"/events?room_id={room_id}&timeout=0", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "world_readable"},
        token=alice.token,
    )
    peek = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    end = peek["messages"]["end"]
    waiting = signal_waits(hs)
    poll = asyncio.create_task(
        hs.ok("GET", f"/events?room_id={room_id}&from={end}&timeout=60000", token=bob.token)
    )
    await waiting.wait()
    await _send(hs, alice, other, "elsewhere")
    first = await _send(hs, alice, room_id, "one")
    woken = await asyncio.wait_for(poll, 30)
    assert [e["event_id"] for e in woken["chunk"]] == [first]
    second = await _send(hs, alice, room_id, "two")
    third = await _send(hs, alice, room_id, "three")
    following = await hs.ok(
        "GET", f"/events?room_id={room_id}&from={woken['end']}&timeout=0", token=bob.token
    )
    assert [e["event_id"] for e in following["chunk"]] == [second, third]
    # More than `limit`: the latest ones.
    latest = await hs.ok(
        "GET", f"/events?room_id={room_id}&from={end}&timeout=0&limit=2", token=bob.token
    )
    assert [e["event_id"] for e in latest["chunk"]] == [second, third]
    status, body = await hs.call("GET", "/events?room_id=nope&timeout=0", token=bob.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    for path in ("/initialSync", "/events?timeout=0", "/events/$x"):
        status, body = await homeserver.call("GET", path)
        assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN"), path
    for path in (
        "/initialSync?limit=x",
        "/initialSync?archived=maybe",
        "/events?from=garbage&timeout=0",
        "/events?from=t1-1&timeout=0",
        "/events?timeout=-5",
        "/events?from=s1_x&timeout=0",
    ):
        status, body = await homeserver.call("GET", path, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), path
