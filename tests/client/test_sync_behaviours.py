"""``/sync`` as clients expect it (issue 20, part 2), through the API on both engines:
kicked and banned rooms in an initial sync, timelines that end at the user's leave,
rooms joined since the token sent as in an initial sync, filters that fill their limit,
``state`` as the state before the timeline, ``/messages`` refused to non-members, and
the room ``initialSync`` refused to banned users."""

from __future__ import annotations

from typing import Any

from roomstream.reading.timeline_rows import filter_budget
from tests.support.client import bodies, q, room_with, send, sync
from tests.support.homeserver import Homeserver, RunningServer, User
from tests.support.js_sdk import JS_DIR, run_script


async def _set_visibility(hs: Homeserver, owner: User, room_id: str, value: str) -> None:
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": value},
        token=owner.token,
    )


async def _send_typed(hs: Homeserver, user: User, room_id: str, event_type: str, body: str) -> str:
    path = f"/rooms/{room_id}/send/{event_type}/{hs.txn()}"
    result = await hs.ok("PUT", path, {"msgtype": "m.text", "body": body}, token=user.token)
    return str(result["event_id"])


def _ids(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["event_id"]) for e in events]


# -- 1. kicked and banned rooms in an initial sync ----------------------------------------


async def test_an_initial_sync_lists_rooms_the_user_was_kicked_or_banned_from(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    kicked, banned, leaver, rejecter, withdrawn = [
        await hs.register(n) for n in ("kicked", "banned", "leaver", "rejecter", "withdrawn")
    ]
    room_id = await room_with(hs, alice, kicked, banned, leaver)
    await send(hs, alice, room_id, "hello")
    await hs.ok("POST", f"/rooms/{room_id}/kick", {"user_id": kicked.user_id}, token=alice.token)
    await hs.ok(
        "POST",
        f"/rooms/{room_id}/ban",
        {"user_id": banned.user_id, "reason": "spam"},
        token=alice.token,
    )
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=leaver.token)
    for user in (rejecter, withdrawn):
        await hs.ok(
            "POST", f"/rooms/{room_id}/invite", {"user_id": user.user_id}, token=alice.token
        )
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=rejecter.token)  # rejects
    await hs.ok(  # alice withdraws her invite: a kick from the invite, as Synapse counts it
        "POST", f"/rooms/{room_id}/kick", {"user_id": withdrawn.user_id}, token=alice.token
    )
    await send(hs, alice, room_id, "after they went")
    for user, membership in ((kicked, "leave"), (banned, "ban"), (withdrawn, "leave")):
        body = await sync(hs, user)  # a fresh login's first sync: no include_leave
        assert list(body["rooms"]["leave"]) == [room_id], user.user_id
        room = body["rooms"]["leave"][room_id]
        timeline = room["timeline"]["events"]
        own = [e for e in timeline + room["state"]["events"] if e.get("state_key") == user.user_id]
        # The client learns who removed them and why (Element: "You were banned ...").
        assert own[-1]["content"]["membership"] == membership
        assert own[-1]["sender"] == alice.user_id
        assert "after they went" not in bodies(timeline)
        assert body["rooms"]["join"] == {} and body["rooms"]["invite"] == {}
        if user is not withdrawn:  # an invitee saw no timeline ("shared" history)
            assert own[-1]["event_id"] == timeline[-1]["event_id"]  # it ends with it
    # Rooms left of one's own accord, invites rejected: only with include_leave (spec).
    for user in (leaver, rejecter):
        assert (await sync(hs, user))["rooms"]["leave"] == {}, user.user_id
        with_leave = await sync(hs, user, filter=q({"room": {"include_leave": True}}))
        assert list(with_leave["rooms"]["leave"]) == [room_id]
    # A forgotten room is gone for good.
    await hs.ok("POST", f"/rooms/{room_id}/forget", {}, token=banned.token)
    assert (await sync(hs, banned))["rooms"]["leave"] == {}


