"""One object holding a process's room machinery, opened from configuration."""

from __future__ import annotations

from collections.abc import Sequence

from signedjson.types import SigningKey

from roomstream.config import Config
from roomstream.errors import BadEventError, Codes
from roomstream.events.format import parse_pdu
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion, room_version
from roomstream.events.signing import load_or_create_signing_key
from roomstream.rooms.creation import LocalEventCreator
from roomstream.rooms.persist import EventPersister, PersistedEvent
from roomstream.rooms.store import EventStore
from roomstream.storage import Database, connect, prepare_database
from roomstream.streams import StreamSet


class RoomEngine:
    """Storage, streams, persistence and local creation for one instance."""

    def __init__(
        self,
        database: Database,
        streams: StreamSet,
        server_name: str,
        instance_name: str,
        signing_key: SigningKey,
    ) -> None:
        self.db = database
        self.streams = streams
        self.server_name = server_name
        self.store = EventStore(database)
        self.persister = EventPersister(self.store, streams, instance_name)
        self.creator = LocalEventCreator(self.persister, server_name, signing_key)

    @classmethod
    async def open(cls, config: Config) -> RoomEngine:
        database = connect(config.database)
        try:
            await prepare_database(database)
            streams = await StreamSet.open(database, config.instance_name, config.stream_writers)
        except BaseException:
            await database.close()
            raise
        key = load_or_create_signing_key(config.data_dir, config.server_name)
        return cls(database, streams, config.server_name, config.instance_name, key)

    async def close(self) -> None:
        await self.streams.flush()
        await self.db.close()

    async def parse_received(self, raw: bytes, version: RoomVersion | str | None = None) -> Event:
        """Parse a PDU received from elsewhere, finding its room's version if not given."""
        if isinstance(version, str):
            version = room_version(version)
        if version is None:
            version = await self._version_for(raw)
        return parse_pdu(raw, version)

    async def receive_pdus(
        self, raws: Sequence[bytes], *, backfilled: bool = False
    ) -> list[PersistedEvent]:
        """Parse, check and persist PDUs from another server. Nothing is stored unless
        every PDU parses; auth failures are stored as rejected events."""
        events = [await self.parse_received(raw) for raw in raws]
        return await self.persister.persist_events(events, backfilled=backfilled)

    async def _version_for(self, raw: bytes) -> RoomVersion:
        import orjson

        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadEventError(Codes.NOT_JSON, f"invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise BadEventError(Codes.BAD_JSON, "a PDU must be a JSON object")
        if data.get("type") == "m.room.create" and isinstance(data.get("content"), dict):
            return room_version(data["content"].get("room_version", "1"))
        room_id = data.get("room_id")
        if not isinstance(room_id, str):
            raise BadEventError(Codes.BAD_JSON, "PDU has no room_id")
        version = await self.store.get_room_version(room_id)
        if version is None:
            raise BadEventError(Codes.NOT_FOUND, f"unknown room {room_id}")
        return version
