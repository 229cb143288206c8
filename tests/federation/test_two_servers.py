"""Two roomstream servers federating for real (issue 22 §5): ``roomstream run`` processes
on loopback, A on SQLite and B on each engine, each with its TLS federation listener,
trusting one test CA, sending through their federation senders.

A user of A creates a room and invites a user of B, who sees the invite and joins;
messages, typing and receipts flow both ways; B is stopped while A keeps sending, and
after its restart has everything, once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.e2e_keys import Device
from tests.support.federation_servers import Account, FederatedServer, q
from tests.support.js_sdk import JS_DIR, run_script
from tests.support.wait import wait_for


def _details(*servers: FederatedServer) -> Any:
    return lambda: "\n\n".join(f"== {s.label}\n{s.output()}" for s in servers)


async def _invited_rooms(account: Account) -> dict[str, Any]:
    return dict((await account.sync())["rooms"].get("invite", {}))


async def test_invite_join_and_messages_both_ways_across_a_restart(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    a, b = servers
    details = _details(a, b)
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = (await alice.ok("POST", "/createRoom", {"preset": "private_chat", "name": "Both"}))[
        "room_id"
    ]
    await alice.send(room, "before bob")

    # The invite reaches B (/invite) and Bob sees it, with the room's stripped state.
    await alice.ok("POST", f"/rooms/{q(room)}/invite", {"user_id": bob.user_id})
    invites = await wait_for(lambda: _invited_rooms(bob), 60, "bob's invite", details=details)
    stripped = invites[room]["invite_state"]["events"]
    assert {"m.room.name", "m.room.join_rules"} <= {e["type"] for e in stripped}

    # Bob joins through A (make_join / send_join); both servers see him joined.
    await bob.ok("POST", f"/join/{q(room)}", {})
    assert (await bob.state(room)) == (await alice.state(room))
    members = await alice.ok("GET", f"/rooms/{q(room)}/joined_members")
    assert set(members["joined"]) == {alice.user_id, bob.user_id}

    # Messages both ways (each server's federation sender to the other's /send).
    await alice.send(room, "hello bob")
    await wait_for(lambda: _has(bob, room, "hello bob"), 60, "A's message on B", details=details)
    await bob.send(room, "hello alice")
    await wait_for(
        lambda: _has(alice, room, "hello alice"), 60, "B's message on A", details=details
    )

    # Typing and a read receipt, each way.
    for writer, reader in ((bob, alice), (alice, bob)):
        await writer.ok(
            "PUT",
            f"/rooms/{q(room)}/typing/{q(writer.user_id)}",
            {"typing": True, "timeout": 30000},
        )
        await wait_for(
            lambda w=writer, r=reader: _typing_on(r, room, w.user_id),
            60,
            f"{writer.user_id} typing on the other server",
            details=details,
        )
        last = (await writer.messages(room))[-1]["event_id"]
        await writer.ok("POST", f"/rooms/{q(room)}/receipt/m.read/{q(last)}", {})
        await wait_for(
            lambda w=writer, r=reader, e=last: _read_by(r, room, e, w.user_id),
            60,
            f"{writer.user_id}'s receipt on the other server",
            details=details,
        )

    # A to-device message from A's user to every device of B's user (m.direct_to_device).
    sent = {"messages": {bob.user_id: {"*": {"secret": "for bob"}}}}
    await alice.ok("PUT", "/sendToDevice/m.test.ping/td1", sent)
    await wait_for(
        lambda: _to_device_from(bob, alice.user_id),
        60,
        "the to-device message on B",
        details=details,
    )

    # B goes away; A keeps sending; B comes back and has every message, once.
    await b.stop()
    for i in range(5):
        await alice.send(room, f"while away {i}")
    await b.start()
    # (Bob's message wakes A's sender for B at once, as REMOTE_SERVER_UP does; without it
    # the short test back-off brings the catch-up too.)
    expected = ["before bob", "hello bob", "hello alice", *(f"while away {i}" for i in range(5))]
    await wait_for(lambda: _bodies_are(bob, room, expected), 120, "B caught up", details=details)
    assert await alice.bodies(room) == expected


async def _has(account: Account, room: str, body: str) -> bool:
    return body in await account.bodies(room)


async def _bodies_are(account: Account, room: str, expected: list[str]) -> bool:
    bodies = await account.bodies(room)
    # Bob joined after "before bob": B fetched it as history (get_missing_events or
    # backfill) or not at all; everything after the join must be there exactly once.
    tail = [b for b in bodies if b != "before bob"]
    return tail == expected[1:]


async def _typing_on(account: Account, room: str, user_id: str) -> bool:
    answer = await account.sync()
    joined = answer["rooms"].get("join", {}).get(room, {})
    for event in joined.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.typing" and user_id in event["content"]["user_ids"]:
            return True
    return False


async def _read_by(account: Account, room: str, event_id: str, user_id: str) -> bool:
    answer = await account.sync()
    joined = answer["rooms"].get("join", {}).get(room, {})
    for event in joined.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.receipt" and user_id in event["content"].get(event_id, {}).get(
            "m.read", {}
        ):
            return True
    return False


async def test_concurrent_state_changes_resolve_alike_on_both_servers(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    """Both sides change the same state at once, several times: the DAG forks, each
    server resolves the forks (state resolution v2.1), and both end with one state."""
    a, b = servers
    details = _details(a, b)
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = (await alice.ok("POST", "/createRoom", {"preset": "public_chat"}))["room_id"]
    # Bob may change the topic too.
    await bob.ok("POST", f"/join/{q(room)}?via={q(a.server_name)}", {})
    levels = await alice.ok("GET", f"/rooms/{q(room)}/state/m.room.power_levels/")
    levels["users"][bob.user_id] = 50
    await alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.power_levels/", levels)
    await wait_for(
        lambda: _level_of(bob, room, bob.user_id, 50), 60, "bob's level on B", details=details
    )
    for i in range(4):
        await asyncio.gather(
            alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.topic/", {"topic": f"A{i}"}),
            bob.ok("PUT", f"/rooms/{q(room)}/state/m.room.topic/", {"topic": f"B{i}"}),
        )
    await alice.send(room, "settle a")
    await bob.send(room, "settle b")

    async def agree() -> bool:
        bodies_a, bodies_b = await alice.bodies(room), await bob.bodies(room)
        if not {"settle a", "settle b"} <= set(bodies_a) & set(bodies_b):
            return False
        return await alice.state(room) == await bob.state(room)

    await wait_for(agree, 90, "one state on both servers", details=details)
    topic = await alice.ok("GET", f"/rooms/{q(room)}/state/m.room.topic/")
    assert topic["topic"] in {f"A{i}" for i in range(4)} | {f"B{i}" for i in range(4)}


async def _level_of(account: Account, room: str, user_id: str, level: int) -> bool:
    status, levels = await account.call("GET", f"/rooms/{q(room)}/state/m.room.power_levels/")
    return status == 200 and levels.get("users", {}).get(user_id) == level


async def _to_device_from(account: Account, sender: str) -> bool:
    answer = await account.sync()
    return any(
        e["sender"] == sender
        and e["type"] == "m.test.ping"
        and e["content"] == {"secret": "for bob"}
        for e in answer.get("to_device", {}).get("events", [])
    )


async def test_device_keys_of_the_other_servers_users(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    """/keys/query and /keys/claim of a user of B, asked of A: A asks B, and passes on
    exactly B's answer for B's user; a server that cannot be reached is a failure."""
    a, b = servers
    alice = await a.register("alice")
    bob = await b.register("bob")
    device = Device(bob.user_id, bob.device_id)
    await bob.ok(
        "POST",
        "/keys/upload",
        {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["k1"])},
    )
    queried = await alice.ok("POST", "/keys/query", {"device_keys": {bob.user_id: []}})
    assert (
        queried["device_keys"][bob.user_id][bob.device_id]["keys"] == (device.device_keys()["keys"])
    )
    assert queried["failures"] == {}
    claimed = await alice.ok(
        "POST",
        "/keys/claim",
        {"one_time_keys": {bob.user_id: {bob.device_id: "signed_curve25519"}}},
    )
    assert claimed["one_time_keys"] == {bob.user_id: {bob.device_id: device.one_time_keys(["k1"])}}
    # A server that is down: its users are a failure, the rest is answered.
    down = "localhost:1"
    queried = await alice.ok(
        "POST", "/keys/query", {"device_keys": {f"@x:{down}": [], alice.user_id: []}}
    )
    assert set(queried["failures"]) == {down}
    assert alice.user_id in queried["device_keys"]


async def test_encrypted_chat_across_servers_with_matrix_js_sdk(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    """matrix-js-sdk with its Rust crypto, Alice on A and Bob on B, in an encrypted room
    (created with Bob invited): each client queries the other server's user's device
    keys and claims a one-time key through its own server (/keys/query and /keys/claim
    asking the other server), shares the room key by to-device message over federation,
    and reads the other's message decrypted; A stored only ciphertext."""
    a, b = servers
    _require_rust_crypto()
    report = await run_script("e2e.mjs", a.url, b.url)
    assert report["encrypted"] is True
    assert "secret from alice" in report["bobRead"]
    assert "secret from bob" in report["aliceRead"]
    assert "m.room.message" not in report["types"]
    assert "m.room.encrypted" in report["types"]


