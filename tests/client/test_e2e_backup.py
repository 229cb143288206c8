"""Server-side key backup through the API on both engines: versions, session keys with the
replacement rule, ``etag`` and ``count``, wrong versions; and the replacement rule against
a naive oracle."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from roomstream.e2e.backup_rule import SessionQuality, replaces
from tests.support.homeserver import Homeserver

AUTH = {"public_key": "pk", "signatures": {}}
ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"


def session(
    index: int, forwarded: int = 0, verified: bool = False, tag: str = ""
) -> dict[str, Any]:
    return {
        "first_message_index": index,
        "forwarded_count": forwarded,
        "is_verified": verified,
        "session_data": {"ciphertext": f"c{index}{forwarded}{verified}{tag}"},
    }


async def test_versions(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    status, body = await hs.call("GET", "/room_keys/version", token=alice.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    v1 = (
        await hs.ok(
            "POST",
            "/room_keys/version",
            {"algorithm": ALGORITHM, "auth_data": AUTH},
            token=alice.token,
        )
    )["version"]
    current = await hs.ok("GET", "/room_keys/version", token=alice.token)
    assert current == {
        "version": v1,
        "algorithm": ALGORITHM,
        "auth_data": AUTH,
        "etag": "0",
        "count": 0,
    }
    v2 = (
        await hs.ok(
            "POST",
            "/room_keys/version",
            {"algorithm": ALGORITHM, "auth_data": AUTH},
            token=alice.token,
        )
    )["version"]
    assert int(v2) > int(v1)
    assert (await hs.ok("GET", "/room_keys/version", token=alice.token))["version"] == v2
    assert (await hs.ok("GET", f"/room_keys/version/{v1}", token=alice.token))["version"] == v1
    # Bob sees none of alice's.
    status, _ = await hs.call("GET", f"/room_keys/version/{v1}", token=bob.token)
    assert status == 404
    # Update: auth_data changes; algorithm and version must match.
    new_auth = {"public_key": "pk2"}
    await hs.ok(
        "PUT",
        f"/room_keys/version/{v2}",
        {"algorithm": ALGORITHM, "auth_data": new_auth, "version": v2},
        token=alice.token,
    )
    assert (await hs.ok("GET", "/room_keys/version", token=alice.token))["auth_data"] == new_auth
    for bad in (
        {"algorithm": "other", "auth_data": {}},
        {"algorithm": ALGORITHM, "auth_data": {}, "version": v1},
    ):
        status, body = await hs.call("PUT", f"/room_keys/version/{v2}", bad, token=alice.token)
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), bad
    status, body = await hs.call(
        "POST", "/room_keys/version", {"algorithm": ALGORITHM}, token=alice.token
    )
    assert (status, body["errcode"]) == (400, "M_MISSING_PARAM")
    # Delete: the previous version becomes current; a deleted number is never reused.
    await hs.ok("DELETE", f"/room_keys/version/{v2}", token=alice.token)
    assert (await hs.ok("GET", "/room_keys/version", token=alice.token))["version"] == v1
    for path in (f"/room_keys/version/{v2}", "/room_keys/version/abc", "/room_keys/version/99"):
        status, body = await hs.call("GET", path, token=alice.token)
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND"), path
    status, _ = await hs.call("DELETE", f"/room_keys/version/{v2}", token=alice.token)
    assert status == 404
    v3 = (
        await hs.ok(
            "POST",
            "/room_keys/version",
            {"algorithm": ALGORITHM, "auth_data": AUTH},
            token=alice.token,
        )
    )["version"]
    assert int(v3) > int(v2)


async def test_keys_replacement_etag_count_and_wrong_version(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    old = (
        await hs.ok(
            "POST",
            "/room_keys/version",
            {"algorithm": ALGORITHM, "auth_data": AUTH},
            token=alice.token,
        )
    )["version"]
    v = (
        await hs.ok(
            "POST",
            "/room_keys/version",
            {"algorithm": ALGORITHM, "auth_data": AUTH},
            token=alice.token,
        )
    )["version"]
    room, other_room = "!r:test.local", "!o:test.local"
    first = await hs.ok(
        "PUT",
        f"/room_keys/keys?version={v}",
        {"rooms": {room: {"sessions": {"s1": session(5), "s2": session(3)}}}},
        token=alice.token,
    )
    assert first["count"] == 2
    # Worse (higher index) changes nothing, etag included.
    same = await hs.ok(
        "PUT", f"/room_keys/keys/{room}/s1?version={v}", session(6, tag="x"), token=alice.token
    )
    assert same == first
    # Better (lower index) replaces; then verified beats a lower index.
    better = await hs.ok(
        "PUT",
        f"/room_keys/keys/{room}?version={v}",
        {"sessions": {"s1": session(2)}},
        token=alice.token,
    )
    assert better["count"] == 2 and better["etag"] != first["etag"]
    await hs.ok(
        "PUT",
        f"/room_keys/keys/{room}/s1?version={v}",
        session(4, verified=True),
        token=alice.token,
    )
    await hs.ok(
        "PUT", f"/room_keys/keys/{room}/s1?version={v}", session(0, 0, False), token=alice.token
    )  # unverified never replaces verified
    got = await hs.ok("GET", f"/room_keys/keys/{room}/s1?version={v}", token=alice.token)
    assert got == session(4, verified=True)
    await hs.ok(
        "PUT", f"/room_keys/keys/{other_room}/s9?version={v}", session(1), token=alice.token
    )
    everything = await hs.ok("GET", f"/room_keys/keys?version={v}", token=alice.token)
    assert everything == {
        "rooms": {
            room: {"sessions": {"s1": session(4, verified=True), "s2": session(3)}},
            other_room: {"sessions": {"s9": session(1)}},
        }
    }
    assert await hs.ok("GET", f"/room_keys/keys/{other_room}?version={v}", token=alice.token) == {
        "sessions": {"s9": session(1)}
    }
    assert await hs.ok("GET", f"/room_keys/keys/!none:x?version={v}", token=alice.token) == {
        "sessions": {}
    }
    status, body = await hs.call(
        "GET", f"/room_keys/keys/{room}/nope?version={v}", token=alice.token
    )
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    info = await hs.ok("GET", "/room_keys/version", token=alice.token)
    assert info["count"] == 3
    # Writing to an old version: 403 with the current one.
    status, body = await hs.call(
        "PUT", f"/room_keys/keys/{room}/s1?version={old}", session(0), token=alice.token
    )
    assert (status, body["errcode"], body["current_version"]) == (
        403,
        "M_WRONG_ROOM_KEYS_VERSION",
        v,
    )
    for bad in (session(-1), {**session(1), "is_verified": "yes"}, {"session_data": {}}, "x"):
        status, body = await hs.call(
            "PUT", f"/room_keys/keys/{room}/s1?version={v}", bad, token=alice.token
        )
        assert (status, body["errcode"]) == (400, "M_BAD_JSON"), bad
    status, body = await hs.call("PUT", f"/room_keys/keys/{room}/s1", session(0), token=alice.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    # Deletes: one session, one room, everything; each changes the etag and the count.
    one = await hs.ok("DELETE", f"/room_keys/keys/{room}/s2?version={v}", token=alice.token)
    assert one["count"] == 2 and one["etag"] != info["etag"]
    rest = await hs.ok("DELETE", f"/room_keys/keys?version={v}", token=alice.token)
    assert rest["count"] == 0
    assert await hs.ok("GET", f"/room_keys/keys?version={v}", token=alice.token) == {"rooms": {}}


def naive_better(new: tuple[bool, int, int], old: tuple[bool, int, int] | None) -> bool:
    """The spec's words, one case at a time."""
    if old is None:
        return True
    if new[0] != old[0]:
        return new[0]  # verified beats unverified
    if new[1] != old[1]:
        return new[1] < old[1]
    return new[2] < old[2]


quality = st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 5))


@given(st.lists(quality, max_size=12))
def test_replacement_rule_matches_the_oracle(uploads: list[tuple[bool, int, int]]) -> None:
    stored: tuple[bool, int, int] | None = None
    for upload in uploads:
        expected = naive_better(upload, stored)
        old = None if stored is None else SessionQuality(*stored)
        assert replaces(SessionQuality(*upload), old) == expected
        if expected:
            stored = upload