# -- 2. a room left during the interval ends at the leave ---------------------------------


async def test_a_left_rooms_timeline_stops_at_the_leave(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    # world_readable: what follows bob's leave is visible to him by the rules, yet
    # the leave section's timeline still ends at the leave (spec).
    await _set_visibility(hs, alice, room_id, "world_readable")
    start = await sync(hs, bob)
    await send(hs, alice, room_id, "before")
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    await send(hs, alice, room_id, "after")
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "t"}, token=alice.token)
    later = await sync(hs, bob, since=start["next_batch"])
    room = later["rooms"]["leave"][room_id]
    events = room["timeline"]["events"]
    assert bodies(events) == ["before"]
    assert (events[-1]["type"], events[-1]["state_key"]) == ("m.room.member", bob.user_id)
    assert events[-1]["content"]["membership"] == "leave"
    assert "m.room.topic" not in {e["type"] for e in events + room["state"]["events"]}
    # The same on an initial sync with include_leave, and on the next incremental one
    # nothing more comes of the room.
    initial = await sync(hs, bob, filter=q({"room": {"include_leave": True}}))
    events = initial["rooms"]["leave"][room_id]["timeline"]["events"]
    assert bodies(events) == ["before"] and events[-1]["content"]["membership"] == "leave"
    assert "m.room.topic" not in {
        e["type"] for e in initial["rooms"]["leave"][room_id]["state"]["events"]
    }
    await send(hs, alice, room_id, "much later")
    quiet = await sync(hs, bob, since=later["next_batch"])
    assert room_id not in quiet["rooms"]["leave"] and room_id not in quiet["rooms"]["join"]


async def test_a_ban_during_the_interval_ends_the_timeline_at_the_ban(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    await _set_visibility(hs, alice, room_id, "world_readable")
    start = await sync(hs, bob)
    await hs.ok("POST", f"/rooms/{room_id}/ban", {"user_id": bob.user_id}, token=alice.token)
    await send(hs, alice, room_id, "behind his back")
    body = await sync(hs, bob, since=start["next_batch"])
    events = body["rooms"]["leave"][room_id]["timeline"]["events"]
    assert bodies(events) == [] and events[-1]["content"]["membership"] == "ban"


# -- 3. a room joined since the token comes as in an initial sync -------------------------


async def test_a_room_joined_since_the_token_comes_with_its_latest_events_and_state(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    for n in range(12):
        await send(hs, alice, room_id, f"m{n}")
    start = await sync(hs, bob)
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    body = await sync(hs, bob, since=start["next_batch"])
    room = body["rooms"]["join"][room_id]
    events = room["timeline"]["events"]
    # The latest 10 visible events (shared history: everything), not just the join.
    assert len(events) == 10 and room["timeline"]["limited"] is True
    assert bodies(events) == [f"m{n}" for n in range(3, 12)]
    assert events[-1]["state_key"] == bob.user_id
    state = {(e["type"], e["state_key"]) for e in room["state"]["events"]}
    assert {("m.room.create", ""), ("m.room.member", alice.user_id)} <= state
    assert not set(_ids(room["state"]["events"])) & set(_ids(events))
    # prev_batch continues back from the timeline's first event.
    older = await hs.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=5&from={room['timeline']['prev_batch']}",
        token=bob.token,
    )
    assert bodies(older["chunk"]) == ["m2", "m1", "m0"]
    # A room whose whole visible history fits is not limited.
    small = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    await send(hs, alice, small, "only one")
    mark = await sync(hs, bob, since=body["next_batch"])
    await hs.ok("POST", f"/rooms/{small}/join", {}, token=bob.token)
    joined = (await sync(hs, bob, since=mark["next_batch"]))["rooms"]["join"][small]
    assert joined["timeline"]["limited"] is False
    assert joined["timeline"]["events"][0]["type"] == "m.room.create"
    assert bodies(joined["timeline"]["events"]) == ["only one"]
    # state is the state before the timeline: the create event is not repeated in it.
    assert joined["state"]["events"] == []


async def test_a_rejoin_brings_the_history_sent_while_away(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)  # shared history
    await send(hs, alice, room_id, "together")
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    for n in range(3):
        await send(hs, alice, room_id, f"away {n}")
    # bob's client synced on while away: its token is past what was sent meanwhile.
    away = await sync(hs, bob)
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await send(hs, alice, room_id, "welcome back")
    body = await sync(hs, bob, since=away["next_batch"])
    timeline = body["rooms"]["join"][room_id]["timeline"]
    assert bodies(timeline["events"])[-5:] == [
        "together",
        "away 0",
        "away 1",
        "away 2",
        "welcome back",
    ]
    # Under "joined" visibility the history while away is not theirs: the timeline is
    # the rejoin and what follows, after their leave.
    await _set_visibility(hs, alice, room_id, "joined")
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    away = await sync(hs, bob, since=body["next_batch"])
    await send(hs, alice, room_id, "unseen")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    again = await sync(hs, bob, since=away["next_batch"])
    events = again["rooms"]["join"][room_id]["timeline"]["events"]
    assert "unseen" not in bodies(events)
    assert events[-1]["content"]["membership"] == "join"
    # A display name change is no rejoin: only the new events come.
    mark = again["next_batch"]
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.member/{bob.user_id}",
        {"membership": "join", "displayname": "Bob"},
        token=bob.token,
    )
    renamed = await sync(hs, bob, since=mark)
    events = renamed["rooms"]["join"][room_id]["timeline"]["events"]
    assert [e["content"].get("displayname") for e in events] == ["Bob"]
    assert renamed["rooms"]["join"][room_id]["timeline"]["limited"] is False


