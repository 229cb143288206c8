"""Device management: ``/devices``, ``/devices/{id}``, ``/delete_devices`` (user-interactive
auth with the password), and what deleting a device takes with it, on both engines."""

from __future__ import annotations

from typing import Any

from tests.support.e2e_keys import PASSWORD, Device, password_auth
from tests.support.homeserver import Homeserver


async def login(hs: Homeserver, name: str, device_id: str, display: str) -> str:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": name},
        "password": PASSWORD,
        "device_id": device_id,
        "initial_device_display_name": display,
    }
    return str((await hs.ok("POST", "/login", body))["access_token"])


async def test_list_get_rename(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    phone = await login(hs, "alice", "PHONE", "Alice's phone")
    await hs.ok("GET", "/account/whoami", token=alice.token)  # seen: PHONE not yet
    devices = (await hs.ok("GET", "/devices", token=alice.token))["devices"]
    assert {d["device_id"]: d["display_name"] for d in devices} == {
        alice.device_id: None,
        "PHONE": "Alice's phone",
    }
    assert all(d["user_id"] == alice.user_id for d in devices)
    # Where each device was last seen (this process's own requests count at once).
    by_id = {d["device_id"]: d for d in devices}
    assert by_id[alice.device_id]["last_seen_ip"] == "127.0.0.1"
    assert isinstance(by_id[alice.device_id]["last_seen_ts"], int)
    assert by_id["PHONE"]["last_seen_ip"] is None and by_id["PHONE"]["last_seen_ts"] is None
    got = await hs.ok("GET", "/devices/PHONE", token=phone)
    assert got["display_name"] == "Alice's phone"
    before = hs.process.keys.position()
    await hs.ok("PUT", "/devices/PHONE", {"display_name": "Old phone"}, token=alice.token)
    assert (await hs.ok("GET", "/devices/PHONE", token=alice.token))["display_name"] == "Old phone"
    assert hs.process.keys.position() > before  # a device_lists row: contacts re-query
    await hs.ok("PUT", "/devices/PHONE", {}, token=alice.token)  # nothing to change
    # Refusals: unknown device, another user's device, bad name.
    bob = await hs.register("bob")
    for token in (alice.token, bob.token):
        status, body = await hs.call("GET", "/devices/NOPE", token=token)
        assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    status, body = await hs.call("GET", "/devices/PHONE", token=bob.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    status, body = await hs.call("PUT", "/devices/PHONE", {"display_name": "x"}, token=bob.token)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    status, body = await hs.call("PUT", "/devices/PHONE", {"display_name": 5}, token=alice.token)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    status, body = await hs.call("GET", "/devices")
    assert (status, body["errcode"]) == (401, "M_MISSING_TOKEN")


async def test_delete_needs_the_password_and_takes_tokens_keys_and_inbox(
    homeserver: Homeserver,
) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    phone = await login(hs, "alice", "PHONE", "phone")
    device = Device(alice.user_id, "PHONE")
    await hs.ok(
        "POST",
        "/keys/upload",
        {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["1"])},
        token=phone,
    )
    await hs.ok(
        "PUT",
        "/sendToDevice/m.test/t1",
        {"messages": {alice.user_id: {"PHONE": {"hello": 1}}}},
        token=bob.token,
    )
    # No auth: 401 with the password flow and a session.
    status, body = await hs.call("DELETE", "/devices/PHONE", {}, token=alice.token)
    assert status == 401
    assert body["flows"] == [{"stages": ["m.login.password"]}] and body["session"]
    # A wrong password, or another user's password: 403; nothing deleted.
    status, body = await hs.call(
        "DELETE",
        "/devices/PHONE",
        {"auth": password_auth(alice.user_id, "wrong")},
        token=alice.token,
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    status, body = await hs.call(
        "DELETE", "/devices/PHONE", {"auth": password_auth(bob.user_id)}, token=alice.token
    )
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    await hs.ok("GET", "/account/whoami", token=phone)
    before = hs.process.keys.position()
    await hs.ok(
        "DELETE", "/devices/PHONE", {"auth": password_auth(alice.user_id)}, token=alice.token
    )
    assert hs.process.keys.position() > before
    status, body = await hs.call("GET", "/account/whoami", token=phone)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    keys = await hs.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token)
    assert keys["device_keys"][alice.user_id] == {}

    def leftovers(t: Any) -> list[int]:
        return [
            int(
                t.query_one(
                    f"SELECT COUNT(*) FROM {table} WHERE user_id = ? AND device_id = ?",
                    (alice.user_id, "PHONE"),
                )[0]
            )
            for table in ("e2e_device_keys", "e2e_one_time_keys", "device_inbox", "devices")
        ]

    assert await hs.engine.db.run_interaction("leftovers", leftovers) == [0, 0, 0, 0]
    status, body = await hs.call(
        "DELETE", "/devices/PHONE", {"auth": password_auth(alice.user_id)}, token=alice.token
    )
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")


async def test_delete_devices_in_bulk(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    one = await login(hs, "alice", "ONE", "one")
    two = await login(hs, "alice", "TWO", "two")
    status, body = await hs.call("POST", "/delete_devices", {"devices": ["ONE"]}, token=alice.token)
    assert status == 401 and body["flows"] == [{"stages": ["m.login.password"]}]
    status, body = await hs.call("POST", "/delete_devices", {"devices": "ONE"}, token=alice.token)
    assert (status, body["errcode"]) == (400, "M_BAD_JSON")
    await hs.ok(
        "POST",
        "/delete_devices",
        {"devices": ["ONE", "TWO", "UNKNOWN"], "auth": password_auth("alice")},
        token=alice.token,
    )
    for token in (one, two):
        status, _ = await hs.call("GET", "/account/whoami", token=token)
        assert status == 401
    devices = (await hs.ok("GET", "/devices", token=alice.token))["devices"]
    assert [d["device_id"] for d in devices] == [alice.device_id]


async def test_logout_forgets_the_device_keys_and_tells_contacts(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    for token, device_id in ((alice.token, alice.device_id),):
        device = Device(alice.user_id, device_id)
        await hs.ok(
            "POST",
            "/keys/upload",
            {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["1"])},
            token=token,
        )
    phone = await login(hs, "alice", "PHONE", "phone")
    await hs.ok(
        "POST",
        "/keys/upload",
        {"device_keys": Device(alice.user_id, "PHONE").device_keys()},
        token=phone,
    )
    before = hs.process.keys.position()
    await hs.ok("POST", "/logout", {}, token=alice.token)
    assert hs.process.keys.position() > before
    ask = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}
    assert (await hs.ok("POST", "/keys/claim", ask, token=bob.token))["one_time_keys"] == {}
    keys = await hs.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token)
    assert list(keys["device_keys"][alice.user_id]) == ["PHONE"]
    await hs.ok("POST", "/logout/all", {}, token=phone)
    keys = await hs.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token)
    assert keys["device_keys"][alice.user_id] == {}
    rows = await hs.engine.db.run_interaction(
        "test_query",
        lambda t: t.query_one(
            "SELECT COUNT(*) FROM e2e_device_keys WHERE user_id = ?", (alice.user_id,)
        ),
    )
    assert int(rows[0]) == 0
