"""Room-engine helpers: a remote server's signed events, and a public room on the local
server that a remote user joins (tests/rooms/conftest.py keeps the fixtures)."""

from __future__ import annotations

from typing import Any

from signedjson.types import SigningKey

from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.hashing import encode_base64
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion
from roomstream.events.signing import get_verify_key
from roomstream.rooms.engine import RoomEngine

SERVER = "local.test"


REMOTE = "remote.test"


def verify_key_base64(key: SigningKey) -> str:
    """The public half of ``key`` as ``roomstream keys add`` takes it."""
    return encode_base64(get_verify_key(key).encode())


def remote_event(
    key: SigningKey,
    version: RoomVersion,
    room_id: str,
    sender: str,
    event_type: str,
    content: dict[str, Any],
    prev_events: list[str],
    auth_events: list[str],
    depth: int,
    state_key: str | None = None,
    origin_server_ts: int = 1_700_000_000_000,
) -> Event:
    """An event as another server would have made and signed it."""
    return finalise_local_event(
        build_event_dict(
            version,
            event_type=event_type,
            sender=sender,
            content=content,
            prev_events=prev_events,
            auth_events=auth_events,
            depth=depth,
            room_id=room_id,
            state_key=state_key,
            origin_server_ts=origin_server_ts,
        ),
        version,
        REMOTE,
        key,
    )


ALICE = "@alice:local.test"


BOB = "@bob:remote.test"


async def public_room(engine: RoomEngine, version: str = "12") -> str:
    from roomstream.rooms.creation import RoomPreset

    room_id, _ = await engine.creator.create_room(
        ALICE, version=version, preset=RoomPreset.PUBLIC_CHAT, name="Lobby"
    )
    return room_id


async def remote_join(
    engine: RoomEngine,
    remote_key: SigningKey,
    room_id: str,
    prev_events: list[str] | None = None,
    depth: int = 10,
) -> tuple[Event, RoomVersion, dict[tuple[str, str], str]]:
    """Bob (on the remote server) joins the public room: his join, the room's version and
    its current state before the join. Prev events default to the forward extremities."""
    version, extremities, current = await engine.persister.get_room_state(room_id)
    auth = [current[("m.room.power_levels", "")], current[("m.room.join_rules", "")]]
    if not version.room_id_from_create_event:
        auth.append(current[("m.room.create", "")])
    join = remote_event(
        remote_key,
        version,
        room_id,
        BOB,
        "m.room.member",
        {"membership": "join"},
        sorted(extremities) if prev_events is None else prev_events,
        auth,
        depth=depth,
        state_key=BOB,
    )
    return join, version, current
