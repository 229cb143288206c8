"""``/sync``'s end-to-end-encryption fields: the syncing device's one-time key counts and
unused fallback key types, and ``device_lists.changed`` from the device_lists stream (with
its own part of the sync token), on both engines."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.e2e_keys import Device
from tests.support.homeserver import Homeserver, User, signal_waits


async def test_counts_and_changed_device_lists(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    room = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await hs.ok("POST", f"/rooms/{room}/invite", {"user_id": bob.user_id}, token=alice.token)
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    first = await hs.ok("GET", "/sync", token=alice.token)
    assert first["device_one_time_keys_count"] == {"signed_curve25519": 0}
    assert first["device_unused_fallback_key_types"] == []
    assert first["device_lists"] == {"changed": [], "left": []}
    device = Device(alice.user_id, alice.device_id)
    await hs.ok(
        "POST",
        "/keys/upload",
        {
            "one_time_keys": device.one_time_keys(["1", "2", "3"]),
            "fallback_keys": {"signed_curve25519:F": {"key": "f", "fallback": True}},
        },
        token=alice.token,
    )
    for user in (bob, carol):
        keys = Device(user.user_id, user.device_id).device_keys()
        await hs.ok("POST", "/keys/upload", {"device_keys": keys}, token=user.token)
    since = first["next_batch"]
    later = await hs.ok("GET", f"/sync?since={since}&timeout=0", token=alice.token)
    assert later["device_one_time_keys_count"] == {"signed_curve25519": 3}
    assert later["device_unused_fallback_key_types"] == ["signed_curve25519"]
    # carol shares no room with alice.
    assert later["device_lists"] == {"changed": [bob.user_id], "left": []}
    again = await hs.ok("GET", f"/sync?since={later['next_batch']}&timeout=0", token=alice.token)
    assert again["device_lists"]["changed"] == []
    # A token from before the device_lists part (five parts) still works: changes since 0.
    old = "_".join(since.split("_")[:5])
    from_old = await hs.ok("GET", f"/sync?since={old}&timeout=0", token=alice.token)
    assert from_old["device_lists"]["changed"] == [bob.user_id]


async def test_own_key_change_wakes_a_long_poll(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    since = (await hs.ok("GET", "/sync", token=alice.token))["next_batch"]
    poll = asyncio.create_task(
        hs.ok("GET", f"/sync?since={since}&timeout=60000", token=alice.token)
    )
    keys = Device(alice.user_id, alice.device_id).device_keys()
    await hs.ok("POST", "/keys/upload", {"device_keys": keys}, token=alice.token)
    woken = await asyncio.wait_for(poll, 30)
    assert woken["device_lists"]["changed"] == [alice.user_id]


async def alice_waits_in_a_room_with_bob(
    hs: Homeserver,
) -> tuple[User, User, asyncio.Event, asyncio.Task[Any]]:
    """alice and bob share a room; alice's incremental sync (a minute's long poll) is
    started, and ``waiting`` is set each time a sync starts waiting.
    Returns (alice, bob, waiting, the poll)."""
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room = (await hs.ok("POST", "/createRoom", {"invite": [bob.user_id]}, token=alice.token))[
        "room_id"
    ]
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    since = (await hs.ok("GET", "/sync", token=alice.token))["next_batch"]
    waiting = signal_waits(hs)
    poll = asyncio.create_task(
        hs.ok("GET", f"/sync?since={since}&timeout=60000", token=alice.token)
    )
    return alice, bob, waiting, poll


async def test_a_room_members_key_change_wakes_a_long_poll(homeserver: Homeserver) -> None:
    """Bob's new device keys wake Alice's waiting sync (they share a room): her client must
    re-query his keys before it next encrypts for the room."""
    hs = homeserver
    _, bob, waiting, poll = await alice_waits_in_a_room_with_bob(hs)
    await asyncio.wait_for(waiting.wait(), 30)
    keys = Device(bob.user_id, bob.device_id).device_keys()
    await hs.ok("POST", "/keys/upload", {"device_keys": keys}, token=bob.token)
    woken = await asyncio.wait_for(poll, 30)
    assert woken["device_lists"]["changed"] == [bob.user_id]


async def test_a_replicated_key_change_wakes_room_members_once_complete(
    homeserver: Homeserver,
) -> None:
    """A device_lists row written by another process wakes the syncs here of the users
    sharing a room with its user, once that writer's position reaches it."""
    hs = homeserver
    _, bob, waiting, poll = await alice_waits_in_a_room_with_bob(hs)
    try:
        await asyncio.wait_for(waiting.wait(), 30)
        waiting.clear()
        hs.process.on_replicated_rows("device_lists", "elsewhere", 7, [[bob.user_id]])
        hs.process.on_replicated_position("device_lists", "elsewhere", 7)
        # Woken: the sync read again (this process has no such row: nothing new) and waits.
        await asyncio.wait_for(waiting.wait(), 30)
        assert not poll.done()
    finally:
        poll.cancel()


async def test_sharing_a_room_and_no_longer_sharing_one(homeserver: Homeserver) -> None:
    """Who comes to share a room is in ``changed`` (the client may have missed their key
    changes); who shares none any more is in ``left``, on both sides of a leave, and only
    once they share no room at all."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    public = {"preset": "public_chat"}
    first = (await hs.ok("POST", "/createRoom", public, token=alice.token))["room_id"]
    second = (await hs.ok("POST", "/createRoom", public, token=alice.token))["room_id"]
    tokens = {
        u.user_id: (await hs.ok("GET", "/sync", token=u.token))["next_batch"]
        for u in (alice, bob, carol)
    }

    async def lists(user: Any) -> dict[str, list[str]]:
        path = f"/sync?since={tokens[user.user_id]}&timeout=0"
        body = await hs.ok("GET", path, token=user.token)
        tokens[user.user_id] = body["next_batch"]
        return dict(body["device_lists"])

    await hs.ok("POST", f"/join/{first}", {}, token=bob.token)
    await hs.ok("POST", f"/join/{second}", {}, token=bob.token)
    assert await lists(alice) == {"changed": [bob.user_id], "left": []}
    assert await lists(bob) == {"changed": [alice.user_id], "left": []}
    await hs.ok("POST", f"/rooms/{first}/leave", {}, token=bob.token)
    # Still sharing the second room: nobody left anyone.
    assert (await lists(alice))["left"] == []
    assert (await lists(bob))["left"] == []
    await hs.ok("POST", f"/join/{second}", {}, token=carol.token)
    await hs.ok("POST", f"/rooms/{second}/leave", {}, token=bob.token)
    assert await lists(alice) == {"changed": [carol.user_id], "left": [bob.user_id]}
    assert sorted((await lists(bob))["left"]) == sorted([alice.user_id, carol.user_id])
    # Once gone, bob's device changes are not alice's business.
    await hs.ok("PUT", f"/devices/{bob.device_id}", {"display_name": "x"}, token=bob.token)
    assert (await lists(alice))["changed"] == []