def _require_rust_crypto() -> None:
    assert (JS_DIR / "node_modules" / "@matrix-org" / "matrix-sdk-crypto-wasm").is_dir(), (
        "matrix-js-sdk's Rust crypto is not installed: run `make setup`"
    )


async def test_rejecting_an_invite_and_knocking_across_servers(
    servers: tuple[FederatedServer, FederatedServer],
) -> None:
    """B's user rejects an invite to A's room (make_leave / send_leave through A) and
    knocks on another (make_knock / send_knock); both servers agree on each membership,
    and the knock, accepted by an invite, ends in a join."""
    a, b = servers
    details = _details(a, b)
    alice = await a.register("alice")
    bob = await b.register("bob")
    private = (await alice.ok("POST", "/createRoom", {"preset": "private_chat"}))["room_id"]
    await alice.ok("POST", f"/rooms/{q(private)}/invite", {"user_id": bob.user_id})
    await wait_for(lambda: _has_invite(bob, private), 60, "the invite on B", details=details)
    await bob.ok("POST", f"/rooms/{q(private)}/leave", {})
    assert await _membership(alice, private, bob.user_id) == "leave"
    left = (await bob.sync())["rooms"].get("leave", {})
    assert private in left

    knocked = (
        await alice.ok(
            "POST",
            "/createRoom",
            {
                "preset": "private_chat",
                "initial_state": [
                    {
                        "type": "m.room.join_rules",
                        "state_key": "",
                        "content": {"join_rule": "knock"},
                    }
                ],
            },
        )
    )["room_id"]
    await bob.ok("POST", f"/knock/{q(knocked)}?via={q(a.server_name)}", {"reason": "let me in"})
    assert await _membership(alice, knocked, bob.user_id) == "knock"
    await alice.ok("POST", f"/rooms/{q(knocked)}/invite", {"user_id": bob.user_id})
    await wait_for(lambda: _has_invite(bob, knocked), 60, "the knock's invite", details=details)
    await bob.ok("POST", f"/join/{q(knocked)}", {})
    assert await _membership(alice, knocked, bob.user_id) == "join"


async def _has_invite(account: Account, room: str) -> bool:
    answer = await account.sync()
    return room in answer["rooms"].get("invite", {})


async def _membership(account: Account, room: str, user_id: str) -> str | None:
    status, member = await account.call("GET", f"/rooms/{q(room)}/state/m.room.member/{q(user_id)}")
    return member.get("membership") if status == 200 else None
