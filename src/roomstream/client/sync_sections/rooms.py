"""The ``rooms`` section: the token's ``events`` part (the read path's per-writer events
token) and the response's ``rooms`` (join, invite, leave), from
:meth:`~roomstream.reading.RoomReader.sync`.

Its :meth:`RoomsSection.finish` runs after the other sections: it merges their per-room
data (room account data, ephemeral events) into the joined rooms, drops joined rooms
with nothing to say from an incremental sync, and adds summaries and unread counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Self

from roomstream.client.filtering import (
    EMPTY_SYNC_FILTER,
    EventFilter,
    RoomEventFilter,
    SyncFilter,
)
from roomstream.client.ignored import IgnoredUsers, hide_ignored, ignored_invite
from roomstream.client.push_store import PushRulesStore
from roomstream.client.relations_routes import bundle_aggregations
from roomstream.client.store import ClientStore
from roomstream.client.sync_sections.base import (
    SyncContext,
    SyncSection,
    SyncServices,
    events,
    room_key,
    user_key,
)
from roomstream.client.unread import UnreadCounter
from roomstream.events.types import EventTypes
from roomstream.reading import EventsToken, RoomReader, RoomTimeline
from roomstream.reading.relations import attach_bundles
from roomstream.streams.rows import EventRow, events_row_from_wire

__all__ = ["RoomsSection"]


class RoomsSection(SyncSection):
    name = "events"
    stream = "events"
    ZERO = EventsToken(0)

    def __init__(
        self,
        reader: RoomReader,
        store: ClientStore,
        ignored: IgnoredUsers | None,
        push_rules: PushRulesStore | None = None,
    ) -> None:
        self.reader = reader
        self.store = store
        #: Whom each user ignores (None: nobody ignores anyone).
        self.ignored = ignored
        self.unread = UnreadCounter(reader, None if push_rules is None else push_rules.rules_of)

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.reader, services.store, services.ignored, services.push_rules)

    @staticmethod
    def parse_position(text: str) -> Any:
        return EventsToken.parse(text)

    @staticmethod
    def format_position(position: Any) -> str:
        return str(position.to_string())

    @staticmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        """An event wakes its room's syncs (and, a membership event, its target's: the
        user may not be in the room yet); a state change wakes its room's."""
        decoded = events_row_from_wire(row)
        if isinstance(decoded, EventRow) and decoded.type == EventTypes.MEMBER:
            member = decoded.state_key
            if member is not None:
                return [room_key(decoded.room_id), user_key(member)]
        return [room_key(decoded.room_id)]

    def current_position(self) -> EventsToken:
        return self.reader.current_token()

    async def collect(
        self, ctx: SyncContext, since: EventsToken | None, upto: EventsToken
    ) -> EventsToken:
        # The read path reads up to what it has ingested, not ``upto``: its own token.
        user_id, only = ctx.user_id, ctx.filter
        ignored = frozenset() if self.ignored is None else await self.ignored.of(user_id)
        result = await self.reader.sync(
            user_id,
            since,
            # A state-only sync (limit 0) reads one event per room, folded into state.
            timeline_limit=max(1, ctx.timeline_limit),
            device_id=ctx.device_id,
            full_state=ctx.full_state,
            lazy_members=only.state.lazy_load_members,
            timeline_filter=_timeline_predicate(only.timeline, ignored),
            # An initial sync reads the aggregations in its own transaction.
            aggregate=since is None and ctx.timeline_limit > 0,
            ignored=ignored,
        )
        if ctx.timeline_limit == 0:
            for room_id, timeline in result.rooms.items():
                if timeline.membership != "invite":
                    result.rooms[room_id] = _state_only(timeline, result.next_token)
        rooms = ctx.body["rooms"]
        join: dict[str, Any] = rooms["join"]
        invite: dict[str, Any] = rooms["invite"]
        leave: dict[str, Any] = rooms["leave"]
        left = [r for r, t in result.rooms.items() if t.membership in ("leave", "ban")]
        forgotten = await self.store.forgotten_rooms(user_id, left) if left else set()
        for room_id, timeline in result.rooms.items():
            if not only.room_allowed(room_id):
                continue
            if timeline.membership == "join":
                join[room_id] = _joined_room(timeline, only, ignored)
            elif timeline.membership == "invite" and since is None:
                invite[room_id] = {"invite_state": events(timeline.state)}
            elif (
                timeline.membership in ("leave", "ban")
                and room_id not in forgotten
                # A leave since the token is news, always sent. In an initial sync, a
                # room the user left of their own accord only when the filter asks
                # (spec: include_leave); one they were kicked or banned from always,
                # as Synapse sends it (clients show "you were banned from ...").
                and (since is not None or only.include_leave or not _left_by_self(timeline))
            ):
                leave[room_id] = {
                    "timeline": _timeline(timeline, only, ignored),
                    "state": events(_kept(only.state, timeline.state)),
                    "account_data": events([]),
                }
        # Server-side aggregations (m.thread, m.reference) on the timelines' events: an
        # initial sync read them with its timelines; an incremental one reads them in one
        # more transaction, only when some served event may have relations.
        served = [
            e
            for part in (join, leave)
            for room in part.values()
            for e in room["timeline"]["events"]
        ]
        if since is None:
            attach_bundles(served, result.aggregations)
        else:
            # An incremental sync's timelines hold events after the token, except rooms
            # whose membership of the user moved (a newly joined room shows older
            # history): the rest are skipped unless the change cache saw a relation to
            # them (the common case then costs no read).
            moved = {e.get("room_id") for e in result.membership_changes}
            candidates = self.reader.may_have_relations_since(
                [str(e.get("event_id")) for e in served if e.get("room_id") not in moved],
                since.minimum,
            )
            served = [
                e
                for e in served
                if e.get("room_id") in moved or str(e.get("event_id")) in candidates
            ]
            await bundle_aggregations(self.reader, user_id, ctx.device_id, served, ignored)
        if since is not None:
            newly_invited = {r for r, t in result.rooms.items() if t.membership == "invite"} | {
                e["room_id"]
                for e in result.membership_changes
                if e.get("content", {}).get("membership") == "invite"
            }
            newly_invited = {r for r in newly_invited if only.room_allowed(r)}
            await self._invites(
                user_id, newly_invited - set(join), invite, every=ctx.full_state, only=only
            )
        for room_id in [
            r
            for r, room in invite.items()
            if ignored_invite(room["invite_state"]["events"], user_id, ignored)
        ]:
            del invite[room_id]  # invites from ignored users are dropped (spec)
        ctx.prev_batch = result.next_token.to_string() if since is None else since.to_string()
        if since is not None and result.members_moved():
            # Over the whole range (from the slowest writer's position): the device lists
            # section may over-report who changed, never miss one.
            ctx.membership_range = (since.minimum, result.next_token.maximum)
        return result.next_token

    async def finish(self, ctx: SyncContext) -> None:
        only = ctx.filter
        join: dict[str, Any] = ctx.body["rooms"]["join"]
        if ctx.room_account_data or ctx.room_ephemeral:
            joined = await ctx.joined_rooms()
            prev_batch = ctx.prev_batch
            for room_id in set(ctx.room_account_data) | set(ctx.room_ephemeral):
                if room_id not in joined or not only.room_allowed(room_id):
                    continue
                room = join.get(room_id)
                if room is None:
                    room = join[room_id] = _empty_joined_room(prev_batch)
                if room_id in ctx.room_account_data:
                    room["account_data"]["events"] = ctx.room_account_data[room_id]
                ephemeral = ctx.room_ephemeral.get(room_id)
                if ephemeral:
                    room["ephemeral"]["events"].extend(only.ephemeral.apply(ephemeral))
        if ctx.incremental and not ctx.full_state:
            # Rooms the filter left with nothing to say are not sent, and so do not end
            # a long poll (a message type the client filtered out does not wake it).
            for room_id in [r for r, room in join.items() if _says_nothing(room)]:
                del join[room_id]
        summaries = await self.reader.room_summaries(
            ctx.user_id,
            [r for r, room in join.items() if not ctx.incremental or _membership_moved(room)],
        )
        for room_id, summary in summaries.items():
            join[room_id]["summary"] = summary
        if ctx.filter.timeline.unread_thread_notifications:
            # As Synapse: the room's counts are its main timeline's, and each thread with
            # unread notifications has its own (none: the key is left out).
            threaded = await self.unread.threaded_counts(ctx.user_id, list(join))
            for room_id, split in threaded.items():
                join[room_id]["unread_notifications"] = split.main
                if split.threads:
                    join[room_id]["unread_thread_notifications"] = split.threads
        else:
            for room_id, counts in (await self.unread.counts(ctx.user_id, list(join))).items():
                join[room_id]["unread_notifications"] = counts
        rooms = ctx.body["rooms"]
        if rooms["join"] or rooms["invite"] or rooms["leave"]:
            ctx.has_news = True

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
                invite[timeline.room_id] = {"invite_state": events(timeline.state)}


