"""Who may read a room's state and an event's context: a member who left reads the state
at their leave, anyone reads a ``world_readable`` room's current state, and ``/context``
of an event the user may not see is ``403`` (``404`` for one the room does not have)."""

from __future__ import annotations

from tests.support.client import room_with, send
from tests.support.homeserver import Homeserver, User


async def set_topic(hs: Homeserver, user: User, room_id: str, topic: str) -> None:
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": topic}, token=user.token)


def topic_of(state: list[dict[str, object]]) -> object:
    topics = [e["content"] for e in state if e["type"] == "m.room.topic"]
    assert len(topics) == 1
    return topics[0]


async def test_a_member_who_left_reads_the_state_at_their_leave(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob, preset="private_chat")
    await set_topic(homeserver, alice, room_id, "before")
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    await set_topic(homeserver, alice, room_id, "after")
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "later"}, token=alice.token
    )

    state = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=bob.token)
    assert topic_of(state) == {"topic": "before"}
    assert "m.room.name" not in {e["type"] for e in state}
    mine = [e for e in state if e["type"] == "m.room.member" and e["state_key"] == bob.user_id]
    assert [e["content"]["membership"] for e in mine] == ["leave"]
    entry = await homeserver.ok("GET", f"/rooms/{room_id}/state/m.room.topic/", token=bob.token)
    assert entry == {"topic": "before"}
    status, body = await homeserver.call(
        "GET", f"/rooms/{room_id}/state/m.room.name/", token=bob.token
    )
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    # A member still reads the current state (and the cached answer is not the leaver's).
    current = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    assert topic_of(current) == {"topic": "after"}
    again = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=bob.token)
    assert topic_of(again) == {"topic": "before"}

    # Banned: the state at the ban.
    carol = await homeserver.register("carol")
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": carol.user_id}, token=alice.token
    )
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=carol.token)
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/ban", {"user_id": carol.user_id}, token=alice.token
    )
    await set_topic(homeserver, alice, room_id, "after the ban")
    banned = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=carol.token)
    assert topic_of(banned) == {"topic": "after"}


async def test_only_world_readable_rooms_are_readable_without_joining(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    stranger = await homeserver.register("stranger")
    room_id = await room_with(homeserver, alice, preset="private_chat")
    await set_topic(homeserver, alice, room_id, "hello")
    for path in (f"/rooms/{room_id}/state", f"/rooms/{room_id}/state/m.room.topic/"):
        status, body = await homeserver.call("GET", path, token=stranger.token)
        assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "world_readable"},
        token=alice.token,
    )
    state = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=stranger.token)
    assert topic_of(state) == {"topic": "hello"}
    assert {e["type"] for e in state} >= {"m.room.create", "m.room.history_visibility"}
    entry = await homeserver.ok(
        "GET", f"/rooms/{room_id}/state/m.room.topic/", token=stranger.token
    )
    assert entry == {"topic": "hello"}
    # Current state, as it changes.
    await set_topic(homeserver, alice, room_id, "changed")
    state = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=stranger.token)
    assert topic_of(state) == {"topic": "changed"}
    # Not world_readable any more: closed again.
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "shared"},
        token=alice.token,
    )
    status, _ = await homeserver.call("GET", f"/rooms/{room_id}/state", token=stranger.token)
    assert status == 403
    # An unknown room is forbidden, not an error.
    status, body = await homeserver.call(
        "GET", "/rooms/!unknown:test.local/state", token=stranger.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")


async def test_context_of_a_hidden_event_is_forbidden_and_of_an_unknown_one_not_found(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "joined"},
        token=alice.token,
    )
    hidden = await send(homeserver, alice, room_id, "before bob")
    # Not in the room: forbidden, as Synapse.
    status, body = await homeserver.call(
        "GET", f"/rooms/{room_id}/context/{hidden}", token=bob.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    seen = await send(homeserver, alice, room_id, "after bob")
    # Joined, but the event is from before the join under `joined`: still forbidden.
    status, body = await homeserver.call(
        "GET", f"/rooms/{room_id}/context/{hidden}", token=bob.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    context = await homeserver.ok("GET", f"/rooms/{room_id}/context/{seen}", token=bob.token)
    assert context["event"]["event_id"] == seen
    # Unknown, or of another room: not found.
    for event_id in ("$nosuchevent", seen):
        other_room = await room_with(homeserver, bob) if event_id == seen else room_id
        status, body = await homeserver.call(
            "GET", f"/rooms/{other_room}/context/{event_id}", token=bob.token
        )
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