# -- 4. a filter that excludes events still fills its limit -------------------------------


async def test_a_timeline_filter_reads_on_to_fill_its_limit(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    room_id = await room_with(hs, alice)
    for n in range(8):
        await send(hs, alice, room_id, f"m{n}")
        await _send_typed(hs, alice, room_id, "org.example.noise", f"n{n}")
        await _send_typed(hs, alice, room_id, "org.example.noise", f"n{n}b")
    only_messages = q({"room": {"timeline": {"limit": 5, "types": ["m.room.message"]}}})
    body = await sync(hs, alice, filter=only_messages)
    timeline = body["rooms"]["join"][room_id]["timeline"]
    assert bodies(timeline["events"]) == ["m3", "m4", "m5", "m6", "m7"]
    assert timeline["limited"] is True
    older = await hs.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=50&from={timeline['prev_batch']}"
        f"&filter={q({'types': ['m.room.message']})}",
        token=alice.token,
    )
    assert bodies(older["chunk"]) == ["m2", "m1", "m0"]  # nothing skipped
    # Incremental: the same.
    for n in range(8, 16):
        await _send_typed(hs, alice, room_id, "org.example.noise", f"n{n}")
        await send(hs, alice, room_id, f"m{n}")
    later = await sync(hs, alice, since=body["next_batch"], filter=only_messages)
    timeline = later["rooms"]["join"][room_id]["timeline"]
    assert bodies(timeline["events"]) == ["m11", "m12", "m13", "m14", "m15"]
    assert timeline["limited"] is True
    # not_senders, and every event type excluded but messages through not_types.
    bob = await hs.register("bob")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    for n in range(6):
        await send(hs, bob, room_id, f"bob {n}")
    not_bob = q({"room": {"timeline": {"limit": 3, "not_senders": [bob.user_id]}}})
    timeline = (await sync(hs, alice, filter=not_bob))["rooms"]["join"][room_id]["timeline"]
    assert [e["sender"] for e in timeline["events"]] == [alice.user_id] * 3
    assert timeline["limited"] is True


