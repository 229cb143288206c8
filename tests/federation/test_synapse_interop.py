"""roomstream and Synapse 1.163 (from PyPI) federating on loopback (issue 22 §5).

Synapse runs with a TLS federation listener whose certificate comes from the test's CA
(roomstream verifies it), ``federation_verify_certificates: false`` on its side (it cannot
know the test CA) and ``ip_range_blacklist: []``. Both servers are named by IP literal
with their federation port, so each finds the other without ``.well-known`` or DNS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.federation.certs import TestCertificateAuthority
from roomstream.storage import DatabaseConfig
from tests.support.federation_servers import Account, FederatedServer, q
from tests.support.synapse_peer import SynapsePeer, synapse_peer
from tests.support.wait import wait_for


@pytest.fixture
async def peers(tmp_path: Path) -> AsyncIterator[tuple[FederatedServer, SynapsePeer]]:
    ca = TestCertificateAuthority()
    pair = ca.issue("127.0.0.1")
    (tmp_path / "syn.crt").write_bytes(pair.certificate_pem)
    (tmp_path / "syn.key").write_bytes(pair.private_key_pem)
    ours = FederatedServer(
        tmp_path,
        "rs",
        DatabaseConfig(engine="sqlite", path=str(tmp_path / "rs.db")),
        ca,
        host="127.0.0.1",
    )
    async with synapse_peer(
        tmp_path / "synapse", tmp_path / "syn.crt", tmp_path / "syn.key"
    ) as syn:
        try:
            await ours.start()
            yield ours, syn
        finally:
            await ours.close()


class SynapseAccount:
    def __init__(self, peer: SynapsePeer, user_id: str, token: str) -> None:
        self.peer, self.user_id, self.token = peer, user_id, token
        self.txn = 0

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        return await self.peer.ok(method, path, body, token=self.token)

    async def send(self, room_id: str, body: str) -> str:
        self.txn += 1
        path = f"/rooms/{q(room_id)}/send/m.room.message/s{self.txn}"
        return str((await self.ok("PUT", path, {"msgtype": "m.text", "body": body}))["event_id"])

    async def bodies(self, room_id: str) -> list[str]:
        answer = await self.ok("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=100")
        return [
            e["content"]["body"] for e in reversed(answer["chunk"]) if e["type"] == "m.room.message"
        ]

    async def state(self, room_id: str) -> dict[tuple[str, str], str]:
        events = await self.ok("GET", f"/rooms/{q(room_id)}/state")
        return {(e["type"], e["state_key"]): e["event_id"] for e in events}


async def _both_see(
    ours: Account, theirs: SynapseAccount, room: str, body: str, details: Any
) -> None:
    async def seen() -> bool:
        return body in await ours.bodies(room) and body in await theirs.bodies(room)

    await wait_for(seen, 90, f"{body!r} on both servers", details=details)


async def _states_agree(ours: Account, theirs: SynapseAccount, room: str, details: Any) -> None:
    async def agree() -> bool:
        return await ours.state(room) == await theirs.state(room)

    await wait_for(agree, 90, "the same room state on both servers", details=details)


async def test_a_synapse_user_joins_a_roomstream_room(
    peers: tuple[FederatedServer, SynapsePeer],
) -> None:
    ours, syn = peers
    details = lambda: f"== roomstream\n{ours.output()}\n== synapse\n{syn.log_tail()}"  # noqa: E731
    alice = await ours.register("alice")
    carol = SynapseAccount(syn, *await syn.register("carol"))
    room = (await alice.ok("POST", "/createRoom", {"preset": "public_chat", "name": "Ours"}))[
        "room_id"
    ]
    await alice.send(room, "before carol")
    await carol.ok("POST", f"/join/{q(room)}?server_name={q(ours.server_name)}", {})
    await _states_agree(alice, carol, room, details)
    await alice.send(room, "from roomstream")
    await _both_see(alice, carol, room, "from roomstream", details)
    await carol.send(room, "from synapse")
    await _both_see(alice, carol, room, "from synapse", details)
    await _states_agree(alice, carol, room, details)


async def test_a_roomstream_user_joins_a_synapse_room(
    peers: tuple[FederatedServer, SynapsePeer],
) -> None:
    ours, syn = peers
    details = lambda: f"== roomstream\n{ours.output()}\n== synapse\n{syn.log_tail()}"  # noqa: E731
    alice = await ours.register("alice")
    carol = SynapseAccount(syn, *await syn.register("carol"))
    room = (await carol.ok("POST", "/createRoom", {"preset": "public_chat", "name": "Theirs"}))[
        "room_id"
    ]
    await carol.send(room, "before alice")
    await alice.ok("POST", f"/join/{q(room)}?via={q(syn.server_name)}", {})
    await _states_agree(alice, carol, room, details)
    await carol.send(room, "from synapse")
    await _both_see(alice, carol, room, "from synapse", details)
    await alice.send(room, "from roomstream")
    await _both_see(alice, carol, room, "from roomstream", details)
    await _states_agree(alice, carol, room, details)
    # Back-pagination past the join: roomstream backfills the room's history from
    # Synapse (shared history: the message from before the join is visible), in order.
    assert await alice.bodies(room) == await carol.bodies(room)
    assert (await alice.bodies(room))[0] == "before alice"
