"""Profiles through the API, on SQLite and PostgreSQL: ``GET /profile/{userId}``,
``GET/PUT/DELETE /profile/{userId}/displayname`` and ``/avatar_url`` with their errors;
new joins, invites and knocks carrying the member's profile; a change sent as a join
event into every room the user is joined to (and only those), in the background, across
processes; the user directory showing the names; matrix-js-sdk showing them; and the
endpoints fuzzed."""

from __future__ import annotations

import asyncio
import http.client
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from roomstream.client.directory import search_users_txn
from roomstream.config import parse_config
from roomstream.pipelines.session import spark_session
from roomstream.pipelines.views import ViewsSink, rebuild_views, start_views_query
from tests.support.cluster import Client, Cluster
from tests.support.fuzz import FuzzTarget, json_values
from tests.support.homeserver import Homeserver, RunningServer, User
from tests.support.js_sdk import run_script
from tests.support.sharding import rooms_by_owner
from tests.support.wait import wait_for

AVATAR = "mxc://test.local/avatar"


def _profile(user: User | str) -> str:
    return "/profile/" + quote(user if isinstance(user, str) else user.user_id, safe="")


async def _member(hs: Homeserver, room_id: str, user: User, viewer: User) -> dict[str, Any]:
    """The content of ``user``'s current membership event, as ``viewer`` reads it."""
    path = f"/rooms/{room_id}/state/m.room.member/{user.user_id}"
    result: dict[str, Any] = await hs.ok("GET", path, token=viewer.token)
    return result


async def _member_events(hs: Homeserver, room_id: str, user: User, viewer: User) -> list[Any]:
    """Every ``m.room.member`` event of ``user`` in the room, oldest first (contents)."""
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=1000", token=viewer.token)
    return [
        e["content"]
        for e in reversed(page["chunk"])
        if e["type"] == "m.room.member" and e["state_key"] == user.user_id
    ]


async def _create(hs: Homeserver, user: User, body: dict[str, Any] | None = None) -> str:
    return str((await hs.ok("POST", "/createRoom", body or {}, token=user.token))["room_id"])


async def _fanout_idle(hs: Homeserver) -> None:
    await wait_for(lambda: hs.process.profiles.fanout.pending == 0, 60, "the fan-outs to end")


# -- the endpoints ------------------------------------------------------------------------