async def test_a_filtered_timeline_reads_on_within_a_bound(homeserver: Homeserver) -> None:
    """Limit 1: at most 5 x max(2, 10) = 50 visible events are put to the filter; a
    match further back is not read (``limited``, for the client to paginate), one
    within the bound is."""
    hs = homeserver
    alice = await hs.register("alice")
    assert filter_budget(1) == 50
    rare = q({"room": {"timeline": {"limit": 1, "types": ["org.example.rare"]}}})
    near = await room_with(hs, alice)
    far = await room_with(hs, alice)
    for room_id, noise in ((near, 40), (far, 60)):
        await _send_typed(hs, alice, room_id, "org.example.rare", "found")
        for n in range(noise):
            await send(hs, alice, room_id, f"noise {n}")
    body = await sync(hs, alice, filter=rare)
    found = body["rooms"]["join"][near]["timeline"]
    assert [e["content"]["body"] for e in found["events"]] == ["found"]
    missed = body["rooms"]["join"][far]["timeline"]
    assert missed["events"] == [] and missed["limited"] is True
    # The same bound on an incremental sync.
    since = body["next_batch"]
    await _send_typed(hs, alice, far, "org.example.rare", "again")
    for n in range(60):
        await send(hs, alice, far, f"more noise {n}")
    later = (await sync(hs, alice, since=since, filter=rare))["rooms"]["join"][far]["timeline"]
    assert later["events"] == [] and later["limited"] is True


# -- 5. state is the state before the timeline --------------------------------------------


async def test_an_initial_syncs_state_does_not_repeat_the_timeline(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    room_id = (await hs.ok("POST", "/createRoom", {"name": "first"}, token=alice.token))["room_id"]
    body = await sync(hs, alice, filter=q({"room": {"timeline": {"limit": 50}}}))
    room = body["rooms"]["join"][room_id]
    timeline = room["timeline"]["events"]
    assert timeline[0]["type"] == "m.room.create"
    assert room["state"]["events"] == []  # nothing before the first event
    # A shorter timeline: state is what precedes it, none of its own events.
    await hs.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "second"}, token=alice.token
    )
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "third"}, token=alice.token)
    body = await sync(hs, alice, filter=q({"room": {"timeline": {"limit": 2}}}))
    room = body["rooms"]["join"][room_id]
    names = [e["content"]["name"] for e in room["timeline"]["events"]]
    assert names == ["second", "third"]
    state = {(e["type"], e["state_key"]): e for e in room["state"]["events"]}
    assert state[("m.room.name", "")]["content"] == {"name": "first"}
    assert ("m.room.create", "") in state
    assert not set(_ids(room["state"]["events"])) & set(_ids(room["timeline"]["events"]))
    # The same through a timeline filter that skips the name changes: the client still
    # learns the current name (state carries what the timeline leaves out).
    only_messages = q({"room": {"timeline": {"limit": 2, "types": ["m.room.message"]}}})
    await send(hs, alice, room_id, "hello")
    room = (await sync(hs, alice, filter=only_messages))["rooms"]["join"][room_id]
    state = {(e["type"], e["state_key"]): e for e in room["state"]["events"]}
    assert state[("m.room.name", "")]["content"] == {"name": "third"}
    # A state-only sync (limit 0) has the current state.
    body = await sync(hs, alice, filter=q({"room": {"timeline": {"limit": 0}}}))
    state = {
        (e["type"], e["state_key"]): e for e in body["rooms"]["join"][room_id]["state"]["events"]
    }
    assert state[("m.room.name", "")]["content"] == {"name": "third"}
    assert ("m.room.create", "") in state


# -- 6. /messages for non-members ---------------------------------------------------------


