"""``POST /keys/upload``, ``/keys/query``, ``/keys/claim`` and ``GET /keys/changes``
through the API, on both engines."""

from __future__ import annotations

from tests.support.e2e_keys import Device
from tests.support.homeserver import Homeserver, User


def device_of(user: User) -> Device:
    return Device(user.user_id, user.device_id)


async def test_upload_then_query_shows_signed_keys_with_display_name(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await hs.ok(
        "PUT", f"/devices/{alice.device_id}", {"display_name": "Alice's laptop"}, token=alice.token
    )
    dev = device_of(alice)
    keys = dev.device_keys()
    answer = await hs.ok(
        "POST",
        "/keys/upload",
        {"device_keys": keys, "one_time_keys": dev.one_time_keys(["a", "b"])},
        token=alice.token,
    )
    assert answer["one_time_key_counts"] == {"signed_curve25519": 2}
    # Identical keys again: fine, counts unchanged.
    again = await hs.ok("POST", "/keys/upload", {"device_keys": keys}, token=alice.token)
    assert again["one_time_key_counts"] == {"signed_curve25519": 2}
    result = await hs.ok(
        "POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token
    )
    got = result["device_keys"][alice.user_id][alice.device_id]
    assert got["keys"] == keys["keys"]
    assert got["signatures"] == keys["signatures"]
    assert got["unsigned"] == {"device_display_name": "Alice's laptop"}
    assert result["failures"] == {}
    # Asking for a named device only; an unknown device or user gives nothing.
    result = await hs.ok(
        "POST",
        "/keys/query",
        {"device_keys": {alice.user_id: ["NOPE"], "@nobody:test.local": []}},
        token=bob.token,
    )
    assert result["device_keys"] == {alice.user_id: {}, "@nobody:test.local": {}}


async def test_upload_refusals(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    dev = device_of(alice)
    # Unsigned / wrongly signed / another device's keys.
    unsigned = dev.device_keys()
    del unsigned["signatures"]
    forged = dev.device_keys()
    forged["keys"][f"curve25519:{alice.device_id}"] = "other"  # signature no longer matches
    other = Device(alice.user_id, "OTHER").device_keys()
    for bad in (unsigned, forged, other, "x", {"user_id": alice.user_id}):
        status, body = await hs.call(
            "POST", "/keys/upload", {"device_keys": bad}, token=alice.token
        )
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), bad
    await hs.ok("POST", "/keys/upload", {"device_keys": dev.device_keys()}, token=alice.token)
    # Different keys for a device that has keys: refused, the first ones stay.
    status, body = await hs.call(
        "POST", "/keys/upload", {"device_keys": dev.device_keys("new-curve")}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    # One-time keys: bad names, and a key ID reused with another key.
    for bad_otks in ({"nocolon": {"key": "k"}}, {"a:b": 5}, []):
        status, body = await hs.call(
            "POST", "/keys/upload", {"one_time_keys": bad_otks}, token=alice.token
        )
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), bad_otks
    await hs.ok("POST", "/keys/upload", {"one_time_keys": {"c:1": "k1"}}, token=alice.token)
    await hs.ok("POST", "/keys/upload", {"one_time_keys": {"c:1": "k1"}}, token=alice.token)
    status, body = await hs.call(
        "POST", "/keys/upload", {"one_time_keys": {"c:1": "k2"}}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    status, body = await hs.call("POST", "/keys/upload", {})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    for bad_query in (
        {},
        {"device_keys": []},
        {"device_keys": {"alice": []}},
        {"device_keys": {alice.user_id: "x"}},
    ):
        status, body = await hs.call("POST", "/keys/query", bad_query, token=alice.token)
        assert status == 400 and body["errcode"] in (
            "M_MISSING_PARAM",
            "M_BAD_JSON",
            "M_INVALID_PARAM",
        ), bad_query
    for bad_claim in ({}, {"one_time_keys": {alice.user_id: {"D": 1}}}):
        status, body = await hs.call("POST", "/keys/claim", bad_claim, token=alice.token)
        assert status == 400 and body["errcode"] in ("M_MISSING_PARAM", "M_INVALID_PARAM")


async def test_claim_hands_each_key_out_once_then_the_fallback(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    dev = device_of(alice)
    otks = dev.one_time_keys(["AAA", "BBB"])
    fallback = {"signed_curve25519:FB": {"key": "fallback", "fallback": True}}
    await hs.ok(
        "POST",
        "/keys/upload",
        {"device_keys": dev.device_keys(), "one_time_keys": otks, "fallback_keys": fallback},
        token=alice.token,
    )
    ask = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}
    seen = []
    for _ in range(2):
        claimed = await hs.ok("POST", "/keys/claim", ask, token=bob.token)
        ((name, key),) = claimed["one_time_keys"][alice.user_id][alice.device_id].items()
        assert otks[name] == key
        seen.append(name)
    assert sorted(seen) == sorted(otks)
    counts = await hs.process.keys.one_time_key_counts(alice.user_id, alice.device_id)
    assert counts == {"signed_curve25519": 0}
    assert await hs.process.keys.unused_fallback_key_types(alice.user_id, alice.device_id) == [
        "signed_curve25519"
    ]
    for _ in range(2):  # the fallback key, again and again, now marked used
        claimed = await hs.ok("POST", "/keys/claim", ask, token=bob.token)
        assert claimed["one_time_keys"][alice.user_id][alice.device_id] == fallback
    assert await hs.process.keys.unused_fallback_key_types(alice.user_id, alice.device_id) == []
    # A new fallback key is unused again; re-uploading the same used one keeps it used.
    await hs.ok("POST", "/keys/upload", {"fallback_keys": fallback}, token=alice.token)
    assert await hs.process.keys.unused_fallback_key_types(alice.user_id, alice.device_id) == []
    new_fallback = {"signed_curve25519:FB2": {"key": "fallback2", "fallback": True}}
    await hs.ok("POST", "/keys/upload", {"fallback_keys": new_fallback}, token=alice.token)
    assert await hs.process.keys.unused_fallback_key_types(alice.user_id, alice.device_id) == [
        "signed_curve25519"
    ]
    # Nothing for an unknown device or algorithm.
    nothing = await hs.ok(
        "POST",
        "/keys/claim",
        {"one_time_keys": {alice.user_id: {"NOPE": "signed_curve25519", alice.device_id: "x"}}},
        token=bob.token,
    )
    assert nothing == {"one_time_keys": {}, "failures": {}}


async def test_changes_lists_users_sharing_a_room(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    room = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    await hs.ok("POST", f"/rooms/{room}/invite", {"user_id": bob.user_id}, token=alice.token)
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    start = hs.process.keys.position()
    for user in (bob, carol):
        await hs.ok(
            "POST", "/keys/upload", {"device_keys": device_of(user).device_keys()}, token=user.token
        )
    end = hs.process.keys.position()
    assert end > start
    changes = await hs.ok(
        "GET", f"/keys/changes?from=s1_0_0_0_0_{start}&to=s1_0_0_0_0_{end}", token=alice.token
    )
    # carol shares no room with alice: not listed.
    assert changes == {"changed": [bob.user_id], "left": []}
    # Nothing changed between end and end.
    changes = await hs.ok(
        "GET", f"/keys/changes?from=s1_0_0_0_0_{end}&to=s1_0_0_0_0_{end}", token=alice.token
    )
    assert changes == {"changed": [], "left": []}
    status, body = await hs.call("GET", "/keys/changes?to=s1_0_0_0_0_1", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_MISSING_PARAM")
    status, body = await hs.call(
        "GET", "/keys/changes?from=s1_0_0_0_0_z&to=s1_0_0_0_0_1", token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")
    # A token from before the stream's part: from the beginning, up to now.
    changes = await hs.ok("GET", "/keys/changes?from=s1_0_0_0_0&to=s1_0_0_0_0", token=alice.token)
    assert changes == {"changed": [bob.user_id], "left": []}
    # Bob leaves: with the events range, he is in `left` for alice.
    ordering_before = await _max_ordering(hs)
    await hs.ok("POST", f"/rooms/{room}/leave", {}, token=bob.token)
    ordering_after = await _max_ordering(hs)
    changed, left = await hs.process.keys.changed_since(
        alice.user_id, end, end, (ordering_before, ordering_after)
    )
    assert (changed, left) == (set(), {bob.user_id})


async def _max_ordering(hs: Homeserver) -> int:
    row = await hs.engine.db.run_interaction(
        "test_query", lambda t: t.query_one("SELECT MAX(stream_ordering) FROM events")
    )
    return int(row[0])


async def test_changes_between_sync_tokens_list_who_came_and_who_left(
    homeserver: Homeserver,
) -> None:
    """``/keys/changes`` reads membership moves between the tokens' events parts, as
    /sync does: a user who came to share a room is changed, one who shares none is left."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    carol = await hs.register("carol")
    public = {"preset": "public_chat"}
    room = (await hs.ok("POST", "/createRoom", public, token=alice.token))["room_id"]
    await hs.ok("POST", f"/join/{room}", {}, token=bob.token)
    before = (await hs.ok("GET", "/sync", token=alice.token))["next_batch"]
    await hs.ok("POST", f"/rooms/{room}/leave", {}, token=bob.token)
    await hs.ok("POST", f"/join/{room}", {}, token=carol.token)
    after = (await hs.ok("GET", f"/sync?since={before}&timeout=0", token=alice.token))["next_batch"]
    changes = await hs.ok("GET", f"/keys/changes?from={before}&to={after}", token=alice.token)
    assert changes == {"changed": [carol.user_id], "left": [bob.user_id]}
    nothing = await hs.ok("GET", f"/keys/changes?from={after}&to={after}", token=alice.token)
    assert nothing == {"changed": [], "left": []}
