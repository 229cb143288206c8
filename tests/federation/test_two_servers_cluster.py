"""Federation with a server that is a deployment of several processes (issue 22 §5).

Server A is one ``roomstream run`` on SQLite; server B is a cluster on PostgreSQL with
Redis replication (:class:`~tests.support.federation_servers.FederatedCluster`): events
writers ``w1`` and ``w2``, a federation sender ``fed_sender`` of its own, and ``main``,
which runs the federation listener and the Client-Server API Bob uses but writes no
events. Everything B receives about the room (the invite, the join's handshake, A's
messages) must be carried out by the room's writer, and Bob's join and messages too; the
federation sender sends what either writer persisted.

A user of A creates a room and invites a user of B, who joins; messages flow both ways,
typing and a receipt too; then both users set the topic at once, several times, and
both servers end with the same state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from roomstream.federation.certs import TestCertificateAuthority
from roomstream.replication.sharding import writer_for_room
from roomstream.storage import DatabaseConfig
from tests.support.federation_servers import Account, FederatedCluster, FederatedServer, q
from tests.support.wait import wait_for

#: Rounds of topics set on both servers at once.
TOPIC_ROUNDS = 4


@pytest.fixture
async def servers(
    tmp_path: Path, pg_database: str, redis_url: str
) -> AsyncIterator[tuple[FederatedServer, FederatedCluster]]:
    schema = f"fedcluster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    ca = TestCertificateAuthority()
    a = FederatedServer(
        tmp_path, "a", DatabaseConfig(engine="sqlite", path=str(tmp_path / "a.db")), ca
    )
    b = FederatedCluster(
        tmp_path, "b", DatabaseConfig(engine="postgres", dsn=pg_database, schema=schema), ca
    )
    try:
        await a.start()
        await b.start()
        yield a, b
    finally:
        await b.close()
        await a.close()


def _details(*servers: FederatedServer) -> Any:
    return lambda: "\n\n".join(f"== {s.label}\n{s.output()}" for s in servers)


async def test_a_cluster_federates_invite_join_messages_and_concurrent_state(
    servers: tuple[FederatedServer, FederatedCluster],
) -> None:
    a, b = servers
    details = _details(a, b)
    alice = await a.register("alice")
    bob = await b.register("bob")  # through main: not an events writer
    # Bob may set the topic too (power 50), for the concurrent state changes.
    levels = {"users": {bob.user_id: 50}}  # (alice: the creator, above every level)
    request = {"preset": "private_chat", "name": "Both", "power_level_content_override": levels}
    room = (await alice.ok("POST", "/createRoom", request))["room_id"]
    owner = writer_for_room(room, ["w1", "w2"])
    assert owner in ("w1", "w2")

    # The invite reaches B's listener (main), which hands it to the room's writer.
    await alice.ok("POST", f"/rooms/{q(room)}/invite", {"user_id": bob.user_id})
    invites = await wait_for(lambda: _invited_rooms(bob), 60, "bob's invite", details=details)
    assert room in invites

    # Bob joins through main; the join (and the room's state) is persisted by the owner.
    await bob.ok("POST", f"/join/{q(room)}", {})
    await wait_for(
        lambda: _same_state(alice, bob, room), 60, "the same state after the join", details=details
    )
    members = await alice.ok("GET", f"/rooms/{q(room)}/joined_members")
    assert set(members["joined"]) == {alice.user_id, bob.user_id}
    answer = await bob.ok("GET", f"/rooms/{q(room)}/joined_members")
    assert set(answer["joined"]) == {alice.user_id, bob.user_id}

    # Messages both ways: A's through main's /send to the owner; Bob's forwarded by main
    # to the owner, then sent by fed_sender.
    await alice.send(room, "hello bob")
    await wait_for(lambda: _has(bob, room, "hello bob"), 60, "A's message on B", details=details)
    await bob.send(room, "hello alice")
    await wait_for(
        lambda: _has(alice, room, "hello alice"), 60, "B's message on A", details=details
    )

    # Typing and a read receipt, B to A: written on main, sent by fed_sender.
    await bob.ok(
        "PUT", f"/rooms/{q(room)}/typing/{q(bob.user_id)}", {"typing": True, "timeout": 30000}
    )
    await wait_for(
        lambda: _ephemeral_on(alice, room, "m.typing", bob.user_id),
        60,
        "bob typing on A",
        details=details,
    )
    last = (await bob.messages(room))[-1]["event_id"]
    await bob.ok("POST", f"/rooms/{q(room)}/receipt/m.read/{q(last)}", {})
    await wait_for(
        lambda: _ephemeral_on(alice, room, "m.receipt", bob.user_id),
        60,
        "bob's receipt on A",
        details=details,
    )
    # And A to B: received by main's listener, shown by main.
    await alice.ok(
        "PUT", f"/rooms/{q(room)}/typing/{q(alice.user_id)}", {"typing": True, "timeout": 30000}
    )
    await wait_for(
        lambda: _ephemeral_on(bob, room, "m.typing", alice.user_id),
        60,
        "alice typing on B",
        details=details,
    )

    # Both set the topic at once, several times: each server resolves the forked state,
    # and both end with the same (once each holds every topic event of the other).
    topics: list[str] = []
    for i in range(TOPIC_ROUNDS):
        pair = [f"alice's topic {i}", f"bob's topic {i}"]
        topics += pair
        await asyncio.gather(
            alice.ok("PUT", f"/rooms/{q(room)}/state/m.room.topic", {"topic": pair[0]}),
            bob.ok("PUT", f"/rooms/{q(room)}/state/m.room.topic", {"topic": pair[1]}),
        )
    for account in (alice, bob):
        await wait_for(
            lambda account=account: _has_topics(account, room, topics),
            90,
            f"every topic on {account.server.label}",
            details=details,
        )
    await wait_for(
        lambda: _same_state(alice, bob, room), 60, "the same state on both", details=details
    )
    topic_on_a = await alice.ok("GET", f"/rooms/{q(room)}/state/m.room.topic")
    topic_on_b = await bob.ok("GET", f"/rooms/{q(room)}/state/m.room.topic")
    assert topic_on_a == topic_on_b
    assert topic_on_a["topic"] in topics

    # After the resolution, the room still works both ways.
    await bob.send(room, "after the topics")
    await wait_for(
        lambda: _has(alice, room, "after the topics"), 60, "B's last message", details=details
    )
    assert (await alice.bodies(room))[-3:] == ["hello bob", "hello alice", "after the topics"]
    assert await bob.bodies(room) == await alice.bodies(room)


async def _invited_rooms(account: Account) -> dict[str, Any]:
    return dict((await account.sync())["rooms"].get("invite", {}))


async def _same_state(one: Account, other: Account, room: str) -> bool:
    status, _ = await other.call("GET", f"/rooms/{q(room)}/state")
    return status == 200 and await one.state(room) == await other.state(room)


async def _has(account: Account, room: str, body: str) -> bool:
    return body in await account.bodies(room)


async def _has_topics(account: Account, room: str, topics: list[str]) -> bool:
    events = await account.messages(room, limit=200)
    seen = {e["content"].get("topic") for e in events if e["type"] == "m.room.topic"}
    return set(topics) <= seen


async def _ephemeral_on(account: Account, room: str, event_type: str, user_id: str) -> bool:
    """Whether an incremental sync of ``account`` shows ``user_id`` in an ephemeral event
    of ``event_type`` (typing: among the user IDs; a receipt: as a reader)."""
    answer = await account.sync()
    joined = answer["rooms"].get("join", {}).get(room, {})
    for event in joined.get("ephemeral", {}).get("events", []):
        if event["type"] != event_type:
            continue
        if event_type == "m.typing" and user_id in event["content"]["user_ids"]:
            return True
        if event_type == "m.receipt" and any(
            user_id in by_type.get("m.read", {}) for by_type in event["content"].values()
        ):
            return True
    return False


async def test_a_stopped_cluster_catches_up_once_restarted(
    servers: tuple[FederatedServer, FederatedCluster],
) -> None:
    """Every process of B stops while A keeps sending; restarted, B has each message
    exactly once (A's sender catches the destination up by room)."""
    a, b = servers
    details = _details(a, b)
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = (await alice.ok("POST", "/createRoom", {"preset": "public_chat"}))["room_id"]
    await bob.ok("POST", f"/join/{q(room)}?via={q(a.server_name)}", {})
    await alice.send(room, "before")
    await wait_for(lambda: _has(bob, room, "before"), 60, "A's message on B", details=details)
    await b.stop()
    away = [f"while away {i}" for i in range(5)]
    for body in away:
        await alice.send(room, body)
    await b.start()

    async def caught_up() -> bool:
        bodies = await bob.bodies(room)
        return bodies[bodies.index("before") :] == ["before", *away]

    await wait_for(caught_up, 120, "B caught up, each message once", details=details)


async def test_a_cluster_back_paginates_history_from_before_the_join(
    servers: tuple[FederatedServer, FederatedCluster],
) -> None:
    """Under ``shared`` history, Bob (on B's main, which writes no events) paginating
    back past his join gets A's messages from before it, each once (backfill)."""
    a, b = servers
    alice = await a.register("alice")
    bob = await b.register("bob")
    room = (await alice.ok("POST", "/createRoom", {"preset": "public_chat"}))["room_id"]
    before = [f"before {i}" for i in range(3)]
    for body in before:
        await alice.send(room, body)
    await bob.ok("POST", f"/join/{q(room)}?via={q(a.server_name)}", {})
    assert await bob.bodies(room) == before
