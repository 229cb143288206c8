"""One object holding a process's room machinery, opened from configuration."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from signedjson.types import SigningKey

from roomstream import exactjson
from roomstream.config import Config
from roomstream.errors import (
    EventNotJsonError,
    EventRoomUnknownError,
    MalformedEventError,
)
from roomstream.events.format import ContentHashMismatchError, parse_pdu, room_id_for_create_event
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion, room_version
from roomstream.events.signing import (
    check_event_signatures,
    check_signed_by,
    load_or_create_signing_key,
    required_signers,
)
from roomstream.events.types import EventTypes
from roomstream.rooms.creation import LocalEventCreator
from roomstream.rooms.keys import KeyNeed, ServerKeyStore, keys_valid_at, local_key_map
from roomstream.rooms.participants import PersistParticipant
from roomstream.rooms.persist import EventPersister, PersistedEvent
from roomstream.rooms.store import EventStore
from roomstream.state.cooperative import shorten_switch_interval
from roomstream.state.groups import StateMap
from roomstream.storage import Database, connect, prepare_database
from roomstream.streams import StreamSet

logger = logging.getLogger(__name__)


class RoomEngine:
    """Storage, streams, persistence and local creation for one instance."""

    def __init__(
        self,
        database: Database,
        streams: StreamSet,
        server_name: str,
        instance_name: str,
        signing_key: SigningKey,
        *,
        participants: Sequence[PersistParticipant],
        event_cache_size: int = 20_000,
    ) -> None:
        self.db = database
        self.streams = streams
        self.server_name = server_name
        self.store = EventStore(database, event_cache_size)
        self.persister = EventPersister(
            self.store,
            streams,
            instance_name,
            participants=participants,
            server_name=server_name,
        )
        self.creator = LocalEventCreator(self.persister, server_name, signing_key)
        self.keys = ServerKeyStore(database, local_key_map(server_name, signing_key))
        #: Work started for this engine by whoever assembled it (e.g. rebuilding the read
        #: side's records), cancelled by :meth:`close`; its progress must be durable.
        self.background: list[asyncio.Task[object]] = []

    @classmethod
    async def open(
        cls, config: Config, *, participants: Sequence[PersistParticipant]
    ) -> RoomEngine:
        """Open the configured database (migrated), streams and signing key.

        ``participants`` record in every persisted batch's transaction (see
        :mod:`roomstream.rooms.participants`); the process assembly passes the read
        side's (``roomstream.homeserver.open_room_engine``). Required, so that nothing
        builds an engine whose events the read side never learns of by forgetting it."""
        database = connect(config.database)
        try:
            await prepare_database(database)
            streams = await StreamSet.open(database, config.instance_name, config.stream_writers)
        except BaseException:
            await database.close()
            raise
        key = load_or_create_signing_key(config.data_dir, config.server_name)
        shorten_switch_interval()  # see roomstream.state.cooperative
        return cls(
            database,
            streams,
            config.server_name,
            config.instance_name,
            key,
            participants=participants,
            event_cache_size=config.caches.events,
        )

    async def close(self) -> None:
        for task in self.background:
            # Its progress is durable: the next start carries on where it stopped.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
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
        self,
        raws: Sequence[bytes],
        *,
        backfilled: bool = False,
        trust_unsigned: bool = False,
        outliers: bool = False,
        state_before: Mapping[str, Sequence[StateMap]] | None = None,
        redecide: Sequence[Event] = (),
    ) -> list[PersistedEvent]:
        """Parse, check and persist PDUs from another server; results in input order.

        The spec's checks on receipt, in order: format (:func:`parse_pdu`); signatures of
        every server that must sign (:func:`check_event_signatures`, keys from
        :attr:`keys`) unless the caller says the input is trusted (``trust_unsigned``,
        for data whose origin is vouched for otherwise); then the content hash, where a
        mismatch means the event is used in its redacted form (the result says
        ``redacted_on_receipt``); then the auth rules (failures are stored as rejected).

        Nothing is stored unless every PDU passes the format and signature checks. A
        batch may open a new room: its create event gives the version of the others.
        ``outliers``, ``state_before`` and ``redecide`` are
        :meth:`EventPersister.persist_events`'s (events fetched as outliers; the state at
        a gap in the DAG; stored outliers to decide again, checked when they were stored).
        """
        decoded = [_decode(raw) for raw in raws]
        # Rooms opened by this batch: their versions come from its create events.
        new_rooms: dict[str, RoomVersion] = {}
        parsed: dict[int, tuple[Event, bool]] = {}
        for i, (raw, data) in enumerate(zip(raws, decoded, strict=True)):
            if data.get("type") == EventTypes.CREATE:
                version = _create_version(data)
                parsed[i] = _parse(raw, version)
                new_rooms.setdefault(room_id_for_create_event(parsed[i][0]), version)
        events: list[Event] = []
        mismatched: set[str] = set()
        for i, (raw, data) in enumerate(zip(raws, decoded, strict=True)):
            if i not in parsed:
                parsed[i] = _parse(raw, await self._stored_or_new_version(data, new_rooms))
            event, redacted = parsed[i]
            events.append(event)
            if redacted:
                mismatched.add(event.event_id)
        if not trust_unsigned:
            await self.check_signatures(events)
        for event_id in sorted(mismatched):
            logger.warning("content hash of %s does not match: using its redacted form", event_id)
        results = await self.persister.persist_events(
            events,
            backfilled=backfilled,
            outliers=outliers,
            state_before=state_before,
            redecide=redecide,
        )
        return [
            # (An event stored before keeps what it was stored as.)
            dataclasses.replace(r, redacted_on_receipt=True)
            if r.new and r.event_id in mismatched
            else r
            for r in results
        ]

    async def receive_out_of_band_membership(
        self, raw: bytes, version: RoomVersion
    ) -> PersistedEvent:
        """Store a membership event of a local user in a room this server may not hold
        (an invite from another server), after the format and signature checks: an
        outlier that becomes the user's current membership in a room not held here
        (``EventPersister.persist_events``'s ``out_of_band``)."""
        event, _ = _parse(raw, version)
        await self.check_signatures([event])
        [result] = await self.persister.persist_events([event], out_of_band=True)
        return result

    async def check_signatures(
        self, events: Sequence[Event], also: Mapping[str, str] | None = None
    ) -> None:
        """Raise ``EventSignatureError`` unless every server that must sign each event
        (and, for an event ID in ``also``, that server too) did, with a key valid at the
        event's ``origin_server_ts``; keys the store lacks are fetched through its
        fetcher, once for all of them."""
        also = also or {}
        needs = [need for event in events for need in _key_needs(event, also.get(event.event_id))]
        known = await self.keys.verify_keys_at(needs)
        for event in events:
            valid = keys_valid_at(known, _signed_at(event))
            check_event_signatures(event, valid)
            extra = also.get(event.event_id)
            if extra is not None:
                check_signed_by(event, extra, valid)

    async def _stored_or_new_version(
        self, data: dict[str, object], new_rooms: dict[str, RoomVersion]
    ) -> RoomVersion:
        room_id = data.get("room_id")
        if not isinstance(room_id, str):
            raise MalformedEventError("PDU has no room_id")
        version = await self.store.get_room_version(room_id)
        if version is None:
            version = new_rooms.get(room_id)
        if version is None:
            raise EventRoomUnknownError(f"unknown room {room_id}")
        return version

    async def _version_for(self, raw: bytes) -> RoomVersion:
        data = _decode(raw)
        if data.get("type") == EventTypes.CREATE:
            return _create_version(data)
        return await self._stored_or_new_version(data, {})


def _signed_at(event: Event) -> int:
    """When the event says it was signed (its ``origin_server_ts``; 0 if it says not).
    Room versions before 5 do not hold keys to their validity (as Synapse): 0, which
    every known key covers."""
    if not event.room_version.enforce_key_validity:
        return 0
    ts = event.data.get("origin_server_ts")
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else 0


def _key_needs(event: Event, extra_signer: str | None = None) -> list[KeyNeed]:
    """The keys that may verify ``event``'s required signatures (every key ID each
    required server signed with, valid at the event's time)."""
    signatures = event.data.get("signatures")
    signatures = signatures if isinstance(signatures, dict) else {}
    signers = required_signers(event.data, event.room_version)
    if extra_signer is not None:
        signers = signers | {extra_signer}
    needs = []
    for server in sorted(signers):
        by_server = signatures.get(server)
        for kid in sorted(by_server) if isinstance(by_server, dict) else ():
            if isinstance(kid, str):
                needs.append(KeyNeed(server, kid, _signed_at(event)))
    return needs


def _decode(raw: bytes) -> dict[str, object]:
    """Just enough parsing to find a PDU's room and version (``parse_pdu`` is strict)."""
    try:
        # exactjson: room versions 1-5 may hold integers beyond 64 bits.
        data = exactjson.loads(raw)
    except ValueError as exc:
        raise EventNotJsonError(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MalformedEventError("a PDU must be a JSON object")
    return data


def _create_version(data: dict[str, object]) -> RoomVersion:
    content = data.get("content")
    if not isinstance(content, dict):
        raise MalformedEventError("'content' must be an object")
    return room_version(content.get("room_version", "1"))


def _parse(raw: bytes, version: RoomVersion) -> tuple[Event, bool]:
    """The event to use, and whether it is the redacted form of one whose content hash
    did not match (the spec: such an event is redacted, then processed further)."""
    try:
        return parse_pdu(raw, version), False
    except ContentHashMismatchError as exc:
        return exc.redacted_event, True
