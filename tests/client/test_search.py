"""``POST /search`` (room events), through the API on both engines: matching (words as
prefixes, keys, encrypted events never), what a user may find (the visibility records:
a late joiner under ``joined``, a member who left, a redaction), ``order_by``, the filter,
``event_context`` with profiles, ``include_state``, groupings, ``next_batch`` pages and
the errors of bad requests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.client import bodies, room_with, send
from tests.support.homeserver import Homeserver, User


async def search(
    hs: Homeserver, user: User, term: str, next_batch: str | None = None, **category: Any
) -> dict[str, Any]:
    path = "/search" if next_batch is None else f"/search?next_batch={next_batch}"
    body = {"search_categories": {"room_events": {"search_term": term, **category}}}
    result = await hs.ok("POST", path, body, token=user.token)
    room_events: dict[str, Any] = result["search_categories"]["room_events"]
    return room_events


def found(result: dict[str, Any]) -> list[str]:
    return bodies([r["result"] for r in result["results"]])


async def set_visibility(hs: Homeserver, user: User, room_id: str, value: str) -> None:
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": value},
        token=user.token,
    )


async def join(hs: Homeserver, user: User, room_id: str) -> None:
    await hs.ok("POST", f"/join/{room_id}", {}, token=user.token)


async def test_words_match_as_prefixes_in_any_order_and_all_must_occur(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await send(homeserver, alice, room_id, "the quick brown fox")
    await send(homeserver, alice, room_id, "a lazy dog")
    await send(homeserver, alice, room_id, "Quickly, brownies!")
    assert sorted(found(await search(homeserver, alice, "quick"))) == [
        "Quickly, brownies!",
        "the quick brown fox",
    ]
    assert found(await search(homeserver, alice, "fox QUICK")) == ["the quick brown fox"]
    assert found(await search(homeserver, alice, "fox dog")) == []
    nothing = await search(homeserver, alice, "zebra")
    assert nothing["results"] == [] and nothing["count"] == 0
    # No words at all (punctuation only) finds nothing rather than failing.
    assert (await search(homeserver, alice, "?!"))["results"] == []
    result = await search(homeserver, alice, "lazy")
    hit = result["results"][0]
    assert hit["result"]["room_id"] == room_id and hit["result"]["sender"] == alice.user_id
    assert isinstance(hit["rank"], float) and result["count"] == 1
    assert result["highlights"] == ["lazy"]


async def test_keys_select_body_name_or_topic_and_encrypted_events_are_never_found(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.name/", {"name": "Walrus club"}, token=alice.token
    )
    await homeserver.ok(
        "PUT", f"/rooms/{room_id}/state/m.room.topic/", {"topic": "walrus facts"}, token=alice.token
    )
    await send(homeserver, alice, room_id, "walrus sighting")
    # An encrypted event: the server has no plaintext, whatever the ciphertext says.
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/send/m.room.encrypted/{homeserver.txn()}",
        {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "walrus", "body": "walrus"},
        token=alice.token,
    )
    every = await search(homeserver, alice, "walrus")
    assert sorted(r["result"]["type"] for r in every["results"]) == [
        "m.room.message",
        "m.room.name",
        "m.room.topic",
    ]
    names = await search(homeserver, alice, "walrus", keys=["content.name"])
    assert [r["result"]["content"] for r in names["results"]] == [{"name": "Walrus club"}]
    topics = await search(homeserver, alice, "walrus", keys=["content.topic", "content.body"])
    assert sorted(r["result"]["type"] for r in topics["results"]) == [
        "m.room.message",
        "m.room.topic",
    ]


async def test_a_late_joiner_under_joined_finds_only_what_followed_their_join(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice)
    await set_visibility(homeserver, alice, room_id, "joined")
    await send(homeserver, alice, room_id, "secret plan before bob")
    await join(homeserver, bob, room_id)
    await send(homeserver, alice, room_id, "secret plan after bob")
    mine = await search(homeserver, bob, "secret plan")
    assert found(mine) == ["secret plan after bob"] and mine["count"] == 1
    # Alice, there all along, finds both.
    assert sorted(found(await search(homeserver, alice, "secret"))) == [
        "secret plan after bob",
        "secret plan before bob",
    ]
    # Under `shared` the same late join would have shown the history: the rule is the
    # visibility at each event, not the room's current setting.
    await set_visibility(homeserver, alice, room_id, "shared")
    await send(homeserver, alice, room_id, "secret plan under shared")
    assert sorted(found(await search(homeserver, bob, "secret"))) == [
        "secret plan after bob",
        "secret plan under shared",
    ]


async def test_a_member_who_left_finds_what_they_saw_and_nothing_after(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    await set_visibility(homeserver, alice, room_id, "joined")
    await send(homeserver, alice, room_id, "harbour meeting while bob is here")
    await homeserver.ok("POST", f"/rooms/{room_id}/leave", {}, token=bob.token)
    await send(homeserver, alice, room_id, "harbour meeting after bob left")
    assert found(await search(homeserver, bob, "harbour")) == ["harbour meeting while bob is here"]
    # A stranger (never in the room) finds nothing, even naming the room in the filter.
    carol = await homeserver.register("carol")
    assert (await search(homeserver, carol, "harbour", filter={"rooms": [room_id]}))[
        "results"
    ] == []


async def test_redacted_events_are_not_found(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    event_id = await send(homeserver, alice, room_id, "oops password hunter2")
    await send(homeserver, alice, room_id, "password reset done")
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/redact/{event_id}/{homeserver.txn()}",
        {},
        token=alice.token,
    )
    assert found(await search(homeserver, alice, "password")) == ["password reset done"]
    assert (await search(homeserver, alice, "hunter2"))["results"] == []


async def test_order_by_recent_pages_with_next_batch_and_rank_has_none(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    for i in range(7):
        await send(homeserver, alice, room_id, f"tick {i}")
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page = await search(
            homeserver, alice, "tick", token, order_by="recent", filter={"limit": 3}
        )
        pages.append(found(page))
        token = page.get("next_batch")
        if token is None:
            break
    assert pages == [["tick 6", "tick 5", "tick 4"], ["tick 3", "tick 2", "tick 1"], ["tick 0"]]
    ranked = await search(homeserver, alice, "tick", filter={"limit": 3})
    assert len(ranked["results"]) == 3 and "next_batch" not in ranked
    assert ranked["count"] == 7
    ranks = [r["rank"] for r in ranked["results"]]
    assert ranks == sorted(ranks, reverse=True)


async def test_rank_puts_the_better_match_first(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await send(homeserver, alice, room_id, "kayak " + " ".join(f"filler{i}" for i in range(40)))
    await send(homeserver, alice, room_id, "kayak kayak kayak")
    await send(homeserver, alice, room_id, "nothing here")
    result = await search(homeserver, alice, "kayak", order_by="rank")
    assert found(result)[0] == "kayak kayak kayak" and len(result["results"]) == 2


async def test_the_filter_limits_rooms_senders_and_types(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    first = await room_with(homeserver, alice, bob)
    second = await room_with(homeserver, alice, bob)
    await send(homeserver, alice, first, "pelican from alice in first")
    await send(homeserver, bob, first, "pelican from bob in first")
    await send(homeserver, alice, second, "pelican from alice in second")
    only_first = await search(homeserver, alice, "pelican", filter={"rooms": [first]})
    assert sorted(found(only_first)) == ["pelican from alice in first", "pelican from bob in first"]
    not_first = await search(homeserver, alice, "pelican", filter={"not_rooms": [first]})
    assert found(not_first) == ["pelican from alice in second"]
    by_bob = await search(homeserver, alice, "pelican", filter={"senders": [bob.user_id]})
    assert found(by_bob) == ["pelican from bob in first"]
    not_bob = await search(homeserver, alice, "pelican", filter={"not_senders": [bob.user_id]})
    assert len(not_bob["results"]) == 2 and not_bob["count"] == 2
    no_messages = await search(homeserver, alice, "pelican", filter={"not_types": ["m.room.*"]})
    assert no_messages["results"] == []
    limited = await search(homeserver, alice, "pelican", filter={"limit": 1})
    assert len(limited["results"]) == 1 and limited["count"] == 3


async def test_ignored_users_events_are_not_found(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice, bob)
    await send(homeserver, bob, room_id, "heron from bob")
    await send(homeserver, alice, room_id, "heron from alice")
    await homeserver.ok(
        "PUT",
        f"/user/{alice.user_id}/account_data/m.ignored_user_list",
        {"ignored_users": {bob.user_id: {}}},
        token=alice.token,
    )
    assert found(await search(homeserver, alice, "heron")) == ["heron from alice"]


async def test_event_context_has_visible_neighbours_tokens_and_profiles(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT",
        f"/profile/{alice.user_id}/displayname",
        {"displayname": "Alice A"},
        token=alice.token,
    )
    await set_visibility(homeserver, alice, room_id, "joined")
    await send(homeserver, alice, room_id, "before bob one")
    await send(homeserver, alice, room_id, "before bob two")
    await join(homeserver, bob, room_id)
    await send(homeserver, alice, room_id, "middle")
    await send(homeserver, alice, room_id, "the albatross")
    await send(homeserver, bob, room_id, "after one")
    await send(homeserver, bob, room_id, "after two")
    await send(homeserver, bob, room_id, "after three")
    context = {"before_limit": 5, "after_limit": 2, "include_profile": True}
    result = await search(homeserver, bob, "albatross", event_context=context)
    (hit,) = result["results"]
    ctx = hit["context"]
    # Bob joined under `joined`: no message from before his join appears, his join does
    # (and the room's set-up before the change to `joined`, which was `shared`).
    assert bodies(ctx["events_before"]) == ["middle"]
    assert len(ctx["events_before"]) == 5
    assert ctx["events_before"][1]["type"] == "m.room.member"
    assert ctx["events_before"][1]["state_key"] == bob.user_id
    assert bodies(ctx["events_after"]) == ["after one", "after two"]
    assert ctx["profile_info"][alice.user_id] == {"displayname": "Alice A"}
    assert set(ctx["profile_info"]) == {alice.user_id, bob.user_id}
    # The tokens paginate on from the context's edges with /messages.
    page = await homeserver.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=f&limit=5&from={ctx['end']}",
        token=bob.token,
    )
    assert bodies(page["chunk"]) == ["after three"]
    back = await homeserver.ok(
        "GET",
        f"/rooms/{room_id}/messages?dir=b&limit=5&from={ctx['start']}",
        token=bob.token,
    )
    assert bodies(back["chunk"]) == []
    plain = await search(homeserver, bob, "albatross", event_context={"before_limit": 1})
    assert "profile_info" not in plain["results"][0]["context"]
    assert len(plain["results"][0]["context"]["events_before"]) == 1


async def test_include_state_gives_each_result_rooms_state(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    other = await room_with(homeserver, alice)
    await send(homeserver, alice, room_id, "osprey")
    result = await search(homeserver, alice, "osprey", include_state=True)
    assert set(result["state"]) == {room_id}
    types = {e["type"] for e in result["state"][room_id]}
    assert {"m.room.create", "m.room.member", "m.room.power_levels"} <= types
    assert other not in result["state"]
    assert "state" not in await search(homeserver, alice, "osprey")


async def test_groupings_by_room_and_sender(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    first = await room_with(homeserver, alice, bob)
    second = await room_with(homeserver, alice)
    a1 = await send(homeserver, alice, first, "gannet one")
    b1 = await send(homeserver, bob, first, "gannet two")
    a2 = await send(homeserver, alice, second, "gannet three")
    groupings = {"group_by": [{"key": "room_id"}, {"key": "sender"}]}
    result = await search(homeserver, alice, "gannet", order_by="recent", groupings=groupings)
    by_room = result["groups"]["room_id"]
    assert by_room[first]["results"] == [b1, a1] and by_room[second]["results"] == [a2]
    # Groups are ordered by their newest result.
    assert by_room[second]["order"] > by_room[first]["order"]
    by_sender = result["groups"]["sender"]
    assert by_sender[alice.user_id]["results"] == [a2, a1]
    assert by_sender[bob.user_id]["results"] == [b1]


async def test_a_room_groups_next_batch_reads_on_in_that_room_only(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    first = await room_with(homeserver, alice)
    second = await room_with(homeserver, alice)
    for i in range(3):
        await send(homeserver, alice, first, f"puffin first {i}")
        await send(homeserver, alice, second, f"puffin second {i}")
    groupings = {"group_by": [{"key": "room_id"}]}
    page = await search(
        homeserver, alice, "puffin", order_by="recent", filter={"limit": 2}, groupings=groupings
    )
    assert found(page) == ["puffin second 2", "puffin first 2"]
    token = page["groups"]["room_id"][first]["next_batch"]
    rest = await search(homeserver, alice, "puffin", token, order_by="recent")
    assert found(rest) == ["puffin first 1", "puffin first 0"]


@pytest.mark.parametrize(
    ("category", "status", "errcode"),
    [
        ({}, 400, "M_MISSING_PARAM"),
        ({"search_term": 5}, 400, "M_BAD_JSON"),
        ({"search_term": "x", "keys": ["content.url"]}, 400, "M_INVALID_PARAM"),
        ({"search_term": "x", "keys": "content.body"}, 400, "M_BAD_JSON"),
        ({"search_term": "x", "order_by": "best"}, 400, "M_INVALID_PARAM"),
        ({"search_term": "x", "filter": {"limit": "ten"}}, 400, "M_BAD_JSON"),
        ({"search_term": "x", "filter": {"limit": 0}}, 200, None),
        ({"search_term": "x", "event_context": {"before_limit": -1}}, 400, "M_INVALID_PARAM"),
        ({"search_term": "x", "event_context": {"before_limit": "a"}}, 400, "M_BAD_JSON"),
        (
            {"search_term": "x", "groupings": {"group_by": [{"key": "type"}]}},
            400,
            "M_INVALID_PARAM",
        ),
        ({"search_term": "x", "groupings": {"group_by": ["room_id"]}}, 400, "M_BAD_JSON"),
        ({"search_term": "x" * 1001}, 400, "M_INVALID_PARAM"),
    ],
)
async def test_bad_requests_get_a_matrix_error(
    homeserver: Homeserver, category: dict[str, Any], status: int, errcode: str | None
) -> None:
    alice = await homeserver.register("alice")
    body = {"search_categories": {"room_events": category}}
    got, result = await homeserver.call("POST", "/search", body, token=alice.token)
    assert got == status, result
    if errcode is not None:
        assert result["errcode"] == errcode


async def test_bad_next_batch_missing_category_and_no_token(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    body = {"search_categories": {"room_events": {"search_term": "x"}}}
    status, result = await homeserver.call(
        "POST", "/search?next_batch=garbage", body, token=alice.token
    )
    assert (status, result["errcode"]) == (400, "M_INVALID_PARAM")
    assert await homeserver.ok("POST", "/search", {"search_categories": {}}, token=alice.token) == {
        "search_categories": {}
    }
    status, result = await homeserver.call("POST", "/search", {"search_categories": {}})
    assert (status, result["errcode"]) == (401, "M_MISSING_TOKEN")
    status, result = await homeserver.call("POST", "/search", {}, token=alice.token)
    assert (status, result["errcode"]) == (400, "M_MISSING_PARAM")
