"""``PUT /sendToDevice/{type}/{txnId}`` is idempotent per sending device and transaction
ID, as ``PUT /send`` is, on both engines: a retry delivers nothing again, concurrent
duplicates deliver once, another device's same transaction ID is another message, and
a send forwarded to the ``to_device`` writer over the internal API keeps the rule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from roomstream.client.userdata import TO_DEVICE_TRANSACTION_KEPT_MS
from roomstream.config import parse_config
from roomstream.replication.endpoints import TO_DEVICE, ToDeviceCall
from roomstream.replication.http import InternalHttpClient, InternalHttpServer
from tests.support.homeserver import Homeserver, User
from tests.support.ports import free_port


async def _login(hs: Homeserver, name: str) -> User:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": name},
        "password": "secret-password",
    }
    result = await hs.ok("POST", "/login", body)
    return User(result["user_id"], result["access_token"], result["device_id"])


async def _send(hs: Homeserver, sender: User, to: User, txn_id: str, n: int) -> None:
    body = {"messages": {to.user_id: {to.device_id: {"n": n}}}}
    await hs.ok("PUT", f"/sendToDevice/m.test/{txn_id}", body, token=sender.token)


async def _received(hs: Homeserver, user: User) -> list[Any]:
    """Every to-device message waiting for the user's device (acknowledged after)."""
    result = await hs.ok("GET", "/sync?timeout=0", token=user.token)
    events = result["to_device"]["events"]
    await hs.ok("GET", f"/sync?timeout=0&since={result['next_batch']}", token=user.token)
    return [(e["sender"], e["content"]["n"]) for e in events]


async def test_a_retried_transaction_is_delivered_once(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await _send(hs, alice, bob, "t1", 1)
    await _send(hs, alice, bob, "t1", 1)  # the client's retry
    await _send(hs, alice, bob, "t1", 99)  # same ID, other body: still the first send
    await _send(hs, alice, bob, "t2", 2)
    # Another device of Alice's, and another user, may use the same transaction ID.
    alice_laptop = await _login(hs, "alice")
    await _send(hs, alice_laptop, bob, "t1", 3)
    carol = await hs.register("carol")
    await _send(hs, carol, bob, "t1", 4)
    assert await _received(hs, bob) == [
        (alice.user_id, 1),
        (alice.user_id, 2),
        (alice.user_id, 3),
        (carol.user_id, 4),
    ]
    # Remembered after delivery too: a late retry sends nothing.
    await _send(hs, alice, bob, "t2", 2)
    assert await _received(hs, bob) == []


async def test_concurrent_duplicates_are_delivered_once(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await asyncio.gather(*(_send(hs, alice, bob, "same", 1) for _ in range(12)))
    await asyncio.gather(*(_send(hs, alice, bob, f"each-{n}", 10 + n) for n in range(4)))
    received = await _received(hs, bob)
    assert sorted(received) == [(alice.user_id, n) for n in (1, 10, 11, 12, 13)]


async def test_an_old_transaction_id_is_forgotten(homeserver: Homeserver) -> None:
    """Transaction IDs older than the retention are deleted when the device sends again
    (so the table does not grow without bound); then the same ID is a new message."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    await _send(hs, alice, bob, "old", 1)
    await hs.engine.db.run_interaction(
        "test_query",
        lambda t: t.execute(
            "UPDATE to_device_transactions SET created_ts = created_ts - ?",
            (TO_DEVICE_TRANSACTION_KEPT_MS + 1000,),
        ),
    )
    await _send(hs, alice, bob, "new", 2)
    await _send(hs, alice, bob, "old", 3)
    assert await _received(hs, bob) == [(alice.user_id, n) for n in (1, 2, 3)]


async def test_a_forwarded_send_is_idempotent_too(homeserver: Homeserver, tmp_path: Path) -> None:
    """What another process forwards to the to_device writer (the internal API's
    ``/client/to_device``) carries the sending device and transaction ID."""
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    port = free_port()
    config = parse_config(
        {
            "server_name": hs.config.server_name,
            "data_dir": str(tmp_path / "internal"),
            "instances": {"main": {"internal_port": port}},
        }
    )
    server = InternalHttpServer(config, bindings=hs.process.forwarded.bindings())
    await server.start(host="127.0.0.1", port=port)
    client = InternalHttpClient(config)
    try:
        messages = {bob.user_id: {bob.device_id: {"n": 1}}}
        for _ in range(2):
            call = ToDeviceCall(alice.user_id, "m.test", messages, alice.device_id, "fw")
            await client.call(TO_DEVICE, "main", call)
        call = ToDeviceCall(alice.user_id, "m.test", messages, "OTHERDEVICE", "fw")
        await client.call(TO_DEVICE, "main", call)
        # Without a transaction (an older caller): every call delivers.
        await client.call(TO_DEVICE, "main", ToDeviceCall(alice.user_id, "m.test", messages))
    finally:
        await client.close()
        await server.close()
    assert await _received(hs, bob) == [(alice.user_id, 1)] * 3
