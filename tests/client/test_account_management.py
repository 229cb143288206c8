"""Account management through the API, on both engines: ``POST /account/password``,
``POST /account/deactivate``, the 3PID endpoints (unsupported, answered as Synapse
answers them unconfigured), ``/voip/turnServer``, ``/thirdparty/...`` and
``GET /capabilities``."""

from __future__ import annotations

from typing import Any

from tests.support.e2e_keys import PASSWORD, Device, password_auth
from tests.support.homeserver import Homeserver, User


async def login(hs: Homeserver, name: str, password: str = PASSWORD, **extra: Any) -> str:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": name},
        "password": password,
        **extra,
    }
    return str((await hs.ok("POST", "/login", body))["access_token"])


async def login_status(hs: Homeserver, name: str, password: str) -> tuple[int, Any]:
    body = {"type": "m.login.password", "user": name, "password": password}
    return await hs.call("POST", "/login", body)


async def whoami_status(hs: Homeserver, token: str) -> tuple[int, str | None]:
    status, body = await hs.call("GET", "/account/whoami", token=token)
    return status, body.get("errcode")


async def device_leftovers(hs: Homeserver, user_id: str, device_id: str) -> list[int]:
    """Rows the device still has: keys, one-time keys, to-device inbox, the device."""

    def count(t: Any) -> list[int]:
        return [
            int(
                t.query_one(
                    f"SELECT COUNT(*) FROM {table} WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )[0]
            )
            for table in ("e2e_device_keys", "e2e_one_time_keys", "device_inbox", "devices")
        ]

    return await hs.engine.db.run_interaction("device_leftovers", count)


async def phone_with_keys_and_mail(hs: Homeserver, owner: User, sender: User) -> str:
    """Log ``owner`` in on device PHONE with keys uploaded and a to-device message queued."""
    phone = await login(hs, owner.user_id, device_id="PHONE")
    device = Device(owner.user_id, "PHONE")
    await hs.ok(
        "POST",
        "/keys/upload",
        {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["1"])},
        token=phone,
    )
    await hs.ok(
        "PUT",
        f"/sendToDevice/m.test/{hs.txn()}",
        {"messages": {owner.user_id: {"PHONE": {"hello": 1}}}},
        token=sender.token,
    )
    assert await device_leftovers(hs, owner.user_id, "PHONE") == [1, 1, 1, 1]
    return phone


async def test_change_password_logs_out_the_other_devices(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    bob = await hs.register("bob")
    phone = await phone_with_keys_and_mail(hs, alice, bob)
    # A second token on the requesting device: Synapse ends it too.
    twin = await login(hs, "alice", device_id=alice.device_id)
    new = {"new_password": "a new password"}
    # User-interactive auth first: the flow, then a wrong password is 403.
    status, body = await hs.call("POST", "/account/password", new, token=alice.token)
    assert status == 401 and body["flows"] == [{"stages": ["m.login.password"]}]
    assert body["session"]
    wrong = {**new, "auth": password_auth(alice.user_id, "wrong")}
    status, body = await hs.call("POST", "/account/password", wrong, token=alice.token)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    # Auth given but no new password: 400, nothing changed.
    auth = {"auth": password_auth(alice.user_id, session=body.get("session", ""))}
    status, body = await hs.call("POST", "/account/password", auth, token=alice.token)
    assert (status, body["errcode"]) == (400, "M_MISSING_PARAM")
    assert (await login_status(hs, "alice", PASSWORD))[0] == 200
    await hs.ok("POST", "/account/password", {**new, **auth}, token=alice.token)
    # The requesting token stays; the other device and the device's other token end.
    assert await whoami_status(hs, alice.token) == (200, None)
    assert await whoami_status(hs, phone) == (401, "M_UNKNOWN_TOKEN")
    assert await whoami_status(hs, twin) == (401, "M_UNKNOWN_TOKEN")
    assert await device_leftovers(hs, alice.user_id, "PHONE") == [0, 0, 0, 0]
    devices = (await hs.ok("GET", "/devices", token=alice.token))["devices"]
    assert [d["device_id"] for d in devices] == [alice.device_id]
    keys = await hs.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token)
    assert keys["device_keys"][alice.user_id] == {}
    # Only the new password logs in now; the hash is argon2, as at registration.
    status, body = await login_status(hs, "alice", PASSWORD)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    assert (await login_status(hs, "alice", "a new password"))[0] == 200
    record = await hs.process.accounts.store.get_user(alice.user_id)
    assert record is not None and record.password_hash is not None
    assert record.password_hash.startswith("$argon2id$")