async def test_profile_endpoints(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    # Registration names the user after the localpart (as Synapse); no token needed to read.
    assert await hs.ok("GET", _profile(alice)) == {"displayname": "alice"}
    assert await hs.ok("GET", _profile(alice) + "/displayname") == {"displayname": "alice"}
    assert await hs.ok("GET", _profile(alice) + "/avatar_url") == {"avatar_url": None}
    capabilities = (await hs.ok("GET", "/capabilities", token=alice.token))["capabilities"]
    assert (
        capabilities["m.set_displayname"] == capabilities["m.set_avatar_url"] == {"enabled": True}
    )

    put = {"displayname": "  Alice Liddell "}
    assert await hs.ok("PUT", _profile(alice) + "/displayname", put, token=alice.token) == {}
    put = {"avatar_url": AVATAR}
    assert await hs.ok("PUT", _profile(alice) + "/avatar_url", put, token=alice.token) == {}
    expected = {"displayname": "Alice Liddell", "avatar_url": AVATAR}
    assert await hs.ok("GET", _profile(alice), token=bob.token) == expected
    assert await hs.ok("GET", _profile(alice) + "/displayname") == {"displayname": "Alice Liddell"}
    assert await hs.ok("GET", _profile(alice) + "/avatar_url") == {"avatar_url": AVATAR}
    # The longest values accepted (Synapse's limits, in characters).
    longest = {"displayname": "é" * 256}
    await hs.ok("PUT", _profile(alice) + "/displayname", longest, token=alice.token)
    longest_url = {"avatar_url": "mxc://test.local/" + "a" * 983}
    await hs.ok("PUT", _profile(alice) + "/avatar_url", longest_url, token=alice.token)
    assert await hs.ok("GET", _profile(alice)) == {**longest, **longest_url}

    # "" and DELETE unset a field; with nothing set the whole profile is 404 (Synapse).
    await hs.ok("PUT", _profile(alice) + "/displayname", {"displayname": ""}, token=alice.token)
    assert await hs.ok("GET", _profile(alice)) == longest_url
    assert await hs.ok("GET", _profile(alice) + "/displayname") == {"displayname": None}
    await hs.ok("DELETE", _profile(alice) + "/avatar_url", token=alice.token)
    status, body = await hs.call("GET", _profile(alice))
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    assert await hs.ok("GET", _profile(alice) + "/avatar_url") == {"avatar_url": None}
    await hs.ok("PUT", _profile(alice) + "/displayname", {"displayname": "A"}, token=alice.token)
    await hs.ok("DELETE", _profile(alice) + "/displayname", token=alice.token)
    assert await hs.ok("GET", _profile(alice) + "/displayname") == {"displayname": None}
    await hs.ok("PUT", _profile(alice) + "/displayname", {"displayname": "A"}, token=alice.token)
    await _fanout_idle(hs)


async def test_profile_errors(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    name = _profile(alice) + "/displayname"
    avatar = _profile(alice) + "/avatar_url"
    # Unknown users: a local one, another server's (no federation), not a user ID.
    for path, expected in [
        (_profile("@nobody:test.local"), (404, "M_NOT_FOUND")),
        (_profile("@nobody:test.local") + "/displayname", (404, "M_NOT_FOUND")),
        (_profile("@nobody:test.local") + "/avatar_url", (404, "M_NOT_FOUND")),
        (_profile("@alice:elsewhere.example"), (404, "M_NOT_FOUND")),
        (_profile("@alice:elsewhere.example") + "/displayname", (404, "M_NOT_FOUND")),
        (_profile("alice"), (400, "M_INVALID_PARAM")),
        (_profile("@alice") + "/displayname", (400, "M_INVALID_PARAM")),
    ]:
        status, body = await hs.call("GET", path)
        assert (status, body["errcode"]) == expected, path
    # A token that is sent must be valid; changes need one.
    status, body = await hs.call("GET", _profile(alice), token="nope")
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    for method in ("PUT", "DELETE"):
        status, body = await hs.call(method, name, {"displayname": "x"})
        assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN"), method
    # Only one's own profile.
    for method, path, put in [
        ("PUT", name, {"displayname": "Mallory"}),
        ("PUT", avatar, {"avatar_url": AVATAR}),
        ("DELETE", name, None),
        ("DELETE", avatar, None),
        ("PUT", _profile("@nobody:test.local") + "/displayname", {"displayname": "x"}),
    ]:
        status, body = await hs.call(method, path, put, token=bob.token)
        assert (status, body["errcode"]) == (403, "M_FORBIDDEN"), (method, path)
    # Bad bodies.
    bad: list[tuple[str, Any, bytes | None, str]] = [
        (name, {"displayname": 5}, None, "M_BAD_JSON"),
        (name, {"displayname": True}, None, "M_BAD_JSON"),
        (name, {"displayname": ["a"]}, None, "M_BAD_JSON"),
        (name, {"displayname": {"a": "b"}}, None, "M_BAD_JSON"),
        (avatar, {"avatar_url": 1.5}, None, "M_BAD_JSON"),
        # Absent (or null) is not a value: Synapse answers 400 too, "" unsets.
        (name, {}, None, "M_MISSING_PARAM"),
        (name, {"displayname": None}, None, "M_MISSING_PARAM"),
        (name, {"avatar_url": AVATAR}, None, "M_MISSING_PARAM"),
        (avatar, {"avatar_url": None}, None, "M_MISSING_PARAM"),
        (name, {"displayname": "x" * 257}, None, "M_INVALID_PARAM"),
        (avatar, {"avatar_url": "mxc://t/" + "a" * 993}, None, "M_INVALID_PARAM"),
        (name, None, b"{not json", "M_NOT_JSON"),
        (name, None, b'["displayname"]', "M_BAD_JSON"),
        (avatar, None, b"", "M_MISSING_PARAM"),  # an empty body reads as {}
    ]
    for path, put, raw, code in bad:
        status, body = await hs.call("PUT", path, put, raw=raw, token=alice.token)
        assert (status, body["errcode"]) == (400, code), (path, put, raw)
    # Nothing refused was stored, and nothing was sent into rooms.
    assert await hs.ok("GET", _profile(alice)) == {"displayname": "alice"}
    assert hs.process.profiles.fanout.sent == 0


# -- membership events carry the profile --------------------------------------------------


async def test_new_member_events_carry_the_profile(homeserver: Homeserver) -> None:
    hs = homeserver
    alice, bob, carol, dave = [await hs.register(n) for n in ("alice", "bob", "carol", "dave")]
    await hs.ok("PUT", _profile(bob) + "/displayname", {"displayname": "Bob B"}, token=bob.token)
    await hs.ok("PUT", _profile(bob) + "/avatar_url", {"avatar_url": AVATAR}, token=bob.token)
    bob_profile = {"displayname": "Bob B", "avatar_url": AVATAR}

    room = await _create(hs, alice, {"invite": [bob.user_id]})
    # The creator's join and the invitee's invite (the invitee's profile, not the sender's).
    assert await _member(hs, room, alice, alice) == {"membership": "join", "displayname": "alice"}
    assert await _member(hs, room, bob, alice) == {"membership": "invite", **bob_profile}
    await hs.ok("POST", f"/rooms/{room}/join", {}, token=bob.token)
    assert await _member(hs, room, bob, alice) == {"membership": "join", **bob_profile}
    # /invite, and a join whose body names a display name (kept, as Synapse keeps it).
    await hs.ok("POST", f"/rooms/{room}/invite", {"user_id": carol.user_id}, token=alice.token)
    assert await _member(hs, room, carol, alice) == {"membership": "invite", "displayname": "carol"}
    await hs.ok("POST", f"/join/{room}", {"displayname": "Just C"}, token=carol.token)
    assert await _member(hs, room, carol, alice) == {"membership": "join", "displayname": "Just C"}
    # PUT /state of one's own join carries it too.
    path = f"/rooms/{room}/state/m.room.member/{carol.user_id}"
    await hs.ok("PUT", path, {"membership": "join", "avatar_url": None}, token=carol.token)
    assert await _member(hs, room, carol, alice) == {
        "membership": "join",
        "avatar_url": None,
        "displayname": "carol",
    }
    # /joined_members shows the names.
    joined = (await hs.ok("GET", f"/rooms/{room}/joined_members", token=alice.token))["joined"]
    assert joined[bob.user_id] == {"display_name": "Bob B", "avatar_url": AVATAR}
    # Leaving, kicks and bans carry nothing.
    await hs.ok("POST", f"/rooms/{room}/leave", {}, token=bob.token)
    assert await _member(hs, room, bob, alice) == {"membership": "leave"}
    await hs.ok("POST", f"/rooms/{room}/ban", {"user_id": carol.user_id}, token=alice.token)
    assert await _member(hs, room, carol, alice) == {"membership": "ban"}
    # A knock carries the knocker's profile.
    rules = {"join_rule": "knock"}
    await hs.ok("PUT", f"/rooms/{room}/state/m.room.join_rules/", rules, token=alice.token)
    await hs.ok("POST", f"/knock/{room}", {"reason": "hi"}, token=dave.token)
    assert await _member(hs, room, dave, alice) == {
        "membership": "knock",
        "reason": "hi",
        "displayname": "dave",
    }


# -- a change fanned out ------------------------------------------------------------------


async def test_a_change_is_sent_into_every_joined_room_and_only_those(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    joined = [await _create(hs, bob, {"preset": "public_chat"}) for _ in range(4)]
    for room in joined:
        await hs.ok("POST", f"/join/{room}", {}, token=alice.token)
    invited = await _create(hs, bob, {"invite": [alice.user_id]})
    left = await _create(hs, bob, {"preset": "public_chat"})
    await hs.ok("POST", f"/join/{left}", {}, token=alice.token)
    await hs.ok("POST", f"/rooms/{left}/leave", {}, token=alice.token)
    since = (await hs.ok("GET", "/sync?timeout=0", token=bob.token))["next_batch"]

    name = {"displayname": "Alice Liddell"}
    assert await hs.ok("PUT", _profile(alice) + "/displayname", name, token=alice.token) == {}

    async def everywhere() -> bool:
        contents = [await _member(hs, room, alice, bob) for room in joined]
        return all(c.get("displayname") == "Alice Liddell" for c in contents)

    await wait_for(everywhere, 60, "the new name in every joined room")
    await _fanout_idle(hs)
    for room in joined:
        assert await _member_events(hs, room, alice, bob) == [
            {"membership": "join", "displayname": "alice"},
            {"membership": "join", "displayname": "Alice Liddell"},
        ]
    # Not the room alice is only invited to, nor the one she left (not joined again).
    assert await _member(hs, invited, alice, bob) == {
        "membership": "invite",
        "displayname": "alice",
    }
    assert await _member(hs, left, alice, bob) == {"membership": "leave"}
    listed = (await hs.ok("GET", "/joined_rooms", token=alice.token))["joined_rooms"]
    assert sorted(listed) == sorted(joined)
    # Bob's sync brings the new member events.
    synced = await hs.ok("GET", f"/sync?timeout=0&since={since}", token=bob.token)
    for room in joined:
        events = synced["rooms"]["join"][room]["timeline"]["events"]
        assert [(e["type"], e["content"].get("displayname")) for e in events] == [
            ("m.room.member", "Alice Liddell")
        ]

    # The same name again sends nothing; an avatar then a name, quickly: each room ends
    # with both, whichever order the fan-outs ran in.
    await hs.ok("PUT", _profile(alice) + "/displayname", name, token=alice.token)
    await _fanout_idle(hs)
    for room in joined:
        assert len(await _member_events(hs, room, alice, bob)) == 2
    avatar = {"avatar_url": AVATAR}
    await hs.ok("PUT", _profile(alice) + "/avatar_url", avatar, token=alice.token)
    await hs.ok("PUT", _profile(alice) + "/displayname", {"displayname": "A"}, token=alice.token)
    await _fanout_idle(hs)
    for room in joined:
        events = await _member_events(hs, room, alice, bob)
        assert events[-1] == {"membership": "join", "displayname": "A", "avatar_url": AVATAR}
        assert 3 <= len(events) <= 4
    # Clearing both: the member events carry neither.
    await hs.ok("DELETE", _profile(alice) + "/displayname", token=alice.token)
    await hs.ok("DELETE", _profile(alice) + "/avatar_url", token=alice.token)
    await _fanout_idle(hs)
    for room in joined:
        assert await _member(hs, room, alice, bob) == {"membership": "join"}
    assert hs.process.profiles.fanout.failed == 0


async def test_the_fan_out_goes_on_past_a_room_that_fails(
    homeserver: Homeserver, caplog: pytest.LogCaptureFixture
) -> None:
    """A room whose event cannot be made (its writer unreachable, say) is logged and
    skipped; the other rooms still get the change."""
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    rooms = [await _create(hs, bob, {"preset": "public_chat"}) for _ in range(3)]
    for room in rooms:
        await hs.ok("POST", f"/join/{room}", {}, token=alice.token)
    fanout = hs.process.profiles.fanout
    # The first room refuses the join: the writer raises (as a room's writer that cannot
    # be reached would, or the auth rules).
    writer = fanout.writer
    real_send = writer.send

    async def send(room_id: str, *args: Any, **kwargs: Any) -> str:
        if room_id == rooms[0]:
            raise RuntimeError("writer unreachable")
        return await real_send(room_id, *args, **kwargs)

    writer.send = send  # type: ignore[method-assign]
    try:
        name = {"displayname": "Alice"}
        await hs.ok("PUT", _profile(alice) + "/displayname", name, token=alice.token)
        await _fanout_idle(hs)
    finally:
        writer.send = real_send  # type: ignore[method-assign]
    assert (fanout.sent, fanout.failed) == (2, 1)
    assert f"profile change of {alice.user_id} not sent to {rooms[0]}" in caplog.text
    assert (await _member(hs, rooms[0], alice, bob)).get("displayname") == "alice"
    for room in rooms[1:]:
        assert (await _member(hs, room, alice, bob)).get("displayname") == "Alice"


async def test_fan_out_across_processes(cluster: Cluster) -> None:
    """A change made on the reader reaches rooms of both events writers: each room's join
    event is forwarded to its writer like any send."""
    processes, raw = cluster
    config = parse_config(raw)
    reader = f"http://127.0.0.1:{raw['instances']['reader']['http_port']}"

    async with aiohttp.ClientSession() as session:

        async def register(name: str) -> Client:
            body = {"username": name, "password": "pw", "auth": {"type": "m.login.dummy"}}
            async with session.post(
                reader + "/_matrix/client/v3/register", data=orjson.dumps(body)
            ) as resp:
                result = orjson.loads(await resp.read())
            return Client(session, reader, result["user_id"], result["access_token"])

        alice, bob = await register("alice"), await register("bob")

        async def create(_: int) -> str:
            created = await bob.ok("POST", "/createRoom", {"preset": "public_chat"})
            return str(created["room_id"])

        owned = await rooms_by_owner(create, config.writers_of("events"), per_writer=2)
        rooms = [room for by_writer in owned.values() for room in by_writer]
        for room in rooms:
            await alice.ok("POST", f"/join/{room}")
        await alice.ok("PUT", f"/profile/{alice.user_id}/displayname", {"displayname": "Al"})

        async def everywhere() -> bool:
            for room in rooms:
                path = f"/rooms/{room}/state/m.room.member/{alice.user_id}"
                status, content = await bob.call("GET", path)
                if status != 200 or content.get("displayname") != "Al":
                    return False
            return True

        await wait_for(everywhere, 60, "the new name in the rooms of both writers")
        # Read on a writer too: the events were made there.
        w2 = bob.on(f"http://127.0.0.1:{raw['instances']['w2']['http_port']}")
        for room in owned["w2"]:
            path = f"/rooms/{room}/state/m.room.member/{alice.user_id}"
            assert await w2.ok("GET", path) == {"membership": "join", "displayname": "Al"}
    assert not any(p.errors() for p in processes.values())


# -- the user directory -------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Any:
    session = spark_session("local[2]", app_name="roomstream-profile-tests")
    try:
        yield session
    finally:
        session.stop()


def _stream_views(spark: SparkSession, hs: Homeserver, offset: dict[str, int]) -> None:
    """The streaming views job from ``offset`` over what is there now, then stop."""
    config = hs.config.database
    sink = ViewsSink(config, sink_name="profiles-test")
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
async def test_user_directory_shows_profile_changes(
    homeserver: Homeserver, spark: SparkSession
) -> None:
    """The views take display names from member events: the registration's name first,
    then the fan-out's join events carry a change into the directory."""
    hs = homeserver
    alice, bob = await hs.register("alice"), await hs.register("bob")
    room = await _create(hs, alice, {"preset": "public_chat"})
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    await hs.engine.streams.generator("events").flush()
    rebuilt = await asyncio.to_thread(rebuild_views, spark, hs.config.database)

    async def search(term: str) -> list[dict[str, Any]]:
        found = await hs.engine.db.run_interaction(
            "search_users", search_users_txn, alice.user_id, term, 10
        )
        return list(found.results)

    assert await search("bob") == [{"user_id": bob.user_id, "display_name": "bob"}]
    await hs.ok(
        "PUT", _profile(bob) + "/displayname", {"displayname": "Robert Tables"}, token=bob.token
    )
    await hs.ok("PUT", _profile(bob) + "/avatar_url", {"avatar_url": AVATAR}, token=bob.token)
    await _fanout_idle(hs)
    assert (await _member(hs, room, bob, alice)).get("avatar_url") == AVATAR
    await hs.engine.streams.generator("events").flush()
    await asyncio.to_thread(_stream_views, spark, hs, rebuilt.offset)
    expected = {"user_id": bob.user_id, "display_name": "Robert Tables", "avatar_url": AVATAR}
    assert await search("tables") == [expected]
    body = await hs.ok(
        "POST", "/user_directory/search", {"search_term": "robert"}, token=alice.token
    )
    assert body == {"results": [expected], "limited": False}


# -- matrix-js-sdk ------------------------------------------------------------------------


async def test_matrix_js_sdk_shows_profiles(running_server: RunningServer) -> None:
    report = await run_script("profiles.mjs", running_server.url)
    assert report["before"] == {"name": "alice"}
    assert report["after"] == {"name": "Alice Liddell", "avatar": "mxc://wonderland.example/alice"}
    assert report["invited"] == {"name": "Carol Queen"}
    assert report["profile"] == {
        "displayname": "Alice Liddell",
        "avatar_url": "mxc://wonderland.example/alice",
    }
    assert report["bob_own_name"] == "bob"
    # The room's member events as bob's client holds them: the two changes, in order.
    assert report["alice_member_events"][-2:] == [
        {"membership": "join", "displayname": "Alice Liddell", "avatar_url": None},
        {
            "membership": "join",
            "displayname": "Alice Liddell",
            "avatar_url": "mxc://wonderland.example/alice",
        },
    ]


# -- fuzz ---------------------------------------------------------------------------------


def _request(target: FuzzTarget, method: str, path: str, body: bytes | None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {target.token}", "Content-Type": "application/json"}
        conn.request(method, "/_matrix/client/v3" + path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, orjson.loads(resp.read())
    finally:
        conn.close()


values = st.one_of(json_values, st.text(max_size=300), st.text(min_size=990, max_size=1010))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["displayname", "avatar_url"]),
    key=st.sampled_from(["displayname", "avatar_url", "x"]),
    value=values,
)
def test_fuzzed_profile_changes(target: FuzzTarget, field: str, key: str, value: Any) -> None:
    """Any body: a Matrix 400 or a change that reads back as stored; never a 5xx."""
    path = _profile(target.user_id) + "/" + field
    status, body = _request(target, "PUT", path, orjson.dumps({key: value}))
    limit = 256 if field == "displayname" else 1000
    valid = key == field and isinstance(value, str) and len(value) <= limit and "\x00" not in value
    if not valid:
        assert status == 400 and body["errcode"] in (
            "M_BAD_JSON",
            "M_MISSING_PARAM",
            "M_INVALID_PARAM",
        ), (status, body)
        return
    assert (status, body) == (200, {})
    stored = value.strip() if field == "displayname" else value
    assert _request(target, "GET", path, None) == (200, {field: stored or None})


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=st.text(max_size=40), suffix=st.sampled_from(["", "/displayname", "/avatar_url"]))
def test_fuzzed_profile_reads(target: FuzzTarget, user: str, suffix: str) -> None:
    status, body = _request(target, "GET", _profile(user) + suffix, None)
    assert status in (200, 400, 404), (user, status, body)
    if status != 200:
        assert body["errcode"] in ("M_INVALID_PARAM", "M_NOT_FOUND", "M_UNRECOGNIZED"), body
