"""``/user_directory/search`` and ``/publicRooms``, served from the Spark views.

Rooms are made through the client API; the view tables are filled by the views job's
Spark rebuild (``rebuild_views``), on SQLite and PostgreSQL, and then read both through
the library (:mod:`roomstream.client.directory`) and over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from roomstream.client.directory import RoomListToken, public_rooms_txn, search_users_txn
from roomstream.pipelines.session import spark_session
from roomstream.pipelines.views import ViewsSink, rebuild_views, start_views_query
from tests.support.homeserver import Homeserver, User

SEARCH = "/user_directory/search"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # The pattern of tests/pipelines/conftest.py (one session for these tests).
    session = spark_session("local[2]", app_name="roomstream-directory-tests")
    try:
        yield session
    finally:
        session.stop()


async def test_directory_requests_validated(homeserver: Homeserver) -> None:
    """Authentication and bad bodies answer Matrix errors; with empty views both lists
    are empty (nothing is read from anywhere but the views)."""
    alice = await homeserver.register("alice")
    await homeserver.ok(
        "POST", "/createRoom", {"visibility": "public", "name": "x"}, token=alice.token
    )
    status, body = await homeserver.call("POST", SEARCH, {"search_term": "a"})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    status, body = await homeserver.call("POST", SEARCH, {"search_term": "a"}, token="nope")
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    status, body = await homeserver.call("POST", "/publicRooms", {})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    bad: list[tuple[Any, bytes | None, str]] = [
        ({}, None, "M_MISSING_PARAM"),
        ({"search_term": 5}, None, "M_BAD_JSON"),
        ({"search_term": "a", "limit": "3"}, None, "M_BAD_JSON"),
        ({"search_term": "a", "limit": -1}, None, "M_INVALID_PARAM"),
        (None, b"{not json", "M_NOT_JSON"),
        (None, b"[1]", "M_BAD_JSON"),
    ]
    for body_json, raw, code in bad:
        status, body = await homeserver.call("POST", SEARCH, body_json, raw=raw, token=alice.token)
        assert (status, body["errcode"]) == (400, code), (body_json, raw)
    for rooms_body, code in [
        ({"since": "garbage"}, "M_INVALID_PARAM"),
        ({"limit": True}, "M_BAD_JSON"),
        ({"filter": []}, "M_BAD_JSON"),
        ({"filter": {"generic_search_term": 3}}, "M_BAD_JSON"),
    ]:
        status, body = await homeserver.call("POST", "/publicRooms", rooms_body, token=alice.token)
        assert (status, body["errcode"]) == (400, code), rooms_body
    status, body = await homeserver.call("GET", "/publicRooms?since=f1.nope")
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await homeserver.call("GET", "/publicRooms?server=elsewhere.org")
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    # The views job has not run: nothing is listed yet.
    assert await homeserver.ok("POST", SEARCH, {"search_term": "alice"}, token=alice.token) == {
        "results": [],
        "limited": False,
    }
    assert await homeserver.ok("GET", "/publicRooms") == {
        "chunk": [],
        "total_room_count_estimate": 0,
    }


async def _build_world(hs: Homeserver) -> dict[str, Any]:
    alice, bob, carol, dave, eve = [
        await hs.register(n) for n in ("alice", "bob", "carol", "dave", "eve")
    ]

    async def create(user: User, body: dict[str, Any]) -> str:
        return str((await hs.ok("POST", "/createRoom", body, token=user.token))["room_id"])

    lobby = await create(
        alice,
        {
            "visibility": "public",
            "name": "The Lobby",
            "topic": "say hello",
            "room_alias_name": "lobby",
        },
    )
    await hs.ok("POST", f"/join/{lobby}", {}, token=bob.token)
    await hs.ok(
        "PUT",
        f"/rooms/{lobby}/state/m.room.avatar",
        {"url": "mxc://test.local/l"},
        token=alice.token,
    )
    secret = await create(alice, {"name": "secret", "invite": [carol.user_id]})
    await hs.ok("POST", f"/rooms/{secret}/join", {}, token=carol.token)
    await create(dave, {"name": "alone"})  # dave shares nothing: not listed
    cafe = await create(eve, {"visibility": "public", "name": "Eve's cafe"})
    await create(alice, {"preset": "public_chat", "name": "unlisted"})  # not published
    await hs.ok(
        "PUT",
        f"/rooms/{lobby}/state/m.room.member/{bob.user_id}",
        {"membership": "join", "displayname": "Bobby", "avatar_url": "mxc://test.local/b"},
        token=bob.token,
    )
    users = {"alice": alice, "bob": bob, "carol": carol, "dave": dave, "eve": eve}
    return {"users": users, "lobby": lobby, "cafe": cafe}


def _stream_views(spark: SparkSession, hs: Homeserver, offset: dict[str, int]) -> None:
    """The streaming views job from ``offset`` over what is there now, then stop."""
    config = hs.config.database
    sink = ViewsSink(config, sink_name="directory-test")
    checkpoint = str(Path(hs.config.data_dir) / "views-ckpt")
    query, _ = start_views_query(
        spark, config, checkpoint, sink=sink, available_now=True, starting_offsets=offset
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
        sink.close()


@pytest.mark.spark
async def test_directory_from_rebuilt_views(homeserver: Homeserver, spark: SparkSession) -> None:
    world = await _build_world(homeserver)
    u = world["users"]
    # The views cover what the events writer has stored as its position: store it first.
    await homeserver.engine.streams.generator("events").flush()
    rebuilt = await asyncio.to_thread(rebuild_views, spark, homeserver.config.database)
    db = homeserver.engine.db

    async def search(who: str, term: str, limit: int = 10) -> tuple[list[str], bool]:
        found = await db.run_interaction(
            "search_users", search_users_txn, u[who].user_id, term, limit
        )
        return [r["user_id"] for r in found.results], found.limited

    # Library: the visibility rule.
    everyone = sorted(x.user_id for x in u.values())
    assert await search("alice", "test.local") == (
        [u[n].user_id for n in ("alice", "bob", "carol", "eve")],
        False,
    )
    # bob shares no room with carol, who is only in a private room; dave is alone.
    assert await search("bob", "test.local") == (
        [u[n].user_id for n in ("alice", "bob", "eve")],
        False,
    )
    assert await search("dave", "carol") == ([], False)
    assert await search("carol", "carol") == ([u["carol"].user_id], False)
    assert u["dave"].user_id in everyone
    # Display name, words, case, ranking and limits.
    assert await search("carol", "BOBBY") == ([u["bob"].user_id], False)
    assert await search("carol", "bob local") == ([u["bob"].user_id], False)
    assert await search("alice", "test.local", limit=2) == (
        [u["alice"].user_id, u["bob"].user_id],
        True,
    )
    assert await search("alice", "e") == (
        [u["eve"].user_id, u["alice"].user_id, u["bob"].user_id, u["carol"].user_id],
        False,
    )  # "@e…" starts with the word: first
    assert await search("alice", "%") == ([], False)  # LIKE wildcards are literal

    # Library: the room list (published rooms only, most members first).
    page = await db.run_interaction("public_rooms", public_rooms_txn, 10, None, None)
    assert [r.room_id for r in page.chunk] == [world["lobby"], world["cafe"]]
    assert page.total_room_count_estimate == 2
    assert page.next_batch is None and page.prev_batch is None
    assert page.chunk[0].to_json() == {
        "room_id": world["lobby"],
        "name": "The Lobby",
        "topic": "say hello",
        "canonical_alias": "#lobby:test.local",
        "avatar_url": "mxc://test.local/l",
        "num_joined_members": 2,
        "world_readable": False,
        "guest_can_join": False,
        "join_rule": "public",
    }
    found = await db.run_interaction("public_rooms", public_rooms_txn, 10, None, "CAFE")
    assert [r.room_id for r in found.chunk] == [world["cafe"]]

    # HTTP: the user directory.
    body = await homeserver.ok("POST", SEARCH, {"search_term": "bobby"}, token=u["eve"].token)
    assert body == {
        "results": [
            {
                "user_id": u["bob"].user_id,
                "display_name": "Bobby",
                "avatar_url": "mxc://test.local/b",
            }
        ],
        "limited": False,
    }
    # HTTP: pages of one room, there and back, by the tokens.
    first = await homeserver.ok("GET", "/publicRooms?limit=1")
    assert [r["room_id"] for r in first["chunk"]] == [world["lobby"]]
    assert "prev_batch" not in first and first["total_room_count_estimate"] == 2
    second = await homeserver.ok(
        "POST", "/publicRooms", {"limit": 1, "since": first["next_batch"]}, token=u["bob"].token
    )
    assert [r["room_id"] for r in second["chunk"]] == [world["cafe"]]
    assert second["chunk"][0]["name"] == "Eve's cafe"
    assert "next_batch" not in second
    back = await homeserver.ok("GET", f"/publicRooms?limit=1&since={second['prev_batch']}")
    assert [r["room_id"] for r in back["chunk"]] == [world["lobby"]]
    assert "prev_batch" not in back and back["next_batch"] == first["next_batch"]
    RoomListToken.parse(back["next_batch"])
    searched = await homeserver.ok(
        "POST",
        "/publicRooms",
        {"filter": {"generic_search_term": "hello"}},
        token=u["dave"].token,
    )
    assert [r["room_id"] for r in searched["chunk"]] == [world["lobby"]]

    # The streaming job carries changes on: bob leaves his only room.
    await homeserver.ok("POST", f"/rooms/{world['lobby']}/leave", {}, token=u["bob"].token)
    stale = await homeserver.ok("GET", "/publicRooms")
    assert stale["chunk"][0]["num_joined_members"] == 2  # the views have not seen it yet
    await homeserver.engine.streams.generator("events").flush()
    await asyncio.to_thread(_stream_views, spark, homeserver, rebuilt.offset)
    fresh = await homeserver.ok("GET", "/publicRooms")
    assert sorted((r["room_id"], r["num_joined_members"]) for r in fresh["chunk"]) == sorted(
        [(world["lobby"], 1), (world["cafe"], 1)]
    )
    assert await search("carol", "bob") == ([], False)  # in no room: out of the directory
