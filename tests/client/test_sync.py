"""/sync and the reads over the HTTP API: initial and incremental sync, the long poll woken
by another user's message, invites, leaves, transaction IDs, ephemeral and per-user data,
/messages, /context, /members, /event, /state."""

from __future__ import annotations

import asyncio

from tests.support.client import bodies, room_with, send
from tests.support.homeserver import Homeserver


async def test_initial_and_incremental_sync_with_every_section(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    event_id = await send(homeserver, alice, room_id, "hello")
    first = await homeserver.ok("GET", "/sync", token=alice.token)
    for key in ("join", "invite", "leave"):
        assert key in first["rooms"]
    room = first["rooms"]["join"][room_id]
    for key in ("timeline", "state", "ephemeral", "account_data", "unread_notifications"):
        assert key in room
    assert bodies(room["timeline"]["events"]) == ["hello"]
    mine = next(e for e in room["timeline"]["events"] if e["event_id"] == event_id)
    assert mine["unsigned"]["transaction_id"].startswith("t")
    assert "signatures" not in mine and "prev_events" not in mine
    # Nothing new: an incremental sync with timeout 0 returns at once, empty.
    again = await homeserver.ok(
        "GET", f"/sync?since={first['next_batch']}&timeout=0", token=alice.token
    )
    assert again["rooms"]["join"] == {}
    await send(homeserver, alice, room_id, "second")
    later = await homeserver.ok("GET", f"/sync?since={again['next_batch']}", token=alice.token)
    assert bodies(later["rooms"]["join"][room_id]["timeline"]["events"]) == ["second"]


async def test_long_poll_is_woken_by_another_users_message(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    start = await homeserver.ok("GET", "/sync", token=bob.token)
    poll = asyncio.create_task(
        homeserver.ok("GET", f"/sync?since={start['next_batch']}&timeout=60000", token=bob.token)
    )
    await asyncio.sleep(0)  # let the poll start (its result cannot depend on this)
    await send(homeserver, alice, room_id, "wake up")
    woken = await asyncio.wait_for(poll, 30)
    assert bodies(woken["rooms"]["join"][room_id]["timeline"]["events"]) == ["wake up"]
    # The sender's device sees its transaction ID; bob's does not.
    event = woken["rooms"]["join"][room_id]["timeline"]["events"][-1]
    assert "transaction_id" not in event.get("unsigned", {})


async def test_invites_and_leaves_appear_in_their_sections(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, preset="private_chat")
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name", {"name": "Secret"}, token=alice.token
    )
    start = await homeserver.ok("GET", "/sync", token=bob.token)
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": bob.user_id}, token=alice.token
    )
    invited = await homeserver.ok("GET", f"/sync?since={start['next_batch']}", token=bob.token)
    state = invited["rooms"]["invite"][room_id]["invite_state"]["events"]
    assert any(e["type"] == "m.room.name" and e["content"] == {"name": "Secret"} for e in state)
    assert any(e["type"] == "m.room.member" and e["state_key"] == bob.user_id for e in state)
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    joined = await homeserver.ok("GET", f"/sync?since={invited['next_batch']}", token=bob.token)
    assert room_id in joined["rooms"]["join"]
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/kick", {"user_id": bob.user_id}, token=alice.token
    )
    kicked = await homeserver.ok("GET", f"/sync?since={joined['next_batch']}", token=bob.token)
    assert room_id in kicked["rooms"]["leave"]
    await send(homeserver, alice, room_id, "after the kick")
    after = await homeserver.ok(
        "GET", f"/sync?since={kicked['next_batch']}&timeout=0", token=bob.token
    )
    assert room_id not in after["rooms"]["join"] and room_id not in after["rooms"]["leave"]


