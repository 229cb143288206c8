"""``/sync``: the rooms part from the read path (:class:`~roomstream.reading.RoomReader`),
the rest from the per-user streams, all behind one opaque token, long-polled through the
:class:`~roomstream.client.notifier.Notifier`.

The token is ``<events>_<account_data>_<receipts>_<to_device>_<typing>``: the read
path's events token (per-writer positions; it never contains ``_``) and a position of each
other stream. Every sub-object of the response is present even when empty.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from roomstream.accounts import Requester
from roomstream.client.notifier import Notifier
from roomstream.client.store import ClientStore
from roomstream.client.typing import TypingState
from roomstream.client.userdata import UserData
from roomstream.errors import Codes, MatrixError
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

    def to_string(self) -> str:
        return "_".join(
            [
                self.events.to_string(),
                str(self.account_data),
                str(self.receipts),
                str(self.to_device),
                str(self.typing),
            ]
        )

    @classmethod
    def parse(cls, text: str) -> SyncToken:
        parts = text.split("_")
        if len(parts) != 5 or not all(_TAIL.fullmatch(p) for p in parts[1:]):
            raise MatrixError(400, Codes.INVALID_PARAM, f"invalid sync token {text[:64]!r}")
        return cls(EventsToken.parse(parts[0]), *(int(p) for p in parts[1:]))


@dataclass(frozen=True, slots=True)
class SyncRequest:
    since: SyncToken | None
    timeout_ms: int
    full_state: bool
    timeline_limit: int = DEFAULT_TIMELINE_LIMIT


def _events(events: list[Any]) -> dict[str, Any]:
    return {"events": events}


def _account_events(by_type: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": t, "content": c} for t, c in sorted(by_type.items())]


class SyncHandler:
    def __init__(
        self,
        reader: RoomReader,
        userdata: UserData,
        typing: TypingState,
        notifier: Notifier,
        store: ClientStore,
    ) -> None:
        self.reader = reader
        self.userdata = userdata
        self.typing = typing
        self.notifier = notifier
        self.store = store
        #: (user, device) -> the to-device position up to which its inbox was cleared.
        self._to_device_cleared: dict[tuple[str, str], int] = {}

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
                    return body
                await waiter.wait(remaining)

    async def _build(
        self, requester: Requester, request: SyncRequest
    ) -> tuple[dict[str, Any], bool]:
        user_id, device_id = requester.user_id, requester.device_id
        since = request.since
        initial = since is None or request.full_state
        positions = {
            name: self.userdata.position(name) for name in ("account_data", "receipts", "to_device")
        }
        typing_token = self.typing.token
        result = await self.reader.sync(
            user_id,
            None if initial or since is None else since.events,
            timeline_limit=request.timeline_limit,
            device_id=device_id,
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
        left = [r for r, t in result.rooms.items() if t.membership in ("leave", "ban")]
        forgotten = await self.store.forgotten_rooms(user_id, left) if left else set()
        for room_id, timeline in result.rooms.items():
            if timeline.membership == "join":
                join[room_id] = self._joined_room(timeline)
            elif timeline.membership == "invite" and initial:
                invite[room_id] = {"invite_state": _events(timeline.state)}
            elif timeline.membership in ("leave", "ban") and room_id not in forgotten:
                leave[room_id] = {
                    "timeline": self._timeline(timeline),
                    "state": _events(timeline.state),
                    "account_data": _events([]),
                }
        if not initial:
            newly_invited = {r for r, t in result.rooms.items() if t.membership == "invite"} | {
                e["room_id"]
                for e in result.membership_changes
                if e.get("content", {}).get("membership") == "invite"
            }
            await self._invites(user_id, newly_invited - set(join), invite)
        prev_batch = result.next_token.to_string() if since is None else since.events.to_string()
        for room_id in set(room_data) | set(receipts) | set(typing):
            if room_id not in joined:
                continue
            room = join.get(room_id)
            if room is None:
                room = join[room_id] = self._empty_joined_room(prev_batch)
            if room_id in room_data:
                room["account_data"]["events"] = _account_events(room_data[room_id])
            if room_id in typing:
                room["ephemeral"]["events"].append(
                    {"type": "m.typing", "content": {"user_ids": typing[room_id]}}
                )
            if room_id in receipts:
                room["ephemeral"]["events"].append(
                    {"type": "m.receipt", "content": receipts[room_id]}
                )
        next_batch = SyncToken(
            result.next_token,
            positions["account_data"],
            positions["receipts"],
            to_device_end,
            typing_token,
        )
        body = {
            "next_batch": next_batch.to_string(),
            "rooms": {"join": join, "invite": invite, "leave": leave, "knock": {}},
            "account_data": _events(_account_events(global_data)),
            "to_device": _events(to_device),
            "presence": _events([]),
            "device_lists": {"changed": [], "left": []},
            "device_one_time_keys_count": {},
        }
        empty = not (join or invite or leave or global_data or to_device)
        return body, empty

    async def _invites(self, user_id: str, invited: set[str], invite: dict[str, Any]) -> None:
        """Rooms the user was invited to since the token: their stripped state (the
        read path's invite view: the invite and the room's descriptive state)."""
        if not invited:
            return
        page = await self.reader.latest_rooms(
            user_id, room_limit=len(invited) + 50, event_limit=1, memberships=("invite",)
        )
        for timeline in page.rooms:
            if timeline.room_id in invited:
                invite[timeline.room_id] = {"invite_state": _events(timeline.state)}

    def _timeline(self, timeline: RoomTimeline) -> dict[str, Any]:
        return {
            "events": timeline.events,
            "limited": timeline.limited,
            "prev_batch": timeline.prev_batch.to_string(),
        }

    def _joined_room(self, timeline: RoomTimeline) -> dict[str, Any]:
        room = self._empty_joined_room(timeline.prev_batch.to_string())
        room["timeline"] = self._timeline(timeline)
        room["state"] = _events(timeline.state)
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
