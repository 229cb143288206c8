"""Registration, login, logout, whoami, and how tokens and passwords are stored."""

from __future__ import annotations

import hashlib

from roomstream.accounts import Accounts, AccountStore
from roomstream.errors import MatrixError
from roomstream.storage import Database
from tests.support.homeserver import SERVER_NAME, Homeserver


async def test_register_needs_the_dummy_stage_then_logs_in(homeserver: Homeserver) -> None:
    status, body = await homeserver.call(
        "POST", "/register", {"username": "alice", "password": "pw"}
    )
    assert status == 401
    assert body["flows"] == [{"stages": ["m.login.dummy"]}]
    assert isinstance(body["session"], str) and body["session"]
    done = await homeserver.ok(
        "POST",
        "/register",
        {
            "username": "Alice",
            "password": "pw",
            "auth": {"type": "m.login.dummy", "session": body["session"]},
        },
    )
    assert done["user_id"] == f"@alice:{SERVER_NAME}"
    whoami = await homeserver.ok("GET", "/account/whoami", token=done["access_token"])
    assert whoami == {
        "user_id": "@alice:test.local",
        "device_id": done["device_id"],
        "is_guest": False,
    }


async def test_taken_and_invalid_user_names(homeserver: Homeserver) -> None:
    await homeserver.register("bob")
    status, body = await homeserver.call(
        "POST", "/register", {"username": "bob", "password": "x", "auth": {"type": "m.login.dummy"}}
    )
    assert (status, body["errcode"]) == (400, "M_USER_IN_USE")
    status, body = await homeserver.call("POST", "/register", {"username": "b@d name"})
    assert (status, body["errcode"]) == (400, "M_INVALID_USERNAME")
    status, body = await homeserver.call("GET", "/register/available?username=bob")
    assert (status, body["errcode"]) == (400, "M_USER_IN_USE")
    assert await homeserver.ok("GET", "/register/available?username=carol") == {"available": True}


async def test_login_logout_and_tokens(homeserver: Homeserver) -> None:
    await homeserver.register("dave", "correct horse")
    assert await homeserver.ok("GET", "/login") == {"flows": [{"type": "m.login.password"}]}
    wrong = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": "dave"},
        "password": "nope",
    }
    status, body = await homeserver.call("POST", "/login", wrong)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    good = dict(wrong, password="correct horse", device_id="PHONE")
    first = await homeserver.ok("POST", "/login", good)
    assert first["device_id"] == "PHONE" and first["user_id"] == "@dave:test.local"
    second = await homeserver.ok(
        "POST",
        "/login",
        {"type": "m.login.password", "user": "@dave:test.local", "password": "correct horse"},
    )
    assert second["device_id"] != "PHONE"
    await homeserver.ok("POST", "/logout", {}, token=first["access_token"])
    status, body = await homeserver.call("GET", "/account/whoami", token=first["access_token"])
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    await homeserver.ok("GET", "/account/whoami", token=second["access_token"])
    await homeserver.ok("POST", "/logout/all", {}, token=second["access_token"])
    status, body = await homeserver.call("GET", "/account/whoami", token=second["access_token"])
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    status, body = await homeserver.call("GET", "/account/whoami")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")


async def test_only_hashes_are_stored(homeserver: Homeserver) -> None:
    user = await homeserver.register("erin", "hunter2")
    rows = await homeserver.engine.db.run_interaction(
        "test_query", lambda t: t.query("SELECT token_hash FROM access_tokens")
    )
    assert [r[0] for r in rows] == [hashlib.sha256(user.token.encode()).hexdigest()]
    (stored,) = await homeserver.engine.db.run_interaction(
        "test_query",
        lambda t: t.query_one("SELECT password_hash FROM users WHERE user_id = ?", (user.user_id,)),
    )
    assert stored.startswith("$argon2id$") and "hunter2" not in stored


async def test_closed_registration(database: Database) -> None:
    accounts = Accounts(AccountStore(database), SERVER_NAME, registration_enabled=False)
    try:
        await accounts.register("x", "pw", auth={"type": "m.login.dummy"})
    except MatrixError as exc:
        assert (exc.http_status, exc.errcode) == (403, "M_FORBIDDEN")
    else:
        raise AssertionError("registration should be closed")
    created = await accounts.create_account("x", "pw", admin=True)
    assert created.user_id == "@x:test.local" and created.access_token is None


async def test_versions_unknown_endpoints_and_cors(homeserver: Homeserver) -> None:
    versions = await homeserver.ok("GET", "/_matrix/client/versions")
    assert "v1.1" in versions["versions"]
    status, body = await homeserver.call("GET", "/no/such/endpoint")
    assert (status, body["errcode"]) == (404, "M_UNRECOGNIZED")
    status, body = await homeserver.call("DELETE", "/login")
    assert (status, body["errcode"]) == (405, "M_UNRECOGNIZED")
    status, body = await homeserver.call("POST", "/login", raw=b"{not json")
    assert (status, body["errcode"]) == (400, "M_NOT_JSON")
    url = homeserver.server.make_url("/_matrix/client/v3/createRoom")
    async with homeserver.session.options(
        url, headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
        assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]
