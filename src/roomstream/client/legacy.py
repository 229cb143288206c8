"""The deprecated reads Synapse still serves and clients still call: the room
``initialSync`` (matrix-js-sdk peeks into ``world_readable`` rooms with it), the global
``initialSync``, the old event stream (``/events``) and a room's local aliases.

Nothing here reads events on its own: timelines, pagination, visibility and state come
from the read path (:class:`~roomstream.reading.RoomReader`: ``latest_pages``,
``paginate``, ``latest_rooms``, ``sync``, ``room_state_for``), the long poll from the
sync :class:`~roomstream.client.notifier.Notifier`, per-user data from
:class:`~roomstream.client.userdata.UserData`. Response shapes are Synapse's.

Tokens: ``end`` is an events token (``s…``/``m…``) read *before* the events it follows,
so ``/events?from=end`` repeats nothing and misses nothing; ``start`` is a room token
(``t…``) to paginate ``/messages`` backwards from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from roomstream.accounts import Requester
from roomstream.client.notifier import Notifier
from roomstream.client.store import ClientStore
from roomstream.client.userdata import UserData
from roomstream.errors import ForbiddenError, MatrixError
from roomstream.events.types import EventTypes
from roomstream.reading import (
    MAX_LIMIT,
    ClientEvent,
    EventsToken,
    RoomPosition,
    RoomReader,
    RoomsCursor,
)
from roomstream.rooms.store import EventStore
from roomstream.storage import Transaction

__all__ = ["LegacyReads"]

#: Longest ``/events`` long poll honoured (as ``/sync``).
MAX_EVENTS_TIMEOUT_MS = 120_000
#: Before every event: where ``start`` points when a page holds a room's oldest event.
ROOM_START = RoomPosition(-(2**62), -(2**62))
#: Rooms read per page of the global ``initialSync``.
ROOMS_PER_PAGE = 100


class LegacyReads:
    def __init__(
        self,
        reader: RoomReader,
        event_store: EventStore,
        store: ClientStore,
        userdata: UserData,
        notifier: Notifier,
    ) -> None:
        self.reader = reader
        self.event_store = event_store
        self.store = store
        self.userdata = userdata
        self.notifier = notifier

    # -- GET /rooms/{id}/aliases -------------------------------------------------------

    async def room_aliases(self, requester: Requester, room_id: str) -> list[str]:
        """This server's aliases of the room, for a member or anyone when the room is
        ``world_readable`` (403 otherwise, as Synapse)."""
        await self._require_member_or_world_readable(requester, room_id)
        return await self.store.get_aliases(room_id)

    async def _require_member_or_world_readable(self, requester: Requester, room_id: str) -> None:
        """403 unless the user is joined to the room or its history is ``world_readable``
        now (Synapse's ``check_user_in_room_or_world_readable``)."""
        if await self.event_store.get_membership(room_id, requester.user_id) == "join":
            return
        entry = await self.event_store.get_current_state_entry(
            room_id, (EventTypes.HISTORY_VISIBILITY, "")
        )
        event = None if entry is None else await self.event_store.get_event(entry)
        content = {} if event is None else event.data.get("content") or {}
        if content.get("history_visibility") != "world_readable":
            raise ForbiddenError(f"user {requester.user_id} is not in room {room_id}")

    # -- GET /rooms/{id}/initialSync ---------------------------------------------------

    async def room_initial_sync(
        self, requester: Requester, room_id: str, limit: int
    ) -> dict[str, Any]:
        """The room as the user may see it (:meth:`RoomReader.room_state_for` decides,
        403 otherwise): its latest ``limit`` visible events and state, now for a member
        or a peeker, as of their leave for one who left. A peek has no ``membership``
        (as Synapse) and no receipts of others' private kind."""
        user_id = requester.user_id
        end = self.reader.current_token()
        view = await self.reader.room_state_for(user_id, room_id)
        if view.membership == "ban" or (
            view.membership == "leave" and await self.store.forgotten_rooms(user_id, [room_id])
        ):
            # Only a departed member who left and did not forget the room sees it as of
            # their leave; a banned one (as Synapse) or one who forgot it may only peek
            # (403 unless the room is world_readable).
            view = await self.reader.room_state_for(user_id, room_id, departed=False)
        receipts: list[dict[str, Any]] = []
        if view.membership in ("leave", "ban") and view.member_event is not None:
            messages = await self._messages_before_leave(
                requester, room_id, view.member_event, limit, end
            )
        else:
            page = (
                await self.reader.latest_pages(
                    user_id, [room_id], limit=limit, device_id=requester.device_id
                )
            )[room_id]
            start = page.prev_batch if page.limited else ROOM_START
            messages = _messages(page.events, start.to_string(), end.to_string())
            receipts = await self._receipts([room_id], user_id)
        body: dict[str, Any] = {
            "room_id": room_id,
            "messages": messages,
            "state": view.state,
            "presence": [],
            "receipts": receipts,
            "account_data": await self._room_account_data(user_id, room_id),
            "visibility": "public" if await self._public(room_id) else "private",
        }
        if view.membership is not None:
            body["membership"] = view.membership
        return body

    async def _messages_before_leave(
        self, requester: Requester, room_id: str, leave_event: str, limit: int, end: EventsToken
    ) -> dict[str, Any]:
        """The latest ``limit`` visible events up to the user's leave; ``end`` stays an
        events token (``/events`` from it serves nothing of a room the user left)."""
        try:
            at_leave = await self.reader.position_of_event(room_id, leave_event)
        except MatrixError:  # not a timeline event (an out-of-band invite rejected)
            return _messages([], ROOM_START.to_string(), end.to_string())
        after_leave = RoomPosition.after_event(
            at_leave.topological_ordering, at_leave.stream_ordering
        )
        chunk = await self.reader.paginate(
            requester.user_id,
            room_id,
            after_leave,
            direction="b",
            limit=limit,
            device_id=requester.device_id,
        )
        start = chunk.end or ROOM_START
        return _messages(list(reversed(chunk.events)), start.to_string(), end.to_string())

    # -- GET /initialSync --------------------------------------------------------------

    async def initial_sync(
        self, requester: Requester, limit: int, archived: bool
    ) -> dict[str, Any]:
        """Every room of the user (joined and invited; left and banned ones too when
        ``archived``) with its latest ``limit`` events and state (left rooms: the state
        at the leave), global account data, and ``end`` to follow ``/events`` from."""
        user_id = requester.user_id
        memberships: tuple[str, ...] = ("join", "invite")
        if archived:
            memberships += ("leave", "ban")
        account_position = self.userdata.position("account_data")
        global_data, room_data = await self.userdata.account_data_since(
            user_id, 0, account_position
        )
        timelines = []
        cursor: RoomsCursor | None = None
        end: EventsToken | None = None
        while True:
            page = await self.reader.latest_rooms(
                user_id,
                room_limit=ROOMS_PER_PAGE,
                event_limit=limit,
                cursor=cursor,
                memberships=memberships,
                device_id=requester.device_id,
            )
            if end is None:  # the first page's: no event after it is missed
                end = page.token
            timelines.extend(page.rooms)
            cursor = page.next_cursor
            if cursor is None:
                break
        public = await self._public_among([t.room_id for t in timelines])
        rooms: list[dict[str, Any]] = []
        for timeline in timelines:
            room_id = timeline.room_id
            entry: dict[str, Any] = {
                "room_id": room_id,
                "membership": timeline.membership,
                "visibility": "public" if room_id in public else "private",
            }
            if timeline.membership in ("invite", "knock"):
                own = [e for e in timeline.state if e.get("state_key") == user_id]
                if own:
                    entry["invite"] = own[-1]
                    entry["inviter"] = own[-1].get("sender")
                rooms.append(entry)
                continue
            # A room the user left: its timeline and state as of their leave.
            state = timeline.state
            entry["messages"] = _messages(
                timeline.events,
                (timeline.prev_batch if timeline.limited else ROOM_START).to_string(),
                end.to_string(),
            )
            entry["state"] = state
            entry["account_data"] = _account_events(room_data.get(room_id, {}))
            rooms.append(entry)
        joined = [t.room_id for t in timelines if t.membership == "join"]
        return {
            "rooms": rooms,
            "presence": [],
            "account_data": _account_events(global_data),
            "receipts": await self._receipts(joined, user_id),
            "end": end.to_string(),
        }

    # -- GET /events -------------------------------------------------------------------

    async def events(
        self,
        requester: Requester,
        since: EventsToken | None,
        timeout_ms: int,
        limit: int,
        room_id: str | None = None,
    ) -> dict[str, Any]:
        """The old event stream: the events the user may see that completed after
        ``since`` (None: now), oldest first, in the rooms they are in and their own
        membership events anywhere; waits up to ``timeout_ms`` for some, woken by the
        notifier that wakes ``/sync``. At most ``limit`` events per room: a room with
        more skips to its latest ones, as a limited ``/sync`` timeline does.

        ``room_id``: that room's events only, for a member or anyone when the room is
        ``world_readable`` (403 otherwise): matrix-js-sdk's peek follows a room so, after
        its room ``initialSync`` (as Synapse)."""
        user_id = requester.user_id
        start = since if since is not None else self.reader.current_token()
        if room_id is not None:
            await self._require_member_or_world_readable(requester, room_id)
            rooms = [room_id]
        else:
            rooms = await self.event_store.get_rooms_for_user(user_id)
        deadline = time.monotonic() + min(timeout_ms, MAX_EVENTS_TIMEOUT_MS) / 1000
        with self.notifier.listen(user_id, rooms) as waiter:
            while True:
                if room_id is None:
                    chunk, end = await self._new_events(requester, start, limit)
                else:
                    chunk, end = await self._new_room_events(requester, room_id, start, limit)
                remaining = deadline - time.monotonic()
                if chunk or remaining <= 0:
                    break
                await waiter.wait(remaining)
        return {"chunk": chunk, "start": start.to_string(), "end": end.to_string()}

    async def _new_events(
        self, requester: Requester, since: EventsToken, limit: int
    ) -> tuple[list[ClientEvent], EventsToken]:
        result = await self.reader.sync(
            requester.user_id, since, timeline_limit=limit, device_id=requester.device_id
        )
        chunk = _stream_chunk([t.events for t in result.rooms.values()], result.membership_changes)
        return chunk, result.next_token

    async def _new_room_events(
        self, requester: Requester, room_id: str, since: EventsToken, limit: int
    ) -> tuple[list[ClientEvent], EventsToken]:
        """The room's latest ``limit`` visible events after ``since``, up to a token read
        first (the next read starts there: nothing is served twice or skipped but what
        ``limit`` leaves out)."""
        upto = self.reader.current_token().advance(since)
        page = await self.reader.paginate(
            requester.user_id,
            room_id,
            upto,
            direction="b",
            limit=limit,
            to_token=since,
            device_id=requester.device_id,
        )
        return list(reversed(page.events)), upto

    # -- per-user data -----------------------------------------------------------------

    async def _receipts(self, room_ids: Sequence[str], user_id: str) -> list[dict[str, Any]]:
        """The rooms' receipts as ``m.receipt`` events; private ones only the user's own."""
        by_room = await self.userdata.receipts_since(
            room_ids, 0, self.userdata.position("receipts")
        )
        result = []
        for room_id, content in sorted(by_room.items()):
            shown = _public_receipts(content, user_id)
            if shown:
                result.append({"type": "m.receipt", "room_id": room_id, "content": shown})
        return result

    async def _room_account_data(self, user_id: str, room_id: str) -> list[dict[str, Any]]:
        rows = await self.userdata.db.run_interaction(
            "room_account_data",
            lambda t: t.query(
                "SELECT account_data_type, content FROM room_account_data"
                " WHERE user_id = ? AND room_id = ?",
                (user_id, room_id),
            ),
        )
        return _account_events({str(r[0]): orjson.loads(r[1]) for r in rows})

    async def _public(self, room_id: str) -> bool:
        return room_id in await self._public_among([room_id])

    async def _public_among(self, room_ids: Sequence[str]) -> set[str]:
        """Those of ``room_ids`` listed in the room directory."""
        if not room_ids:
            return set()
        ids = list(room_ids)

        def txn(t: Transaction) -> set[str]:
            found: set[str] = set()
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                found.update(
                    str(r[0])
                    for r in t.query(
                        "SELECT room_id FROM rooms WHERE is_public = ?"
                        f" AND room_id IN ({','.join('?' * len(chunk))})",
                        (True, *chunk),
                    )
                )
            return found

        return await self.store.db.run_interaction("public_among", txn)


def clamp_limit(limit: int) -> int:
    """A client's ``limit`` within what the read path serves (1..MAX_LIMIT)."""
    return max(1, min(limit, MAX_LIMIT))


def _messages(events: list[ClientEvent], start: str, end: str) -> dict[str, Any]:
    return {"chunk": events, "start": start, "end": end}


def _account_events(by_type: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": t, "content": c} for t, c in sorted(by_type.items())]


def _public_receipts(content: dict[str, Any], user_id: str) -> dict[str, Any]:
    """``m.receipt`` content without other users' ``m.read.private`` receipts."""
    shown: dict[str, Any] = {}
    for event_id, by_type in content.items():
        kept = {}
        for receipt_type, by_user in by_type.items():
            if receipt_type == "m.read.private":
                by_user = {u: r for u, r in by_user.items() if u == user_id}
            if by_user:
                kept[receipt_type] = by_user
        if kept:
            shown[event_id] = kept
    return shown


def _stream_chunk(
    timelines: Sequence[list[ClientEvent]], membership_changes: list[ClientEvent]
) -> list[ClientEvent]:
    """One list of the rooms' new events and the user's membership events, each once,
    oldest first: each room's order kept, rooms interleaved by ``origin_server_ts``
    (the read path gives no order across rooms; the sort is stable)."""
    seen: set[str] = set()
    chunk: list[ClientEvent] = []
    for events in [*timelines, membership_changes]:
        for event in events:
            event_id = str(event.get("event_id"))
            if event_id not in seen:
                seen.add(event_id)
                chunk.append(event)
    chunk.sort(key=lambda e: int(e.get("origin_server_ts") or 0))
    return chunk