def _state_only(timeline: RoomTimeline, now: EventsToken) -> RoomTimeline:
    """A room of a sync whose timeline limit is 0: no timeline events, ``limited`` if
    there were any, and a ``prev_batch`` from where paginating back finds them. The
    state is the state after them (spec: the state at the start of the, empty,
    timeline): the state read (the state before the events) with their state events
    added, later ones replacing earlier ones of the same key."""
    by_key = {(e.get("type"), e.get("state_key")): e for e in timeline.state}
    for event in timeline.events:
        if "state_key" in event:
            by_key[(event.get("type"), event.get("state_key"))] = event
    return replace(
        timeline,
        events=[],
        limited=timeline.limited or bool(timeline.events),
        prev_batch=now if timeline.events else timeline.prev_batch,
        state=list(by_key.values()),
    )


def _left_by_self(timeline: RoomTimeline) -> bool:
    """Whether the user's leave from a room was their own (a leave or a rejected
    invite), not a kick, a ban or a withdrawn invite."""
    event = timeline.member_event
    if event is None or timeline.membership != "leave":
        return False
    return event.get("sender") == event.get("state_key")


def _timeline_predicate(
    only: RoomEventFilter, ignored: frozenset[str]
) -> Callable[[Mapping[str, Any]], bool] | None:
    """What the read path fills timelines with: the events the timeline filter keeps,
    less the non-state events of ignored users (None: every event)."""
    if only.allows_all and not ignored:
        return None
    if not ignored:
        return only.matches

    def keep(event: Mapping[str, Any]) -> bool:
        if "state_key" not in event and event.get("sender") in ignored:
            return False
        return only.allows_all or only.matches(event)

    return keep


