"""Across processes (PostgreSQL, Redis; ``device_lists`` written by ``w2``, clients on the
reader and on ``w1``): key uploads, renames and cross-signing uploads made on the reader
are forwarded to the stream's writer; the keys are served everywhere and a user syncing
on ``w1`` sees the change in ``device_lists.changed``."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.support.cluster import (
    USER_DATA_WRITERS,
    Cluster,
    register,
    run_cluster,
    urls,
)
from tests.support.e2e_keys import CrossSigning, Device

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
async def e2e_cluster(tmp_path: Any, pg_database: str, redis_url: str) -> Any:
    writers = {**USER_DATA_WRITERS, "device_lists": ["w2"]}
    async with run_cluster(tmp_path, pg_database, writers) as running:
        yield running


async def test_key_writes_are_forwarded_and_seen_everywhere(e2e_cluster: Cluster) -> None:
    _, raw = e2e_cluster
    url = urls(raw)
    async with aiohttp.ClientSession() as session:
        alice = await register(session, url["reader"], "alice")
        bob = (await register(session, url["reader"], "bob")).on(url["w1"])
        alice_device = (await alice.ok("GET", "/account/whoami"))["device_id"]
        room_id = (await alice.ok("POST", "/createRoom", {"invite": [bob.user_id]}))["room_id"]
        await bob.ok("POST", f"/rooms/{room_id}/join", {})
        await bob.sync_until(lambda r: room_id in r["rooms"]["join"])

        # On the reader, which does not write device_lists: forwarded to w2.
        device = Device(alice.user_id, alice_device)
        counts = await alice.ok(
            "POST",
            "/keys/upload",
            {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["1"])},
        )
        assert counts["one_time_key_counts"]["signed_curve25519"] == 1
        status, body = await alice.call(
            "POST", "/keys/upload", {"device_keys": device.device_keys("other")}
        )
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM")  # the writer's refusal
        await alice.ok("PUT", f"/devices/{alice_device}", {"display_name": "web"})
        cs = CrossSigning(alice.user_id)
        await alice.ok("POST", "/keys/device_signing/upload", cs.upload_body())
        # A message wakes bob's sync on w1 (device_lists rows wake only their own user).
        await alice.ok("PUT", f"/rooms/{room_id}/send/m.room.message/t1", {"body": "hi"})
        await bob.sync_until(lambda r: alice.user_id in r["device_lists"]["changed"])
        for client in (bob, bob.on(url["reader"]), bob.on(url["w2"])):
            keys = await client.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}})
            got = keys["device_keys"][alice.user_id][alice_device]
            assert got["unsigned"]["device_display_name"] == "web"
            assert keys["master_keys"][alice.user_id] == cs.upload_body()["master_key"]
        claimed = await bob.ok(
            "POST",
            "/keys/claim",
            {"one_time_keys": {alice.user_id: {alice_device: "signed_curve25519"}}},
        )
        assert claimed["one_time_keys"][alice.user_id][alice_device] == device.one_time_keys(["1"])
