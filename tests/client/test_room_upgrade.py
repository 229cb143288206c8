"""``POST /rooms/{id}/upgrade``: the new room's create event and copied state, the
tombstone, bans carried over, aliases moved, the old room's power levels restricted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.client import send
from tests.support.homeserver import Homeserver, User


async def state_of(hs: Homeserver, user: User, room_id: str) -> dict[tuple[str, str], Any]:
    events = await hs.ok("GET", f"/rooms/{room_id}/state", token=user.token)
    return {(e["type"], e["state_key"]): e for e in events}


@pytest.mark.parametrize("new_version", ["11", "12"])
async def test_an_upgrade_replaces_the_room(homeserver: Homeserver, new_version: str) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    old = (
        await hs.ok(
            "POST",
            "/createRoom",
            {
                "preset": "public_chat",
                "room_version": "10",
                "name": "The room",
                "topic": "a topic",
                "room_alias_name": "upgraded",
                "visibility": "public",
                "power_level_content_override": {"users": {bob.user_id: 10}},
            },
            token=alice.token,
        )
    )["room_id"]
    for user in (bob, carol):
        await hs.ok("POST", f"/rooms/{old}/join", {}, token=user.token)
    await hs.ok("POST", f"/rooms/{old}/ban", {"user_id": carol.user_id}, token=alice.token)
    await send(hs, bob, old, "before the upgrade")

    # Bob cannot upgrade (the tombstone needs state_default), and nothing is created.
    status, error = await hs.call(
        "POST", f"/rooms/{old}/upgrade", {"new_version": new_version}, token=bob.token
    )
    assert (status, error["errcode"]) == (403, "M_FORBIDDEN")
    assert (await hs.ok("GET", "/directory/room/%23upgraded:test.local"))["room_id"] == old

    result = await hs.ok(
        "POST", f"/rooms/{old}/upgrade", {"new_version": new_version}, token=alice.token
    )
    new = result["replacement_room"]
    assert new != old

    old_state = await state_of(hs, alice, old)
    tombstone = old_state[("m.room.tombstone", "")]
    assert tombstone["content"]["replacement_room"] == new
    assert tombstone["sender"] == alice.user_id
    old_levels = old_state[("m.room.power_levels", "")]["content"]
    assert old_levels["events_default"] == 50 and old_levels["invite"] == 50
    # Bob (level 10) can no longer speak in the old room.
    status, error = await hs.call(
        "PUT", f"/rooms/{old}/send/m.room.message/{hs.txn()}", {"body": "x"}, token=bob.token
    )
    assert (status, error["errcode"]) == (403, "M_FORBIDDEN")
    assert "alias" not in old_state[("m.room.canonical_alias", "")]["content"]

    new_state = await state_of(hs, alice, new)
    create = new_state[("m.room.create", "")]["content"]
    assert create["room_version"] == new_version
    assert create["predecessor"] == {"room_id": old}
    for key, field in (("m.room.name", "name"), ("m.room.topic", "topic")):
        assert new_state[(key, "")]["content"] == old_state[(key, "")]["content"], field
    assert new_state[("m.room.join_rules", "")]["content"]["join_rule"] == "public"
    assert new_state[("m.room.member", carol.user_id)]["content"]["membership"] == "ban"
    assert ("m.room.member", bob.user_id) not in new_state
    assert new_state[("m.room.canonical_alias", "")]["content"] == {"alias": "#upgraded:test.local"}
    levels = new_state[("m.room.power_levels", "")]["content"]
    assert levels["users"].get(bob.user_id) == 10
    assert levels["events_default"] == 0
    if new_version == "12":
        assert alice.user_id not in levels["users"]  # a creator: infinite power
    else:
        assert levels["users"][alice.user_id] == 100
    assert (await hs.ok("GET", "/directory/room/%23upgraded:test.local"))["room_id"] == new
    # Published in the directory as the old room was.
    assert await hs.process.store.is_room_public(new)


async def test_a_space_upgrade_keeps_its_type_and_children(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    space = (
        await hs.ok(
            "POST",
            "/createRoom",
            {"preset": "public_chat", "creation_content": {"type": "m.space"}},
            token=alice.token,
        )
    )["room_id"]
    child = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    gone = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    via = {"via": ["test.local"]}
    await hs.ok("PUT", f"/rooms/{space}/state/m.space.child/{child}", via, token=alice.token)
    await hs.ok("PUT", f"/rooms/{space}/state/m.space.child/{gone}", {}, token=alice.token)
    new = (
        await hs.ok("POST", f"/rooms/{space}/upgrade", {"new_version": "12"}, token=alice.token)
    )["replacement_room"]
    state = await state_of(hs, alice, new)
    assert state[("m.room.create", "")]["content"]["type"] == "m.space"
    assert state[("m.space.child", child)]["content"] == via
    assert ("m.space.child", gone) not in state  # emptied children are not copied


async def test_upgrade_input_errors(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    cases = [
        (room_id, {}, alice, 400, "M_MISSING_PARAM"),
        (room_id, {"new_version": 12}, alice, 400, "M_BAD_JSON"),
        (room_id, {"new_version": "13"}, alice, 400, "M_UNSUPPORTED_ROOM_VERSION"),
        ("!unknown:test.local", {"new_version": "12"}, alice, 404, "M_NOT_FOUND"),
        (room_id, {"new_version": "12"}, bob, 403, "M_FORBIDDEN"),
    ]
    for target, body, user, status, code in cases:
        got, error = await hs.call("POST", f"/rooms/{target}/upgrade", body, token=user.token)
        assert (got, error["errcode"]) == (status, code), body
    state = await state_of(hs, alice, room_id)
    assert ("m.room.tombstone", "") not in state