async def test_change_password_can_keep_the_devices(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    phone = await login(hs, "alice", device_id="PHONE")
    body = {
        "new_password": "another",
        "logout_devices": False,
        "auth": password_auth(alice.user_id),
    }
    await hs.ok("POST", "/account/password", body, token=phone)
    assert await whoami_status(hs, alice.token) == (200, None)
    assert await whoami_status(hs, phone) == (200, None)
    assert (await login_status(hs, "alice", "another"))[0] == 200


async def test_change_password_refuses_bad_input(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    auth = password_auth(alice.user_id)
    for body, errcode in [
        ({"new_password": 5, "auth": auth}, "M_BAD_JSON"),
        ({"new_password": "x", "logout_devices": "no", "auth": auth}, "M_BAD_JSON"),
        ({"new_password": "x", "auth": "password"}, "M_BAD_JSON"),
        ({"new_password": "", "auth": auth}, "M_INVALID_PARAM"),
        ({"new_password": "x" * 513, "auth": auth}, "M_INVALID_PARAM"),
    ]:
        status, answer = await hs.call("POST", "/account/password", body, token=alice.token)
        assert (status, answer["errcode"]) == (400, errcode), body
    status, answer = await hs.call("POST", "/account/password", raw=b"[1]", token=alice.token)
    assert (status, answer["errcode"]) == (400, "M_BAD_JSON")
    status, answer = await hs.call("POST", "/account/password", {"new_password": "x"})
    assert (status, answer["errcode"]) == (401, "M_MISSING_TOKEN")
    assert (await login_status(hs, "alice", PASSWORD))[0] == 200


async def test_deactivate_leaves_rooms_and_ends_everything(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    bob = await hs.register("bob")
    phone = await phone_with_keys_and_mail(hs, alice, bob)
    joined = (await hs.ok("POST", "/createRoom", {"preset": "public_chat"}, token=bob.token))[
        "room_id"
    ]
    await hs.ok("POST", f"/rooms/{joined}/join", {}, token=alice.token)
    invited = (await hs.ok("POST", "/createRoom", {"invite": [alice.user_id]}, token=bob.token))[
        "room_id"
    ]
    own = (await hs.ok("POST", "/createRoom", {}, token=alice.token))["room_id"]
    # User-interactive auth, as for deleting devices.
    status, body = await hs.call("POST", "/account/deactivate", {}, token=alice.token)
    assert status == 401 and body["flows"] == [{"stages": ["m.login.password"]}]
    status, body = await hs.call(
        "POST",
        "/account/deactivate",
        {"auth": password_auth(alice.user_id, "wrong")},
        token=alice.token,
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    assert await whoami_status(hs, alice.token) == (200, None)
    done = await hs.ok(
        "POST", "/account/deactivate", {"auth": password_auth(alice.user_id)}, token=alice.token
    )
    assert done == {"id_server_unbind_result": "no-support"}
    # Every token ends; login says the account is deactivated, whatever the password.
    for token in (alice.token, phone):
        assert await whoami_status(hs, token) == (401, "M_UNKNOWN_TOKEN")
    for password in (PASSWORD, "wrong"):
        status, body = await login_status(hs, "alice", password)
        assert (status, body["errcode"]) == (403, "M_USER_DEACTIVATED")
    assert await device_leftovers(hs, alice.user_id, alice.device_id) == [0, 0, 0, 0]
    assert await device_leftovers(hs, alice.user_id, "PHONE") == [0, 0, 0, 0]
    # Left every room: joined, invited (the invite rejected), its own.
    for room_id in (joined, invited):
        member = await hs.ok(
            "GET", f"/rooms/{room_id}/state/m.room.member/{alice.user_id}", token=bob.token
        )
        assert member["membership"] == "leave"
    store = hs.engine.store
    for membership in ("join", "invite"):
        assert await store.get_rooms_for_user(alice.user_id, membership) == []
    assert await store.get_membership(own, alice.user_id) == "leave"
    # The user ID is never given out again.
    status, body = await hs.call(
        "POST",
        "/register",
        {"username": "alice", "password": "pw", "auth": {"type": "m.login.dummy"}},
    )
    assert (status, body["errcode"]) == (400, "M_USER_IN_USE")


async def test_deactivate_refuses_bad_input(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    auth = password_auth(alice.user_id)
    for body in ({"auth": auth, "erase": "yes"}, {"auth": auth, "id_server": 1}, {"auth": []}):
        status, answer = await hs.call("POST", "/account/deactivate", body, token=alice.token)
        assert (status, answer["errcode"]) == (400, "M_BAD_JSON"), body
    status, answer = await hs.call("POST", "/account/deactivate", {"auth": auth})
    assert (status, answer["errcode"]) == (401, "M_MISSING_TOKEN")
    assert await whoami_status(hs, alice.token) == (200, None)


async def test_threepids_stay_unsupported(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice", PASSWORD)
    token = alice.token
    assert await hs.ok("GET", "/account/3pid", token=token) == {"threepids": []}
    status, body = await hs.call("GET", "/account/3pid")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
    creds = {"client_secret": "secret", "sid": "sid"}

    async def refused(path: str, body: Any, status: int, errcode: str) -> None:
        got, answer = await hs.call("POST", path, body, token=token)
        assert (got, answer.get("errcode")) == (status, errcode), (path, body, answer)

    # Adding: no validated session is ever known (no email or SMS is sent).
    await refused("/account/3pid", {}, 400, "M_MISSING_PARAM")
    await refused("/account/3pid", {"three_pid_creds": creds}, 400, "M_THREEPID_AUTH_FAILED")
    await refused("/account/3pid", {"threePidCreds": {"sid": "x"}}, 400, "M_MISSING_PARAM")
    await refused("/account/3pid/add", {"sid": "x"}, 400, "M_MISSING_PARAM")
    status, body = await hs.call("POST", "/account/3pid/add", creds, token=token)
    assert status == 401 and body["flows"] == [{"stages": ["m.login.password"]}]
    with_auth = {**creds, "auth": password_auth(alice.user_id)}
    await refused("/account/3pid/add", with_auth, 400, "M_THREEPID_AUTH_FAILED")
    bind = {**creds, "id_server": "id.example", "id_access_token": "t"}
    await refused("/account/3pid/bind", bind, 400, "M_THREEPID_AUTH_FAILED")
    await refused("/account/3pid/bind", creds, 400, "M_MISSING_PARAM")
    # Removing: nothing bound anywhere, so "no-support" (Synapse's answer).
    threepid = {"medium": "email", "address": "a@example.org"}
    for path in ("/account/3pid/unbind", "/account/3pid/delete"):
        answer = await hs.ok("POST", path, threepid, token=token)
        assert answer == {"id_server_unbind_result": "no-support"}
        await refused(path, {**threepid, "medium": "fax"}, 400, "M_INVALID_PARAM")
        await refused(path, {"medium": "email"}, 400, "M_MISSING_PARAM")
    # Tokens by email or SMS: not sent.
    await refused("/account/3pid/email/requestToken", {}, 400, "M_THREEPID_MEDIUM_NOT_SUPPORTED")
    await refused("/account/3pid/msisdn/requestToken", {}, 400, "M_THREEPID_MEDIUM_NOT_SUPPORTED")
    await refused("/account/password/email/requestToken", {}, 400, "M_UNKNOWN")
    await refused("/account/3pid/email/requestToken", [], 400, "M_BAD_JSON")
    capabilities = (await hs.ok("GET", "/capabilities", token=token))["capabilities"]
    assert capabilities["m.3pid_changes"] == {"enabled": False}
    assert capabilities["m.change_password"] == {"enabled": True}


async def test_turn_and_third_party_networks_unconfigured(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    token = alice.token
    assert await hs.ok("GET", "/voip/turnServer", token=token) == {}
    assert await hs.ok("GET", "/thirdparty/protocols", token=token) == {}
    for path in ("/thirdparty/user", "/thirdparty/user/irc", "/thirdparty/location/irc"):
        assert await hs.ok("GET", path + "?alias=x", token=token) == []
    status, body = await hs.call("GET", "/thirdparty/protocol/irc", token=token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    for path in ("/voip/turnServer", "/thirdparty/protocols", "/thirdparty/location"):
        status, body = await hs.call("GET", path)
        assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")
