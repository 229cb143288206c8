"""Filters' ID lists and the timeline limit, over HTTP on both engines: room and user
IDs in ``rooms``/``not_rooms``/``senders``/``not_senders`` must be IDs (``400
M_BAD_JSON``, the errcode of every malformed filter), and a timeline ``limit`` of 0 (a
state-only sync, as clients use it) is accepted: no timeline events, the state as if
the timeline were empty."""

from __future__ import annotations

from typing import Any

import pytest

from roomstream.client.filtering import parse_sync_filter
from roomstream.errors import MatrixError
from tests.support.client import q, room_with, send, state_keys, sync
from tests.support.homeserver import Homeserver

V12_ROOM = "!Nhcu5BS-UMnFX7hBVfVSoXiD7OgH6iRT-xyIuqDnpYQ"

BAD_IDS: list[dict[str, Any]] = [
    {"room": {"rooms": ["not-a-room"]}},
    {"room": {"not_rooms": ["!no-server"]}},
    {"room": {"rooms": ["#alias:test.local"]}},
    {"room": {"timeline": {"rooms": ["@alice:test.local"]}}},
    {"room": {"state": {"not_rooms": [""]}}},
    {"room": {"timeline": {"senders": ["alice"]}}},
    {"room": {"timeline": {"not_senders": ["@alice"]}}},
    {"room": {"ephemeral": {"senders": ["!room:test.local"]}}},
    {"room": {"account_data": {"senders": ["@a:bad host"]}}},
    {"presence": {"senders": ["@"]}},
    {"account_data": {"not_senders": ["@x:" + "a" * 300]}},
]

GOOD_IDS: list[dict[str, Any]] = [
    {"room": {"rooms": ["!room:test.local", V12_ROOM], "not_rooms": []}},
    {"room": {"timeline": {"senders": ["@alice:test.local", "@bob:other.example:8448"]}}},
    {"room": {"state": {"not_senders": ["@Legacy_Upper:test.local"]}}},
    {"room": {"timeline": {"limit": 0}}},
]


@pytest.mark.parametrize("definition", BAD_IDS)
def test_a_filter_with_a_malformed_id_is_refused(definition: dict[str, Any]) -> None:
    with pytest.raises(MatrixError) as info:
        parse_sync_filter(definition)
    assert (info.value.http_status, info.value.errcode) == (400, "M_BAD_JSON")


@pytest.mark.parametrize("definition", GOOD_IDS)
def test_a_filter_with_well_formed_ids_is_taken(definition: dict[str, Any]) -> None:
    parse_sync_filter(definition)


async def test_malformed_ids_are_refused_uploaded_inline_and_for_messages(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    path = f"/user/{alice.user_id}/filter"
    for definition in BAD_IDS:
        status, body = await homeserver.call("POST", path, definition, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_BAD_JSON"), definition
        status, body = await homeserver.call(
            "GET", f"/sync?filter={q(definition)}", token=alice.token
        )
        assert (status, body["errcode"]) == (400, "M_BAD_JSON"), definition
    for messages_filter in ({"senders": ["nobody"]}, {"not_rooms": ["room"]}):
        status, body = await homeserver.call(
            "GET",
            f"/rooms/{room_id}/messages?dir=b&filter={q(messages_filter)}",
            token=alice.token,
        )
        assert (status, body["errcode"]) == (400, "M_BAD_JSON"), messages_filter
    for definition in GOOD_IDS:
        await homeserver.ok("POST", path, definition, token=alice.token)
        await homeserver.ok("GET", f"/sync?timeout=0&filter={q(definition)}", token=alice.token)


async def test_timeline_limit_zero_is_a_state_only_sync(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    await send(homeserver, alice, room_id, "one")
    state_only = q({"room": {"timeline": {"limit": 0}}})

    initial = await sync(homeserver, alice, filter=state_only)
    room = initial["rooms"]["join"][room_id]
    assert room["timeline"]["events"] == []
    assert room["timeline"]["limited"] is True
    keys = state_keys(room["state"]["events"])
    assert {("m.room.create", ""), ("m.room.member", alice.user_id)} <= keys
    assert ("m.room.member", bob.user_id) in keys
    # The state is the room's current state, whole.
    current = await homeserver.ok("GET", f"/rooms/{room_id}/state", token=alice.token)
    assert keys == state_keys(current)

    # Incremental: new state events arrive as state (the latest of each key), messages
    # not at all, and paginating back from prev_batch finds what was left out.
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "first"}, token=alice.token
    )
    await send(homeserver, bob, room_id, "two")
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "second"}, token=alice.token
    )
    await send(homeserver, bob, room_id, "three")
    later = await sync(homeserver, alice, since=initial["next_batch"], filter=state_only)
    room = later["rooms"]["join"][room_id]
    assert room["timeline"]["events"] == []
    assert room["timeline"]["limited"] is True
    topics = [e for e in room["state"]["events"] if e["type"] == "m.room.topic"]
    assert [e["content"]["topic"] for e in topics] == ["second"]
    assert all(e["type"] != "m.room.message" for e in room["state"]["events"])
    back = await homeserver.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=2&from={room['timeline']['prev_batch']}",
        token=alice.token,
    )
    assert [e["content"].get("body") for e in back["chunk"]] == ["three", None]

    # Nothing new: nothing for the room.
    quiet = await sync(homeserver, alice, since=later["next_batch"], filter=state_only)
    assert room_id not in quiet["rooms"]["join"]
    # An uploaded filter with limit 0 does the same.
    filter_id = (
        await homeserver.ok(
            "POST",
            f"/user/{alice.user_id}/filter",
            {"room": {"timeline": {"limit": 0}}},
            token=alice.token,
        )
    )["filter_id"]
    again = await sync(homeserver, alice, filter=filter_id)
    assert again["rooms"]["join"][room_id]["timeline"]["events"] == []
