"""A room engine on each database engine, plus a second (remote) server's signing key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from signedjson.types import SigningKey

from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.hashing import encode_base64
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion
from roomstream.events.signing import get_verify_key, key_id, load_or_create_signing_key
from roomstream.reading import read_side_participants
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet

SERVER = "local.test"
REMOTE = "remote.test"


@pytest.fixture
async def engine(
    database: Database, tmp_path: Path, remote_key: SigningKey
) -> AsyncIterator[RoomEngine]:
    """A room engine that knows the remote server's key (as an operator would add it)."""
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    engine = RoomEngine(
        database, streams, SERVER, "main", key, participants=read_side_participants()
    )
    await engine.keys.add(REMOTE, key_id(remote_key), verify_key_base64(remote_key))
    yield engine


@pytest.fixture
def remote_key(tmp_path: Path) -> SigningKey:
    return load_or_create_signing_key(tmp_path / "remote", REMOTE)


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
