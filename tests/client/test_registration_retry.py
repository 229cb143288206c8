"""A registration retried through its completed user-interactive-auth session (the
client lost the first answer) is answered with that registration's user again, logged
in afresh, as Synapse does, not ``M_USER_IN_USE``. Only with the account's password; a
session that registered nobody, or another session, still meets the taken name."""

from __future__ import annotations

from typing import Any

from tests.support.homeserver import Homeserver


async def _uia_session(homeserver: Homeserver, body: dict[str, Any]) -> str:
    status, answer = await homeserver.call("POST", "/register", body)
    assert status == 401, answer
    session: str = answer["session"]
    return session


async def test_retry_through_the_same_session_answers_the_first_registration(
    homeserver: Homeserver,
) -> None:
    body: dict[str, Any] = {"username": "alice", "password": "pw-alice"}
    session = await _uia_session(homeserver, body)
    body["auth"] = {"type": "m.login.dummy", "session": session}
    first = await homeserver.ok("POST", "/register", body)
    again = await homeserver.ok("POST", "/register", body)
    assert again["user_id"] == first["user_id"] == f"@alice:{homeserver.config.server_name}"
    assert again["access_token"] != first["access_token"]
    assert again["device_id"] != first["device_id"]
    for answer in (first, again):  # both logins are live
        me = await homeserver.ok("GET", "/account/whoami", token=answer["access_token"])
        assert (me["user_id"], me["device_id"]) == (answer["user_id"], answer["device_id"])
    # A retry naming its device and inhibiting login: the same user, no token.
    quiet = await homeserver.ok("POST", "/register", {**body, "inhibit_login": True})
    assert quiet["user_id"] == first["user_id"] and "access_token" not in quiet
    # A retry without the account's password is refused (it would be a free login).
    for password in ("wrong", None):
        retry = {k: v for k, v in body.items() if k != "password"}
        if password is not None:
            retry["password"] = password
        status, answer = await homeserver.call("POST", "/register", retry)
        assert (status, answer["errcode"]) == (403, "M_FORBIDDEN"), answer
    # Another session, or none, meets the taken name.
    other = await _uia_session(homeserver, {"username": "alice2", "password": "x"})
    for auth in ({"type": "m.login.dummy", "session": other}, {"type": "m.login.dummy"}):
        status, answer = await homeserver.call("POST", "/register", {**body, "auth": auth})
        assert (status, answer["errcode"]) == (400, "M_USER_IN_USE"), answer


async def test_retry_of_a_registration_without_username_keeps_the_generated_user(
    homeserver: Homeserver,
) -> None:
    body: dict[str, Any] = {"password": "pw", "auth": {"type": "m.login.dummy", "session": "s1"}}
    first = await homeserver.ok("POST", "/register", body)
    again = await homeserver.ok("POST", "/register", body)
    assert again["user_id"] == first["user_id"]
    # A new session makes a new user.
    other = await homeserver.ok(
        "POST", "/register", {**body, "auth": {"type": "m.login.dummy", "session": "s2"}}
    )
    assert other["user_id"] != first["user_id"]
