"""``/messages`` gives ``end`` whenever its page holds events (as Synapse): a page shorter
than ``limit`` is no sign that nothing follows (``to`` cut it, new events may come after
a forward page, hidden events were skipped). ``end`` is left out only for an empty page,
where nothing the user may see lies further in that direction."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from tests.support.client import bodies, room_with, send
from tests.support.homeserver import Homeserver, User


async def messages(hs: Homeserver, user: User, room_id: str, **params: Any) -> dict[str, Any]:
    query = "&".join(f"{k}={quote(str(v))}" for k, v in params.items())
    result: dict[str, Any] = await hs.ok(
        "GET", f"/rooms/{room_id}/messages?{query}", token=user.token
    )
    return result


async def test_a_short_backwards_page_has_end_and_the_next_page_is_empty_without(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    await send(homeserver, alice, room_id, "only")
    # Fewer events than the default limit of 10 (the conformance suite's first case).
    page = await messages(homeserver, alice, room_id, dir="b")
    assert bodies(page["chunk"]) == ["only"] and len(page["chunk"]) < 10
    assert "end" in page
    rest = await messages(homeserver, alice, room_id, dir="b", **{"from": page["end"]})
    assert rest["chunk"] == [] and "end" not in rest


async def test_a_short_forwards_page_has_end_to_continue_from_when_more_arrive(
    homeserver: Homeserver,
) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    start = (await messages(homeserver, alice, room_id, dir="b", limit=1))["end"]
    await send(homeserver, alice, room_id, "one")
    page = await messages(homeserver, alice, room_id, dir="f", limit=50, **{"from": start})
    assert bodies(page["chunk"]) == ["one"] and "end" in page
    await send(homeserver, alice, room_id, "two")
    later = await messages(homeserver, alice, room_id, dir="f", **{"from": page["end"]})
    assert bodies(later["chunk"]) == ["two"] and "end" in later
    nothing = await messages(homeserver, alice, room_id, dir="f", **{"from": later["end"]})
    assert nothing["chunk"] == [] and "end" not in nothing


async def test_a_page_cut_by_to_has_end(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    for i in range(3):
        await send(homeserver, alice, room_id, f"old{i}")
    sync = await homeserver.ok("GET", "/sync", token=alice.token)
    await send(homeserver, alice, room_id, "new0")
    await send(homeserver, alice, room_id, "new1")
    page = await messages(homeserver, alice, room_id, dir="b", limit=10, to=sync["next_batch"])
    assert bodies(page["chunk"]) == ["new1", "new0"]
    assert "end" in page
    # More history exists beyond `to`: paginating on from `end` finds it.
    older = await messages(homeserver, alice, room_id, dir="b", limit=3, **{"from": page["end"]})
    assert bodies(older["chunk"]) == ["old2", "old1", "old0"]


async def test_a_page_with_hidden_events_skipped_has_end(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, alice)
    await homeserver.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.history_visibility/",
        {"history_visibility": "joined"},
        token=alice.token,
    )
    for i in range(4):
        await send(homeserver, alice, room_id, f"before{i}")
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=bob.token)
    await send(homeserver, alice, room_id, "after")
    page = await messages(homeserver, bob, room_id, dir="b", limit=10)
    # bob sees his join and what follows, and the `shared` state before the change to
    # `joined`, not the messages between the two.
    assert bodies(page["chunk"]) == ["after"]
    assert page["chunk"][1]["type"] == "m.room.member" and len(page["chunk"]) < 10
    assert page["chunk"][2]["content"] == {"history_visibility": "joined"}
    assert "end" in page
    rest = await messages(homeserver, bob, room_id, dir="b", **{"from": page["end"]})
    assert rest["chunk"] == [] and "end" not in rest


async def test_a_page_the_filter_empties_still_has_end(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    for i in range(3):
        await send(homeserver, alice, room_id, f"m{i}")
    only_topics = orjson.dumps({"types": ["m.room.topic"]}).decode()
    page = await messages(homeserver, alice, room_id, dir="b", limit=2, filter=only_topics)
    assert page["chunk"] == [] and "end" in page
    more = await messages(homeserver, alice, room_id, dir="b", limit=2, **{"from": page["end"]})
    assert bodies(more["chunk"]) == ["m0"]


async def test_the_start_of_the_room_reached_exactly(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    room_id = await room_with(homeserver, alice)
    everything = await messages(homeserver, alice, room_id, dir="b", limit=100)
    count = len(everything["chunk"])
    exact = await messages(homeserver, alice, room_id, dir="b", limit=count)
    assert len(exact["chunk"]) == count and "end" in exact
    beyond = await messages(homeserver, alice, room_id, dir="b", **{"from": exact["end"]})
    assert beyond["chunk"] == [] and "end" not in beyond
