"""``/sync``: the rooms part from the read path (:class:`~roomstream.reading.RoomReader`),
the rest from the per-user streams, all behind one opaque token, long-polled through the
:class:`~roomstream.client.notifier.Notifier`.

The token is
``<events>_<account_data>_<receipts>_<to_device>_<typing>_<device_lists>_<presence>``:
one part per section of :data:`~roomstream.client.sync_sections.SECTIONS`, in its order (the read
path's events token, which never contains ``_``, then a position of each other stream).
Each section fills its part of the response (:mod:`roomstream.client.sync_sections`);
every sub-object of the response is present even when empty.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from roomstream.accounts import Requester
from roomstream.client.filtering import EMPTY_SYNC_FILTER, SyncFilter
from roomstream.client.ignored import IgnoredUsers
from roomstream.client.notifier import Notifier
from roomstream.client.presence_store import PresenceStore
from roomstream.client.push_store import PushRulesStore
from roomstream.client.store import ClientStore
from roomstream.client.sync_sections import (
    SECTIONS,
    SyncContext,
    SyncServices,
    build_sections,
)
from roomstream.client.sync_sections.base import events
from roomstream.client.typing import TypingState
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.errors import InvalidParamError
from roomstream.events.redaction import redact
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.reading import EventsToken, RoomReader

__all__ = ["SyncHandler", "SyncToken"]

#: Longest long-poll honoured (clients ask for 30 s).
MAX_TIMEOUT_MS = 120_000
DEFAULT_TIMELINE_LIMIT = 10


@dataclass(frozen=True, slots=True)
class SyncToken:
    """A position per section (by section name), written in :data:`SECTIONS` order.

    Parsing: a token with fewer parts than there are sections (one issued before the
    later sections existed) means each missing part's ``ZERO``; more parts, or a part
    its section does not read, is ``M_INVALID_PARAM``."""

    positions: Mapping[str, Any]

    @property
    def events(self) -> EventsToken:
        """The read path's events token (the first part)."""
        token: EventsToken = self.positions["events"]
        return token

    def position(self, section: str) -> Any:
        return self.positions[section]

    def to_string(self) -> str:
        return "_".join(s.format_position(self.positions[s.name]) for s in SECTIONS)

    @classmethod
    def parse(cls, text: str) -> SyncToken:
        parts = text.split("_")
        if len(parts) > len(SECTIONS):
            raise InvalidParamError(f"invalid sync token {text[:64]!r}")
        positions: dict[str, Any] = {}
        for i, section in enumerate(SECTIONS):
            if i >= len(parts):
                positions[section.name] = section.ZERO
                continue
            try:
                positions[section.name] = section.parse_position(parts[i])
            except ValueError:
                raise InvalidParamError(f"invalid sync token {text[:64]!r}") from None
        return cls(MappingProxyType(positions))


@dataclass(frozen=True, slots=True)
class SyncRequest:
    since: SyncToken | None
    timeout_ms: int
    full_state: bool
    filter: SyncFilter = EMPTY_SYNC_FILTER

    @property
    def timeline_limit(self) -> int:
        limit = self.filter.timeline.limit
        return DEFAULT_TIMELINE_LIMIT if limit is None else limit


#: Devices whose lazy-loaded members are remembered, and members remembered per device
#: (past either bound the memory is dropped: the device is sent members again).
MAX_LAZY_MEMBERS_PER_DEVICE = 50_000


@dataclass
class _SentMembers:
    """The members (room -> user -> member event ID) sent to one device, valid for the
    sync that continues from ``token`` (the ``next_batch`` they were sent with)."""

    token: str
    members: dict[str, dict[str, str]]
    size: int = 0


