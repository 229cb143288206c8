"""Inbound EDUs as a local user sees them: after another server's typing, receipt,
presence, device list and to-device EDUs, Alice's /sync shows Bob (remote) typing, his
receipt, his presence, his device list changed and his message to her device (once,
however often the transaction repeats); EDUs naming users of another server, or about a
room their server is not in, change nothing. Both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.storage import DatabaseConfig
from tests.federation.edus_support import BOB, REMOTE, STRANGER, Scene, join_remote, scene
from tests.support.client import room_with, send, sync


@pytest.fixture
async def s(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Scene]:
    async for one in scene(db_config, tmp_path):
        yield one


def ephemeral(body: Any, room_id: str, event_type: str) -> list[dict[str, Any]]:
    room = body["rooms"]["join"].get(room_id, {})
    events = room.get("ephemeral", {}).get("events", [])
    return [e for e in events if e["type"] == event_type]


async def test_remote_user_typing_shows_and_stops(s: Scene) -> None:
    hs, alice, room_id = s.hs, s.alice, s.room_id
    first = await sync(hs, alice)
    await s.edus.on_edu(REMOTE, "m.typing", {"room_id": room_id, "user_id": BOB, "typing": True})
    typing = await sync(hs, alice, since=first["next_batch"])
    (event,) = ephemeral(typing, room_id, "m.typing")
    assert event["content"]["user_ids"] == [BOB]
    await s.edus.on_edu(REMOTE, "m.typing", {"room_id": room_id, "user_id": BOB, "typing": False})
    stopped = await sync(hs, alice, since=typing["next_batch"])
    (event,) = ephemeral(stopped, room_id, "m.typing")
    assert event["content"]["user_ids"] == []


async def test_typing_for_another_servers_user_or_a_room_not_joined_is_dropped(s: Scene) -> None:
    hs, alice, room_id = s.hs, s.alice, s.room_id
    first = await sync(hs, alice)
    # The stranger's server speaks for Bob; Bob's server for a user of the stranger's;
    # the stranger's server for its own user in a room it is not in.
    for origin, user in (
        (STRANGER, BOB),
        (REMOTE, f"@eve:{STRANGER}"),
        (STRANGER, f"@eve:{STRANGER}"),
    ):
        content = {"room_id": room_id, "user_id": user, "typing": True}
        await s.edus.on_edu(origin, "m.typing", content)
    # Bob's server, for a room it is not in.
    other_room = await room_with(hs, alice)
    content = {"room_id": other_room, "user_id": BOB, "typing": True}
    await s.edus.on_edu(REMOTE, "m.typing", content)
    later = await sync(hs, alice, since=first["next_batch"])
    assert ephemeral(later, room_id, "m.typing") == []
    assert ephemeral(later, other_room, "m.typing") == []
    assert hs.process.typing_state.changed([room_id, other_room], 0) == {}


async def test_remote_receipts_plain_and_threaded(s: Scene) -> None:
    hs, alice, room_id = s.hs, s.alice, s.room_id
    message = await send(hs, alice, room_id, "read me")
    first = await sync(hs, alice)
    content = {
        room_id: {
            "m.read": {
                BOB: {"event_ids": [message], "data": {"ts": 1_700_000_000_000}},
                # Not Bob's server's user: left out, the rest kept.
                f"@eve:{STRANGER}": {"event_ids": [message], "data": {"ts": 1}},
            }
        }
    }
    await s.edus.on_edu(REMOTE, "m.receipt", content)
    later = await sync(hs, alice, since=first["next_batch"])
    (event,) = ephemeral(later, room_id, "m.receipt")
    readers = event["content"][message]["m.read"]
    assert set(readers) == {BOB}
    assert "thread_id" not in readers[BOB]
    assert readers[BOB]["ts"] == 1_700_000_000_000  # their server's time, kept

    threaded = {room_id: {"m.read": {BOB: {"event_ids": [message], "data": {"thread_id": "main"}}}}}
    await s.edus.on_edu(REMOTE, "m.receipt", threaded)
    again = await sync(hs, alice, since=later["next_batch"])
    (event,) = ephemeral(again, room_id, "m.receipt")
    assert event["content"][message]["m.read"][BOB]["thread_id"] == "main"


async def test_receipts_for_a_room_the_origin_is_not_in_are_dropped(s: Scene) -> None:
    hs, alice, room_id = s.hs, s.alice, s.room_id
    message = await send(hs, alice, room_id, "read me")
    first = await sync(hs, alice)
    user = f"@eve:{STRANGER}"
    content = {room_id: {"m.read": {user: {"event_ids": [message]}}}}
    await s.edus.on_edu(STRANGER, "m.receipt", content)
    later = await sync(hs, alice, since=first["next_batch"])
    assert ephemeral(later, room_id, "m.receipt") == []


async def test_remote_presence_shown_to_users_sharing_a_room(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    loner = await hs.register("loner")
    first, loner_first = await sync(hs, alice), await sync(hs, loner)
    push = [
        {
            "user_id": BOB,
            "presence": "online",
            "last_active_ago": 5000,
            "currently_active": True,
            "status_msg": "hi",
        },
        {"user_id": f"@eve:{STRANGER}", "presence": "online"},
    ]
    await s.edus.on_edu(REMOTE, "m.presence", {"push": push})
    later = await sync(hs, alice, since=first["next_batch"])
    (event,) = [e for e in later["presence"]["events"] if e["sender"] == BOB]
    assert event["content"]["presence"] == "online"
    assert event["content"]["status_msg"] == "hi"
    assert event["content"]["currently_active"] is True
    assert 5000 <= event["content"]["last_active_ago"] < 60_000
    senders = {e["sender"] for e in later["presence"]["events"]}
    assert f"@eve:{STRANGER}" not in senders
    # Sharing no room with Bob, the loner does not see him.
    loner_later = await sync(hs, loner, since=loner_first["next_batch"])
    assert BOB not in {e["sender"] for e in loner_later["presence"]["events"]}
    status = await hs.ok("GET", f"/presence/{BOB}/status", token=alice.token)
    assert status["presence"] == "online"


async def test_device_list_update_marks_the_remote_user_changed(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    first = await sync(hs, alice)
    update = {"user_id": BOB, "device_id": "BOBPHONE", "stream_id": 1, "prev_id": []}
    await s.edus.on_edu(REMOTE, "m.device_list_update", update)
    later = await sync(hs, alice, since=first["next_batch"])
    assert BOB in later["device_lists"]["changed"]
    cached = await s.edus.device_lists.get(BOB)  # type: ignore[attr-defined]
    assert cached is not None and not cached.stale and list(cached.devices) == ["BOBPHONE"]
    # A gap (prev_id we never saw): stale, cached devices dropped, changed again.
    gap = {"user_id": BOB, "device_id": "BOBLAPTOP", "stream_id": 9, "prev_id": [7]}
    await s.edus.on_edu(REMOTE, "m.device_list_update", gap)
    again = await sync(hs, alice, since=later["next_batch"])
    assert BOB in again["device_lists"]["changed"]
    cached = await s.edus.device_lists.get(BOB)  # type: ignore[attr-defined]
    assert cached is not None and cached.stale and cached.devices == {}
    # The stranger's server cannot speak for Bob.
    forged = {"user_id": BOB, "device_id": "X", "stream_id": 10, "prev_id": [9]}
    await s.edus.on_edu(STRANGER, "m.device_list_update", forged)
    quiet = await sync(hs, alice, since=again["next_batch"])
    assert BOB not in quiet["device_lists"]["changed"]


async def test_signing_key_update_marks_the_remote_user_changed(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    first = await sync(hs, alice)
    public = "A" * 43
    master = {"user_id": BOB, "usage": ["master"], "keys": {f"ed25519:{public}": public}}
    await s.edus.on_edu(REMOTE, "m.signing_key_update", {"user_id": BOB, "master_key": master})
    later = await sync(hs, alice, since=first["next_batch"])
    assert BOB in later["device_lists"]["changed"]
    cached = await s.edus.device_lists.get(BOB)  # type: ignore[attr-defined]
    # Cross-signing keys of a user whose devices are not tracked yet: no list row.
    assert cached is None


async def test_to_device_arrives_once_though_the_transaction_repeats(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    first = await sync(hs, alice)
    content = {
        "sender": BOB,
        "type": "m.room_key_request",
        "message_id": "m1",
        "messages": {
            alice.user_id: {alice.device_id: {"action": "request", "n": 1}},
            f"@eve:{STRANGER}": {"D": {"n": 2}},
        },
    }
    for _ in range(3):
        await s.edus.on_edu(REMOTE, "m.direct_to_device", content)
    later = await sync(hs, alice, since=first["next_batch"])
    assert later["to_device"]["events"] == [
        {"type": "m.room_key_request", "sender": BOB, "content": {"action": "request", "n": 1}}
    ]
    # Another message ID is another message; every device ("*") too.
    await s.edus.on_edu(
        REMOTE,
        "m.direct_to_device",
        {**content, "message_id": "m2", "messages": {alice.user_id: {"*": {"n": 3}}}},
    )
    # The stranger's server cannot send as Bob.
    await s.edus.on_edu(STRANGER, "m.direct_to_device", {**content, "message_id": "m3"})
    again = await sync(hs, alice, since=later["next_batch"])
    assert [e["content"] for e in again["to_device"]["events"]] == [{"n": 3}]


async def test_remote_user_in_a_second_room_counts_for_that_room_only(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    second = await room_with(hs, alice)
    carol = f"@carol:{STRANGER}"
    await join_remote(hs, second, carol)
    first = await sync(hs, alice)
    await s.edus.on_edu(STRANGER, "m.typing", {"room_id": second, "user_id": carol, "typing": True})
    await s.edus.on_edu(
        STRANGER, "m.typing", {"room_id": s.room_id, "user_id": carol, "typing": True}
    )
    later = await sync(hs, alice, since=first["next_batch"])
    (event,) = ephemeral(later, second, "m.typing")
    assert event["content"]["user_ids"] == [carol]
    assert ephemeral(later, s.room_id, "m.typing") == []


async def test_typing_and_receipts_for_a_room_this_server_left_are_dropped(s: Scene) -> None:
    hs, alice = s.hs, s.alice
    left = await room_with(hs, alice)
    await join_remote(hs, left, BOB)
    message = await send(hs, alice, left, "before leaving")
    await hs.ok("POST", f"/rooms/{left}/leave", {}, token=alice.token)
    await s.edus.on_edu(REMOTE, "m.typing", {"room_id": left, "user_id": BOB, "typing": True})
    await s.edus.on_edu(REMOTE, "m.receipt", {left: {"m.read": {BOB: {"event_ids": [message]}}}})
    assert hs.process.typing_state.changed([left], 0) == {}
    receipts = await hs.process.userdata.receipts_since([left], 0, 2**62)
    assert receipts == {}
