"""A room engine on each database engine, plus a second (remote) server's signing key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from signedjson.types import SigningKey

from roomstream.events.format import build_event_dict, finalise_local_event
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion
from roomstream.events.signing import load_or_create_signing_key
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet

SERVER = "local.test"
REMOTE = "remote.test"


@pytest.fixture
async def engine(database: Database, tmp_path: Path) -> AsyncIterator[RoomEngine]:
    streams = await StreamSet.open(database, "main", {})
    key = load_or_create_signing_key(tmp_path / "keys", SERVER)
    yield RoomEngine(database, streams, SERVER, "main", key)


@pytest.fixture
def remote_key(tmp_path: Path) -> SigningKey:
    return load_or_create_signing_key(tmp_path / "remote", REMOTE)


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
