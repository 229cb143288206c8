"""Filters with many ``*`` wildcards, over HTTP on both engines: matched by
:mod:`roomstream.glob` (no backtracking), so a /sync with 1,000 wildcards answers
(a regular expression with ``.*`` per star took exponential time on the event loop), and
patterns are bounded when the filter is parsed."""

from __future__ import annotations

from typing import Any

from roomstream.client.filtering import MAX_WILDCARD_PATTERNS, MAX_WILDCARDS
from roomstream.glob import MAX_GLOB_LENGTH
from tests.support.client import q, room_with
from tests.support.homeserver import Homeserver

LONG_A = "a" * 200
LONG_AB = "a" * 199 + "b"


async def test_a_thousand_wildcards_answer(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    for event_type in (LONG_A, LONG_AB, "m.room.message"):
        await homeserver.ok(
            "PUT",
            f"/rooms/{room_id}/send/{event_type}/{homeserver.txn()}",
            {"body": "x"},
            token=alice.token,
        )
    # Against LONG_A each of these is exponential for a backtracking matcher.
    patterns = ["*" * 1000 + "b", "a*" * 40 + "b", "*a" * 20 + "*b"]
    definition: dict[str, Any] = {"room": {"timeline": {"types": patterns, "limit": 50}}}
    filter_id = (
        await homeserver.ok("POST", f"/user/{alice.user_id}/filter", definition, token=alice.token)
    )["filter_id"]
    not_definition = {"room": {"timeline": {"not_types": patterns, "limit": 50}}}
    for chosen in (filter_id, q(definition)):
        body = await homeserver.ok("GET", f"/sync?filter={chosen}", token=alice.token)
        timeline = body["rooms"]["join"][room_id]["timeline"]["events"]
        assert [e["type"] for e in timeline] == [LONG_AB]
    body = await homeserver.ok("GET", f"/sync?filter={q(not_definition)}", token=alice.token)
    types = [e["type"] for e in body["rooms"]["join"][room_id]["timeline"]["events"]]
    assert LONG_A in types and "m.room.message" in types and LONG_AB not in types
    messages_filter = q({"types": patterns})
    status, page = await homeserver.call(
        "GET", f"/rooms/{room_id}/messages?dir=b&filter={messages_filter}", token=alice.token
    )
    assert status == 200 and [e["type"] for e in page["chunk"]] == [LONG_AB]


async def test_pattern_sizes_are_bounded(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    path = f"/user/{alice.user_id}/filter"
    too_long = {"room": {"timeline": {"types": ["*" * (MAX_GLOB_LENGTH + 1)]}}}
    too_many = {"account_data": {"not_types": [f"{i}*" for i in range(MAX_WILDCARD_PATTERNS + 1)]}}
    too_many_stars = {"room": {"state": {"types": ["*a" * MAX_WILDCARDS + "*"]}}}
    for definition in (too_long, too_many, too_many_stars):
        status, body = await homeserver.call("POST", path, definition, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    # At the limits, and exact types in any number, are fine.
    fine = {
        "room": {
            "timeline": {
                "types": ["*" * MAX_GLOB_LENGTH, "*a" * (MAX_WILDCARDS - MAX_WILDCARD_PATTERNS)]
                + [f"{i}*" for i in range(MAX_WILDCARD_PATTERNS - 2)]
                + [f"type.{i}" for i in range(2000)]
            }
        }
    }
    await homeserver.ok("POST", path, fine, token=alice.token)
