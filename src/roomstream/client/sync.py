"""``/sync``: the rooms part from the read path (:class:`~roomstream.reading.RoomReader`),
the rest from the per-user streams, all behind one opaque token, long-polled through the
:class:`~roomstream.client.notifier.Notifier`.

The token is ``<events>_<account_data>_<receipts>_<to_device>_<typing>_<device_lists>``:
the read path's events token (per-writer positions; it never contains ``_``) and a
position of each other stream (a token from before the ``device_lists`` part was added
parses with 0 there). Every sub-object of the response is present even when empty.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from roomstream.accounts import Requester
from roomstream.client.filtering import EMPTY_SYNC_FILTER, EventFilter, SyncFilter
from roomstream.client.ignored import IgnoredUsers, hide_ignored, ignored_invite
from roomstream.client.notifier import Notifier
from roomstream.client.store import ClientStore
from roomstream.client.typing import TypingState
from roomstream.client.unread import UnreadCounter
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.errors import InvalidParamError
from roomstream.events.redaction import redact
from roomstream.reading import EventsToken, RoomReader, RoomTimeline

__all__ = ["SyncHandler", "SyncToken"]

_TAIL = re.compile(r"[0-9]{1,18}")
#: Longest long-poll honoured (clients ask for 30 s).
MAX_TIMEOUT_MS = 120_000
DEFAULT_TIMELINE_LIMIT = 10


@dataclass(frozen=True, slots=True)
class SyncToken:
    events: EventsToken
    account_data: int
    receipts: int
    to_device: int
    typing: int
    device_lists: int = 0

    def to_string(self) -> str:
        return "_".join(
            [
                self.events.to_string(),
                str(self.account_data),
                str(self.receipts),
                str(self.to_device),
                str(self.typing),
                str(self.device_lists),
            ]
        )

    @classmethod
    def parse(cls, text: str) -> SyncToken:
        parts = text.split("_")
        if len(parts) not in (5, 6) or not all(_TAIL.fullmatch(p) for p in parts[1:]):
            raise InvalidParamError(f"invalid sync token {text[:64]!r}")
        return cls(EventsToken.parse(parts[0]), *(int(p) for p in parts[1:]))


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
MAX_LAZY_DEVICES = 10_000
MAX_LAZY_MEMBERS_PER_DEVICE = 50_000


@dataclass
class _SentMembers:
    """The members (room -> user -> member event ID) sent to one device, valid for the
    sync that continues from ``token`` (the ``next_batch`` they were sent with)."""

    token: str
    members: dict[str, dict[str, str]]
    size: int = 0


def _events(events: list[Any]) -> dict[str, Any]:
    return {"events": events}


def _account_events(
    by_type: dict[str, dict[str, Any]], only: EventFilter | None = None
) -> list[dict[str, Any]]:
    events = [{"type": t, "content": c} for t, c in sorted(by_type.items())]
    return events if only is None or only.allows_all else only.apply(events)


def _state_only(timeline: RoomTimeline, now: EventsToken, *, merge: bool) -> RoomTimeline:
    """A room of a sync whose timeline limit is 0: no timeline events, ``limited`` if
    there were any, and a ``prev_batch`` from where paginating back finds them. The
    state is the state after them (spec: the state at the start of the, empty, timeline):
    ``merge`` (incremental sync, whose state is the state before the events read) adds
    their state events, later ones replacing earlier ones of the same key; an initial
    sync's state is already the current state."""
    state = list(timeline.state)
    if merge:
        by_key = {(e.get("type"), e.get("state_key")): e for e in state}
        for event in timeline.events:
            if "state_key" in event:
                by_key[(event.get("type"), event.get("state_key"))] = event
        state = list(by_key.values())
    return replace(
        timeline,
        events=[],
        limited=timeline.limited or bool(timeline.events),
        prev_batch=now if timeline.events else timeline.prev_batch,
        state=state,
    )


