"""Helpers for the federation sender's tests: a room engine with members on fake remote
servers, a recording transport that fails on demand, and an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roomstream.config import Config, parse_config
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.hashing import compute_event_id
from roomstream.events.room_versions import room_version
from roomstream.events.signing import load_or_create_signing_key
from roomstream.federation.sender import FederationSender
from roomstream.reading import read_side_participants
from roomstream.replication.commands import Command
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet

SERVER = "local.test"
ALICE = "@alice:local.test"


class Unreachable(Exception):
    """What the fake transport raises for a destination that is down (no ``status``)."""


class Refused(Exception):
    """A 4xx answer to the transaction itself."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@dataclass
class Sent:
    destination: str
    txn_id: str
    body: Mapping[str, Any]

    @property
    def event_ids(self) -> list[str]:
        return [pdu_event_id(p) for p in self.body["pdus"]]


def pdu_event_id(pdu: Mapping[str, Any]) -> str:
    """A room version 12 PDU's event ID (its reference hash: it carries none)."""
    return compute_event_id(pdu, room_version("12"))


@dataclass
class FakeTransport:
    """Records accepted transactions; ``down`` destinations fail; a ``gate`` holds one
    destination's transactions until it is set."""

    event_ids_of: Mapping[str, str] = field(default_factory=dict)
    accepted: list[Sent] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    refuse: dict[str, int] = field(default_factory=dict)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)

    async def send_transaction(
        self, destination: str, txn_id: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.attempts[destination] = self.attempts.get(destination, 0) + 1
        gate = self.gates.get(destination)
        if gate is not None:
            self.in_flight.add(destination)
            await gate.wait()
            self.in_flight.discard(destination)
        if destination in self.down:
            raise Unreachable(destination)
        if destination in self.refuse:
            raise Refused(self.refuse[destination])
        self.accepted.append(Sent(destination, txn_id, body))
        return {"pdus": {}}

    def pdus_to(self, destination: str) -> list[dict[str, Any]]:
        sent = [s for s in self.accepted if s.destination == destination]
        return [dict(p) for s in sent for p in s.body["pdus"]]

    def edus_to(self, destination: str) -> list[dict[str, Any]]:
        sent = [s for s in self.accepted if s.destination == destination]
        return [dict(e) for s in sent for e in s.body["edus"]]


@dataclass
class FakeClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class CommandLog:
    sent: list[tuple[Command, str]] = field(default_factory=list)

    def __call__(self, cmd: Command, instance: str) -> bool:
        self.sent.append((cmd, instance))
        return True


def sender_config(**raw: Any) -> Config:
    return parse_config({"server_name": SERVER, **raw})


async def open_engine(
    database: Database,
    tmp_path: Path,
    instance: str = "main",
    writers: Mapping[str, tuple[str, ...]] | None = None,
) -> RoomEngine:
    streams = await StreamSet.open(database, instance, dict(writers or {}))
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    return RoomEngine(
        database, streams, SERVER, instance, key, participants=read_side_participants()
    )


async def room_with_remote_members(
    engine: RoomEngine, tmp_path: Path, servers: list[str], name: str = "Lobby"
) -> str:
    """A public room Alice creates, joined by one user of each remote server."""
    room_id, _ = await engine.creator.create_room(
        ALICE, version="12", preset=RoomPreset.PUBLIC_CHAT, name=name
    )
    for server in servers:
        await remote_join(engine, tmp_path, room_id, server)
    return room_id


async def remote_join(engine: RoomEngine, tmp_path: Path, room_id: str, server: str) -> str:
    version, extremities, current = await engine.persister.get_room_state(room_id)
    auth = [current[("m.room.power_levels", "")], current[("m.room.join_rules", "")]]
    if not version.room_id_from_create_event:
        auth.append(current[("m.room.create", "")])
    prevs = await engine.store.get_events(sorted(extremities))
    user = f"@user:{server}"
    event = finalise_local_event(
        build_event_dict(
            version,
            event_type="m.room.member",
            sender=user,
            content={"membership": "join"},
            prev_events=sorted(extremities),
            auth_events=auth,
            depth=max(e.depth for e in prevs.values()) + 1,
            room_id=room_id,
            state_key=user,
            origin_server_ts=1_700_000_000_000,
        ),
        version,
        server,
        load_or_create_signing_key(tmp_path / server, server),
    )
    [persisted] = await engine.receive_pdus([event.raw], trust_unsigned=True)
    assert persisted.rejected_reason is None and not persisted.soft_failed
    return event.event_id


async def say(engine: RoomEngine, room_id: str, body: str) -> str:
    created = await engine.creator.create_event(
        room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": body}
    )
    return created.event.event_id


def start_sender(
    engine: RoomEngine,
    transport: FakeTransport,
    clock: FakeClock,
    config: Config | None = None,
    commands: CommandLog | None = None,
) -> FederationSender:
    return FederationSender(
        engine,
        config or sender_config(),
        transport,
        send_command=commands,
        clock=clock,
        jitter=lambda: 1.0,
    )
