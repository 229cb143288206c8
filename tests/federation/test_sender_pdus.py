"""The federation sender with real storage (both engines) and a fake transport: local
events reach every server in the room in order; a failing destination backs off (the clock
is injected) while the others carry on, then catches up by room; a restart sends nothing
twice and misses nothing; REMOTE_SERVER_UP resets the back-off; sharding partitions the
destinations; FEDERATION_ACK reports the position."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roomstream.federation.destination_queue import BackoffPolicy
from roomstream.federation.sender import FederationSender, sender_for
from roomstream.replication.commands import FederationAckCommand, RemoteServerUpCommand
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from tests.federation.sender_support import (
    ALICE,
    CommandLog,
    FakeClock,
    FakeTransport,
    open_engine,
    pdu_event_id,
    remote_join,
    room_with_remote_members,
    say,
    sender_config,
    start_sender,
)
from tests.support.wait import wait_for

R1 = "one.test"
R2 = "two.test"
FIRST_BACKOFF_S = BackoffPolicy().first_interval_ms / 1000


@pytest.fixture
async def engine(database: Database, tmp_path: Path) -> AsyncIterator[RoomEngine]:
    yield await open_engine(database, tmp_path)


@pytest.fixture
async def running() -> AsyncIterator[list[FederationSender]]:
    senders: list[FederationSender] = []
    yield senders
    for sender in senders:
        await sender.stop()


def event_ids(transport: FakeTransport, destination: str) -> list[str]:
    return [pdu_event_id(p) for p in transport.pdus_to(destination)]


async def test_messages_reach_each_destination_in_order(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1, R2])
    transport, clock = FakeTransport(), FakeClock()
    sender = start_sender(engine, transport, clock)
    running.append(sender)
    await sender.start()
    sent = [await say(engine, room, f"m{i}") for i in range(5)]
    for remote in (R1, R2):
        await wait_for(lambda r=remote: len(event_ids(transport, r)) == 5, what=remote)
        assert event_ids(transport, remote) == sent
    # History from before the sender's first start (the joins) is not replayed.
    for accepted in transport.accepted:
        assert accepted.body["origin"] == "local.test"
        assert accepted.body["edus"] == []
    txn_ids = [(s.destination, s.txn_id) for s in transport.accepted]
    assert len(set(txn_ids)) == len(txn_ids)
    assert local_sender_only(transport)


def local_sender_only(transport: FakeTransport) -> bool:
    return all(p["sender"] == ALICE for s in transport.accepted for p in s.body["pdus"])


async def test_failing_destination_backs_off_then_catches_up_by_room(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room_a = await room_with_remote_members(engine, tmp_path, [R1, R2], "A")
    room_b = await room_with_remote_members(engine, tmp_path, [R1, R2], "B")
    transport, clock = FakeTransport(down={R2}), FakeClock()
    commands = CommandLog()
    sender = start_sender(engine, transport, clock, commands=commands)
    running.append(sender)
    await sender.start()
    m1 = await say(engine, room_a, "m1")
    await wait_for(lambda: sender.queues.get(R2) and sender.queues[R2].retry.retry_interval)
    assert sender.queues[R2].retry.retry_interval == FIRST_BACKOFF_S * 1000
    m2 = await say(engine, room_a, "m2")
    m3 = await say(engine, room_b, "m3")
    m4 = await say(engine, room_a, "m4")
    # The healthy destination is unaffected.
    await wait_for(lambda: event_ids(transport, R1) == [m1, m2, m3, m4], what="R1 all")
    # The failing one was tried once and waits for its back-off (the clock stands still).
    assert transport.attempts[R2] == 1
    sender.retry_due()
    await wait_for(lambda: sender.queues[R2].pending_pdu_count == 0)
    assert transport.attempts[R2] == 1
    # Back up, and the back-off has passed: each room's newest event, in stream order.
    transport.down.clear()
    clock.now += FIRST_BACKOFF_S
    sender.retry_due()
    await wait_for(lambda: event_ids(transport, R2) == [m3, m4], what="catch-up")
    # The remote fetches m1 and m2 with get_missing_events: m4's prev event is m2.
    m4_pdu = transport.pdus_to(R2)[-1]
    assert m4_pdu["prev_events"] == [m2]
    # Announced once the recovery is recorded.
    up = [(RemoteServerUpCommand(R2), "main")]
    await wait_for(lambda: commands.sent == up, what="REMOTE_SERVER_UP")
    await wait_for(lambda: not sender.queues[R2].catching_up, what="live again")
    m5 = await say(engine, room_b, "m5")
    await wait_for(lambda: event_ids(transport, R2) == [m3, m4, m5], what="live after catch-up")
    assert event_ids(transport, R1) == [m1, m2, m3, m4, m5]


async def test_remote_server_up_resets_the_backoff(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1])
    transport, clock = FakeTransport(down={R1}), FakeClock()
    sender = start_sender(engine, transport, clock)
    running.append(sender)
    await sender.start()
    m1 = await say(engine, room, "m1")
    await wait_for(lambda: sender.queues.get(R1) and sender.queues[R1].retry.retry_interval)
    transport.down.clear()
    sender.on_command(RemoteServerUpCommand("elsewhere.test"))  # not ours: nothing happens
    assert transport.attempts[R1] == 1
    sender.on_command(RemoteServerUpCommand(R1))  # no clock change needed
    await wait_for(lambda: event_ids(transport, R1) == [m1], what="retried at once")
    assert sender.queues[R1].retry.retry_interval == 0


async def test_backoff_is_persisted_across_restarts(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1])
    transport, clock = FakeTransport(down={R1}), FakeClock()
    first = start_sender(engine, transport, clock)
    await first.start()
    m1 = await say(engine, room, "m1")
    await wait_for(lambda: first.queues.get(R1) and first.queues[R1].retry.retry_interval)
    await first.stop()
    transport.down.clear()
    second = start_sender(engine, transport, clock)
    running.append(second)
    await second.start()
    # Still backing off after the restart, and marked for catch-up.
    assert second.queues[R1].catching_up
    assert second.queues[R1].retry.retry_interval == FIRST_BACKOFF_S * 1000
    clock.now += FIRST_BACKOFF_S
    second.retry_due()
    await wait_for(lambda: event_ids(transport, R1) == [m1], what="caught up after restart")


async def test_restart_sends_nothing_twice_and_misses_nothing(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1, R2])
    transport, clock = FakeTransport(), FakeClock()
    first = start_sender(engine, transport, clock)
    await first.start()
    before = [await say(engine, room, f"a{i}") for i in range(3)]
    for remote in (R1, R2):
        await wait_for(lambda r=remote: event_ids(transport, r) == before, what=remote)
    # Stop mid-stream: R1's next transaction is in flight, more events are queued.
    gate = transport.gates[R1] = asyncio.Event()
    b0 = await say(engine, room, "b0")
    await wait_for(lambda: R1 in transport.in_flight, what="in flight")
    b1 = await say(engine, room, "b1")
    b2 = await say(engine, room, "b2")
    await wait_for(lambda: first.queues[R1].pending_pdu_count == 3, what="queued")
    await wait_for(lambda: event_ids(transport, R2)[-3:] == [b0, b1, b2], what="R2")
    stopping = asyncio.create_task(first.stop())
    gate.set()  # the transaction in flight completes; stop() waits for it
    await stopping
    assert event_ids(transport, R1) == [*before, b0]
    # While no sender runs, more events.
    c0 = await say(engine, room, "c0")
    second = start_sender(engine, transport, clock)
    running.append(second)
    await second.start()
    c1 = await say(engine, room, "c1")
    # R1 missed b1, b2 (queued, never sent): it gets the room's newest event by catch-up
    # and fetches the rest by get_missing_events; R2 had everything sent.
    await wait_for(lambda: event_ids(transport, R1)[-1:] == [c1], what="R1 caught up")
    await wait_for(lambda: event_ids(transport, R2)[-1:] == [c1], what="R2 live")
    every = [*before, b0, b1, b2, c0, c1]
    for remote in (R1, R2):
        got = event_ids(transport, remote)
        assert len(got) == len(set(got)), f"{remote} got an event twice: {got}"
        assert got == sorted(got, key=every.index), "out of order"
        # Nothing missed: each event was sent, or a later one of the room was (whose
        # prev_events lead back to it).
        last_sent = max(every.index(e) for e in got)
        assert last_sent == len(every) - 1
    assert event_ids(transport, R2) == every


async def test_refused_transaction_is_not_retried(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1])
    transport, clock = FakeTransport(refuse={R1: 400}), FakeClock()
    sender = start_sender(engine, transport, clock)
    running.append(sender)
    await sender.start()
    await say(engine, room, "m1")
    await wait_for(lambda: transport.attempts.get(R1) == 1)
    del transport.refuse[R1]
    m2 = await say(engine, room, "m2")
    await wait_for(lambda: event_ids(transport, R1) == [m2], what="next one sent, no back-off")
    assert transport.attempts[R1] == 2


async def test_destination_joining_later_gets_events_from_its_join_on(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    room = await room_with_remote_members(engine, tmp_path, [R1])
    transport, clock = FakeTransport(), FakeClock()
    sender = start_sender(engine, transport, clock)
    running.append(sender)
    await sender.start()
    m1 = await say(engine, room, "m1")
    await wait_for(lambda: event_ids(transport, R1) == [m1])
    await remote_join(engine, tmp_path, room, R2)
    m2 = await say(engine, room, "m2")
    await wait_for(lambda: event_ids(transport, R2) == [m2], what="R2 after joining")
    await wait_for(lambda: event_ids(transport, R1) == [m1, m2])
    # The remote join itself is not sent anywhere: its origin sends it.
    assert all(p["sender"] == ALICE for s in transport.accepted for p in s.body["pdus"])


async def test_sharded_senders_partition_destinations_and_ack(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    instances = ["fed1", "fed2"]
    # Remote names chosen (deterministically) so that each sender owns some.
    candidates = [f"r{i}.test" for i in range(40)]
    remotes = [next(c for c in candidates if sender_for(c, instances) == i) for i in instances]
    remotes += [next(c for c in candidates if c not in remotes)]
    room = await room_with_remote_members(engine, tmp_path, remotes)
    raw = {
        "instances": {"main": {}, "fed1": {}, "fed2": {}},
        "federation_sender_instances": instances,
    }
    transports = {name: FakeTransport() for name in instances}
    logs = {name: CommandLog() for name in instances}
    clock = FakeClock()
    for name in instances:
        config = sender_config(instance_name=name, **raw)
        sender = start_sender(engine, transports[name], clock, config, logs[name])
        running.append(sender)
        await sender.start()
    m1 = await say(engine, room, "m1")
    for remote in remotes:
        owner = sender_for(remote, instances)
        await wait_for(lambda r=remote, o=owner: event_ids(transports[o], r) == [m1], what=remote)
    for name in instances:
        got = {s.destination for s in transports[name].accepted}
        assert got == {r for r in remotes if sender_for(r, instances) == name}
        # FEDERATION_ACK <instance> <events position> towards main.
        acks = [c for c, to in logs[name].sent if isinstance(c, FederationAckCommand)]
        assert acks and all(to == "main" for c, to in logs[name].sent)
        assert acks[-1].instance_name == name
        position = engine.streams.generator("events").get_linear_position()
        await wait_for(
            lambda n=name, p=position: (
                [c for c, _ in logs[n].sent if isinstance(c, FederationAckCommand)][-1].token == p
            ),
            what="ack of the position",
        )


async def test_kicked_and_rescinded_invitee_servers_hear_of_it(
    engine: RoomEngine, tmp_path: Path, running: list[FederationSender]
) -> None:
    r3 = "three.test"
    room = await room_with_remote_members(engine, tmp_path, [R1, R2])
    transport, clock = FakeTransport(), FakeClock()
    sender = start_sender(engine, transport, clock)
    running.append(sender)
    await sender.start()
    creator = engine.creator

    async def invitee_server_accepts(event: Any, stripped: Any) -> Any:
        return event  # (what /invite does is tested in test_remote_join.py)

    creator.remote_invite = invitee_server_accepts
    invitee = f"@user:{r3}"
    invite = await creator.create_event(
        room, ALICE, "m.room.member", {"membership": "invite"}, state_key=invitee
    )
    rescind = await creator.create_event(
        room, ALICE, "m.room.member", {"membership": "leave"}, state_key=invitee
    )
    kick = await creator.create_event(
        room, ALICE, "m.room.member", {"membership": "leave"}, state_key=f"@user:{R2}"
    )
    after = await say(engine, room, "after the kick")
    ids = [e.event.event_id for e in (invite, rescind, kick)]
    # The invite reaches the invitee by /invite, not through the sender; the rescinding
    # leave does go to its server. The kicked server hears of its kick, then nothing.
    await wait_for(lambda: event_ids(transport, R1) == [*ids, after], what="R1")
    await wait_for(lambda: event_ids(transport, r3) == [ids[1]], what="invitee's server")
    await wait_for(lambda: event_ids(transport, R2) == ids, what="kicked server")
    # R1 has the last event, so it was planned for every destination already: none for R2.
    queue = sender.queues[R2]
    await wait_for(lambda: not queue.in_flight, what="R2 idle")
    assert queue.pending_pdu_count == 0 and event_ids(transport, R2) == ids


async def test_two_events_writers_merged_in_stream_order(
    database: Database, tmp_path: Path, running: list[FederationSender]
) -> None:
    writers = {"events": ("w1", "w2")}
    w1 = await open_engine(database, tmp_path, "w1", writers)
    w2 = await open_engine(database, tmp_path, "w2", writers)
    room_a = await room_with_remote_members(w1, tmp_path, [R1], "A")
    room_b = await room_with_remote_members(w2, tmp_path, [R1], "B")
    on_w1, on_w2 = w1.streams.generator("events"), w2.streams.generator("events")

    def replicate() -> None:
        """What replication does between the two: each hears the other's position (an
        idle writer's own position moves up to what it has seen allocated), then w1
        tells its listeners."""
        on_w2.advance("w1", on_w1.get_position("w1"))
        on_w1.advance("w2", on_w2.get_position("w2"))
        sender.on_replicated_position("events", "w2", on_w1.get_position("w2"))

    config = sender_config(
        instance_name="w1",
        instances={"w1": {}, "w2": {}},
        stream_writers={"events": ["w1", "w2"]},
        federation_sender_instances=["w1"],
    )
    transport = FakeTransport()
    sender = start_sender(w1, transport, FakeClock(), config)
    replicate()
    running.append(sender)
    await sender.start()
    a1 = await say(w1, room_a, "a1")
    replicate()
    await wait_for(lambda: event_ids(transport, R1) == [a1], what="a1")
    b1 = await say(w2, room_b, "b1")
    a2 = await say(w1, room_a, "a2")
    # a2 is past the linear position until w1 hears that w2 has nothing in flight below
    # it; then b1 (written first) goes out first, though a2 is w1's own.
    assert on_w1.get_linear_position() < on_w1.get_position("w1")
    replicate()
    await wait_for(lambda: event_ids(transport, R1) == [a1, b1, a2], what="merged")
    b2 = await say(w2, room_b, "b2")
    replicate()
    await wait_for(lambda: event_ids(transport, R1) == [a1, b1, a2, b2], what="w2 alone")
