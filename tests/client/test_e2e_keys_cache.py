"""The cache of users' ``/keys/query`` parts (roomstream.e2e.keys_cache): every change to
what a user's keys answer drops the user's entry, on this process at once and on others
when the ``device_lists`` row arrives; the cache is not used while those rows may not
arrive; a read racing with a change never fills it. Both engines."""

from __future__ import annotations

import dataclasses
from typing import Any

from roomstream.client import _keys_cache_live
from roomstream.config import Config
from roomstream.e2e.key_format import format_user_keys
from roomstream.e2e.keys_cache import KeysCache
from tests.support.e2e_keys import CrossSigning, Device, password_auth
from tests.support.homeserver import Homeserver, User


async def query(hs: Homeserver, asker: User, user_id: str) -> dict[str, Any]:
    body = {"device_keys": {user_id: []}}
    answer: dict[str, Any] = await hs.ok("POST", "/keys/query", body, token=asker.token)
    return answer


async def login(hs: Homeserver, device_id: str, name: str) -> str:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": "alice"},
        "password": "secret-password",
        "device_id": device_id,
        "initial_device_display_name": name,
    }
    return str((await hs.ok("POST", "/login", body))["access_token"])


async def test_every_change_drops_the_users_cached_keys(homeserver: Homeserver) -> None:
    hs = homeserver
    cache = hs.process.keys.cache
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    phone_token = await login(hs, "PHONE", "phone")
    phone = Device(alice.user_id, "PHONE")
    await hs.ok("POST", "/keys/upload", {"device_keys": phone.device_keys()}, token=phone_token)

    # Each query below fills the cache (checked once here); each change must drop it.
    await query(hs, bob, alice.user_id)
    assert alice.user_id in cache.get_many([alice.user_id])
    # A rename through /devices.
    await hs.ok("PUT", "/devices/PHONE", {"display_name": "renamed"}, token=alice.token)
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert got["PHONE"]["unsigned"] == {"device_display_name": "renamed"}
    # A login naming the existing device renames it too (and says so on the stream).
    assert alice.user_id in cache.get_many([alice.user_id])
    before = hs.process.keys.position()
    phone_token = await login(hs, "PHONE", "phone again")
    assert hs.process.keys.position() > before
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert got["PHONE"]["unsigned"] == {"device_display_name": "phone again"}
    # New device keys.
    device = Device(alice.user_id, alice.device_id)
    await hs.ok("POST", "/keys/upload", {"device_keys": device.device_keys()}, token=alice.token)
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert set(got) == {"PHONE", alice.device_id}
    # Cross-signing keys, then a signature on a device.
    cs = CrossSigning(alice.user_id)
    await hs.ok("POST", "/keys/device_signing/upload", cs.upload_body(), token=alice.token)
    answer = await query(hs, bob, alice.user_id)
    assert answer["master_keys"][alice.user_id] == cs.upload_body()["master_key"]
    unsigned = {k: v for k, v in phone.device_keys().items() if k != "signatures"}
    signed = cs.sign(cs.self_signing, unsigned)
    body = {alice.user_id: {"PHONE": signed}}
    assert (await hs.ok("POST", "/keys/signatures/upload", body, token=alice.token)) == {
        "failures": {}
    }
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert got["PHONE"]["signatures"][alice.user_id] == {
        **phone.device_keys()["signatures"][alice.user_id],
        **signed["signatures"][alice.user_id],
    }
    # The device deleted (its keys with it).
    auth = password_auth(alice.user_id)
    await hs.ok("POST", "/delete_devices", {"devices": ["PHONE"], "auth": auth}, token=alice.token)
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert set(got) == {alice.device_id}
    # The user-signing key is cached with the rest, and still shown to its owner only.
    own = await query(hs, alice, alice.user_id)
    assert own["user_signing_keys"][alice.user_id] == cs.upload_body()["user_signing_key"]
    assert (await query(hs, bob, alice.user_id))["user_signing_keys"] == {}


async def test_a_replicated_row_drops_the_cached_keys(homeserver: Homeserver) -> None:
    """A change another process wrote reaches this one as its ``device_lists`` row: until
    then the cached answer stands (the cache is used), after it the change shows."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    device = Device(alice.user_id, alice.device_id)
    await hs.ok("POST", "/keys/upload", {"device_keys": device.device_keys()}, token=alice.token)
    await query(hs, bob, alice.user_id)
    # Another process's change: the database moves, no row has arrived here yet.
    await hs.engine.db.run_interaction(
        "test_rename",
        lambda t: t.execute(
            "UPDATE devices SET display_name = ? WHERE user_id = ? AND device_id = ?",
            ("elsewhere", alice.user_id, alice.device_id),
        ),
    )
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert "device_display_name" not in got[alice.device_id]["unsigned"]
    hs.process.on_replicated_rows("device_lists", "w2", 10**6, [[bob.user_id]])
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert "device_display_name" not in got[alice.device_id]["unsigned"]  # not alice's row
    hs.process.on_replicated_rows("device_lists", "w2", 10**6, [[alice.user_id]])
    got = (await query(hs, bob, alice.user_id))["device_keys"][alice.user_id]
    assert got[alice.device_id]["unsigned"] == {"device_display_name": "elsewhere"}


def test_not_trusted_while_rows_may_not_arrive_and_no_racing_fill() -> None:
    live = [True]
    cache = KeysCache(10, live=lambda: live[0])
    keys = format_user_keys({"D": ('{"a":1}', None)}, {}, {})
    cache.put("@a:x", keys, cache.generation)
    assert cache.get_many(["@a:x", "@b:x"]) == {"@a:x": keys}
    live[0] = False
    assert cache.get_many(["@a:x"]) == {}
    cache.put("@b:x", keys, cache.generation)  # not filled either
    live[0] = True
    assert cache.get_many(["@b:x"]) == {}
    # A read that started before an invalidation does not fill the cache.
    started = cache.generation
    cache.apply_rows([["@c:x"]])
    cache.put("@b:x", keys, started)
    assert cache.get_many(["@b:x"]) == {}
    cache.put("@b:x", keys, cache.generation)
    assert cache.get_many(["@b:x"]) == {"@b:x": keys}
    cache.invalidate_all()
    assert len(cache) == 0


def test_who_trusts_the_cache(homeserver: Homeserver) -> None:
    """The process writing the whole stream always; others only while replication says
    the stream is live, never without replication."""
    config: Config = homeserver.config
    assert config.writers_of("device_lists") == (config.instance_name,)
    assert _keys_cache_live(config, None) is None
    sharded = dataclasses.replace(config, stream_writers={"device_lists": ("main", "w2")})
    never = _keys_cache_live(sharded, None)
    assert never is not None and not never()
    asked: list[str] = []

    def stream_live(name: str) -> bool:
        asked.append(name)
        return True

    live = _keys_cache_live(sharded, stream_live)
    assert live is not None and live() and asked == ["device_lists"]
