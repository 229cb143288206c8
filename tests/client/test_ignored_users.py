"""``m.ignored_user_list``: the non-state events of ignored users leave the ignoring
user's ``/sync`` timelines, ``/messages`` and ``/context``; their invites are dropped; a
change takes effect from the next request; the list is cached per user and forgotten when
an ``account_data`` row about it arrives (another process's write)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from roomstream.client.ignored import IgnoredUsers
from tests.support.client import bodies, room_with, send
from tests.support.homeserver import Homeserver, User


async def ignore(hs: Homeserver, user: User, *ignored: User) -> None:
    content = {"ignored_users": {u.user_id: {} for u in ignored}}
    await hs.ok(
        "PUT", f"/user/{user.user_id}/account_data/m.ignored_user_list", content, token=user.token
    )


def timeline(sync: dict[str, Any], room_id: str) -> list[dict[str, Any]]:
    room = sync["rooms"]["join"].get(room_id)
    return [] if room is None else list(room["timeline"]["events"])


async def test_ignored_users_messages_are_hidden_but_their_state_is_not(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    room_id = await room_with(hs, alice, bob, carol)
    await ignore(hs, alice, bob)
    hidden = await send(hs, bob, room_id, "from bob")
    await send(hs, carol, room_id, "from carol")
    await hs.ok(
        "PUT",
        f"/rooms/{room_id}/state/m.room.member/{bob.user_id}",
        {"membership": "join", "displayname": "Bob"},
        token=bob.token,
    )

    first = await hs.ok("GET", "/sync", token=alice.token)
    events = timeline(first, room_id)
    assert bodies(events) == ["from carol"]
    renamed = [e for e in events if e["content"].get("displayname") == "Bob"]
    assert [(e["type"], e["sender"]) for e in renamed] == [("m.room.member", bob.user_id)]
    # Others still see bob.
    assert bodies(timeline(await hs.ok("GET", "/sync", token=carol.token), room_id)) == [
        "from bob",
        "from carol",
    ]

    # Incremental: a room with only bob's message is not sent, and does not end a poll.
    await send(hs, bob, room_id, "bob again")
    later = await hs.ok("GET", f"/sync?since={first['next_batch']}&timeout=0", token=alice.token)
    assert room_id not in later["rooms"]["join"]
    await send(hs, carol, room_id, "carol again")
    later = await hs.ok("GET", f"/sync?since={first['next_batch']}&timeout=0", token=alice.token)
    assert bodies(timeline(later, room_id)) == ["carol again"]

    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=alice.token)
    assert bodies(page["chunk"]) == ["carol again", "from carol"]
    assert any(e["content"].get("displayname") == "Bob" for e in page["chunk"])

    status, body = await hs.call("GET", f"/rooms/{room_id}/context/{hidden}", token=alice.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    carol_first = next(e for e in events if bodies([e]) == ["from carol"])
    context = await hs.ok(
        "GET", f"/rooms/{room_id}/context/{carol_first['event_id']}?limit=10", token=alice.token
    )
    around = context["events_before"] + context["events_after"]
    assert all(e["sender"] != bob.user_id or "state_key" in e for e in around), (
        "bob's messages around the event"
    )
    assert any(e["sender"] == bob.user_id and e["type"] == "m.room.member" for e in around)

    # Unignoring takes effect from the next request.
    await ignore(hs, alice)
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=alice.token)
    assert bodies(page["chunk"]) == ["carol again", "bob again", "from carol", "from bob"]
    await send(hs, bob, room_id, "bob heard")
    after = await hs.ok("GET", f"/sync?since={later['next_batch']}&timeout=0", token=alice.token)
    assert bodies(timeline(after, room_id)) == ["bob heard"]


async def test_invites_from_ignored_users_are_dropped(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, carol = [await hs.register(n) for n in ("alice", "bob", "carol")]
    from_bob = await room_with(hs, bob)
    await hs.ok("POST", f"/rooms/{from_bob}/invite", {"user_id": alice.user_id}, token=bob.token)
    await ignore(hs, alice, bob)
    first = await hs.ok("GET", "/sync", token=alice.token)
    assert first["rooms"]["invite"] == {}
    # Incremental: a new invite from bob is dropped, carol's is shown.
    second_from_bob = await room_with(hs, bob)
    await hs.ok(
        "POST", f"/rooms/{second_from_bob}/invite", {"user_id": alice.user_id}, token=bob.token
    )
    from_carol = await room_with(hs, carol)
    await hs.ok(
        "POST", f"/rooms/{from_carol}/invite", {"user_id": alice.user_id}, token=carol.token
    )
    later = await hs.ok("GET", f"/sync?since={first['next_batch']}&timeout=0", token=alice.token)
    assert set(later["rooms"]["invite"]) == {from_carol}
    full = await hs.ok(
        "GET", f"/sync?since={first['next_batch']}&timeout=0&full_state=true", token=alice.token
    )
    assert set(full["rooms"]["invite"]) == {from_carol}
    # Unignored: bob's invites are back in an initial sync.
    await ignore(hs, alice)
    again = await hs.ok("GET", "/sync", token=alice.token)
    assert set(again["rooms"]["invite"]) == {from_bob, second_from_bob, from_carol}


async def test_the_list_is_cached_and_forgotten_by_an_account_data_row(
    homeserver: Homeserver,
) -> None:
    """A write made by another process (here: straight into the table, as its writer
    would) is not seen until its ``account_data`` row arrives over replication: the list
    is read from the cache, not per request; the row makes the process read it again."""
    hs = homeserver
    alice, bob = [await hs.register(n) for n in ("alice", "bob")]
    room_id = await room_with(hs, alice, bob)
    await send(hs, bob, room_id, "hello")
    # The write's own row reaches this process's cache asynchronously (the notifier's
    # read of new local rows): let it land, so it cannot be what drops the entry below.
    row_seen = asyncio.Event()

    def on_rows(stream: str, writer: str, since: int, upto: int, updates: list[Any]) -> None:
        if stream == "account_data" and any(r[0] == alice.user_id for _, r in updates):
            row_seen.set()

    hs.process.notifier.local_row_listeners.append(on_rows)
    await ignore(hs, alice)
    await asyncio.wait_for(row_seen.wait(), 30)
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b", token=alice.token)
    assert bodies(page["chunk"]) == ["hello"]  # the empty list, now cached
    content = orjson.dumps({"ignored_users": {bob.user_id: {}}}).decode()
    await hs.engine.db.run_interaction(
        "test_query",
        lambda t: t.execute(
            "UPDATE account_data SET content = ? WHERE user_id = ? AND account_data_type = ?",
            (content, alice.user_id, "m.ignored_user_list"),
        ),
    )
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b", token=alice.token)
    assert bodies(page["chunk"]) == ["hello"]  # cached
    hs.process.on_replicated_rows(
        "account_data", "elsewhere", 10**6, [[alice.user_id, None, "m.ignored_user_list"]]
    )
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b", token=alice.token)
    assert bodies(page["chunk"]) == []
    # Rows about other data, other users or room account data do not drop the entry.
    cache = hs.process.ignored
    hs.process.on_replicated_rows(
        "account_data",
        "elsewhere",
        10**6 + 1,
        [
            [alice.user_id, None, "m.direct"],
            [bob.user_id, None, "m.ignored_user_list"],
            [alice.user_id, room_id, "m.ignored_user_list"],
        ],
    )
    assert alice.user_id in cache._cache


async def test_a_read_that_raced_an_invalidation_is_not_cached() -> None:
    contents = [{"ignored_users": {"@old:hs": {}}}, {"ignored_users": {"@new:hs": {}}}]
    cache: IgnoredUsers

    async def load(user_id: str) -> dict[str, Any] | None:
        content = contents.pop(0)
        if len(contents) == 1:
            cache.invalidate(user_id)  # a write's row arrives while this read runs
        return content

    cache = IgnoredUsers(load)
    assert await cache.of("@a:hs") == {"@old:hs"}  # served, but not kept
    assert await cache.of("@a:hs") == {"@new:hs"}
    assert await cache.of("@a:hs") == {"@new:hs"}  # now cached: no third load


def test_malformed_lists_ignore_nobody() -> None:
    from roomstream.client.ignored import ignored_from_content

    assert ignored_from_content({"ignored_users": {"@a:hs": {}, "@b:hs": 1}}) == {"@a:hs", "@b:hs"}
    for content in (None, [], {"ignored_users": ["@a:hs"]}, {"ignored_users": "@a:hs"}, {}):
        assert ignored_from_content(content) == frozenset()
