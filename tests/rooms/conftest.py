"""A room engine on each database engine, plus a second (remote) server's signing key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from signedjson.types import SigningKey

from roomstream.events.signing import key_id, load_or_create_signing_key
from roomstream.reading import read_side_participants
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database
from roomstream.streams import StreamSet
from tests.support.rooms import REMOTE, SERVER, verify_key_base64


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
