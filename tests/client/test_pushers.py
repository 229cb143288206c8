"""Pushers: ``GET /pushers``, ``POST /pushers/set`` and delivery to a push gateway of the
test's own (aiohttp on loopback), for a user who never syncs: what the gateway receives,
in order, retried after failures, never twice across a restart."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from roomstream.client import ClientProcess
from roomstream.storage import DatabaseConfig
from tests.support.client import room_with, send
from tests.support.homeserver import Homeserver, User, make_config, serve_homeserver
from tests.support.push_gateway import gateway, pusher_body
from tests.support.wait import wait_for


@asynccontextmanager
async def pushing_homeserver(
    db_config: DatabaseConfig, tmp_path: Path
) -> AsyncIterator[Homeserver]:
    """A homeserver whose pusher pool runs (retries after 20 ms, doubling)."""
    config = make_config(db_config, tmp_path)

    async def start_pushers(process: ClientProcess) -> None:
        process.pushers.initial_backoff = 0.02
        await process.pushers.start()

    async with serve_homeserver(config, prepare=start_pushers) as server:
        yield server


async def _set(hs: Homeserver, user: User, body: dict[str, Any]) -> None:
    await hs.ok("POST", "/pushers/set", body, token=user.token)


async def test_pushers_set_list_replace_delete(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    url = "http://127.0.0.1:9/_matrix/push/v1/notify"
    await _set(homeserver, alice, pusher_body(url, profile_tag="work"))
    listed = (await homeserver.ok("GET", "/pushers", token=alice.token))["pushers"]
    assert listed == [{**pusher_body(url), "profile_tag": "work"}]
    assert (await homeserver.ok("GET", "/pushers", token=bob.token))["pushers"] == []
    # Bob takes the same pushkey with append: both have it; without: alice's goes.
    await _set(homeserver, bob, pusher_body(url, append=True))
    assert len((await homeserver.ok("GET", "/pushers", token=alice.token))["pushers"]) == 1
    await _set(homeserver, bob, pusher_body(url, device_display_name="Tablet"))
    assert (await homeserver.ok("GET", "/pushers", token=alice.token))["pushers"] == []
    bobs = (await homeserver.ok("GET", "/pushers", token=bob.token))["pushers"]
    assert [p["device_display_name"] for p in bobs] == ["Tablet"]
    # kind null deletes.
    await _set(homeserver, bob, {"app_id": "io.example.app", "pushkey": "key-1", "kind": None})
    assert (await homeserver.ok("GET", "/pushers", token=bob.token))["pushers"] == []


async def test_bad_pusher_requests(homeserver: Homeserver) -> None:
    alice = await homeserver.register("alice")
    url = "http://127.0.0.1:9/_matrix/push/v1/notify"
    cases: list[tuple[dict[str, Any], str]] = [
        ({k: v for k, v in pusher_body(url).items() if k != "pushkey"}, "M_MISSING_PARAM"),
        (pusher_body(url, kind="email"), "M_INVALID_PARAM"),
        (pusher_body(url, app_id="x" * 65), "M_INVALID_PARAM"),
        (pusher_body(url, data={}), "M_UNKNOWN"),
        (pusher_body(url, data={"url": "http://127.0.0.1:9/elsewhere"}), "M_UNKNOWN"),
        (pusher_body(url, data={"url": url, "format": "full"}), "M_UNKNOWN"),
        (pusher_body(url, lang=3), "M_BAD_JSON"),
        (pusher_body(url, append="yes"), "M_BAD_JSON"),
    ]
    for body, errcode in cases:
        status, answer = await homeserver.call("POST", "/pushers/set", body, token=alice.token)
        assert (status, answer.get("errcode")) == (400, errcode), (body, answer)
    assert (await homeserver.ok("GET", "/pushers", token=alice.token))["pushers"] == []


async def test_gateway_receives_what_the_rules_call_for_in_order(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with gateway() as gw, pushing_homeserver(db_config, tmp_path) as hs:
        alice = await hs.register("alice")  # never syncs
        bob = await hs.register("bob")
        carol = await hs.register("carol")
        room_id = await room_with(hs, bob, alice, carol)
        await hs.ok("PUT", f"/rooms/{room_id}/state/m.room.name", {"name": "Ops"}, token=bob.token)
        await send(hs, bob, room_id, "before the pusher")
        set_at = int(time.time())
        await _set(hs, alice, pusher_body(gw.url))
        # Muted sender, own message, a notice: no notification for any of them.
        await hs.ok(
            "PUT", f"/pushrules/global/sender/{carol.user_id}", {"actions": []}, token=alice.token
        )
        first = await send(hs, bob, room_id, "m1")
        await send(hs, carol, room_id, "muted")
        await send(hs, alice, room_id, "own")
        await hs.ok(
            "PUT",
            f"/rooms/{room_id}/send/m.room.message/{hs.txn()}",
            {"msgtype": "m.notice", "body": "a notice"},
            token=bob.token,
        )
        await send(hs, bob, room_id, "m2 hello alice")
        await send(hs, bob, room_id, "m3")
        # An edit notifies no one (.m.rule.suppress_edits): m4 follows m3 directly.
        edit = {
            "msgtype": "m.text",
            "body": "* m1 edited",
            "m.new_content": {"msgtype": "m.text", "body": "m1 edited"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": first},
        }
        path = f"/rooms/{room_id}/send/m.room.message/{hs.txn()}"
        await hs.ok("PUT", path, edit, token=bob.token)
        await send(hs, bob, room_id, "m4")
        await wait_for(lambda: len(gw.received) >= 4, what="four notifications")
        assert gw.bodies() == ["m1", "m2 hello alice", "m3", "m4"]
        one = gw.received[0]
        assert (one["event_id"], one["room_id"], one["type"]) == (first, room_id, "m.room.message")
        assert (one["sender"], one["room_name"], one["prio"]) == (bob.user_id, "Ops", "low")
        assert one["sender_display_name"] == "bob"
        assert one["counts"] == {"unread": 1}
        device = one["devices"][0]
        # pushkey_ts: when the pusher was set, in seconds.
        assert set_at <= device.pop("pushkey_ts") <= int(time.time())
        assert one["devices"] == [
            {"app_id": "io.example.app", "pushkey": "key-1", "data": {"extra": 1}, "tweaks": {}}
        ]
        highlight = gw.received[1]
        assert highlight["prio"] == "high"
        assert highlight["devices"][0]["tweaks"] == {"sound": "default", "highlight": True}


async def test_failed_deliveries_are_retried_in_order(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with gateway() as gw, pushing_homeserver(db_config, tmp_path) as hs:
        alice = await hs.register("alice")
        bob = await hs.register("bob")
        room_id = await room_with(hs, bob, alice)
        await _set(hs, alice, pusher_body(gw.url, data={"url": gw.url, "format": "event_id_only"}))
        gw.failures = 3
        sent = [await send(hs, bob, room_id, f"m{i}") for i in range(3)]
        await wait_for(lambda: len(gw.received) >= 3, what="three notifications")
        assert [n["event_id"] for n in gw.received] == sent
        assert gw.attempts == 6  # three failures of the first, then one each
        # event_id_only: IDs, counts and devices, no content.
        assert set(gw.received[0]) == {"event_id", "room_id", "counts", "prio", "devices"}


async def test_a_restart_resumes_after_the_last_delivered_event(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with gateway() as gw:
        async with pushing_homeserver(db_config, tmp_path) as hs:
            alice = await hs.register("alice")
            bob = await hs.register("bob")
            room_id = await room_with(hs, bob, alice)
            await _set(hs, alice, pusher_body(gw.url))
            await send(hs, bob, room_id, "m1")
            await wait_for(lambda: gw.bodies() == ["m1"], what="m1")
            hs.process.pushers.close()  # down: m2 waits for the next process
            await send(hs, bob, room_id, "m2")
            bob_token = bob.token
        async with pushing_homeserver(db_config, tmp_path) as hs:
            path = f"/rooms/{room_id}/send/m.room.message/after-restart"
            await hs.ok("PUT", path, {"msgtype": "m.text", "body": "m3"}, token=bob_token)
            # In order: had m1 been sent again, it would come before m3.
            await wait_for(lambda: len(gw.received) >= 2 and gw.bodies()[-1] == "m3", what="m3")
            assert gw.bodies() == ["m1", "m2", "m3"]


async def test_a_rejected_pushkey_loses_itspusher_body(
    db_config: DatabaseConfig, tmp_path: Path
) -> None:
    async with gateway() as gw, pushing_homeserver(db_config, tmp_path) as hs:
        alice = await hs.register("alice")
        bob = await hs.register("bob")
        room_id = await room_with(hs, bob, alice)
        await _set(hs, alice, pusher_body(gw.url))
        gw.rejected = ["key-1"]
        await send(hs, bob, room_id, "m1")

        async def pushers() -> list[Any]:
            return list((await hs.ok("GET", "/pushers", token=alice.token))["pushers"])

        await wait_for(lambda: gw.bodies() == ["m1"], what="m1")
        await wait_for(lambda: _no(pushers()), what="the pusher deleted")
        # Nothing more is sent to it (a new pusher, then an event: only the new one's).
        gw.rejected = []
        await _set(hs, alice, pusher_body(gw.url, pushkey="key-2"))
        await send(hs, bob, room_id, "m2")
        await wait_for(lambda: len(gw.received) >= 2, what="m2")
        assert [n["devices"][0]["pushkey"] for n in gw.received] == ["key-1", "key-2"]


async def _no(found: Any) -> bool:
    return not await found


async def test_a_devices_pushers_go_when_it_logs_out(homeserver: Homeserver) -> None:
    """As Synapse: the pushers a device set go with the device (logout, logout/all,
    device deletion); another device's stay, and a device changing another device's
    pusher leaves it with the device that set it."""
    hs = homeserver
    alice = await hs.register("alice")
    login = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": "alice"},
        "password": "secret-password",
    }
    phone = (await hs.ok("POST", "/login", login))["access_token"]
    tablet = (await hs.ok("POST", "/login", login))["access_token"]
    url = "http://127.0.0.1:9/_matrix/push/v1/notify"
    await hs.ok("POST", "/pushers/set", pusher_body(url, pushkey="phone"), token=phone)
    await hs.ok("POST", "/pushers/set", pusher_body(url, pushkey="tablet"), token=tablet)
    # The first device renames the phone's pusher: it stays the phone's.
    renamed = pusher_body(url, pushkey="phone", device_display_name="Renamed")
    await hs.ok("POST", "/pushers/set", renamed, token=alice.token)

    async def pushkeys() -> list[str]:
        listed = (await hs.ok("GET", "/pushers", token=alice.token))["pushers"]
        return sorted(p["pushkey"] for p in listed)

    assert await pushkeys() == ["phone", "tablet"]
    await hs.ok("POST", "/logout", {}, token=phone)
    assert await pushkeys() == ["tablet"]
    # Logging out everywhere takes the rest.
    await hs.ok("POST", "/logout/all", {}, token=tablet)
    alice_again = (await hs.ok("POST", "/login", login))["access_token"]
    assert (await hs.ok("GET", "/pushers", token=alice_again))["pushers"] == []
