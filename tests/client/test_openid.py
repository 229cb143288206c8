"""OpenID: ``POST /user/{userId}/openid/request_token`` and the userinfo endpoint a third
party checks the token with (``GET /_matrix/federation/v1/openid/userinfo``, served on the
client listener for now)."""

from __future__ import annotations

from roomstream.accounts.tokens import token_hash
from tests.support.homeserver import SERVER_NAME, Homeserver

USERINFO = "/_matrix/federation/v1/openid/userinfo"


async def test_a_token_names_its_user_until_it_expires(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    for version in ("r0", "v3"):
        issued = await hs.ok(
            "POST",
            f"/_matrix/client/{version}/user/{alice.user_id}/openid/request_token",
            {},
            token=alice.token,
        )
        assert issued["token_type"] == "Bearer"
        assert issued["matrix_server_name"] == SERVER_NAME
        assert issued["expires_in"] == 3600
        token = issued["access_token"]
        assert await hs.ok("GET", f"{USERINFO}?access_token={token}") == {"sub": alice.user_id}
    # Stored only as its hash.
    rows = await hs.engine.db.run_interaction(
        "test_query", lambda t: t.query("SELECT token_hash, user_id FROM openid_tokens")
    )
    assert (token_hash(token), alice.user_id) in {(r[0], r[1]) for r in rows}
    assert all(token not in r[0] for r in rows)
    # It is not an access token, and an access token is not an OpenID token.
    status, body = await hs.call("GET", "/account/whoami", token=token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    status, body = await hs.call("GET", f"{USERINFO}?access_token={alice.token}")
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    # An hour later it names no one.
    openid = hs.process.openid
    now = openid.clock()
    openid.clock = lambda: now + 3600
    status, body = await hs.call("GET", f"{USERINFO}?access_token={token}")
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    openid.clock = lambda: now + 3599
    assert await hs.ok("GET", f"{USERINFO}?access_token={token}") == {"sub": alice.user_id}
    # Issuing after expiry drops the expired rows.
    openid.clock = lambda: now + 7200
    await hs.ok("POST", f"/user/{alice.user_id}/openid/request_token", {}, token=alice.token)
    count = await hs.engine.db.run_interaction(
        "test_query", lambda t: t.query_one("SELECT COUNT(*) FROM openid_tokens")
    )
    assert count is not None and int(count[0]) == 1


async def test_refusals_and_bad_input(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    path = f"/user/{alice.user_id}/openid/request_token"
    status, body = await hs.call("POST", path, {}, token=bob.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await hs.call("POST", path, {})
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    status, body = await hs.call("POST", path, raw=b"{", token=alice.token)
    assert (status, body["errcode"]) == (400, "M_NOT_JSON")
    status, body = await hs.call("GET", USERINFO)
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    for token in ("nope", "x" * 5000):
        status, body = await hs.call("GET", f"{USERINFO}?access_token={token}")
        assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
