"""Reports of events and rooms (stored for admins; 404 for an event the reporter may not
see) and ``timestamp_to_event`` (the nearest event the user may see, in a direction)."""

from __future__ import annotations

from typing import Any

from tests.support.client import room_with, send
from tests.support.homeserver import Homeserver, User


async def joined_history_room(hs: Homeserver, alice: User) -> str:
    room_id = await room_with(hs, alice, preset="public_chat")
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "joined"},
        token=alice.token,
    )
    return room_id


async def test_reports_are_stored_only_for_events_the_reporter_may_see(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    room_id = await joined_history_room(hs, alice)
    before = await send(hs, alice, room_id, "before bob")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    after = await send(hs, alice, room_id, "after bob")
    other_room = await room_with(hs, alice)

    body = {"reason": "spam", "score": -100}
    # Bob joined later in a "joined" room: the earlier event is not his to see or report.
    status, error = await hs.call(
        "POST", f"/rooms/{room_id}/report/{before}", body, token=bob.token
    )
    assert (status, error["errcode"]) == (404, "M_NOT_FOUND")
    # Carol is not in the room: nothing of it, not even that the event exists.
    status, error = await hs.call("POST", f"/rooms/{room_id}/report/{after}", {}, token=carol.token)
    assert (status, error["errcode"]) == (404, "M_NOT_FOUND")
    for path in (f"/rooms/{room_id}/report/$nope", f"/rooms/{other_room}/report/{after}"):
        status, error = await hs.call("POST", path, {}, token=bob.token)
        assert (status, error["errcode"]) == (404, "M_NOT_FOUND"), path
    status, error = await hs.call(
        "POST", f"/rooms/{room_id}/report/{after}", {"score": "bad"}, token=bob.token
    )
    assert (status, error["errcode"]) == (400, "M_BAD_JSON")
    assert await hs.process.reports.event_reports() == []

    assert await hs.ok("POST", f"/rooms/{room_id}/report/{after}", body, token=bob.token) == {}
    await hs.ok("POST", f"/rooms/{room_id}/report/{after}", {}, token=bob.token)
    reports = await hs.process.reports.event_reports()
    assert sorted(
        ((r.user_id, r.event_id, r.room_id, r.reason, r.score) for r in reports), key=repr
    ) == [
        (bob.user_id, after, room_id, "spam", -100),
        (bob.user_id, after, room_id, None, None),
    ]


async def test_room_reports_need_a_known_room_and_a_reason(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, alice, preset="private_chat")
    status, error = await hs.call("POST", f"/rooms/{room_id}/report", {}, token=bob.token)
    assert (status, error["errcode"]) == (400, "M_MISSING_PARAM")
    status, error = await hs.call(
        "POST", "/rooms/!unknown:test.local/report", {"reason": "x"}, token=bob.token
    )
    assert (status, error["errcode"]) == (404, "M_NOT_FOUND")
    assert await hs.process.reports.room_reports() == []
    await hs.ok("POST", f"/rooms/{room_id}/report", {"reason": "abuse"}, token=bob.token)
    reports = await hs.process.reports.room_reports()
    assert [(r.user_id, r.room_id, r.reason) for r in reports] == [(bob.user_id, room_id, "abuse")]


def expected(events: list[dict[str, Any]], ts: int, forwards: bool) -> str | None:
    """The oracle: events in timeline (stream) order; the first at or after ``ts``, or
    the last at or before it, by origin_server_ts then that order."""
    indexed = list(enumerate(events))
    if forwards:
        after = [(e["origin_server_ts"], i, e) for i, e in indexed if e["origin_server_ts"] >= ts]
        return min(after, key=lambda x: (x[0], x[1]))[2]["event_id"] if after else None
    before = [(e["origin_server_ts"], i, e) for i, e in indexed if e["origin_server_ts"] <= ts]
    return max(before, key=lambda x: (x[0], x[1]))[2]["event_id"] if before else None


async def timeline(hs: Homeserver, user: User, room_id: str) -> list[dict[str, Any]]:
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=f&limit=1000", token=user.token)
    events: list[dict[str, Any]] = page["chunk"]
    return events


async def lookup(hs: Homeserver, user: User, room_id: str, ts: int, d: str) -> tuple[int, Any]:
    return await hs.call(
        "GET",
        f"/_matrix/client/v1/rooms/{room_id}/timestamp_to_event?ts={ts}&dir={d}",
        token=user.token,
    )


async def test_timestamp_to_event_answers_the_nearest_visible_event(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    room_id = await joined_history_room(hs, alice)
    for i in range(5):
        await send(hs, alice, room_id, f"early {i}")
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    for i in range(5):
        await send(hs, alice, room_id, f"late {i}")

    everything = await timeline(hs, alice, room_id)
    seen_by_bob = await timeline(hs, bob, room_id)
    assert len(seen_by_bob) < len(everything)
    stamps = sorted({e["origin_server_ts"] for e in everything})
    probes = {stamps[0] - 1, stamps[-1] + 1, *stamps, *(s + 1 for s in stamps)}
    for user, visible in ((alice, everything), (bob, seen_by_bob)):
        for ts in sorted(probes):
            for d in ("f", "b"):
                status, body = await lookup(hs, user, room_id, ts, d)
                want = expected(visible, ts, d == "f")
                if want is None:
                    assert (status, body["errcode"]) == (404, "M_NOT_FOUND"), (ts, d)
                else:
                    assert status == 200, (ts, d, body)
                    assert body["event_id"] == want, (user.user_id, ts, d)
                    stamp = next(e for e in visible if e["event_id"] == want)["origin_server_ts"]
                    assert body["origin_server_ts"] == stamp

    # Not in the room (and not world_readable): 403, as /messages.
    status, body = await lookup(hs, carol, room_id, stamps[-1], "b")
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    for query, code in (("dir=f", "M_MISSING_PARAM"), ("ts=1&dir=x", "M_INVALID_PARAM")):
        status, body = await hs.call(
            "GET", f"/rooms/{room_id}/timestamp_to_event?{query}", token=alice.token
        )
        assert (status, body["errcode"]) == (400, code), query