def _kept(only: EventFilter, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` that pass ``only`` (its ``limit`` is for timelines, not applied)."""
    return events if only.allows_all else [e for e in events if only.matches(e)]


def _timeline(timeline: RoomTimeline, only: SyncFilter, ignored: frozenset[str]) -> dict[str, Any]:
    # The read path filled the timeline with the events the filter keeps (reading on
    # past the others, within a bound) and left out ignored users' (see
    # _timeline_predicate); applying both again here costs one pass over `limit` events.
    return {
        "events": hide_ignored(_kept(only.timeline, timeline.events), ignored),
        "limited": timeline.limited,
        "prev_batch": timeline.prev_batch.to_string(),
    }


def _joined_room(
    timeline: RoomTimeline, only: SyncFilter, ignored: frozenset[str]
) -> dict[str, Any]:
    room = _empty_joined_room(timeline.prev_batch.to_string())
    room["timeline"] = _timeline(timeline, only, ignored)
    room["state"] = events(_kept(only.state, timeline.state))
    return room


def _empty_joined_room(prev_batch: str) -> dict[str, Any]:
    return {
        "timeline": {"events": [], "limited": False, "prev_batch": prev_batch},
        "state": events([]),
        "ephemeral": events([]),
        "account_data": events([]),
        "unread_notifications": {"highlight_count": 0, "notification_count": 0},
        "summary": {},
    }


#: State whose change can change a room's summary.
_SUMMARY_TYPES = frozenset({EventTypes.MEMBER, EventTypes.NAME, EventTypes.CANONICAL_ALIAS})


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
