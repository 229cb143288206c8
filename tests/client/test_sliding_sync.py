"""Simplified sliding sync (MSC4186) over HTTP: a scripted client walks what Element X
does (first range [0, 19] with timeline_limit 1, growing ranges, a room subscription with
a larger timeline, long polls woken by new messages, an invite, a room moving to the top,
a leave, an expired pos); each response is checked against the proposal's rules and
against /sync and /messages for the same data."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from roomstream.sliding.store import SlidingStore
from tests.support.client import bodies, room_with, send
from tests.support.homeserver import Homeserver, User
from tests.support.relations import relate

PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
STABLE = "/_matrix/client/v4/sync"
REQUIRED_STATE = [
    ["m.room.create", ""],
    ["m.room.name", ""],
    ["m.room.member", "$LAZY"],
    ["m.room.member", "$ME"],
]


def room_list(ranges: list[int], *, limit: int = 1) -> dict[str, Any]:
    return {
        "all": {
            "ranges": [ranges],
            "timeline_limit": limit,
            "required_state": REQUIRED_STATE,
            "filters": {"not_room_types": ["m.space"]},
        }
    }


async def sliding(
    hs: Homeserver, user: User, body: dict[str, Any], pos: str | None = None, wait_ms: int = 0
) -> dict[str, Any]:
    query = f"?timeout={wait_ms}" + (f"&pos={pos}" if pos else "")
    result: dict[str, Any] = await hs.ok("POST", PATH + query, body, token=user.token)
    assert isinstance(result["pos"], str)
    return result


async def messages_before(hs: Homeserver, user: User, room_id: str, token: str) -> list[str]:
    page = await hs.ok(
        "GET", f"/rooms/{room_id}/messages?dir=b&limit=50&from={token}", token=user.token
    )
    return [e["event_id"] for e in page["chunk"]]


async def test_element_x_walk(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    rooms: list[str] = []
    latest: dict[str, str] = {}
    for i in range(25):
        body: dict[str, Any] = {"preset": "public_chat"}
        if i % 2 == 0:
            body["name"] = f"room {i}"
        room_id = (await hs.ok("POST", "/createRoom", body, token=alice.token))["room_id"]
        rooms.append(room_id)
        latest[room_id] = await send(hs, alice, room_id, f"message {i}")
    newest_first = list(reversed(rooms))

    # 1. First request: the top 20 rooms, one event each.
    first = await sliding(hs, alice, {"conn_id": "room-list", "lists": room_list([0, 19])})
    assert first["lists"]["all"]["count"] == 25
    assert set(first["rooms"]) == set(newest_first[:20])
    stamps = [first["rooms"][r]["bump_stamp"] for r in newest_first[:20]]
    assert stamps == sorted(stamps, reverse=True) and len(set(stamps)) == 20
    v2 = await hs.ok("GET", "/sync", token=alice.token)
    for index, room_id in enumerate(newest_first[:20]):
        room = first["rooms"][room_id]
        number = 24 - index
        assert room["initial"] is True and room["membership"] == "join"
        assert [e["event_id"] for e in room["timeline"]] == [latest[room_id]]
        assert room["limited"] is True and room["num_live"] == 0
        assert room["joined_count"] == 1 and room["invited_count"] == 0
        assert room["lists"] == ["all"]
        # The same latest event as /sync, and prev_batch pages back from it in /messages.
        assert v2["rooms"]["join"][room_id]["timeline"]["events"][-1]["event_id"] == latest[room_id]
        older = await messages_before(hs, alice, room_id, room["prev_batch"])
        assert older and latest[room_id] not in older
        v2_ids = [e["event_id"] for e in v2["rooms"]["join"][room_id]["timeline"]["events"]]
        assert older[0] == v2_ids[-2]
        types = {(e["type"], e["state_key"]) for e in room["required_state"]}
        assert ("m.room.create", "") in types and ("m.room.member", alice.user_id) in types
        if number % 2 == 0:
            assert room["name"] == f"room {number}" and "heroes" not in room
            assert ("m.room.name", "") in types
        else:
            assert "name" not in room and room["heroes"] == []

    # 2. The range grows: only the rooms not sent yet.
    second = await sliding(
        hs, alice, {"conn_id": "room-list", "lists": room_list([0, 99])}, first["pos"]
    )
    assert second["lists"]["all"]["count"] == 25
    assert set(second["rooms"]) == set(newest_first[20:])
    assert all(r["initial"] for r in second["rooms"].values())
    # Nothing new, timeout 0: an empty answer at once.
    idle = await sliding(
        hs, alice, {"conn_id": "room-list", "lists": room_list([0, 99])}, second["pos"]
    )
    assert idle["rooms"] == {}

    # 3. A subscription with a larger timeline: the top room's history, expanded.
    top = newest_first[0]
    for n in range(5):
        await send(hs, alice, top, f"more {n}")
    body = {
        "conn_id": "room-list",
        "lists": room_list([0, 99]),
        "room_subscriptions": {top: {"timeline_limit": 10, "required_state": [["*", "*"]]}},
    }
    third = await sliding(hs, alice, body, idle["pos"])
    assert list(third["rooms"]) == [top]
    room = third["rooms"][top]
    assert room.get("expanded_timeline") is True and "initial" not in room
    page = await hs.ok("GET", f"/rooms/{top}/messages?dir=b&limit=10", token=alice.token)
    assert [e["event_id"] for e in room["timeline"]] == [
        e["event_id"] for e in reversed(page["chunk"])
    ]
    assert room["num_live"] == 5
    # "*" widened the required state: what was not sent yet now comes (join rules...).
    assert ("m.room.join_rules", "") in {
        (e["type"], e["state_key"]) for e in room["required_state"]
    }
    fourth = await sliding(hs, alice, body, third["pos"])
    assert fourth["rooms"] == {}

    # 4. A long poll woken by a message: the oldest room moves to the top.
    oldest = newest_first[-1]
    poll = asyncio.create_task(sliding(hs, alice, body, fourth["pos"], wait_ms=20_000))
    message = await send(hs, alice, oldest, "back on top")
    fifth = await asyncio.wait_for(poll, 30)
    assert list(fifth["rooms"]) == [oldest]
    moved = fifth["rooms"][oldest]
    assert "initial" not in moved and [e["event_id"] for e in moved["timeline"]] == [message]
    assert moved["num_live"] == 1 and moved["limited"] is False
    assert moved["bump_stamp"] > max(r["bump_stamp"] for r in first["rooms"].values())
    # The room's name did not change: not repeated.
    assert "name" not in moved and "required_state" not in moved
    # The list itself moved it: the top of the range is now that room (a wider
    # timeline for [0, 0] sends it again, expanded).
    narrow = {"conn_id": "room-list", "lists": room_list([0, 0], limit=2)}
    top_now = await sliding(hs, alice, narrow, fifth["pos"])
    assert list(top_now["rooms"]) == [oldest]
    assert top_now["rooms"][oldest]["expanded_timeline"] is True
    assert top_now["rooms"][oldest]["timeline"][-1]["event_id"] == message
    fifth = await sliding(hs, alice, body, top_now["pos"])
    assert fifth["rooms"] == {}
    incremental = await hs.ok("GET", f"/sync?since={v2['next_batch']}", token=alice.token)
    assert bodies(incremental["rooms"]["join"][oldest]["timeline"]["events"]) == ["back on top"]

    # 5. An invite wakes the poll: stripped state, the list grows.
    poll = asyncio.create_task(sliding(hs, alice, body, fifth["pos"], wait_ms=20_000))
    invited_room = (await hs.ok("POST", "/createRoom", {"name": "bob's"}, token=bob.token))[
        "room_id"
    ]
    await hs.ok(
        "POST", f"/rooms/{invited_room}/invite", {"user_id": alice.user_id}, token=bob.token
    )
    sixth = await asyncio.wait_for(poll, 30)
    for _ in range(5):  # bounded: a wake may answer before the invite is complete
        if invited_room in sixth["rooms"]:
            break
        sixth = await sliding(hs, alice, body, sixth["pos"], wait_ms=20_000)
    invite = sixth["rooms"][invited_room]
    assert invite["membership"] == "invite" and invite["initial"] is True
    stripped = {(e["type"], e["state_key"]) for e in invite["stripped_state"]}
    assert ("m.room.member", alice.user_id) in stripped and ("m.room.name", "") in stripped
    assert "timeline" not in invite
    assert sixth["lists"]["all"]["count"] == 26

    # 6. Joining turns it into a full room; then a leave is told once, then dropped.
    await hs.ok("POST", f"/rooms/{invited_room}/join", {}, token=alice.token)
    joined = await sliding(hs, alice, body, sixth["pos"])
    assert joined["rooms"][invited_room]["membership"] == "join"
    assert joined["rooms"][invited_room]["initial"] is True
    assert joined["rooms"][invited_room]["name"] == "bob's"
    left_room = newest_first[5]
    await hs.ok("POST", f"/rooms/{left_room}/leave", {}, token=alice.token)
    left = await sliding(hs, alice, body, joined["pos"])
    assert left["rooms"][left_room]["membership"] == "leave"
    assert left["lists"]["all"]["count"] == 26
    after = await sliding(hs, alice, body, left["pos"])
    assert left_room not in after["rooms"] and after["lists"]["all"]["count"] == 25

    # 7. An old pos is gone: M_UNKNOWN_POS; so is one from another connection.
    status, error = await hs.call("POST", PATH + f"?pos={first['pos']}", body, token=alice.token)
    assert (status, error["errcode"]) == (400, "M_UNKNOWN_POS")
    other = dict(body, conn_id="other")
    status, error = await hs.call("POST", PATH + f"?pos={after['pos']}", other, token=alice.token)
    assert (status, error["errcode"]) == (400, "M_UNKNOWN_POS")
    # The last one still works (and the stable path serves the same connection).
    await hs.ok("POST", STABLE, dict(body, pos=after["pos"]), token=alice.token)

    # 8. A new connection (the app restarted) sees the list as it is now: a message
    # moved one more room up since the last response on any connection.
    bumped = newest_first[10]
    await send(hs, alice, bumped, "bump")
    fresh = await sliding(hs, alice, {"conn_id": "fresh", "lists": room_list([0, 2])})
    assert fresh["lists"]["all"]["count"] == 25
    order = sorted(fresh["rooms"], key=lambda r: -fresh["rooms"][r]["bump_stamp"])
    assert order == [bumped, invited_room, oldest]
    assert bodies(fresh["rooms"][bumped]["timeline"]) == ["bump"]


async def test_visibility_filters_and_extensions(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    # Bob's room is "joined"-only history: what was said before alice joined stays hidden.
    private = await room_with(hs, bob, preset="private_chat")
    await hs.ok(
        "PUT",
        f"/rooms/{private}/state/m.room.history_visibility/",
        {"history_visibility": "joined"},
        token=bob.token,
    )
    await send(hs, bob, private, "before alice")
    await hs.ok("POST", f"/rooms/{private}/invite", {"user_id": alice.user_id}, token=bob.token)
    await hs.ok("POST", f"/rooms/{private}/join", {}, token=alice.token)
    after = await send(hs, bob, private, "after alice")
    dm = await room_with(hs, alice, bob, preset="trusted_private_chat")
    await hs.ok(
        "PUT",
        f"/user/{alice.user_id}/account_data/m.direct",
        {bob.user_id: [dm]},
        token=alice.token,
    )
    # createRoom takes no creation_content yet: a "space" here is any room with
    # m.space.child state (the spaces filter reads only that).
    space = (await hs.ok("POST", "/createRoom", {"name": "space"}, token=alice.token))["room_id"]
    await hs.ok(
        "PUT",
        f"/rooms/{space}/state/m.space.child/{private}",
        {"via": ["test.local"]},
        token=alice.token,
    )
    await hs.ok("PUT", f"/rooms/{space}/state/m.space.child/{dm}", {}, token=alice.token)
    await hs.ok(
        "PUT", f"/user/{alice.user_id}/rooms/{private}/tags/m.favourite", {}, token=alice.token
    )
    await hs.ok(
        "PUT",
        f"/rooms/{dm}/typing/{alice.user_id}",
        {"typing": True, "timeout": 30000},
        token=alice.token,
    )
    body = {
        "lists": {
            "dms": {
                "ranges": [[0, 9]],
                "timeline_limit": 20,
                "required_state": [],
                "filters": {"is_dm": True},
            },
            "spaces": {
                "ranges": [[0, 9]],
                "timeline_limit": 0,
                "required_state": [],
                "filters": {"spaces": [space]},
            },
            "favourites": {
                "range": [0, 9],
                "timeline_limit": 20,
                "required_state": {"include": [{}], "exclude": [{"type": "m.room.member"}]},
                "filters": {"tags": ["m.favourite"]},
            },
            "rest": {
                "ranges": [[0, 9]],
                "timeline_limit": 1,
                "required_state": [],
                "filters": {
                    "is_dm": False,
                    "room_types": [None],
                    "not_room_types": ["m.space"],
                    "not_tags": ["m.favourite"],
                },
            },
        },
        "extensions": {
            "account_data": {"enabled": True},
            "typing": {"enabled": True},
            "receipts": {"enabled": True},
            "to_device": {"enabled": True},
        },
    }
    first = await sliding(hs, alice, body)
    counts = {name: value["count"] for name, value in first["lists"].items()}
    assert counts == {"dms": 1, "spaces": 1, "favourites": 1, "rest": 1}
    assert first["rooms"][dm]["lists"] == ["dms"] and first["rooms"][dm]["is_dm"] is True
    assert first["rooms"][private]["lists"] == ["spaces", "favourites"]
    assert first["rooms"][space]["lists"] == ["rest"] and "is_dm" not in first["rooms"][space]
    fav = first["rooms"][private]
    assert bodies(fav["timeline"]) == ["after alice"] and fav["timeline"][-1]["event_id"] == after
    state_types = {e["type"] for e in fav["required_state"]}
    assert "m.room.member" not in state_types and "m.room.history_visibility" in state_types
    page = await hs.ok("GET", f"/rooms/{private}/messages?dir=b&limit=50", token=alice.token)
    assert "before alice" not in bodies(page["chunk"])
    ext = first["extensions"]
    assert {e["type"] for e in ext["account_data"]["global"]} >= {"m.direct"}
    assert ext["account_data"]["rooms"][private][0]["type"] == "m.tag"
    assert ext["typing"]["rooms"][dm]["content"]["user_ids"] == [alice.user_id]
    assert ext["to_device"]["events"] == []
    # A to-device message wakes a long poll and arrives once.
    poll = asyncio.create_task(sliding(hs, alice, body, first["pos"], wait_ms=20_000))
    await hs.ok(
        "PUT",
        f"/sendToDevice/m.test/{hs.txn()}",
        {"messages": {alice.user_id: {alice.device_id: {"n": 1}}}},
        token=bob.token,
    )
    second = await asyncio.wait_for(poll, 30)
    assert second["rooms"] == {}
    assert second["extensions"]["to_device"]["events"][0]["content"] == {"n": 1}
    third = await sliding(hs, alice, body, second["pos"])
    assert not third["extensions"].get("to_device", {}).get("events")
    # No longer a DM: the room says so (and moves from one list to the other).
    await hs.ok("PUT", f"/user/{alice.user_id}/account_data/m.direct", {}, token=alice.token)
    fourth = await sliding(hs, alice, body, third["pos"])
    assert fourth["rooms"][dm]["is_dm"] is False and fourth["rooms"][dm]["lists"] == ["rest"]
    assert fourth["lists"]["dms"]["count"] == 0 and fourth["lists"]["rest"]["count"] == 2


async def test_bad_requests_are_matrix_errors(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    status, error = await hs.call("POST", PATH, {}, token=None)
    assert status == 401
    cases: list[tuple[Any, str]] = [
        ({"lists": {"a": {"ranges": [[5, 1]], "timeline_limit": 1}}}, "M_INVALID_PARAM"),
        ({"lists": {"a": {"ranges": "x", "timeline_limit": 1}}}, "M_INVALID_PARAM"),
        ({"lists": {"a": {"timeline_limit": -1}}}, "M_INVALID_PARAM"),
        ({"lists": {"a": {"timeline_limit": 1, "required_state": [["a"]]}}}, "M_INVALID_PARAM"),
        ({"lists": {"a": {"timeline_limit": 1, "filters": {"is_dm": "yes"}}}}, "M_INVALID_PARAM"),
        ({"lists": []}, "M_INVALID_PARAM"),
        ({"room_subscriptions": {"!r:x": 3}}, "M_INVALID_PARAM"),
        ({"conn_id": 5}, "M_INVALID_PARAM"),
        ({"extensions": {"to_device": {"enabled": True, "since": "abc"}}}, "M_INVALID_PARAM"),
        ({"pos": "nothing_1"}, "M_UNKNOWN_POS"),
        ([1], "M_BAD_JSON"),
    ]
    for body, errcode in cases:
        status, error = await hs.call("POST", PATH, body, token=alice.token)
        assert (status, error["errcode"]) == (400, errcode), body
    status, error = await hs.call("POST", PATH + "?timeout=soon", {}, token=alice.token)
    assert (status, error["errcode"]) == (400, "M_INVALID_PARAM")
    versions = await hs.ok("GET", "/_matrix/client/versions")
    assert versions["unstable_features"]["org.matrix.simplified_msc3575"] is True


async def test_room_fields_are_sent_when_they_change(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "one"}, token=alice.token)
    body = {"lists": room_list([0, 9])}
    first = await sliding(hs, alice, body)
    room = first["rooms"][room_id]
    assert room["name"] == "one" and room["joined_count"] == 2 and "heroes" not in room
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "two"}, token=alice.token)
    second = await sliding(hs, alice, body, first["pos"])
    delta = second["rooms"][room_id]
    assert delta["name"] == "two" and "initial" not in delta
    assert "joined_count" not in delta and "membership" not in delta
    assert [e["type"] for e in delta["required_state"]] == ["m.room.name"]
    # The name removed: null, and heroes to name the room by.
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name/", {}, token=alice.token)
    third = await sliding(hs, alice, body, second["pos"])
    delta = third["rooms"][room_id]
    assert delta["name"] is None
    assert [h["user_id"] for h in delta["heroes"]] == [bob.user_id]
    # Bob leaves: the count changes; his member event comes through lazy loading.
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    fourth = await sliding(hs, alice, body, third["pos"])
    delta = fourth["rooms"][room_id]
    assert delta["joined_count"] == 1
    members = [e for e in delta["required_state"] if e["type"] == "m.room.member"]
    assert [(m["state_key"], m["content"]["membership"]) for m in members] == [
        (bob.user_id, "leave")
    ]


async def test_a_room_back_in_the_window_after_activity_is_sent_whole(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    older = await room_with(hs, alice)
    await send(hs, alice, older, "old 1")
    newer = await room_with(hs, alice)
    await send(hs, alice, newer, "new 1")
    wide = {"lists": room_list([0, 1], limit=2)}
    narrow = {"lists": room_list([0, 0], limit=2)}
    first = await sliding(hs, alice, wide)
    assert set(first["rooms"]) == {older, newer}
    # Only the top room is watched now; the other gets two messages meanwhile.
    second = await sliding(hs, alice, narrow, first["pos"])
    await send(hs, alice, older, "old 2")
    third = await sliding(hs, alice, narrow, second["pos"])
    await send(hs, alice, older, "old 3")
    # The first message moved it to the top: it came back with a full room.
    assert list(third["rooms"]) == [older]
    back = third["rooms"][older]
    assert back["initial"] is True and bodies(back["timeline"]) == ["old 1", "old 2"]
    assert back["num_live"] == 1
    fourth = await sliding(hs, alice, narrow, third["pos"])
    assert bodies(fourth["rooms"][older]["timeline"]) == ["old 3"]
    assert "initial" not in fourth["rooms"][older]


async def test_only_the_proposals_event_types_bump_a_room(homeserver: Homeserver) -> None:
    """bump_stamp follows MSC4186's list of "proper" activity (a reaction or a topic change
    leaves it; a message moves it above the other rooms), while the server's list keeps
    ordering by any event (the proposal: rooms are not ordered by bump_stamp), so the
    room with the reaction is in range [0, 0] and its news reaches the client."""
    hs = homeserver
    alice = await hs.register("alice")
    quiet = await room_with(hs, alice)
    await send(hs, alice, quiet, "quiet 1")
    busy = await room_with(hs, alice)
    busy_message = await send(hs, alice, busy, "busy 1")
    body = {"lists": room_list([0, 9], limit=5)}
    first = await sliding(hs, alice, body)
    stamps = {r: first["rooms"][r]["bump_stamp"] for r in (quiet, busy)}
    assert stamps[busy] > stamps[quiet]

    reaction = {"m.relates_to": {"rel_type": "m.annotation", "event_id": busy_message, "key": "+"}}
    await hs.ok("PUT", f"/rooms/{quiet}/send/m.reaction/{hs.txn()}", reaction, token=alice.token)
    await hs.ok("PUT", f"/rooms/{quiet}/state/m.room.topic/", {"topic": "t"}, token=alice.token)
    second = await sliding(hs, alice, body, first["pos"])
    delta = second["rooms"][quiet]
    assert [e["type"] for e in delta["timeline"]] == ["m.reaction", "m.room.topic"]
    assert "bump_stamp" not in delta  # unchanged: still below the busy room's
    # A new connection sees the same stamps, and the reacted-to room first in the list.
    fresh = await sliding(hs, alice, {"conn_id": "other", "lists": room_list([0, 0])})
    assert list(fresh["rooms"]) == [quiet]
    assert fresh["rooms"][quiet]["bump_stamp"] == stamps[quiet]
    whole = await sliding(hs, alice, dict(body, conn_id="other"))
    assert {r: whole["rooms"][r]["bump_stamp"] for r in (quiet, busy)} == stamps

    # An encrypted event (a bump type) moves it above the busy room.
    await hs.ok(
        "PUT",
        f"/rooms/{quiet}/send/m.room.encrypted/{hs.txn()}",
        {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"},
        token=alice.token,
    )
    third = await sliding(hs, alice, body, second["pos"])
    assert third["rooms"][quiet]["bump_stamp"] > stamps[busy]
    assert "bump_stamp" not in third["rooms"].get(busy, {})
    again = await sliding(hs, alice, dict(body, conn_id="other"))
    assert again["rooms"][quiet]["bump_stamp"] == third["rooms"][quiet]["bump_stamp"]
    # A message in the busy room: above again.
    await send(hs, alice, busy, "busy 2")
    fourth = await sliding(hs, alice, body, third["pos"])
    assert fourth["rooms"][busy]["bump_stamp"] > third["rooms"][quiet]["bump_stamp"]
    # The whole-list read (a cold process) agrees with the stamps sent incrementally.
    entries = {e.room_id: e for e in await SlidingStore(hs.engine.db).room_list(alice.user_id)}
    assert entries[busy].bump == fourth["rooms"][busy]["bump_stamp"]
    assert entries[quiet].bump == third["rooms"][quiet]["bump_stamp"]
    assert entries[busy].activity == entries[busy].bump > entries[quiet].activity


async def test_a_knocked_room_comes_with_its_stripped_state(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, bob)
    await send(hs, bob, room_id, "members only")
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "club"}, token=bob.token)
    # Knocking needs the knock join rule (the auth rules: 403 otherwise), a known room.
    status, error = await hs.call("POST", f"/knock/{room_id}", {}, token=alice.token)
    assert (status, error["errcode"]) == (403, "M_FORBIDDEN")
    status, error = await hs.call("POST", "/knock/!nowhere:test", {}, token=alice.token)
    assert (status, error["errcode"]) == (404, "M_NOT_FOUND")
    rules = {"join_rule": "knock"}
    await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.join_rules/", rules, token=bob.token)
    knocked = await hs.ok("POST", f"/knock/{room_id}", {"reason": "hi"}, token=alice.token)
    assert knocked == {"room_id": room_id}

    first = await sliding(hs, alice, {"lists": room_list([0, 9])})
    assert first["lists"]["all"]["count"] == 1
    room = first["rooms"][room_id]
    assert room["membership"] == "knock" and room["initial"] is True
    assert "timeline" not in room and "required_state" not in room
    stripped = {(e["type"], e["state_key"]): e for e in room["stripped_state"]}
    assert stripped[("m.room.name", "")]["content"] == {"name": "club"}
    assert stripped[("m.room.join_rules", "")]["content"] == rules
    own = stripped[("m.room.member", alice.user_id)]
    # A knock carries the knocker's profile (as Synapse), here the registration's name.
    assert own["content"] == {"membership": "knock", "reason": "hi", "displayname": "alice"}
    # Nothing of the room's history or members leaks to the knocker.
    assert set(stripped) <= {
        ("m.room.create", ""), ("m.room.name", ""), ("m.room.join_rules", ""),
        ("m.room.avatar", ""), ("m.room.topic", ""), ("m.room.canonical_alias", ""),
        ("m.room.encryption", ""), ("m.room.member", alice.user_id),
    }  # fmt: skip
    # Knocking again while knocking is allowed by the auth rules; once invited it is not.
    await hs.ok("POST", f"/rooms/{room_id}/invite", {"user_id": alice.user_id}, token=bob.token)
    status, error = await hs.call("POST", f"/knock/{room_id}", {}, token=alice.token)
    assert (status, error["errcode"]) == (403, "M_FORBIDDEN")
    second = await sliding(hs, alice, {"lists": room_list([0, 9])}, first["pos"])
    assert second["rooms"][room_id]["membership"] == "invite"
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=alice.token)
    third = await sliding(hs, alice, {"lists": room_list([0, 9])}, second["pos"])
    joined = third["rooms"][room_id]
    assert joined["membership"] == "join" and joined["initial"] is True
    assert bodies(joined["timeline"]) in ([], ["members only"])


async def test_e2ee_extension_follows_device_lists_and_key_counts(homeserver: Homeserver) -> None:
    """The ``e2ee`` extension (MSC3884, Element X asks for it): the device's key counts in
    every answer; device list changes since the connection's last position (a room-mate's
    new keys, who came to share a room, who shares none any more), and only those end a
    long poll (the counts alone do not)."""
    from tests.support.e2e_keys import Device

    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    room = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=alice.token))[
        "room_id"
    ]
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    body = {"lists": room_list([0, 9]), "extensions": {"e2ee": {"enabled": True}}}
    first = await sliding(hs, alice, body)
    assert first["extensions"]["e2ee"] == {
        "device_lists": {"changed": [], "left": []},
        "device_one_time_keys_count": {"signed_curve25519": 0},
        "device_unused_fallback_key_types": [],
    }
    mine = Device(alice.user_id, alice.device_id)
    otks = {"one_time_keys": mine.one_time_keys(["a", "b"])}
    await hs.ok("POST", "/keys/upload", otks, token=alice.token)
    # A count changing is not news: a long poll from before the upload waits (it starts
    # listening), and bob's new keys then end it at once (it would wait ten minutes).
    notifier = hs.process.notifier
    listening = asyncio.Event()
    original_listen = notifier.listen

    @contextlib.contextmanager
    def listen(user_id: str, room_ids: Any) -> Iterator[Any]:
        with original_listen(user_id, room_ids) as waiter:
            listening.set()
            yield waiter

    notifier.listen = listen  # type: ignore[method-assign]
    poll = asyncio.create_task(sliding(hs, alice, body, pos=first["pos"], wait_ms=600_000))
    started = asyncio.create_task(listening.wait())
    done, _ = await asyncio.wait({poll, started}, return_when=asyncio.FIRST_COMPLETED)
    assert started in done and poll not in done, "the key counts alone ended the long poll"
    keys = {"device_keys": Device(bob.user_id, bob.device_id).device_keys()}
    await hs.ok("POST", "/keys/upload", keys, token=bob.token)
    woken = await asyncio.wait_for(poll, 60)
    del notifier.listen
    assert woken["extensions"]["e2ee"]["device_lists"] == {"changed": [bob.user_id], "left": []}
    assert woken["extensions"]["e2ee"]["device_one_time_keys_count"] == {"signed_curve25519": 2}
    await hs.ok("POST", f"/join/{room}", {}, token=carol.token)
    await hs.ok("POST", f"/rooms/{room}/leave", {}, token=bob.token)
    later = await sliding(hs, alice, body, pos=woken["pos"])
    assert later["extensions"]["e2ee"]["device_lists"] == {
        "changed": [carol.user_id],
        "left": [bob.user_id],
    }
    # Not asked for: not sent.
    plain = await sliding(hs, alice, {"lists": room_list([0, 9])}, pos=later["pos"])
    assert "e2ee" not in plain["extensions"]


async def test_timelines_carry_bundled_aggregations(homeserver: Homeserver) -> None:
    """Sliding sync serialises its timelines with the server-side aggregations, as
    ``/sync`` does (Synapse's sliding sync bundles them): a room sent whole carries the
    root's thread summary and references; an incremental response bundles the events
    whose relations the read path's change cache saw, a plain message none."""
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    room_id = await room_with(hs, alice, bob)
    root = await send(hs, alice, room_id, "root")
    reply = await relate(hs, bob, room_id, "m.thread", root, body="in thread")
    reference = await relate(hs, bob, room_id, "m.reference", root)
    body = {"lists": room_list([0, 0], limit=10)}
    first = await sliding(hs, alice, body)
    events = {e["event_id"]: e for e in first["rooms"][room_id]["timeline"]}
    bundle = events[root]["unsigned"]["m.relations"]
    assert bundle["m.thread"]["latest_event"]["event_id"] == reply
    assert bundle["m.thread"]["latest_event"]["content"]["body"] == "in thread"
    assert (bundle["m.thread"]["count"], bundle["m.thread"]["current_user_participated"]) == (
        1,
        True,
    )
    assert bundle["m.reference"] == {"chunk": [{"event_id": reference}]}
    assert "m.relations" not in events[reply].get("unsigned", {})
    # Incremental: a new root and its reply in the same range; a plain message.
    plain = await send(hs, bob, room_id, "plain")
    second_root = await send(hs, bob, room_id, "second root")
    second_reply = await relate(hs, alice, room_id, "m.thread", second_root, body="r")
    later = await sliding(hs, alice, body, first["pos"])
    served = {e["event_id"]: e for e in later["rooms"][room_id]["timeline"]}
    assert set(served) == {plain, second_root, second_reply}
    summary = served[second_root]["unsigned"]["m.relations"]["m.thread"]
    assert (summary["count"], summary["latest_event"]["event_id"]) == (1, second_reply)
    assert "m.relations" not in served[plain].get("unsigned", {})
