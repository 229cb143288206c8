"""``GET /notifications``: the events the user's push rules say notify, newest first,
paged by ``from``/``limit``, ``only=highlight``, ``read`` from the receipt; never events
from before the user joined, never their own."""

from __future__ import annotations

from typing import Any

from tests.support.client import room_with, send, sync
from tests.support.homeserver import Homeserver, User
from tests.support.relations import relate


async def _notifications(hs: Homeserver, user: User, query: str = "") -> Any:
    return await hs.ok("GET", "/notifications" + query, token=user.token)


def _bodies(page: Any) -> list[str]:
    return [n["event"]["content"]["body"] for n in page["notifications"]]


async def test_notifications_newest_first_paged_and_highlights(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    carol = await homeserver.register("carol")
    room_id = await room_with(homeserver, bob, carol)
    await send(homeserver, bob, room_id, "before alice joined")
    await homeserver.ok("POST", f"/rooms/{room_id}/join", {}, token=alice.token)
    first = await send(homeserver, bob, room_id, "m1")
    await send(homeserver, alice, room_id, "alice's own")
    await send(homeserver, carol, room_id, "m2 hello alice")  # contains_user_name: highlight
    await send(homeserver, bob, room_id, "m3")
    page = await _notifications(homeserver, alice)
    assert _bodies(page) == ["m3", "m2 hello alice", "m1"]
    assert "next_token" not in page
    top = page["notifications"][0]
    assert (top["room_id"], top["read"], top["actions"]) == (room_id, False, ["notify"])
    assert isinstance(top["ts"], int) and top["event"]["sender"] == bob.user_id
    # Pages of one: each next_token continues below the last.
    seen: list[str] = []
    query = "?limit=1"
    while True:
        one = await _notifications(homeserver, alice, query)
        seen += _bodies(one)
        if "next_token" not in one:
            break
        query = f"?limit=1&from={one['next_token']}"
    assert seen == ["m3", "m2 hello alice", "m1"]
    highlights = await _notifications(homeserver, alice, "?only=highlight")
    assert _bodies(highlights) == ["m2 hello alice"]
    # A receipt marks what is read.
    await homeserver.ok("POST", f"/rooms/{room_id}/receipt/m.read/{first}", {}, token=alice.token)
    read = {
        n["event"]["content"]["body"]: n["read"]
        for n in (await _notifications(homeserver, alice))["notifications"]
    }
    assert read == {"m3": False, "m2 hello alice": False, "m1": True}
    # The user's rules decide: muting bob removes his messages.
    await homeserver.ok(
        "PUT", f"/pushrules/global/sender/{bob.user_id}", {"actions": []}, token=alice.token
    )
    assert _bodies(await _notifications(homeserver, alice)) == ["m2 hello alice"]


async def test_bad_notifications_parameters(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    for query in ("?from=abc", "?limit=-1", "?only=everything"):
        status, body = await homeserver.call("GET", "/notifications" + query, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), query


async def test_edits_neither_notify_nor_count_as_unread(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room_id = await room_with(homeserver, bob, alice)
    original = await send(homeserver, bob, room_id, "typo")
    edit = {
        "msgtype": "m.text",
        "body": "* fixed",
        "m.new_content": {"msgtype": "m.text", "body": "fixed"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": original},
    }
    path = f"/rooms/{room_id}/send/m.room.message/{homeserver.txn()}"
    await homeserver.ok("PUT", path, edit, token=bob.token)
    assert _bodies(await _notifications(homeserver, alice)) == ["typo"]
    counts = (await sync(homeserver, alice))["rooms"]["join"][room_id]["unread_notifications"]
    assert counts == {"notification_count": 1, "highlight_count": 0}
    # An edit that mentions alice does notify (.m.rule.is_user_mention comes first).
    mention = {**edit, "body": "* fixed @alice", "m.mentions": {"user_ids": [alice.user_id]}}
    path = f"/rooms/{room_id}/send/m.room.message/{homeserver.txn()}"
    await homeserver.ok("PUT", path, mention, token=bob.token)
    assert _bodies(await _notifications(homeserver, alice)) == ["* fixed @alice", "typo"]


async def test_read_follows_the_receipt_of_each_notifications_thread(
    homeserver: Homeserver,
) -> None:
    """``read``: at or before the later of the unthreaded receipt and the receipt of the
    event's thread (``main`` for events in no thread), as unread counts."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    room_id = await room_with(hs, bob, alice)
    root = await send(hs, bob, room_id, "root")
    reply1 = await relate(hs, bob, room_id, "m.thread", root, body="reply1")
    await send(hs, bob, room_id, "main2")
    reply2 = await relate(hs, bob, room_id, "m.thread", root, body="reply2")
    main3 = await send(hs, bob, room_id, "main3")

    async def read_flags() -> dict[str, bool]:
        page = await _notifications(hs, alice)
        return {n["event"]["content"]["body"]: n["read"] for n in page["notifications"]}

    async def receipt(event_id: str, thread_id: str | None) -> None:
        body = {} if thread_id is None else {"thread_id": thread_id}
        path = f"/rooms/{room_id}/receipt/m.read/{event_id}"
        await hs.ok("POST", path, body, token=alice.token)

    unread = {"root": False, "reply1": False, "main2": False, "reply2": False, "main3": False}
    assert await read_flags() == unread
    # The thread's receipt on reply1 reads the thread up to it, nothing of the main line
    # (its root is in the main timeline), though main2 comes before it.
    await receipt(reply1, root)
    assert await read_flags() == {**unread, "reply1": True}
    # The main timeline's receipt on main3 reads root, main2, main3: not reply2.
    await receipt(main3, "main")
    assert await read_flags() == {
        **unread,
        "reply1": True,
        "root": True,
        "main2": True,
        "main3": True,
    }
    # An unthreaded receipt reads everything up to it, in every thread.
    await receipt(reply2, None)
    assert await read_flags() == dict.fromkeys(unread, True)
