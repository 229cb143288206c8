"""EDUs through the federation sender (both engines): typing, receipts, presence and
to-device messages of local users reach the servers that share the room (or own the
device), and nothing of remote users or private receipts leaves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from roomstream.client.presence import UserPresence
from roomstream.client.presence_store import PresenceStore
from roomstream.client.userdata import UserData
from roomstream.e2e import device_lists
from roomstream.federation.sender import FederationSender
from roomstream.replication.commands import RemoteServerUpCommand
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, Transaction
from tests.federation.sender_support import (
    ALICE,
    FakeClock,
    FakeTransport,
    open_engine,
    room_with_remote_members,
    say,
    start_sender,
)
from tests.support.wait import wait_for

R1 = "one.test"
R2 = "two.test"


@pytest.fixture
async def engine(database: Database, tmp_path: Path) -> AsyncIterator[RoomEngine]:
    yield await open_engine(database, tmp_path)


@pytest.fixture
async def setup(
    engine: RoomEngine, tmp_path: Path
) -> AsyncIterator[tuple[FederationSender, FakeTransport, str, str]]:
    """Room A has a member on R1; room B members on R1 and R2; the sender is running."""
    room_a = await room_with_remote_members(engine, tmp_path, [R1], "A")
    room_b = await room_with_remote_members(engine, tmp_path, [R1, R2], "B")
    transport = FakeTransport()
    sender = start_sender(engine, transport, FakeClock())
    await sender.start()
    yield sender, transport, room_a, room_b
    await sender.stop()


def of_type(transport: FakeTransport, destination: str, edu_type: str) -> list[dict[str, Any]]:
    return [e for e in transport.edus_to(destination) if e["edu_type"] == edu_type]


async def test_typing_goes_to_the_rooms_servers(
    setup: tuple[FederationSender, FakeTransport, str, str],
) -> None:
    sender, transport, room_a, room_b = setup
    remote_user = f"@user:{R1}"
    sender.on_replicated_rows("typing", "main", 1, [(room_a, [ALICE, remote_user])])
    await wait_for(lambda: of_type(transport, R1, "m.typing"), what="typing on")
    [edu] = of_type(transport, R1, "m.typing")
    assert edu["content"] == {"room_id": room_a, "user_id": ALICE, "typing": True}
    assert edu["origin"] == "local.test" and edu["destination"] == R1
    sender.on_replicated_rows("typing", "main", 2, [(room_a, [remote_user])])
    await wait_for(lambda: len(of_type(transport, R1, "m.typing")) == 2, what="typing off")
    assert of_type(transport, R1, "m.typing")[1]["content"]["typing"] is False
    # R2 shares only room B: it heard nothing of room A.
    sender.on_replicated_rows("typing", "main", 3, [(room_b, [ALICE])])
    await wait_for(lambda: of_type(transport, R2, "m.typing"), what="typing in B")
    assert [e["content"]["room_id"] for e in of_type(transport, R2, "m.typing")] == [room_b]


async def test_public_receipts_of_local_users_only(
    engine: RoomEngine, setup: tuple[FederationSender, FakeTransport, str, str]
) -> None:
    _, transport, room_a, room_b = setup
    userdata = UserData(engine.streams, "main")
    message = await say(engine, room_b, "hello")
    await userdata.put_receipt(room_b, "m.read.private", ALICE, message, None)
    await userdata.put_receipt(room_b, "m.read", f"@user:{R1}", message, None)
    await userdata.put_receipt(room_b, "m.read", ALICE, message, None)
    for remote in (R1, R2):
        await wait_for(lambda r=remote: of_type(transport, r, "m.receipt"), what=remote)
        [edu] = of_type(transport, remote, "m.receipt")
        receipt = edu["content"][room_b]["m.read"][ALICE]
        assert receipt["event_ids"] == [message]
        assert isinstance(receipt["data"]["ts"], int)
    del room_a


async def test_presence_to_servers_sharing_a_room(
    engine: RoomEngine, setup: tuple[FederationSender, FakeTransport, str, str]
) -> None:
    _, transport, _, _ = setup
    store = PresenceStore(engine.db, engine.streams.generator("presence"))
    lonely = "@lonely:local.test"
    await store.persist(
        [
            UserPresence(lonely, "online", 1, 0, 0, None, True),
            UserPresence(f"@user:{R1}", "online", 1, 0, 0, None, True),
            UserPresence(ALICE, "online", 1_799_999_999_000, 0, 0, "busy", True),
        ]
    )
    for remote in (R1, R2):
        await wait_for(lambda r=remote: of_type(transport, r, "m.presence"), what=remote)
        [edu] = of_type(transport, remote, "m.presence")
        assert edu["content"] == {
            "push": [
                {
                    "user_id": ALICE,
                    "presence": "online",
                    "last_active_ago": 1000,
                    "status_msg": "busy",
                    "currently_active": True,
                }
            ]
        }


async def test_to_device_messages_to_their_destination(
    engine: RoomEngine, setup: tuple[FederationSender, FakeTransport, str, str]
) -> None:
    _, transport, _, _ = setup
    content = {
        "sender": ALICE,
        "type": "m.room_key_request",
        "message_id": "msg1",
        "messages": {f"@user:{R2}": {"DEVICE": {"action": "request"}}},
    }

    def txn(t: Transaction, ids: list[int]) -> None:
        t.execute(
            "INSERT INTO device_federation_outbox (stream_id, instance_name, destination,"
            " message_id, messages_json) VALUES (?, ?, ?, ?, ?)",
            (ids[0], "main", R2, "msg1", orjson.dumps(content).decode()),
        )

    await engine.streams.generator("to_device").run_with_ids("test_outbox", 1, txn)
    await wait_for(lambda: of_type(transport, R2, "m.direct_to_device"), what="to-device")
    [edu] = of_type(transport, R2, "m.direct_to_device")
    assert edu["content"] == content
    assert of_type(transport, R1, "m.direct_to_device") == []


async def test_device_list_updates_to_servers_sharing_a_room(
    engine: RoomEngine, setup: tuple[FederationSender, FakeTransport, str, str]
) -> None:
    _, transport, _, _ = setup
    keys = {"user_id": ALICE, "device_id": "PHONE", "algorithms": [], "keys": {}}

    async def change(*, add: str | None = None, remove: str | None = None) -> None:
        def txn(t: Transaction, ids: list[int]) -> None:
            if add is not None:
                t.execute(
                    "INSERT INTO devices (user_id, device_id, display_name, created_ts)"
                    " VALUES (?, ?, ?, 0)",
                    (ALICE, add, f"{add} name"),
                )
            if remove is not None:
                t.execute(
                    "DELETE FROM devices WHERE user_id = ? AND device_id = ?", (ALICE, remove)
                )
            device_lists.append_txn(t, ids[0], "main", [ALICE, "@bob:one.test"])

        await engine.streams.generator("device_lists").run_with_ids("test_devices", 1, txn)

    def updates(remote: str) -> list[dict[str, Any]]:
        return [e["content"] for e in of_type(transport, remote, "m.device_list_update")]

    await engine.db.run_interaction(
        "test_keys",
        lambda t: t.execute(
            "INSERT INTO e2e_device_keys (user_id, device_id, key_json) VALUES (?, ?, ?)",
            (ALICE, "PHONE", orjson.dumps(keys).decode()),
        ),
    )
    await change(add="PHONE")
    for remote in (R1, R2):
        await wait_for(lambda r=remote: updates(r), what=remote)
        [update] = updates(remote)
        assert update["user_id"] == ALICE and update["device_id"] == "PHONE"
        assert update["deleted"] is False and update["prev_id"] == []
        assert update["device_display_name"] == "PHONE name"
        assert update["keys"]["device_id"] == "PHONE"
    await change(add="LAPTOP", remove="PHONE")
    await wait_for(lambda: len(updates(R2)) == 3, what="second change")
    second = {(u["device_id"], u["deleted"]) for u in updates(R2)[1:]}
    assert second == {("LAPTOP", False), ("PHONE", True)}


async def put_to_device(engine: RoomEngine, destination: str, message_id: str) -> dict[str, Any]:
    content = {
        "sender": ALICE,
        "type": "m.room_key_request",
        "message_id": message_id,
        "messages": {f"@user:{destination}": {"DEVICE": {"n": message_id}}},
    }

    def txn(t: Transaction, ids: list[int]) -> None:
        t.execute(
            "INSERT INTO device_federation_outbox (stream_id, instance_name, destination,"
            " message_id, messages_json) VALUES (?, ?, ?, ?, ?)",
            (ids[0], "main", destination, message_id, orjson.dumps(content).decode()),
        )

    await engine.streams.generator("to_device").run_with_ids("test_outbox", 1, txn)
    return content


async def test_to_device_messages_survive_a_restart_and_are_not_sent_twice(
    engine: RoomEngine, tmp_path: Path
) -> None:
    await room_with_remote_members(engine, tmp_path, [R1])
    transport = FakeTransport(down={R1})
    first = start_sender(engine, transport, FakeClock())
    await first.start()
    sent = [await put_to_device(engine, R1, f"m{i}") for i in range(2)]
    await wait_for(lambda: transport.attempts.get(R1), what="tried")
    await wait_for(lambda: first.queues[R1].pending_edu_count == 2, what="both queued")
    await first.stop()
    transport.down.clear()

    def delivered() -> list[Any]:
        return [e["content"] for e in of_type(transport, R1, "m.direct_to_device")]

    for _ in range(2):  # the second restart finds them accepted: nothing again
        sender = start_sender(engine, transport, FakeClock())
        await sender.start()
        sender.on_command(RemoteServerUpCommand(R1))  # past the stored back-off
        await wait_for(lambda: delivered() == sent, what="delivered once")
        await wait_for(lambda s=sender: s.queues[R1].pending_edu_count == 0, what="idle")
        await sender.stop()
    assert delivered() == sent