def _kept(only: EventFilter, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` that pass ``only`` (its ``limit`` is for timelines, not applied)."""
    return events if only.allows_all else [e for e in events if only.matches(e)]


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
    ) -> None:
        self.reader = reader
        #: Whom each user ignores (None: nobody ignores anyone).
        self.ignored = ignored
        self.keys = keys
        self.userdata = userdata
        self.typing = typing
        self.notifier = notifier
        self.store = store
        self.unread = UnreadCounter(reader)
        #: (user, device) -> the to-device position up to which its inbox was cleared.
        self._to_device_cleared: dict[tuple[str, str], int] = {}
        #: (user, device) -> lazy-loaded members it was sent (most recent last).
        self._sent_members: OrderedDict[tuple[str, str], _SentMembers] = OrderedDict()

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
                if event.get("type") == "m.room.member":
                    member = event.get("state_key")
                    if sent.get(member) == event["event_id"]:
                        continue
                    entry.size += member not in sent
                    sent[member] = event["event_id"]
                kept.append(event)
            room["state"]["events"] = kept
            for event in room["timeline"]["events"]:
                if event.get("type") == "m.room.member" and "state_key" in event:
                    entry.size += event["state_key"] not in sent
                    sent[event["state_key"]] = event["event_id"]
        for room_id in body["rooms"]["leave"]:
            entry.members.pop(room_id, None)
        if entry.size > MAX_LAZY_MEMBERS_PER_DEVICE:
            return
        entry.token = body["next_batch"]
        self._sent_members[key] = entry
        while len(self._sent_members) > MAX_LAZY_DEVICES:
            self._sent_members.popitem(last=False)

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
        user_id, device_id = requester.user_id, requester.device_id
        since = request.since
        only = request.filter
        initial = since is None or request.full_state
        positions = {
            name: self.userdata.position(name) for name in ("account_data", "receipts", "to_device")
        }
        typing_token = self.typing.token
        device_lists_token = 0 if self.keys is None else self.keys.position()
        result = await self.reader.sync(
            user_id,
            None if since is None else since.events,
            # A state-only sync (limit 0) reads one event per room, folded into state.
            timeline_limit=max(1, request.timeline_limit),
            device_id=device_id,
            full_state=request.full_state,
            lazy_members=only.state.lazy_load_members,
        )
        if request.timeline_limit == 0:
            for room_id, timeline in result.rooms.items():
                if timeline.membership != "invite":
                    result.rooms[room_id] = _state_only(
                        timeline, result.next_token, merge=since is not None
                    )
        # Each per-user stream is read only when it moved past the token.
        global_data: dict[str, dict[str, Any]] = {}
        room_data: dict[str, dict[str, dict[str, Any]]] = {}
        ad_since = 0 if initial or since is None else since.account_data
        if positions["account_data"] > ad_since:
            global_data, room_data = await self.userdata.account_data_since(
                user_id, ad_since, positions["account_data"]
            )
        rc_since = 0 if initial or since is None else since.receipts
        typing_since = -1 if initial or since is None else since.typing
        # The joined rooms only filter per-room ephemeral data and room account data:
        # not read when none of those moved (a sync woken by a message, say).
        joined: list[str] = []
        if room_data or positions["receipts"] > rc_since or typing_token != typing_since:
            joined = await self.reader.store.get_rooms_for_user(user_id)
        receipts: dict[str, dict[str, Any]] = {}
        if positions["receipts"] > rc_since:
            receipts = await self.userdata.receipts_since(joined, rc_since, positions["receipts"])
        typing = self.typing.changed(joined, typing_since)
        acknowledged = 0 if since is None else since.to_device
        to_device: list[dict[str, Any]] = []
        to_device_end = acknowledged
        device_key = (user_id, device_id)
        if (
            positions["to_device"] > acknowledged
            or self._to_device_cleared.get(device_key) != acknowledged
        ):
            to_device, to_device_end = await self.userdata.to_device_messages(
                user_id, device_id, acknowledged, positions["to_device"]
            )
            self._to_device_cleared[device_key] = acknowledged
            if len(self._to_device_cleared) > 100_000:
                self._to_device_cleared.pop(next(iter(self._to_device_cleared)))
        join: dict[str, Any] = {}
        invite: dict[str, Any] = {}
        leave: dict[str, Any] = {}
        ignored = frozenset() if self.ignored is None else await self.ignored.of(user_id)
        left = [r for r, t in result.rooms.items() if t.membership in ("leave", "ban")]
        forgotten = await self.store.forgotten_rooms(user_id, left) if left else set()
        for room_id, timeline in result.rooms.items():
            if not only.room_allowed(room_id):
                continue
            if timeline.membership == "join":
                join[room_id] = self._joined_room(timeline, only, ignored)
            elif timeline.membership == "invite" and since is None:
                invite[room_id] = {"invite_state": _events(timeline.state)}
            elif (
                timeline.membership in ("leave", "ban")
                and room_id not in forgotten
                # Rooms left before the token only when the filter asks (spec:
                # include_leave); a leave since the token is news, always sent.
                and (since is not None or only.include_leave)
            ):
                leave[room_id] = {
                    "timeline": self._timeline(timeline, only, ignored),
                    "state": _events(_kept(only.state, timeline.state)),
                    "account_data": _events([]),
                }
        if since is not None:
            newly_invited = {r for r, t in result.rooms.items() if t.membership == "invite"} | {
                e["room_id"]
                for e in result.membership_changes
                if e.get("content", {}).get("membership") == "invite"
            }
            newly_invited = {r for r in newly_invited if only.room_allowed(r)}
            await self._invites(
                user_id, newly_invited - set(join), invite, every=request.full_state, only=only
            )
        for room_id in [
            r
            for r, room in invite.items()
            if ignored_invite(room["invite_state"]["events"], user_id, ignored)
        ]:
            del invite[room_id]  # invites from ignored users are dropped (spec)
        prev_batch = result.next_token.to_string() if since is None else since.events.to_string()
        for room_id in set(room_data) | set(receipts) | set(typing):
            if room_id not in joined or not only.room_allowed(room_id):
                continue
            room = join.get(room_id)
            if room is None:
                room = join[room_id] = self._empty_joined_room(prev_batch)
            if room_id in room_data:
                room["account_data"]["events"] = _account_events(
                    room_data[room_id], only.room_account_data
                )
            ephemeral = []
            if room_id in typing:
                ephemeral.append({"type": "m.typing", "content": {"user_ids": typing[room_id]}})
            if room_id in receipts:
                ephemeral.append({"type": "m.receipt", "content": receipts[room_id]})
            room["ephemeral"]["events"].extend(only.ephemeral.apply(ephemeral))
        if since is not None and not request.full_state:
            # Rooms the filter left with nothing to say are not sent, and so do not end
            # a long poll (a message type the client filtered out does not wake it).
            for room_id in [r for r, room in join.items() if _says_nothing(room)]:
                del join[room_id]
        summaries = await self.reader.room_summaries(
            user_id, [r for r, room in join.items() if since is None or _membership_moved(room)]
        )
        for room_id, summary in summaries.items():
            join[room_id]["summary"] = summary
        for room_id, counts in (await self.unread.counts(user_id, list(join))).items():
            join[room_id]["unread_notifications"] = counts
        next_batch = SyncToken(
            result.next_token,
            positions["account_data"],
            positions["receipts"],
            to_device_end,
            typing_token,
            device_lists_token,
        )
        e2e = await self._e2e(requester, since, device_lists_token)
        account_events = _account_events(global_data, only.account_data)
        body = {
            "next_batch": next_batch.to_string(),
            "rooms": {"join": join, "invite": invite, "leave": leave, "knock": {}},
            "account_data": _events(account_events),
            "to_device": _events(to_device),
            "presence": _events([]),
            **e2e,
        }
        changed = e2e["device_lists"]["changed"]
        empty = not (join or invite or leave or account_events or to_device or changed)
        return body, empty

    async def _e2e(
        self, requester: Requester, since: SyncToken | None, device_lists_token: int
    ) -> dict[str, Any]:
        """``device_lists`` (users sharing a room whose devices changed since the token;
        ``left`` is filled by the lead's sync sections, see E2eKeys.changed_since), and the
        syncing device's one-time key counts and unused fallback key types."""
        if self.keys is None:
            return {
                "device_lists": {"changed": [], "left": []},
                "device_one_time_keys_count": {},
                "device_unused_fallback_key_types": [],
            }
        changed: set[str] = set()
        if since is not None and device_lists_token > since.device_lists:
            changed, _ = await self.keys.changed_since(
                requester.user_id, since.device_lists, device_lists_token
            )
        counts, fallbacks = await self.keys.key_status(requester.user_id, requester.device_id)
        return {
            "device_lists": {"changed": sorted(changed), "left": []},
            "device_one_time_keys_count": counts,
            "device_unused_fallback_key_types": fallbacks,
        }

    async def _invites(
        self,
        user_id: str,
        invited: set[str],
        invite: dict[str, Any],
        *,
        every: bool = False,
        only: SyncFilter = EMPTY_SYNC_FILTER,
    ) -> None:
        """Rooms the user was invited to since the token (``every``: all the rooms the
        user is invited to, for ``full_state``): their stripped state (the read path's
        invite view: the invite and the room's descriptive state)."""
        if every:
            pending = await self.reader.store.get_rooms_for_user(user_id, "invite")
            invited = invited | {r for r in pending if only.room_allowed(r)}
        if not invited:
            return
        page = await self.reader.latest_rooms(
            user_id, room_limit=len(invited) + 50, event_limit=1, memberships=("invite",)
        )
        for timeline in page.rooms:
            if timeline.room_id in invited:
                invite[timeline.room_id] = {"invite_state": _events(timeline.state)}

    def _timeline(
        self, timeline: RoomTimeline, only: SyncFilter, ignored: frozenset[str]
    ) -> dict[str, Any]:
        # The filter applies to the events read: a timeline of `limit` events of which
        # some do not match is shorter, and `limited` with `prev_batch` before the first
        # event read (so paginating back misses none that match). So do ignored users.
        return {
            "events": hide_ignored(_kept(only.timeline, timeline.events), ignored),
            "limited": timeline.limited,
            "prev_batch": timeline.prev_batch.to_string(),
        }

    def _joined_room(
        self, timeline: RoomTimeline, only: SyncFilter, ignored: frozenset[str]
    ) -> dict[str, Any]:
        room = self._empty_joined_room(timeline.prev_batch.to_string())
        room["timeline"] = self._timeline(timeline, only, ignored)
        room["state"] = _events(_kept(only.state, timeline.state))
        return room

    @staticmethod
    def _empty_joined_room(prev_batch: str) -> dict[str, Any]:
        return {
            "timeline": {"events": [], "limited": False, "prev_batch": prev_batch},
            "state": _events([]),
            "ephemeral": _events([]),
            "account_data": _events([]),
            "unread_notifications": {"highlight_count": 0, "notification_count": 0},
            "summary": {},
        }


#: State whose change can change a room's summary.
_SUMMARY_TYPES = frozenset({"m.room.member", "m.room.name", "m.room.canonical_alias"})


def _membership_moved(room: dict[str, Any]) -> bool:
    """Whether a joined room's incremental update may change its summary (spec: the
    summary may be left out when unchanged)."""
    return any(
        e.get("type") in _SUMMARY_TYPES
        for part in ("timeline", "state")
        for e in room[part]["events"]
    )


def _says_nothing(room: dict[str, Any]) -> bool:
    """A joined room entry with no events in any section and no gap to report."""
    timeline = room["timeline"]
    return not (
        timeline["events"]
        or timeline["limited"]
        or room["state"]["events"]
        or room["ephemeral"]["events"]
        or room["account_data"]["events"]
    )
