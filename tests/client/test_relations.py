"""Relations through the API: ``/relations`` (filters, both directions, paging, recurse),
``/threads`` (all, participated, paging), the bundled aggregations of ``/event``,
``/messages`` and ``/context``; all through the visibility records (a user never learns
of a relation sent while they could not see the room) with redacted relations left out."""

from __future__ import annotations

from typing import Any

from tests.support.client import room_with, send
from tests.support.homeserver import Homeserver
from tests.support.relations import relate


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["event_id"]) for e in events]


async def test_relations_filters_directions_and_pages(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    root = await send(hs, alice, room_id, "root")
    replies = [
        await relate(hs, bob, room_id, "m.thread", root, body=f"reply {i}") for i in range(5)
    ]
    reaction = await relate(
        hs, alice, room_id, "m.annotation", root, event_type="m.reaction", key="👍"
    )
    edit = await relate(hs, alice, room_id, "m.replace", root, body="* root")
    other = await send(hs, alice, room_id, "unrelated")

    base = f"/rooms/{room_id}/relations/{root}"
    every = await hs.ok("GET", f"{base}?limit=50", token=bob.token)
    assert ids(every["chunk"]) == [edit, reaction, *reversed(replies)]
    assert "next_batch" not in every and other not in ids(every["chunk"])

    forwards = await hs.ok("GET", f"{base}/m.thread?dir=f&limit=50", token=bob.token)
    assert ids(forwards["chunk"]) == replies
    typed = await hs.ok("GET", f"{base}/m.annotation/m.reaction", token=bob.token)
    assert ids(typed["chunk"]) == [reaction]
    assert (await hs.ok("GET", f"{base}/m.annotation/m.room.message", token=bob.token))[
        "chunk"
    ] == []

    # Pages of two, backwards then forwards: every reply exactly once, in order.
    for direction, expected in (("b", list(reversed(replies))), ("f", replies)):
        seen: list[str] = []
        token = None
        while True:
            query = f"?dir={direction}&limit=2" + (f"&from={token}" if token else "")
            page = await hs.ok("GET", f"{base}/m.thread{query}", token=bob.token)
            seen += ids(page["chunk"])
            assert len(page["chunk"]) <= 2
            if token is not None:
                assert page["prev_batch"] == token
            token = page.get("next_batch")
            if token is None:
                break
        assert seen == expected

    status, body = await hs.call("GET", f"{base}?dir=x", token=bob.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await hs.call("GET", f"{base}?from=garbage", token=bob.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await hs.call("GET", f"/rooms/{room_id}/relations/$nope:test", token=bob.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_recurse_follows_relations_of_relations(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    room_id = await room_with(hs, alice)
    root = await send(hs, alice, room_id, "root")
    reply = await relate(hs, alice, room_id, "m.thread", root)
    reaction = await relate(
        hs, alice, room_id, "m.annotation", reply, event_type="m.reaction", key="x"
    )
    base = f"/rooms/{room_id}/relations/{root}"
    flat = await hs.ok("GET", base, token=alice.token)
    assert ids(flat["chunk"]) == [reply] and "recursion_depth" not in flat
    deep = await hs.ok("GET", f"{base}?recurse=true", token=alice.token)
    assert ids(deep["chunk"]) == [reaction, reply]
    assert deep["recursion_depth"] == 3
    # The filter applies at every level: the reaction hangs off an m.thread event but is
    # itself an m.annotation.
    only_threads = await hs.ok("GET", f"{base}/m.thread?recurse=true", token=alice.token)
    assert ids(only_threads["chunk"]) == [reply]


async def test_relations_follow_visibility_and_redactions(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, eve = [await hs.register(n) for n in ("alice", "bob", "eve")]
    room_id = await room_with(hs, alice, bob, preset="private_chat")
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility",
        {"history_visibility": "joined"},
        token=alice.token,
    )
    root = await send(hs, alice, room_id, "root")
    await hs.ok("POST", f"/rooms/{room_id}/invite", {"user_id": eve.user_id}, token=alice.token)
    await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=eve.token)
    # The root and a reply from before eve joined are not hers to see.
    early = await relate(hs, bob, room_id, "m.thread", root, body="before eve")
    status, body = await hs.call("GET", f"/rooms/{room_id}/relations/{root}", token=eve.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")

    later_root = await send(hs, alice, room_id, "after eve joined")
    hidden_ref = await relate(hs, bob, room_id, "m.reference", later_root)
    seen_ref = await relate(hs, alice, room_id, "m.reference", later_root)
    await hs.ok("POST", f"/rooms/{room_id}/leave", {}, token=eve.token)
    after_leave = await relate(hs, alice, room_id, "m.reference", later_root)
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/redact/{hidden_ref}/{hs.txn()}",
        {"reason": "gone"},
        token=bob.token,
    )
    base = f"/rooms/{room_id}/relations/{later_root}"
    assert ids((await hs.ok("GET", base, token=eve.token))["chunk"]) == [seen_ref]
    assert ids((await hs.ok("GET", base, token=bob.token))["chunk"]) == [after_leave, seen_ref]

    # Aggregations: eve's count and chunk hold only what she may see.
    event = await hs.ok("GET", f"/rooms/{room_id}/event/{later_root}", token=eve.token)
    assert event["unsigned"]["m.relations"]["m.reference"] == {"chunk": [{"event_id": seen_ref}]}
    event = await hs.ok("GET", f"/rooms/{room_id}/event/{root}", token=alice.token)
    thread = event["unsigned"]["m.relations"]["m.thread"]
    assert thread["count"] == 1 and thread["latest_event"]["event_id"] == early

    # A stranger may not read the room at all.
    stranger = await hs.register("stranger")
    status, body = await hs.call("GET", base, token=stranger.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await hs.call("GET", f"/rooms/{room_id}/threads", token=stranger.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")


async def test_threads_and_bundled_aggregations(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    room_id = await room_with(hs, alice, bob, carol)
    first = await send(hs, alice, room_id, "thread one")
    second = await send(hs, bob, room_id, "thread two")
    third = await send(hs, carol, room_id, "thread three")
    await relate(hs, bob, room_id, "m.thread", first, body="1a")
    await relate(hs, carol, room_id, "m.thread", third, body="3a")
    await relate(hs, alice, room_id, "m.thread", second, body="2a")
    latest_one = await relate(hs, carol, room_id, "m.thread", first, body="1b")
    redacted = await relate(hs, carol, room_id, "m.thread", second, body="2b")
    await hs.ok("PUT", f"/rooms/{room_id}/redact/{redacted}/{hs.txn()}", {}, token=carol.token)
    edit = await relate(hs, alice, room_id, "m.replace", first, body="* thread one")

    # Latest activity first (second's latest reply counts though it was redacted since).
    listed = await hs.ok("GET", f"/rooms/{room_id}/threads", token=alice.token)
    assert ids(listed["chunk"]) == [second, first, third]
    summary = listed["chunk"][1]["unsigned"]["m.relations"]["m.thread"]
    assert summary["count"] == 2
    assert summary["latest_event"]["event_id"] == latest_one
    assert summary["latest_event"]["content"]["body"] == "1b"
    assert summary["current_user_participated"] is True  # alice started it
    # Edits are not aggregated; a redacted reply drops out of the count and latest.
    assert set(listed["chunk"][1]["unsigned"]["m.relations"]) == {"m.thread"}
    two = listed["chunk"][0]["unsigned"]["m.relations"]["m.thread"]
    assert (two["count"], two["latest_event"]["content"]["body"]) == (1, "2a")

    participated = await hs.ok(
        "GET", f"/rooms/{room_id}/threads?include=participated", token=bob.token
    )
    assert ids(participated["chunk"]) == [second, first]
    assert (
        participated["chunk"][0]["unsigned"]["m.relations"]["m.thread"]["current_user_participated"]
        is True
    )
    # Carol's only reply to the second thread was redacted: she no longer took part.
    carol_view = await hs.ok("GET", f"/rooms/{room_id}/threads", token=carol.token)
    assert [
        e["unsigned"]["m.relations"]["m.thread"]["current_user_participated"]
        for e in carol_view["chunk"]
    ] == [False, True, True]
    carol_threads = await hs.ok(
        "GET", f"/rooms/{room_id}/threads?include=participated", token=carol.token
    )
    assert ids(carol_threads["chunk"]) == [first, third]

    # Pages of one.
    seen: list[str] = []
    token = None
    while True:
        page = await hs.ok(
            "GET",
            f"/rooms/{room_id}/threads?limit=1" + (f"&from={token}" if token else ""),
            token=alice.token,
        )
        seen += ids(page["chunk"])
        token = page.get("next_batch")
        if token is None:
            break
    assert seen == [second, first, third]
    status, body = await hs.call("GET", f"/rooms/{room_id}/threads?include=mine", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")

    # /messages and /context bundle the same summary; the edit itself carries none.
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=bob.token)
    by_id = {e["event_id"]: e for e in page["chunk"]}
    bundled = by_id[first]["unsigned"]["m.relations"]["m.thread"]
    assert (bundled["count"], bundled["current_user_participated"]) == (2, True)
    assert "m.relations" not in by_id[edit].get("unsigned", {})
    context = await hs.ok("GET", f"/rooms/{room_id}/context/{first}?limit=2", token=carol.token)
    assert context["event"]["unsigned"]["m.relations"]["m.thread"]["count"] == 2
    # The cached format is untouched: a plain /event of the edit has no aggregation, and
    # the thread root's aggregation is current after another reply.
    await relate(hs, bob, room_id, "m.thread", first, body="1c")
    again = await hs.ok("GET", f"/rooms/{room_id}/event/{first}", token=alice.token)
    assert again["unsigned"]["m.relations"]["m.thread"]["count"] == 3


async def test_sync_bundles_thread_summaries_as_the_user_may_see_them(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    root = await send(hs, alice, room_id, "root")
    reply = await relate(hs, bob, room_id, "m.thread", root, body="in thread")
    reference = await relate(hs, bob, room_id, "m.reference", root)
    first = await hs.ok("GET", "/sync", token=alice.token)
    events = {e["event_id"]: e for e in first["rooms"]["join"][room_id]["timeline"]["events"]}
    bundle = events[root]["unsigned"]["m.relations"]
    assert bundle["m.thread"]["latest_event"]["event_id"] == reply
    assert bundle["m.thread"]["count"] == 1
    assert bundle["m.thread"]["current_user_participated"] is True
    assert bundle["m.reference"] == {"chunk": [{"event_id": reference}]}
    assert "m.relations" not in events[reply].get("unsigned", {})
    # Incremental: a root served again after a new reply carries the new summary.
    second = await relate(hs, alice, room_id, "m.thread", root, body="again")
    later = await hs.ok("GET", f"/sync?since={first['next_batch']}", token=bob.token)
    served = later["rooms"]["join"][room_id]["timeline"]["events"]
    assert [e["event_id"] for e in served] == [second]
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=bob.token)
    summary = next(e for e in page["chunk"] if e["event_id"] == root)["unsigned"]
    assert summary["m.relations"]["m.thread"]["count"] == 2
    assert summary["m.relations"]["m.thread"]["latest_event"]["event_id"] == second


async def test_an_incremental_sync_bundles_what_the_change_cache_saw_related(
    homeserver: Homeserver,
) -> None:
    """An incremental sync reads the relations index only for events the read path's
    change cache saw a relation to (tests/client/test_round_trips.py: a plain message
    costs no such read); a root and its reply in the same range still come bundled."""
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    since = (await hs.ok("GET", "/sync", token=bob.token))["next_batch"]
    plain = await send(hs, alice, room_id, "plain")
    root = await send(hs, alice, room_id, "root")
    reply = await relate(hs, bob, room_id, "m.thread", root, body="in thread")
    later = await hs.ok("GET", f"/sync?since={since}", token=bob.token)
    served = {e["event_id"]: e for e in later["rooms"]["join"][room_id]["timeline"]["events"]}
    assert served[root]["unsigned"]["m.relations"]["m.thread"]["latest_event"]["event_id"] == (
        reply
    )
    assert "m.relations" not in served[plain].get("unsigned", {})
    reader = hs.process.reader
    position = reader.current_token().minimum
    assert reader.may_have_relations_since([root, plain], 0) >= {root}
    assert reader.may_have_relations_since([root, plain], position) == set()


async def test_ignored_users_relations_are_not_aggregated_or_listed(
    homeserver: Homeserver,
) -> None:
    """As Synapse: an ignored sender's thread replies are not counted and never the
    latest event (a thread only they replied to has no summary), their references are
    not in the chunk, and ``/relations`` and ``/threads`` leave their events out; the
    user's own replies still count as participation. Others' views are untouched."""
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    room_id = await room_with(hs, alice, bob, carol)
    root = await send(hs, alice, room_id, "root")
    mine = await relate(hs, alice, room_id, "m.thread", root, body="mine")
    by_bob = await relate(hs, bob, room_id, "m.thread", root, body="bob's")
    await relate(hs, carol, room_id, "m.thread", root, body="carol's, latest")
    reference = await relate(hs, bob, room_id, "m.reference", root)
    await relate(hs, carol, room_id, "m.reference", root)
    only_carol = await send(hs, bob, room_id, "carol's thread")
    await relate(hs, carol, room_id, "m.thread", only_carol, body="only carol")
    await hs.ok(
        "PUT",
        f"/user/{alice.user_id}/account_data/m.ignored_user_list",
        {"ignored_users": {carol.user_id: {}}},
        token=alice.token,
    )

    def bundles(events: list[dict[str, Any]]) -> dict[str, Any]:
        return {e["event_id"]: e.get("unsigned", {}).get("m.relations") for e in events}

    def check(found: dict[str, Any]) -> None:
        thread = found[root]["m.thread"]
        assert thread["count"] == 2
        assert thread["latest_event"]["event_id"] == by_bob
        assert thread["current_user_participated"] is True
        assert found[root]["m.reference"] == {"chunk": [{"event_id": reference}]}
        assert found[only_carol] is None

    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=alice.token)
    check(bundles(page["chunk"]))
    initial = await hs.ok("GET", "/sync", token=alice.token)
    check(bundles(initial["rooms"]["join"][room_id]["timeline"]["events"]))
    context = await hs.ok("GET", f"/rooms/{room_id}/context/{root}?limit=20", token=alice.token)
    check(bundles([context["event"], *context["events_before"], *context["events_after"]]))
    event = await hs.ok("GET", f"/rooms/{room_id}/event/{root}", token=alice.token)
    check({root: event["unsigned"]["m.relations"], only_carol: None})

    listed = await hs.ok(
        "GET", f"/rooms/{room_id}/relations/{root}/m.thread?limit=50", token=alice.token
    )
    assert ids(listed["chunk"]) == [by_bob, mine]
    threads = await hs.ok("GET", f"/rooms/{room_id}/threads", token=alice.token)
    assert ids(threads["chunk"]) == [only_carol, root]
    check(bundles(threads["chunk"]))

    # Bob ignores nobody: everything counts for him.
    his = await hs.ok("GET", f"/rooms/{room_id}/event/{root}", token=bob.token)
    assert his["unsigned"]["m.relations"]["m.thread"]["count"] == 3
    assert len(his["unsigned"]["m.relations"]["m.reference"]["chunk"]) == 2
    # Unignoring brings carol's back.
    await hs.ok(
        "PUT",
        f"/user/{alice.user_id}/account_data/m.ignored_user_list",
        {"ignored_users": {}},
        token=alice.token,
    )
    again = await hs.ok("GET", f"/rooms/{room_id}/event/{root}", token=alice.token)
    assert again["unsigned"]["m.relations"]["m.thread"]["count"] == 3
