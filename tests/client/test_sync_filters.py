"""/sync beyond the basics, over HTTP on both engines: the filter language (uploaded and
inline, validation, every section, event_fields, event_format), /messages filters, the
state delta of a limited incremental sync, full_state with since, lazy-loaded members,
room summaries."""

from __future__ import annotations

from typing import Any

from tests.support.client import bodies, q, room_with, send, state_keys, sync
from tests.support.homeserver import Homeserver


async def test_invalid_filters_are_rejected(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bad: list[Any] = [
        [],
        {"room": []},
        {"room": {"timeline": {"limit": "5"}}},
        {"room": {"timeline": {"limit": -1}}},
        {"room": {"timeline": {"types": "m.room.message"}}},
        {"room": {"timeline": {"senders": [1]}}},
        {"room": {"include_leave": "yes"}},
        {"room": {"state": {"lazy_load_members": 1}}},
        {"room": {"timeline": {"contains_url": "true"}}},
        {"event_format": "xml"},
        {"event_fields": ["content.\\x"]},
        {"event_fields": ["content..body"]},
        {"account_data": {"not_types": [None]}},
    ]
    path = f"/user/{alice.user_id}/filter"
    for definition in bad:
        status, body = await homeserver.call("POST", path, definition, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_BAD_JSON"), definition
        status, body = await homeserver.call(
            "GET", f"/sync?filter={q(definition)}", token=alice.token
        )
        # Inline, only what starts with '{' is JSON (anything else is a filter ID).
        expected = "M_BAD_JSON" if isinstance(definition, dict) else "M_INVALID_PARAM"
        assert (status, body["errcode"]) == (400, expected), definition
    status, body = await homeserver.call("GET", "/sync?filter={nope", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_NOT_JSON")
    status, body = await homeserver.call("GET", "/sync?filter=12345", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call(
        "GET", f"/rooms/!x/messages?filter={q({'types': 3})}", token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")


async def test_timeline_state_and_room_filters(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_a = await room_with(homeserver, alice, bob)
    room_b = await room_with(homeserver, alice)
    await send(homeserver, alice, room_a, "from alice")
    await send(homeserver, bob, room_a, "from bob")
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_a}/send/m.room.message/{homeserver.txn()}",
        {"msgtype": "m.image", "body": "pic", "url": "mxc://x/y"},
        token=alice.token,
    )
    await homeserver.ok(
        "PUT", f"/rooms/{room_a}/send/org.example.custom/{homeserver.txn()}", {}, token=bob.token
    )
    await send(homeserver, alice, room_b, "in b")

    def timeline(body: Any, room_id: str) -> list[dict[str, Any]]:
        return list(body["rooms"]["join"][room_id]["timeline"]["events"])

    # Uploaded filter: only messages ('m.room.*' minus state types), not from bob.
    definition = {
        "room": {
            "timeline": {"types": ["m.room.*"], "not_types": ["m.room.member", "m.room.c*"]},
            "state": {"types": ["m.room.name", "m.room.create"]},
            "rooms": [room_a],
        }
    }
    uploaded = await homeserver.ok(
        "POST", f"/user/{alice.user_id}/filter", definition, token=alice.token
    )
    assert (
        await homeserver.ok(
            "GET", f"/user/{alice.user_id}/filter/{uploaded['filter_id']}", token=alice.token
        )
        == definition
    )
    body = await sync(homeserver, alice, filter=uploaded["filter_id"])
    assert set(body["rooms"]["join"]) == {room_a}
    events = timeline(body, room_a)
    assert {e["type"] for e in events} <= {
        "m.room.message",
        "m.room.join_rules",
        "m.room.history_visibility",
        "m.room.power_levels",
    }
    assert bodies(events) == ["from alice", "from bob", "pic"]
    assert {e["type"] for e in body["rooms"]["join"][room_a]["state"]["events"]} <= {
        "m.room.create"
    }
    # Inline filters: senders, contains_url, not_rooms, wildcard in the middle.
    only_bob = {"room": {"timeline": {"senders": [bob.user_id], "not_types": ["m.room.member"]}}}
    body = await sync(homeserver, alice, filter=q(only_bob))
    assert [e["type"] for e in timeline(body, room_a)] == ["m.room.message", "org.example.custom"]
    assert timeline(body, room_b) == []
    with_url = {"room": {"timeline": {"contains_url": True}, "not_rooms": [room_b]}}
    body = await sync(homeserver, alice, filter=q(with_url))
    assert bodies(timeline(body, room_a)) == ["pic"] and room_b not in body["rooms"]["join"]
    without_url = {"room": {"timeline": {"contains_url": False, "types": ["m.*.message"]}}}
    body = await sync(homeserver, alice, filter=q(without_url))
    assert bodies(timeline(body, room_a)) == ["from alice", "from bob"]
    not_alice = {"room": {"timeline": {"not_senders": [alice.user_id], "types": ["*"]}}}
    body = await sync(homeserver, alice, filter=q(not_alice))
    assert {e["sender"] for e in timeline(body, room_a)} == {bob.user_id}


async def test_account_data_ephemeral_and_include_leave(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    left = await room_with(homeserver, alice)
    await homeserver.ok("POST", f"/rooms/{left}/leave", {}, token=alice.token)
    for kind in ("org.example.a", "org.example.b", "m.direct"):
        await homeserver.ok(
            "PUT", f"/user/{alice.user_id}/account_data/{kind}", {"k": kind}, token=alice.token
        )
    await homeserver.ok(
        "PUT",
        f"/user/{alice.user_id}/rooms/{room_id}/account_data/org.example.r",
        {"r": 1},
        token=alice.token,
    )
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/typing/{bob.user_id}",
        {"typing": True, "timeout": 30000},
        token=bob.token,
    )
    everything = await sync(homeserver, alice)
    assert left not in everything["rooms"]["leave"]  # include_leave defaults to false
    types = {e["type"] for e in everything["account_data"]["events"]}
    assert {"org.example.a", "org.example.b", "m.direct"} <= types
    definition = {
        "account_data": {"types": ["org.example.*"], "not_types": ["org.example.b"]},
        "room": {
            "include_leave": True,
            "account_data": {"not_types": ["org.example.r"]},
            "ephemeral": {"types": ["m.receipt"]},
        },
    }
    body = await sync(homeserver, alice, filter=q(definition))
    assert [e["type"] for e in body["account_data"]["events"]] == ["org.example.a"]
    room = body["rooms"]["join"][room_id]
    assert room["account_data"]["events"] == []
    assert all(e["type"] == "m.receipt" for e in room["ephemeral"]["events"])
    assert left in body["rooms"]["leave"]
    unfiltered = everything["rooms"]["join"][room_id]
    assert any(e["type"] == "m.typing" for e in unfiltered["ephemeral"]["events"])
    assert [e["type"] for e in unfiltered["account_data"]["events"]] == ["org.example.r"]


async def test_event_fields_and_event_format(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/send/org.example.dotted/{homeserver.txn()}",
        {"a.b": {"c": 1, "d": 2}, "a": {"b": "nested"}, "x\\y": 3},
        token=alice.token,
    )
    fields = {
        "event_fields": ["type", "content.a\\.b.c", "content.x\\\\y", "unsigned.nothing"],
        "room": {"timeline": {"types": ["org.example.dotted"]}},
    }
    body = await sync(homeserver, alice, filter=q(fields))
    [event] = body["rooms"]["join"][room_id]["timeline"]["events"]
    assert event == {"type": "org.example.dotted", "content": {"a.b": {"c": 1}, "x\\y": 3}}
    federation = {"event_format": "federation", "room": {"timeline": {"limit": 3}}}
    body = await sync(homeserver, alice, filter=q(federation))
    events = body["rooms"]["join"][room_id]["timeline"]["events"]
    assert len(events) == 3
    for event in events:
        assert "prev_events" in event and "auth_events" in event and "depth" in event
        assert "hashes" in event and "signatures" in event
    client = await sync(homeserver, alice, filter=q({"room": {"timeline": {"limit": 3}}}))
    assert all(
        "prev_events" not in e for e in client["rooms"]["join"][room_id]["timeline"]["events"]
    )


async def test_messages_filter(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    for i in range(4):
        await send(homeserver, alice if i % 2 else bob, room_id, f"m{i}")
    definition = {"types": ["m.room.message"], "senders": [bob.user_id]}
    page = await homeserver.ok(
        "GET", f"/rooms/{room_id}/messages?dir=b&limit=50&filter={q(definition)}", token=alice.token
    )
    assert bodies(page["chunk"]) == ["m2", "m0"]
    by_limit = await homeserver.ok(
        "GET", f"/rooms/{room_id}/messages?dir=b&filter={q({'limit': 2})}", token=alice.token
    )
    assert bodies(by_limit["chunk"]) == ["m3", "m2"]
    lazy = {"lazy_load_members": True, "types": ["m.room.message"]}
    page = await homeserver.ok(
        "GET", f"/rooms/{room_id}/messages?dir=b&limit=2&filter={q(lazy)}", token=alice.token
    )
    assert bodies(page["chunk"]) == ["m3", "m2"]
    assert {(e["type"], e["state_key"]) for e in page["state"]} == {
        ("m.room.member", alice.user_id),
        ("m.room.member", bob.user_id),
    }
    page = await homeserver.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=50&filter={q(lazy | {'senders': [bob.user_id]})}",
        token=alice.token,
    )
    assert [e["state_key"] for e in page["state"]] == [bob.user_id]


async def test_limited_incremental_sync_sends_the_state_delta(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    start = await sync(homeserver, bob)
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic", {"topic": "gap"}, token=alice.token
    )
    for i in range(8):
        await send(homeserver, alice, room_id, f"filler {i}")
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name", {"name": "in timeline"}, token=alice.token
    )
    limit5 = q({"room": {"timeline": {"limit": 5}}})
    body = await sync(homeserver, bob, since=start["next_batch"], filter=limit5)
    room = body["rooms"]["join"][room_id]
    assert room["timeline"]["limited"] is True
    # Only what changed in the gap: not the create event, members, power levels...
    assert state_keys(room["state"]["events"]) == {("m.room.topic", "")}
    assert [e["type"] for e in room["timeline"]["events"]][-1] == "m.room.name"
    # Not limited: the timeline carries every change, the state section is empty.
    await send(homeserver, alice, room_id, "one more")
    body = await sync(homeserver, bob, since=body["next_batch"], filter=limit5)
    room = body["rooms"]["join"][room_id]
    assert room["timeline"]["limited"] is False and room["state"]["events"] == []


async def test_full_state_with_since(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    quiet = await room_with(homeserver, alice)
    busy = await room_with(homeserver, alice)
    first = await sync(homeserver, alice)
    await send(homeserver, alice, busy, "new")
    body = await sync(homeserver, alice, since=first["next_batch"], full_state="true")
    assert set(body["rooms"]["join"]) == {quiet, busy}
    assert body["rooms"]["join"][quiet]["timeline"]["events"] == []
    assert bodies(body["rooms"]["join"][busy]["timeline"]["events"]) == ["new"]
    for room_id in (quiet, busy):
        keys = state_keys(body["rooms"]["join"][room_id]["state"]["events"])
        assert {("m.room.create", ""), ("m.room.power_levels", "")} <= keys
        assert ("m.room.member", alice.user_id) in keys


async def test_lazy_loading_members(homeserver: Homeserver) -> None:
    users = [await homeserver.register(n) for n in ("alice", "bob", "carol", "dave")]
    alice, bob, carol, dave = users
    room_id = await room_with(homeserver, alice, bob, carol, dave)
    await send(homeserver, dave, room_id, "dave long ago")
    for i in range(4):
        await send(homeserver, carol, room_id, f"carol {i}")
    lazy = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 3}}}
    first = await sync(homeserver, bob, filter=q(lazy))
    room = first["rooms"]["join"][room_id]
    members = {k for t, k in state_keys(room["state"]["events"]) if t == "m.room.member"}
    assert members == {bob.user_id, carol.user_id}
    assert ("m.room.create", "") in state_keys(room["state"]["events"])
    # Incremental: carol's member event was sent already; dave's was not.
    await send(homeserver, carol, room_id, "carol again")
    await send(homeserver, dave, room_id, "dave again")
    second = await sync(homeserver, bob, since=first["next_batch"], filter=q(lazy))
    room = second["rooms"]["join"][room_id]
    assert state_keys(room["state"]["events"]) == {("m.room.member", dave.user_id)}
    # include_redundant_members: the senders' members every time.
    redundant = {"room": {"state": {"lazy_load_members": True, "include_redundant_members": True}}}
    await send(homeserver, carol, room_id, "carol thrice")
    third = await sync(homeserver, bob, since=second["next_batch"], filter=q(redundant))
    room = third["rooms"]["join"][room_id]
    assert state_keys(room["state"]["events"]) == {
        ("m.room.member", carol.user_id),
        ("m.room.member", bob.user_id),
    }
    # A sync from an older token (another device state, a retry) is sent them again.
    await send(homeserver, dave, room_id, "dave thrice")
    retry = await sync(homeserver, bob, since=first["next_batch"], filter=q(lazy))
    members = {k for t, k in state_keys(retry["rooms"]["join"][room_id]["state"]["events"])}
    assert {carol.user_id, dave.user_id} <= members


async def test_room_summary(homeserver: Homeserver) -> None:
    names = ("alice", "bob", "carol", "dave", "erin", "frank", "gina")
    alice, bob, carol, dave, erin, frank, gina = [await homeserver.register(n) for n in names]
    room_id = await room_with(homeserver, alice, bob, carol, dave, erin, frank)
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/invite", {"user_id": gina.user_id}, token=alice.token
    )
    body = await sync(homeserver, alice)
    summary = body["rooms"]["join"][room_id]["summary"]
    assert summary["m.joined_member_count"] == 6
    assert summary["m.invited_member_count"] == 1
    # Up to 5 others, joined ones first, in the order they joined.
    assert summary["m.heroes"] == [u.user_id for u in (bob, carol, dave, erin, frank)]
    # Incremental: a membership change updates it; a plain message leaves it out.
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=frank.token)
    later = await sync(homeserver, alice, since=body["next_batch"])
    summary = later["rooms"]["join"][room_id]["summary"]
    assert summary["m.joined_member_count"] == 5
    assert summary["m.heroes"] == [u.user_id for u in (bob, carol, dave, erin, gina)]
    await send(homeserver, alice, room_id, "hi")
    quiet = await sync(homeserver, alice, since=later["next_batch"])
    assert quiet["rooms"]["join"][room_id]["summary"] == {}
    # A named room has no heroes.
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name", {"name": "Named"}, token=alice.token
    )
    named = await sync(homeserver, alice, since=quiet["next_batch"])
    assert "m.heroes" not in named["rooms"]["join"][room_id]["summary"]
    assert named["rooms"]["join"][room_id]["summary"]["m.joined_member_count"] == 5


