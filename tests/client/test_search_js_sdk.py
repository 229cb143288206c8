"""matrix-js-sdk and ``POST /search`` against a real ``roomstream run`` process, on SQLite
and PostgreSQL: in a room with ``history_visibility`` ``joined``, a user who joined late
finds, through the SDK's ``searchRoomEvents`` (``order_by`` ``recent``, with context) and
a raw ranked ``search``, only the message sent after their join, and the earlier one is
not even in a result's context; the room's creator finds both, newest first."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_search_finds_only_what_a_late_joiner_may_see(
    running_server: RunningServer,
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("search.mjs", running_server.url)
    before, after, room_id = report["before"], report["after"], report["room_id"]
    assert before != after
    # Bob's own client never had the earlier message either (the visibility rules agree).
    assert report["bob_timeline_has_before"] is False

    bob = report["bob_search"]
    assert [r["event_id"] for r in bob["results"]] == [after]
    (found,) = bob["results"]
    assert found["room_id"] == room_id
    assert found["sender"] == report["alice"]
    assert found["body"] == "xylophone after bob"
    # One event of context either side: before it, bob's own join (nothing follows it);
    # the earlier message is out of his sight there too.
    assert [context[1:] for context in found["context"]] == [["m.room.member", report["bob"]]]
    assert bob["count"] == 1
    assert bob["highlights"] == ["xylophone"]
    assert report["bob_ranked"] == {"count": 1, "results": [after]}

    alice = report["alice_search"]
    assert [r["event_id"] for r in alice["results"]] == [after, before]  # newest first
    assert [r["body"] for r in alice["results"]] == ["xylophone after bob", "xylophone before bob"]
    assert alice["count"] == 2
    # The same context for the later message (bob's join); the earlier one's ends with what
    # followed it, alice's invite of bob.
    assert alice["results"][0]["context"] == found["context"]
    assert alice["results"][1]["context"][-1][1:] == ["m.room.member", report["bob"]]
