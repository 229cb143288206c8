"""Threaded receipts (``thread_id`` on ``/receipt``, validated as Synapse does) and
``unread_thread_notifications`` in ``/sync``: per-thread counts from the threaded
receipts, the main timeline's counts leaving thread events out, and without the filter
every thread added into the room's counts."""

from __future__ import annotations

from typing import Any

from tests.support.client import q, room_with, send, sync
from tests.support.homeserver import Homeserver, User
from tests.support.relations import relate

THREADED = q({"room": {"timeline": {"unread_thread_notifications": True}}})


async def receipt(
    hs: Homeserver,
    user: User,
    room_id: str,
    event_id: str,
    thread_id: Any = None,
    *,
    receipt_type: str = "m.read",
) -> tuple[int, Any]:
    body = {} if thread_id is None else {"thread_id": thread_id}
    return await hs.call(
        "POST", f"/rooms/{room_id}/receipt/{receipt_type}/{event_id}", body, token=user.token
    )


async def test_threaded_receipts_are_validated_stored_and_synced(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    root = await send(hs, alice, room_id, "root")
    reply = await relate(hs, alice, room_id, "m.thread", root)
    reaction = await relate(
        hs, alice, room_id, "m.annotation", reply, event_type="m.reaction", key="👍"
    )
    plain = await send(hs, alice, room_id, "plain")

    refused = [
        (reply, "", "m.read"),  # empty thread ID
        (root, "main", "m.fully_read"),  # not with m.fully_read
        (reply, "main", "m.read"),  # a thread reply is not in the main timeline
        (reaction, "main", "m.read"),  # nor what relates to one
        (plain, root, "m.read"),  # an unrelated event is not in the thread
        (plain, plain, "m.read"),  # an event that roots no thread is no thread
    ]
    for event_id, thread_id, receipt_type in refused:
        status, body = await receipt(
            hs, bob, room_id, event_id, thread_id, receipt_type=receipt_type
        )
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), (event_id, thread_id)
    status, body = await receipt(hs, bob, room_id, reply, 5)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")

    accepted = [(root, "main"), (plain, "main"), (root, root), (reply, root), (reaction, root)]
    for event_id, thread_id in accepted:
        status, body = await receipt(hs, bob, room_id, event_id, thread_id)
        assert status == 200, (event_id, thread_id, body)
    assert (await receipt(hs, bob, room_id, root))[0] == 200  # unthreaded, as before

    # One receipt per (type, thread), each replacing the last: the main one on plain, the
    # thread's on the reaction, the unthreaded one on the root; served with their thread.
    room = (await sync(hs, alice))["rooms"]["join"][room_id]
    content: dict[str, Any] = {}
    for event in room["ephemeral"]["events"]:
        if event["type"] == "m.receipt":
            for event_id, by_type in event["content"].items():
                for user_id, data in by_type.get("m.read", {}).items():
                    if user_id == bob.user_id:
                        content.setdefault(event_id, []).append(data.get("thread_id"))
    assert content == {plain: ["main"], reaction: [root], root: [None]}


def counts(room: dict[str, Any]) -> tuple[int, int]:
    unread = room["unread_notifications"]
    return unread["notification_count"], unread["highlight_count"]


def thread_counts(room: dict[str, Any]) -> dict[str, int]:
    return {
        t: c["notification_count"] for t, c in room.get("unread_thread_notifications", {}).items()
    }


async def test_unread_thread_notifications(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    root = await send(hs, alice, room_id, "root")
    replies = [await relate(hs, alice, room_id, "m.thread", root, body=f"r{i}") for i in range(2)]
    # A reference to a reply is in the reply's thread (and notifies; an edit would be in
    # it too, but notifies no one: .m.rule.suppress_edits).
    await relate(hs, alice, room_id, "m.reference", replies[0], body="see r0")
    await relate(hs, alice, room_id, "m.replace", replies[0], body="* r0")
    other_root = await send(hs, alice, room_id, "other root")
    other_reply = await relate(hs, alice, room_id, "m.thread", other_root, body="o0")
    last = await send(hs, alice, room_id, "last")

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        threaded = (await sync(hs, bob, filter=THREADED))["rooms"]["join"][room_id]
        plain = (await sync(hs, bob))["rooms"]["join"][room_id]
        assert "unread_thread_notifications" not in plain
        return threaded, plain

    threaded, plain = await both()
    # Main: root, other root, last; threads: 3 and 1; without the filter, all seven.
    assert counts(threaded) == (3, 0)
    assert thread_counts(threaded) == {root: 3, other_root: 1}
    assert counts(plain) == (7, 0)

    # A main receipt on the latest event reads the main timeline, not the threads (their
    # replies are before it: found through the relation events, not the main timeline).
    assert (await receipt(hs, bob, room_id, last, "main"))[0] == 200
    threaded, plain = await both()
    assert counts(threaded) == (0, 0)
    assert thread_counts(threaded) == {root: 3, other_root: 1}
    assert counts(plain) == (4, 0)

    # A thread receipt reads that thread up to it; the thread leaves the map once read.
    assert (await receipt(hs, bob, room_id, replies[0], root))[0] == 200
    assert thread_counts((await both())[0]) == {root: 2, other_root: 1}
    assert (await receipt(hs, bob, room_id, other_reply, other_root))[0] == 200
    threaded, plain = await both()
    assert thread_counts(threaded) == {root: 2}
    assert counts(plain) == (2, 0)

    # New events add to the remembered counts: a reply and a main message.
    newer = await relate(hs, alice, room_id, "m.thread", other_root, body="o1")
    await send(hs, alice, room_id, "after")
    threaded, plain = await both()
    assert counts(threaded) == (1, 0)
    assert thread_counts(threaded) == {root: 2, other_root: 1}
    assert counts(plain) == (4, 0)

    # An unthreaded receipt reads everything before it, in every thread.
    assert (await receipt(hs, bob, room_id, newer))[0] == 200
    threaded, plain = await both()
    assert counts(threaded) == (1, 0)  # "after" is after the receipt
    assert thread_counts(threaded) == {}
    assert counts(plain) == (1, 0)


async def test_the_thread_filter_must_be_a_boolean(homeserver: Homeserver) -> None:
    bob = await homeserver.register("bob")
    bad = q({"room": {"timeline": {"unread_thread_notifications": "yes"}}})
    status, body = await homeserver.call("GET", f"/sync?filter={bad}", token=bob.token)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