async def test_unread_notifications_count_since_the_read_receipt(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)  # two members: room_one_to_one
    await send(homeserver, alice, room_id, "my own: never counted")
    first = await send(homeserver, bob, room_id, "one")
    await send(homeserver, bob, room_id, "hey alice, look")  # contains_user_name
    path = f"/rooms/{room_id}/send/m.room.message/{homeserver.txn()}"
    await homeserver.ok(
        "PUT",
        path,
        {"msgtype": "m.text", "body": "alice", "m.mentions": {}},  # intentional: no mention
        token=bob.token,
    )
    await homeserver.ok(
        "PUT", path + "n", {"msgtype": "m.notice", "body": "alice"}, token=bob.token
    )
    body = await sync(homeserver, alice)
    counts = body["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 3, "highlight_count": 1}
    # A receipt on the first message: only what follows it counts.
    await homeserver.ok("POST", f"/rooms/{room_id}/receipt/m.read/{first}", {}, token=alice.token)
    later = await sync(homeserver, alice, since=body["next_batch"])
    counts = later["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 2, "highlight_count": 1}
    # The private receipt counts too; the later of the two wins.
    last = await send(homeserver, bob, room_id, "latest")
    await homeserver.ok(
        "POST", f"/rooms/{room_id}/receipt/m.read.private/{last}", {}, token=alice.token
    )
    read = await sync(homeserver, alice, since=later["next_batch"])
    counts = read["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 0, "highlight_count": 0}


async def test_filtered_out_events_leave_an_incremental_sync_empty(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    no_messages = q({"room": {"timeline": {"not_types": ["m.room.message"]}}})
    start = await sync(homeserver, alice, filter=no_messages)
    await send(homeserver, bob, room_id, "filtered out")
    quiet = await sync(homeserver, alice, since=start["next_batch"], filter=no_messages)
    assert quiet["rooms"]["join"] == {}
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic", {"topic": "shown"}, token=alice.token
    )
    shown = await sync(homeserver, alice, since=quiet["next_batch"], filter=no_messages)
    events = shown["rooms"]["join"][room_id]["timeline"]["events"]
    assert [e["type"] for e in events] == ["m.room.topic"]
