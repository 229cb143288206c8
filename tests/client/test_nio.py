"""matrix-nio, a real Matrix client, against a real ``roomstream run`` process (SQLite and
PostgreSQL): two users register, chat through long-polling syncs, redact, page back, set
a topic, leave; a third sees only the part of a room's history visibility allows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nio import (
    AsyncClient,
    JoinResponse,
    LoginResponse,
    RegisterResponse,
    RoomCreateResponse,
    RoomGetStateEventResponse,
    RoomMessagesResponse,
    RoomPreset,
    RoomPutStateResponse,
    RoomRedactResponse,
    RoomSendResponse,
    SyncResponse,
)

from tests.support.homeserver import RunningServer


@pytest.fixture
async def clients(running_server: RunningServer) -> AsyncIterator[dict[str, AsyncClient]]:
    made: dict[str, AsyncClient] = {}
    for name in ("alice", "bob", "carol"):
        made[name] = AsyncClient(running_server.url, f"@{name}:{running_server.server_name}")
    try:
        yield made
    finally:
        for client in made.values():
            await client.close()


async def sync_ok(client: AsyncClient, **kwargs: Any) -> SyncResponse:
    response = await client.sync(**kwargs)
    assert isinstance(response, SyncResponse), response
    return response


def texts(response: SyncResponse, room_id: str) -> list[str]:
    room = response.rooms.join.get(room_id)
    if room is None:
        return []
    return [getattr(e, "body", None) for e in room.timeline.events if hasattr(e, "body")]


async def test_two_users_chat_with_nio(clients: dict[str, AsyncClient]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    registered = await alice.register("alice", "alice-password", "alice laptop")
    assert isinstance(registered, RegisterResponse), registered
    assert isinstance(await bob.register("bob", "bob-password"), RegisterResponse)
    # Log in again (nio keeps its device ID), as an application would after a restart:
    # a new token for the same device; the old one no longer needed.
    alice.access_token = ""
    login = await alice.login("alice-password", device_name="alice phone")
    assert isinstance(login, LoginResponse), login
    assert login.device_id == registered.device_id
    assert login.access_token != registered.access_token

    created = await alice.room_create(name="nio room", invite=[bob.user_id])
    assert isinstance(created, RoomCreateResponse), created
    room_id = created.room_id
    await sync_ok(alice)
    bob_first = await sync_ok(bob)
    assert room_id in bob_first.rooms.invite
    assert isinstance(await bob.join(room_id), JoinResponse)
    await sync_ok(bob, since=bob.next_batch)

    # bob long-polls; alice's message wakes him.
    poll = asyncio.create_task(bob.sync(timeout=30_000, since=bob.next_batch))
    sent = await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "hi bob"})
    assert isinstance(sent, RoomSendResponse), sent
    woken = await asyncio.wait_for(poll, 60)
    assert isinstance(woken, SyncResponse), woken
    assert texts(woken, room_id) == ["hi bob"]
    assert bob.rooms[room_id].display_name == "nio room"

    reply = await bob.room_send(
        room_id, "m.room.message", {"msgtype": "m.text", "body": "hi alice"}
    )
    assert isinstance(reply, RoomSendResponse)
    alice_sync = await sync_ok(alice, since=alice.next_batch, timeout=30_000)
    assert "hi alice" in texts(alice_sync, room_id)

    # Redact, then page back: the redacted message comes back without its body.
    redacted = await alice.room_redact(room_id, sent.event_id, reason="typo")
    assert isinstance(redacted, RoomRedactResponse), redacted
    for i in range(12):
        await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": f"n{i}"})
    page = await bob.room_messages(room_id, start="", limit=10)
    assert isinstance(page, RoomMessagesResponse), page
    seen = [getattr(e, "body", None) for e in page.chunk]
    assert seen[:3] == ["n11", "n10", "n9"]
    older = await bob.room_messages(room_id, start=page.end, limit=10)
    assert isinstance(older, RoomMessagesResponse)
    old_bodies = [getattr(e, "body", None) for e in older.chunk]
    assert "hi alice" in old_bodies and "hi bob" not in old_bodies
    redacted_events = [e for e in older.chunk if getattr(e, "event_id", None) == sent.event_id]
    assert len(redacted_events) == 1
    assert "body" not in redacted_events[0].source["content"]

    # Topic, then leave.
    topic = await alice.room_put_state(room_id, "m.room.topic", {"topic": "nio topic"})
    assert isinstance(topic, RoomPutStateResponse), topic
    got = await bob.room_get_state_event(room_id, "m.room.topic")
    assert isinstance(got, RoomGetStateEventResponse) and got.content == {"topic": "nio topic"}
    await sync_ok(bob, since=bob.next_batch)
    assert bob.rooms[room_id].topic == "nio topic"
    await bob.room_leave(room_id)
    left = await sync_ok(bob, since=bob.next_batch)
    assert room_id in left.rooms.leave


async def test_partial_visibility_with_nio(clients: dict[str, AsyncClient]) -> None:
    alice, carol = clients["alice"], clients["carol"]
    assert isinstance(await alice.register("alice", "pw-alice"), RegisterResponse)
    assert isinstance(await carol.register("carol", "pw-carol"), RegisterResponse)
    created = await alice.room_create(
        preset=RoomPreset.public_chat,
        initial_state=[
            {"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}}
        ],
    )
    assert isinstance(created, RoomCreateResponse), created
    room_id = created.room_id
    await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "before"})
    assert isinstance(await carol.join(room_id), JoinResponse)
    await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "after"})
    synced = await sync_ok(carol)
    assert texts(synced, room_id) == ["after"]
    history = await carol.room_messages(room_id, start="", limit=50)
    assert isinstance(history, RoomMessagesResponse)
    bodies = [getattr(e, "body", None) for e in history.chunk if hasattr(e, "body")]
    assert bodies == ["after"]
    alice_history = await alice.room_messages(room_id, start="", limit=50)
    assert isinstance(alice_history, RoomMessagesResponse)
    assert [getattr(e, "body", None) for e in alice_history.chunk if hasattr(e, "body")] == [
        "after",
        "before",
    ]


async def test_lazy_members_summary_and_unread_counts_with_nio(
    clients: dict[str, AsyncClient], running_server: RunningServer
) -> None:
    alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
    dave = AsyncClient(running_server.url, f"@dave:{running_server.server_name}")
    try:
        for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol"), (dave, "dave")):
            assert isinstance(await client.register(name, f"pw-{name}"), RegisterResponse)
        others = [bob, carol, dave]
        created = await alice.room_create(invite=[c.user_id for c in others])
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id
        for client in others:
            assert isinstance(await client.join(room_id), JoinResponse)
        for client, body in ((dave, "early"), (carol, "one"), (carol, "hey alice"), (carol, "3")):
            await client.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": body})
        lazy = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 2}}}
        first = await sync_ok(alice, sync_filter=lazy, full_state=True)
        assert texts(first, room_id) == ["hey alice", "3"]
        room = alice.rooms[room_id]
        # Only the timeline's senders (and alice) are loaded; the summary has the rest.
        assert set(room.users) == {alice.user_id, carol.user_id}
        assert room.summary is not None
        assert room.summary.heroes == [bob.user_id, carol.user_id, dave.user_id]
        assert (room.joined_count, room.invited_count) == (4, 0)
        # Everyone else's messages notify; the one naming alice highlights.
        assert (room.unread_notifications, room.unread_highlights) == (4, 1)
        await dave.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "later"})
        await sync_ok(alice, sync_filter=lazy, since=alice.next_batch)
        assert set(room.users) == {alice.user_id, carol.user_id, dave.user_id}
        assert room.unread_notifications == 5
    finally:
        await dave.close()