async def test_messages_is_refused_to_non_members(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    stranger = await hs.register("stranger")
    invitee = await hs.register("invitee")
    leaver = await hs.register("leaver")
    room_id = await room_with(hs, alice, bob, leaver)
    said = await send(hs, bob, room_id, "bob was here")
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=leaver.token)
    await hs.ok("POST", f"/rooms/{room_id}/ban", {"user_id": bob.user_id}, token=alice.token)
    await hs.ok("POST", f"/rooms/{room_id}/invite", {"user_id": invitee.user_id}, token=alice.token)
    for user in (stranger, bob, invitee):
        for query in ("dir=b", "dir=f", "dir=b&from=t1-1"):
            status, body = await hs.call(
                "GET", f"/rooms/{room_id}/messages?{query}", token=user.token
            )
            assert (status, body["errcode"]) == (403, "M_FORBIDDEN"), (user.user_id, query)
    # An unknown room: the same answer (its existence is not revealed).
    status, body = await hs.call("GET", "/rooms/!nowhere:test.local/messages", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    # Members and departed members page as before.
    chunk = (await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b", token=leaver.token))["chunk"]
    assert "bob was here" in bodies(chunk)
    assert (await hs.ok("GET", f"/rooms/{room_id}/messages", token=alice.token))["chunk"]
    # /event and /context still serve what the visibility rules allow the banned user.
    event = await hs.ok("GET", f"/rooms/{room_id}/event/{said}", token=bob.token)
    assert event["content"]["body"] == "bob was here"
    context = await hs.ok("GET", f"/rooms/{room_id}/context/{said}", token=bob.token)
    assert context["event"]["event_id"] == said
    later = await send(hs, alice, room_id, "after the ban")
    status, _ = await hs.call("GET", f"/rooms/{room_id}/event/{later}", token=bob.token)
    assert status == 404
    status, _ = await hs.call("GET", f"/rooms/{room_id}/context/{later}", token=bob.token)
    assert status == 403
    # A departed member who forgot the room is refused too (as Synapse).
    await hs.ok("POST", f"/rooms/{room_id}/forget", {}, token=leaver.token)
    status, body = await hs.call("GET", f"/rooms/{room_id}/messages", token=leaver.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    # world_readable now: anyone may read (a peek), the banned user included.
    await _set_visibility(hs, alice, room_id, "world_readable")
    await send(hs, alice, room_id, "open to all")
    for user in (stranger, bob, invitee, leaver):
        chunk = (await hs.ok("GET", f"/rooms/{room_id}/messages", token=user.token))["chunk"]
        assert bodies(chunk)[0] == "open to all", user.user_id


# -- 7. the room initialSync --------------------------------------------------------------


async def test_room_initial_sync_refuses_banned_users_unless_world_readable(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    await send(hs, bob, room_id, "mine")
    await hs.ok("POST", f"/rooms/{room_id}/ban", {"user_id": bob.user_id}, token=alice.token)
    status, body = await hs.call("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await _set_visibility(hs, alice, room_id, "world_readable")
    await send(hs, alice, room_id, "public now")
    peek = await hs.ok("GET", f"/rooms/{room_id}/initialSync", token=bob.token)
    # Synapse's shape; a peek has no membership.
    assert set(peek) == {
        "room_id",
        "messages",
        "state",
        "presence",
        "receipts",
        "account_data",
        "visibility",
    }
    assert set(peek["messages"]) == {"chunk", "start", "end"}
    assert bodies(peek["messages"]["chunk"])[-1] == "public now"
    topics = {(e["type"], e["state_key"]) for e in peek["state"]}
    assert ("m.room.member", bob.user_id) in topics


# -- what matrix-js-sdk shows -------------------------------------------------------------


async def test_matrix_js_sdk_shows_left_rooms_and_history_sent_while_away(
    running_server: RunningServer,
) -> None:
    """``js/sync_behaviours.mjs`` against a real ``roomstream run``: a banned user's
    fresh client lists the room among its left rooms (banned by the owner, with the
    reason) without the messages after the ban; a rejoining user's client shows the
    messages sent while they were away (shared history) before the newest one."""
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("sync_behaviours.mjs", running_server.url)
    assert report["left"] == [True]
    assert report["membership"] in ("leave", "ban")
    assert report["member"] == {"membership": "ban", "by": True, "reason": "spam"}
    assert report["seen"] == ["rules"]
    assert report["rejoined"][-4:] == ["away 0", "away 1", "away 2", "welcome back"]