class SyncHandler:
    def __init__(
        self,
        reader: RoomReader,
        userdata: UserData,
        typing: TypingState,
        notifier: Notifier,
        store: ClientStore,
        ignored: IgnoredUsers | None = None,
        keys: E2eKeys | None = None,
        presence: PresenceStore | None = None,
        push_rules: PushRulesStore | None = None,
    ) -> None:
        self.reader = reader
        self.notifier = notifier
        #: The sections, in token order (:data:`SECTIONS`).
        self.sections = build_sections(
            SyncServices(reader, userdata, typing, store, ignored, keys, presence, push_rules)
        )
        #: (user, device) -> lazy-loaded members it was sent (most recent last).
        self._sent_members: LruCache[tuple[str, str], _SentMembers] = LruCache("sync_sent_members")

    async def sync(self, requester: Requester, request: SyncRequest) -> dict[str, Any]:
        """The response; with a ``since`` token and nothing new, waits (up to the timeout)
        until something for this user completes."""
        rooms = await self.reader.store.get_rooms_for_user(requester.user_id)
        deadline = time.monotonic() + min(request.timeout_ms, MAX_TIMEOUT_MS) / 1000
        with self.notifier.listen(requester.user_id, rooms) as waiter:
            while True:
                body, empty = await self._build(requester, request)
                remaining = deadline - time.monotonic()
                if not empty or request.since is None or request.full_state or remaining <= 0:
                    break
                await waiter.wait(remaining)
        state_filter = request.filter.state
        if state_filter.lazy_load_members and not state_filter.include_redundant_members:
            self._drop_sent_members(requester, request.since, body)
        if request.filter.event_format == "federation":
            await self._federation_format(body)
        if request.filter.event_fields is not None:
            for section in ("join", "leave"):
                for room in body["rooms"][section].values():
                    for part in ("timeline", "state"):
                        room[part]["events"] = request.filter.project(room[part]["events"])
        return body

    def _drop_sent_members(
        self, requester: Requester, since: SyncToken | None, body: dict[str, Any]
    ) -> None:
        """Lazy-loading without redundant members: drop from each joined room's state the
        member events this device was already sent, and remember what it is sent now.

        Sound across processes and retried requests: the memory is used only by the
        sync continuing from the exact ``next_batch`` it was recorded with (any other
        ``since``, another process, a restart: the device is sent its members again),
        and is bounded per device and in devices."""
        key = (requester.user_id, requester.device_id)
        entry = self._sent_members.pop(key, None)
        if since is None or entry is None or entry.token != since.to_string():
            entry = _SentMembers("", {})
        for room_id, room in body["rooms"]["join"].items():
            sent = entry.members.setdefault(room_id, {})
            kept = []
            for event in room["state"]["events"]:
                if event.get("type") == EventTypes.MEMBER:
                    member = event.get("state_key")
                    if sent.get(member) == event["event_id"]:
                        continue
                    entry.size += member not in sent
                    sent[member] = event["event_id"]
                kept.append(event)
            room["state"]["events"] = kept
            for event in room["timeline"]["events"]:
                if event.get("type") == EventTypes.MEMBER and "state_key" in event:
                    entry.size += event["state_key"] not in sent
                    sent[event["state_key"]] = event["event_id"]
        for room_id in body["rooms"]["leave"]:
            entry.members.pop(room_id, None)
        if entry.size > MAX_LAZY_MEMBERS_PER_DEVICE:
            return
        entry.token = body["next_batch"]
        self._sent_members.set(key, entry)

    async def _federation_format(self, body: dict[str, Any]) -> None:
        """``event_format: federation``: the rooms' events as their PDUs (redacted ones
        pruned), in place of the client format."""
        sections = [
            room[part]
            for name in ("join", "leave")
            for room in body["rooms"][name].values()
            for part in ("timeline", "state")
        ]
        ids = [e["event_id"] for s in sections for e in s["events"] if "event_id" in e]
        stored = await self.reader.store.get_events(ids)

        def pdu(event: dict[str, Any]) -> dict[str, Any]:
            found = stored.get(event.get("event_id", ""))
            if found is None:
                return event
            data = dict(found.data)
            if "redacted_because" in event.get("unsigned", {}):
                data = redact(data, found.room_version)
            data.setdefault("event_id", found.event_id)
            return data

        for section in sections:
            section["events"] = [pdu(e) for e in section["events"]]

    async def _build(
        self, requester: Requester, request: SyncRequest
    ) -> tuple[dict[str, Any], bool]:
        """The response, and whether it is empty (nothing to end a long poll with).

        Every section's position is read before any section reads: each collects up to
        it, so nothing completing meanwhile is skipped by the next token."""
        since = request.since
        upto = [section.current_position() for section in self.sections]
        user_id = requester.user_id
        body: dict[str, Any] = {
            "next_batch": "",
            "rooms": {"join": {}, "invite": {}, "leave": {}, "knock": {}},
            "account_data": events([]),
            "to_device": events([]),
            "presence": events([]),
            "device_lists": {"changed": [], "left": []},
            "device_one_time_keys_count": {},
            "device_unused_fallback_key_types": [],
        }

        async def joined_rooms() -> list[str]:
            return await self.reader.store.get_rooms_for_user(user_id)

        ctx = SyncContext(
            user_id=user_id,
            device_id=requester.device_id,
            filter=request.filter,
            full_state=request.full_state,
            timeline_limit=request.timeline_limit,
            incremental=since is not None,
            body=body,
            load_joined_rooms=joined_rooms,
        )
        positions: dict[str, Any] = {}
        for section, section_upto in zip(self.sections, upto, strict=True):
            section_since = None if since is None else since.position(section.name)
            positions[section.name] = await section.collect(ctx, section_since, section_upto)
        for section in self.sections:
            await section.finish(ctx)
        body["next_batch"] = SyncToken(MappingProxyType(positions)).to_string()
        return body, not ctx.has_news