async def test_ephemeral_and_per_user_data(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    event_id = await send(homeserver, alice, room_id, "read me")
    start = await homeserver.ok("GET", "/sync", token=bob.token)
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/typing/{alice.user_id}",
        {"typing": True, "timeout": 30000},
        token=alice.token,
    )
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/receipt/m.read/{event_id}", {}, token=alice.token
    )
    typing = await homeserver.ok("GET", f"/sync?since={start['next_batch']}", token=bob.token)
    ephemeral = typing["rooms"]["join"][room_id]["ephemeral"]["events"]
    assert {"type": "m.typing", "content": {"user_ids": [alice.user_id]}} in ephemeral
    receipt = next(e for e in ephemeral if e["type"] == "m.receipt")
    assert alice.user_id in receipt["content"][event_id]["m.read"]
    # account data, global and per room (tags)
    await homeserver.ok(
        "PUT", f"/user/{bob.user_id}/account_data/org.example.x", {"a": 1}, token=bob.token
    )
    await homeserver.ok(
        "PUT", f"/user/{bob.user_id}/rooms/{room_id}/tags/u.work", {"order": 0.5}, token=bob.token
    )
    status, _ = await homeserver.call(
        "PUT", f"/user/{alice.user_id}/account_data/x", {}, token=bob.token
    )
    assert status == 403
    data = await homeserver.ok("GET", f"/sync?since={typing['next_batch']}", token=bob.token)
    assert {"type": "org.example.x", "content": {"a": 1}} in data["account_data"]["events"]
    tags = data["rooms"]["join"][room_id]["account_data"]["events"]
    assert {"type": "m.tag", "content": {"tags": {"u.work": {"order": 0.5}}}} in tags
    assert await homeserver.ok(
        "GET", f"/user/{bob.user_id}/rooms/{room_id}/tags", token=bob.token
    ) == {"tags": {"u.work": {"order": 0.5}}}
    # to-device: delivered once, deleted when the next sync acknowledges it
    await homeserver.ok(
        "PUT",
        "/sendToDevice/org.example.ping/1",
        {"messages": {bob.user_id: {"*": {"n": 1}}}},
        token=alice.token,
    )
    delivered = await homeserver.ok("GET", f"/sync?since={data['next_batch']}", token=bob.token)
    assert delivered["to_device"]["events"] == [
        {"type": "org.example.ping", "sender": alice.user_id, "content": {"n": 1}}
    ]
    acked = await homeserver.ok(
        "GET", f"/sync?since={delivered['next_batch']}&timeout=0", token=bob.token
    )
    assert acked["to_device"]["events"] == []
    left = await homeserver.engine.db.run_interaction(
        "test_query", lambda t: t.query("SELECT COUNT(*) FROM device_inbox")
    )
    assert left[0][0] == 0
    # push rules exist with the server defaults
    rules = await homeserver.ok("GET", "/pushrules/", token=bob.token)
    assert any(r["rule_id"] == ".m.rule.message" for r in rules["global"]["underride"])
    # filters
    filter_id = (
        await homeserver.ok(
            "POST",
            f"/user/{bob.user_id}/filter",
            {"room": {"timeline": {"limit": 1}}},
            token=bob.token,
        )
    )["filter_id"]
    assert await homeserver.ok(
        "GET", f"/user/{bob.user_id}/filter/{filter_id}", token=bob.token
    ) == {"room": {"timeline": {"limit": 1}}}
    limited = await homeserver.ok("GET", f"/sync?filter={filter_id}", token=bob.token)
    assert len(limited["rooms"]["join"][room_id]["timeline"]["events"]) == 1
    assert limited["rooms"]["join"][room_id]["timeline"]["limited"] is True


async def test_typing_times_out(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    writer = homeserver.process.typing
    assert writer is not None
    now = [1000.0]
    writer._clock = lambda: now[0]
    writer.set_typing(room_id, alice.user_id, True, 5000)
    assert homeserver.process.typing_state.changed([room_id], 0) == {room_id: [alice.user_id]}
    now[0] += 6
    writer.expire()
    assert homeserver.process.typing_state.changed([room_id], 0) == {room_id: []}


async def test_messages_context_members_event_state(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice)
    ids = [await send(homeserver, alice, room_id, f"m{i}") for i in range(7)]
    page = await homeserver.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=3", token=alice.token)
    assert bodies(page["chunk"]) == ["m6", "m5", "m4"]
    page2 = await homeserver.ok(
        "GET", f"/rooms/{room_id}/messages?dir=b&limit=3&from={page['end']}", token=alice.token
    )
    assert bodies(page2["chunk"]) == ["m3", "m2", "m1"]
    context = await homeserver.ok(
        "GET", f"/rooms/{room_id}/context/{ids[3]}?limit=2", token=alice.token
    )
    assert context["event"]["event_id"] == ids[3]
    assert bodies(context["events_before"]) == ["m2"] and bodies(context["events_after"]) == ["m4"]
    members = await homeserver.ok("GET", f"/rooms/{room_id}/members", token=alice.token)
    assert [m["state_key"] for m in members["chunk"]] == [alice.user_id]
    event = await homeserver.ok("GET", f"/rooms/{room_id}/event/{ids[0]}", token=alice.token)
    assert event["content"]["body"] == "m0"
    state = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    assert {e["type"] for e in state} >= {"m.room.create", "m.room.member", "m.room.power_levels"}
    # bob is not in the room: the event is not found, state is forbidden.
    status, body = await homeserver.call("GET", f"/rooms/{room_id}/event/{ids[0]}", token=bob.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    status, _ = await homeserver.call("GET", f"/rooms/{room_id}/state", token=bob.token)
    assert status == 403
    status, body = await homeserver.call(
        "GET", f"/rooms/{room_id}/messages?from=garbage", token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
