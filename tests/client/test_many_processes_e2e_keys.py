"""Across processes (PostgreSQL, Redis).

- ``device_lists`` written by ``w2``, clients on the reader and on ``w1``: key uploads,
  renames and cross-signing uploads made on the reader are forwarded to the stream's
  writer; the keys are served everywhere and a user syncing on ``w1`` sees the change in
  ``device_lists.changed``.
- matrix-js-sdk with its Rust crypto (``js/e2e.mjs``), both users' clients on the reader,
  the room's events written by ``w2``, ``device_lists`` and ``to_device`` by ``w1``: each
  user reads the other's message decrypted, and the room holds ``m.room.encrypted`` only.
"""

from __future__ import annotations

import functools
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg import sql

from roomstream.config import parse_config
from roomstream.replication.sharding import writer_for_room
from tests.support.cluster import (
    USER_DATA_WRITERS,
    Cluster,
    register,
    run_cluster,
    urls,
)
from tests.support.e2e_keys import CrossSigning, Device
from tests.support.js_sdk import JS_DIR, run_script
from tests.support.wait import wait_for

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
        clients = (bob, bob.on(url["reader"]), bob.on(url["w2"]))
        query = {"device_keys": {alice.user_id: []}}
        for client in clients:  # each process now has alice's keys in its cache
            keys = await client.ok("POST", "/keys/query", query)
            assert keys["master_keys"] == {}
        await alice.ok("PUT", f"/devices/{alice_device}", {"display_name": "web"})
        cs = CrossSigning(alice.user_id)
        await alice.ok("POST", "/keys/device_signing/upload", cs.upload_body())
        # w2's device_lists rows wake bob's sync on w1 (he shares a room with alice).
        await bob.sync_until(lambda r: alice.user_id in r["device_lists"]["changed"])
        master = cs.upload_body()["master_key"]

        async def changes_seen(client: Any) -> bool:
            keys = await client.ok("POST", "/keys/query", query)
            got = keys["device_keys"][alice.user_id][alice_device]
            name = got["unsigned"].get("device_display_name")
            return name == "web" and keys["master_keys"].get(alice.user_id) == master

        # Each process's cached keys are dropped by the rows: on w2 (the writer) and the
        # reader (which forwarded the writes) at once, on w1 as the rows reach it.
        for client in clients:
            seen = functools.partial(changes_seen, client)
            await wait_for(seen, 30, "the key changes in /keys/query")
        claimed = await bob.ok(
            "POST",
            "/keys/claim",
            {"one_time_keys": {alice.user_id: {alice_device: "signed_curve25519"}}},
        )
        assert claimed["one_time_keys"][alice.user_id][alice_device] == device.one_time_keys(["1"])


async def test_js_sdk_encrypted_chat_with_room_keys_and_messages_on_other_processes(
    split_cluster: Cluster,
) -> None:
    """Both clients talk to the reader only, which writes nothing: the room's events are
    forwarded to ``w2`` (the room's owner, not the writer of keys), uploads of device keys
    and one-time keys to ``w1``, and the Megolm room keys travel as to-device messages
    forwarded to ``w1``; every write comes back to the reader over replication and wakes
    the other client's long-polling sync there."""
    assert (JS_DIR / "node_modules" / "@matrix-org" / "matrix-sdk-crypto-wasm").is_dir(), (
        "matrix-js-sdk's Rust crypto is not installed: run `make setup`"
    )
    _, raw = split_cluster
    config = parse_config(raw)
    events_writers = config.writers_of("events")
    assert events_writers == ("w1", "w2")
    assert config.writers_of("device_lists") == config.writers_of("to_device") == ("w1",)
    reader = urls(raw)["reader"]

    report = await run_script("e2e.mjs", "--room-shard", "1/2", reader, reader)

    room_id = report["roomId"]
    assert writer_for_room(room_id, events_writers) == "w2"
    assert report["encrypted"] is True
    assert "secret from alice" in report["bobRead"]
    assert "secret from bob" in report["aliceRead"]
    assert "m.room.message" not in report["types"] and "m.room.encrypted" in report["types"]
    database = raw["database"]
    async with await psycopg.AsyncConnection.connect(database["dsn"]) as conn:
        await conn.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(database["schema"]))
        )
        cursor = await conn.execute(
            "SELECT type, instance_name FROM events WHERE room_id = %s AND state_key IS NULL",
            (room_id,),
        )
        messages = await cursor.fetchall()
        cursor = await conn.execute("SELECT DISTINCT instance_name FROM device_lists_stream")
        device_list_writers = {row[0] for row in await cursor.fetchall()}
    # What the server stored of the conversation is ciphertext only, written by the owner.
    assert sorted(messages) == [("m.room.encrypted", "w2"), ("m.room.encrypted", "w2")]
    assert device_list_writers == {"w1"}
