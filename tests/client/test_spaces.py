"""``GET /rooms/{id}/hierarchy``: the walk's order, depth and suggested-only limits,
pagination, and what a user may learn of each child room (Synapse's rules)."""

from __future__ import annotations

from typing import Any

from tests.support.homeserver import Homeserver, User

VIA = {"via": ["test.local"]}


async def create(hs: Homeserver, user: User, **body: Any) -> str:
    room_id: str = (await hs.ok("POST", "/createRoom", body, token=user.token))["room_id"]
    return room_id


async def add_child(hs: Homeserver, user: User, space: str, child: str, **content: Any) -> None:
    await hs.ok(
        "PUT",
        f"/rooms/{space}/state/m.space.child/{child}",
        {**VIA, **content},
        token=user.token,
    )


async def walk(hs: Homeserver, user: User, space: str, query: str = "") -> tuple[int, Any]:
    return await hs.call(
        "GET", f"/_matrix/client/v1/rooms/{space}/hierarchy?{query}", token=user.token
    )


async def room_ids(hs: Homeserver, user: User, space: str, query: str = "") -> list[str]:
    status, body = await walk(hs, user, space, query)
    assert status == 200, body
    return [r["room_id"] for r in body["rooms"]]


async def test_the_walk_shows_what_each_user_may_learn(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    space_type = {"creation_content": {"type": "m.space"}}
    space = await create(hs, alice, preset="public_chat", name="Space", **space_type)
    public = await create(hs, alice, preset="public_chat", name="Public", topic="hi")
    private = await create(hs, alice, preset="private_chat")
    invited = await create(hs, alice, preset="private_chat", invite=[bob.user_id])
    readable = await create(
        hs,
        alice,
        preset="private_chat",
        initial_state=[
            {
                "type": "m.room.history_visibility",
                "state_key": "",
                "content": {"history_visibility": "world_readable"},
            }
        ],
    )
    restricted_rule = {
        "join_rule": "restricted",
        "allow": [{"type": "m.room_membership", "room_id": space}],
    }
    restricted = await create(
        hs,
        alice,
        preset="private_chat",
        initial_state=[{"type": "m.room.join_rules", "state_key": "", "content": restricted_rule}],
    )
    subspace = await create(hs, alice, preset="public_chat", **space_type)
    deep = await create(hs, alice, preset="public_chat")
    removed = await create(hs, alice, preset="public_chat")
    # Ordered: valid "order" first (by it), then by the child event's timestamp.
    await add_child(hs, alice, space, public, order="b")
    await add_child(hs, alice, space, private, order="a")
    await add_child(hs, alice, space, invited, order="c", suggested=True)
    await add_child(hs, alice, space, readable, order="\u00e9")  # invalid: as if none
    await add_child(hs, alice, space, restricted)
    await add_child(hs, alice, space, subspace, suggested=True)
    await add_child(hs, alice, subspace, deep)
    # A child event without "via" is no child (a removed one).
    await hs.ok("PUT", f"/rooms/{space}/state/m.space.child/{removed}", {}, token=alice.token)

    # Children without a valid order: by their child event's timestamp, then room ID
    # (two events of one millisecond are ordered by room ID, which is random).
    stamps = {
        e["state_key"]: e["origin_server_ts"]
        for e in await hs.ok("GET", f"/rooms/{space}/state", token=alice.token)
        if e["type"] == "m.space.child"
    }
    unordered = sorted([readable, restricted, subspace], key=lambda r: (stamps[r], r))
    walked_after = {subspace: [subspace, deep]}
    tail = [room for child in unordered for room in walked_after.get(child, [child])]
    everything = [space, private, public, invited, *tail]
    assert await room_ids(hs, alice, space) == everything
    # Bob: not the private room; invited to one; not in the space, so not the restricted.
    bob_may_not = {private, restricted}
    assert await room_ids(hs, bob, space) == [r for r in everything if r not in bob_may_not]
    await hs.ok("POST", f"/rooms/{space}/join", {}, token=carol.token)
    carol_may_not = {private, invited}
    assert await room_ids(hs, carol, space) == [r for r in everything if r not in carol_may_not]
    assert await room_ids(hs, alice, space, "max_depth=0") == [space]
    assert await room_ids(hs, alice, space, "max_depth=1") == [r for r in everything if r != deep]
    # Suggested at every level: the subspace's child is not.
    assert await room_ids(hs, alice, space, "suggested_only=true") == [space, invited, subspace]

    status, body = await walk(hs, alice, space, "max_depth=0")
    assert status == 200
    root = body["rooms"][0]
    assert root["name"] == "Space" and root["room_type"] == "m.space"
    assert root["join_rule"] == "public" and root["num_joined_members"] == 2
    assert root["world_readable"] is False and root["guest_can_join"] is False
    children = [(c["state_key"], c["content"].get("order")) for c in root["children_state"]]
    assert [c for c, _ in children] == [r for r in everything[1:] if r != deep]
    assert {c["type"] for c in root["children_state"]} == {"m.space.child"}
    status, body = await walk(hs, bob, space)
    assert status == 200
    entry = next(r for r in body["rooms"] if r["room_id"] == public)
    assert (entry["name"], entry["topic"], entry["children_state"]) == ("Public", "hi", [])


async def test_pages_continue_the_walk(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    space = await create(hs, alice, preset="public_chat", creation_content={"type": "m.space"})
    children = [await create(hs, alice, preset="public_chat") for _ in range(5)]
    for index, child in enumerate(children):
        await add_child(hs, alice, space, child, order=f"{index:02d}")
    whole = await room_ids(hs, alice, space)
    assert whole == [space, *children]

    pages: list[str] = []
    query = "limit=2"
    while True:
        status, body = await walk(hs, alice, space, query)
        assert status == 200, body
        assert len(body["rooms"]) <= 2
        pages.extend(r["room_id"] for r in body["rooms"])
        if "next_batch" not in body:
            break
        token = body["next_batch"]
        query = f"limit=2&from={token}"
        # The token is for this walk only: other parameters or another user, 400.
        for other, user in ((f"limit=2&from={token}&max_depth=3", alice), (query, bob)):
            status, error = await walk(hs, user, space, other)
            assert (status, error["errcode"]) == (400, "M_INVALID_PARAM"), other
    assert pages == whole
    for bad in ("from=garbage", "limit=0", "max_depth=-1", "suggested_only=maybe"):
        status, error = await walk(hs, alice, space, bad)
        assert (status, error["errcode"]) == (400, "M_INVALID_PARAM"), bad


async def test_a_root_the_user_may_not_learn_of_is_forbidden(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    private = await create(hs, alice, preset="private_chat", creation_content={"type": "m.space"})
    for room_id in (private, "!unknown:test.local"):
        status, error = await walk(hs, bob, room_id)
        assert (status, error["errcode"]) == (403, "M_FORBIDDEN"), room_id
