"""The EDU and query tests' set-up: a local homeserver with a room a remote user (of
``REMOTE``) has joined, the join received as another server's signed event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from signedjson.key import generate_signing_key

from roomstream.events.auth import auth_types_for_event
from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.federation.edus import FederationEdus
from roomstream.storage import DatabaseConfig
from tests.support.client import room_with
from tests.support.homeserver import Homeserver, User, make_config, serve_homeserver

REMOTE = "remote.test"
BOB = f"@bob:{REMOTE}"
#: A server in no room here.
STRANGER = "stranger.test"


@dataclass
class Scene:
    hs: Homeserver
    alice: User
    room_id: str
    edus: FederationEdus


async def join_remote(hs: Homeserver, room_id: str, user_id: str) -> str:
    """``user_id`` (of another server) joins the public room, as their server would
    send it (signed by a key of theirs; received trusting it); the join's event ID."""
    server = user_id.partition(":")[2]
    version, extremities, current = await hs.engine.persister.get_room_state(room_id)
    prev = await hs.engine.persister.get_events(extremities)
    content = {"membership": "join"}
    keys = auth_types_for_event(version, "m.room.member", user_id, user_id, content)
    event = finalise_local_event(
        build_event_dict(
            version,
            event_type="m.room.member",
            sender=user_id,
            content=content,
            prev_events=sorted(extremities),
            auth_events=[current[k] for k in keys if k in current],
            depth=max(e.depth for e in prev.values()) + 1,
            room_id=room_id,
            state_key=user_id,
        ),
        version,
        server,
        generate_signing_key("remote"),
    )
    (result,) = await hs.engine.receive_pdus([event.raw], trust_unsigned=True)
    assert result.rejected_reason is None and not result.soft_failed, result
    return event.event_id


async def scene(db_config: DatabaseConfig, tmp_path: Path) -> AsyncIterator[Scene]:
    """Alice (local) in a public room Bob (remote) joined; the process's EDU handler."""
    async with serve_homeserver(make_config(db_config, tmp_path)) as hs:
        alice = await hs.register("alice")
        room_id = await room_with(hs, alice)
        await join_remote(hs, room_id, BOB)
        edus = FederationEdus.for_client_process(hs.process, hs.engine)
        yield Scene(hs, alice, room_id, edus)
