"""Simplified sliding sync (MSC4186) at
``/_matrix/client/unstable/org.matrix.simplified_msc3575/sync`` and
``/_matrix/client/v4/sync`` (``docs/client_api.md``, "Sliding sync").

The room list, filters and per-connection memory are :mod:`roomstream.sliding`; every
timeline and invite view comes from the read path (:class:`~roomstream.reading.RoomReader`),
which applies history visibility: the latest events of the rooms in a list's range are one
``latest_rooms`` read per run of consecutive rooms (its cursor), and what changed since the
connection's last response is one incremental ``sync`` read (rooms with nothing new are
skipped from its change cache). Required state is the current state of rooms the user is
joined to. Long polls wait on the :class:`~roomstream.client.notifier.Notifier`.
"""

from __future__ import annotations

import asyncio
import bisect
import operator
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from roomstream.accounts import Accounts, Requester
from roomstream.client.notifier import Notifier
from roomstream.client.presence import ONLINE, PRESENCE_STATES
from roomstream.client.presence_service import PresenceService
from roomstream.client.relations_routes import bundle_aggregations
from roomstream.client.request import json_response, read_json
from roomstream.client.server import Route, authenticate
from roomstream.client.typing import TypingState
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.errors import InvalidParamError
from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.reading import (
    ClientEvent,
    EventsToken,
    RoomPosition,
    RoomReader,
    RoomTimeline,
    client_event,
)
from roomstream.reading.relations import attach_bundles
from roomstream.sliding.connections import ConnectionStore, RoomSent, Snapshot
from roomstream.sliding.request import RoomConfig, RoomFilters, SlidingRequest, parse_request
from roomstream.sliding.store import BUMP_EVENT_TYPES, RoomEntry, SlidingStore, StateRow

__all__ = ["SlidingSyncHandler", "sliding_sync_routes"]

UNSTABLE_FEATURE = "org.matrix.simplified_msc3575"
UNSTABLE_PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
STABLE_PATH = "/_matrix/client/v4/sync"
#: Memberships whose rooms are listed (leave only as described in ``_listed``).
LISTED = frozenset({"join", "invite", "knock", "ban"})
MAX_HEROES = 5


@dataclass
class _Timeline:
    events: list[dict[str, Any]]
    limited: bool
    prev_batch: str
    num_live: int = 0


@dataclass
class _Plan:
    """One room this response carries."""

    entry: RoomEntry
    config: RoomConfig
    lists: list[str]
    initial: bool
    expanded: bool = False
    timeline: _Timeline | None = None
    sent: RoomSent | None = None


@dataclass
class _Built:
    body: dict[str, Any]
    snapshot: Snapshot
    empty: bool
    window: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Derived:
    """A room list's derived views: the rooms every connection lists (``listed``, in
    order; rooms the user left themselves are decided per connection, ``self_left``
    says whether there are any), by ID, and the joined ones."""

    entries: list[RoomEntry]
    listed: list[RoomEntry]
    self_left: bool
    by_id: dict[str, RoomEntry]
    joined: set[str]
    listed_ids: set[str]


def _neg_activity(entry: RoomEntry) -> int:
    return -entry.activity


def _moved(
    entries: list[RoomEntry], before: Sequence[RoomEntry], after: Sequence[RoomEntry]
) -> list[RoomEntry]:
    """``entries`` (newest first: activity, then room ID, descending) with each entry of
    ``before`` (which it holds) replaced by the same position of ``after``, in order."""
    result = list(entries)
    for old in before:
        key = -old.activity
        low = bisect.bisect_left(result, key, key=_neg_activity)
        high = bisect.bisect_right(result, key, low, key=_neg_activity)
        index = next((i for i in range(low, high) if result[i] is old), None)
        if index is None:  # not where its order says: rebuild (never expected)
            gone = {e.room_id for e in before}
            rebuilt = [*after, *(e for e in entries if e.room_id not in gone)]
            rebuilt.sort(key=_RECENCY, reverse=True)
            return rebuilt
        del result[index]
    for new in after:
        key = -new.activity
        low = bisect.bisect_left(result, key, key=_neg_activity)
        high = bisect.bisect_right(result, key, low, key=_neg_activity)
        # Among equal activity, room IDs descend.
        index = next((i for i in range(low, high) if result[i].room_id < new.room_id), high)
        result.insert(index, new)
    return result


def _dm_rooms(direct: dict[str, Any] | None) -> set[str]:
    rooms: set[str] = set()
    for value in (direct or {}).values():
        if isinstance(value, list):
            rooms.update(r for r in value if isinstance(r, str))
    return rooms


class SlidingSyncHandler:
    def __init__(
        self,
        reader: RoomReader,
        userdata: UserData,
        typing: TypingState,
        notifier: Notifier,
        connections: ConnectionStore | None = None,
        *,
        keys: E2eKeys | None = None,
        max_cached_lists: int = 10_000,
    ) -> None:
        self.reader = reader
        #: End-to-end encryption's keys (None: the e2ee extension says nothing changed).
        self.keys = keys
        self.userdata = userdata
        self.typing = typing
        self.notifier = notifier
        self.connections = connections if connections is not None else ConnectionStore()
        self.store = SlidingStore(reader.db)
        #: user -> (events token, their room list at it), least recently used first.
        self._lists: LruCache[str, tuple[EventsToken, list[RoomEntry]]] = LruCache(
            "sliding_lists", max_cached_lists
        )
        #: id(room list) -> what responses derive from it (the list is kept inside).
        self._derived_cache: LruCache[int, _Derived] = LruCache("sliding_derived")
        #: user -> (account data position, rooms of their m.direct), as ``_lists``.
        self._direct: LruCache[str, tuple[int, set[str]]] = LruCache(
            "sliding_direct", max_cached_lists
        )

    async def sync(self, requester: Requester, request: SlidingRequest) -> dict[str, Any]:
        """The response; with a ``pos`` and nothing new, waits (up to the timeout) until
        something for this user completes."""
        key = (requester.user_id, requester.device_id or "", request.conn_id)
        if request.pos is None:
            connection, previous = self.connections.start(key)
        else:
            connection, previous = self.connections.resume(key, request.pos)
        user_id = requester.user_id
        if previous is None:
            # A connection's first response never waits: nothing to listen for.
            built = await self._build(requester, request, None)
            built.body["pos"] = self.connections.commit(key, connection, built.snapshot)
            return built.body
        # Wake on the user's rooms as last known (a membership change since then wakes
        # through the user's own key, and the list read below then sees it).
        joined = self._derived(previous.entries, user_id).joined
        deadline = time.monotonic() + request.timeout_ms / 1000
        while True:
            with self.notifier.listen(user_id, joined) as waiter:
                while True:
                    built = await self._build(requester, request, previous)
                    remaining = deadline - time.monotonic()
                    if not built.empty or remaining <= 0:
                        break
                    now_joined = self._derived(built.snapshot.entries, user_id).joined
                    if not now_joined <= joined:
                        break  # listen again, on the rooms joined since
                    await waiter.wait(remaining)
            if not built.empty or remaining <= 0:
                break
            joined = now_joined
        built.body["pos"] = self.connections.commit(key, connection, built.snapshot)
        return built.body

    def _derived(self, entries: list[RoomEntry], user_id: str) -> _Derived:
        """What every response needs from a room list, computed once per list (lists
        are immutable once built; the last few are kept by identity)."""
        found = self._derived_cache.get(id(entries))
        if found is not None and found.entries is entries:
            return found
        listed: list[RoomEntry] = []
        self_left = False
        for e in entries:
            if e.membership == "leave" and e.member_sender == user_id:
                self_left = True
            elif e.membership in LISTED or e.membership == "leave":
                listed.append(e)
        derived = _Derived(
            entries,
            listed,
            self_left,
            {e.room_id: e for e in entries},
            {e.room_id for e in entries if e.membership == "join"},
            {e.room_id for e in listed},
        )
        self._remember(derived)
        return derived

    def _remember(self, derived: _Derived) -> None:
        self._derived_cache.set(id(derived.entries), derived)

    async def _direct_rooms(self, user_id: str, position: int) -> set[str]:
        """The rooms of the user's ``m.direct``, read again only when the account data
        stream has moved since the last read (``position`` was taken before this read,
        so a cached set is never older than the position it is kept under)."""
        cached = self._direct.get(user_id)
        if cached is not None and cached[0] == position:
            return cached[1]
        rooms = _dm_rooms(await self.userdata.get_account_data(user_id, None, "m.direct"))
        self._direct.set(user_id, (position, rooms))
        return rooms

    # -- the room list -------------------------------------------------------------------

    def _listed(self, entry: RoomEntry, user_id: str, previous: Snapshot | None) -> bool:
        """The proposal's server list: joined, invited, knocked and banned rooms; rooms
        the user was kicked from; rooms the user left themselves only until the client
        has been told of the leave on this connection."""
        if entry.membership in LISTED:
            return True
        if entry.membership != "leave":
            return False
        if entry.member_sender != user_id:
            return True
        sent = previous.rooms.get(entry.room_id) if previous is not None else None
        return sent is not None and sent.membership != "leave"

    async def _filter(
        self, entries: list[RoomEntry], filters: RoomFilters, user_id: str, dms: set[str]
    ) -> list[RoomEntry]:
        kept = entries
        if filters.is_dm is not None:
            kept = [e for e in kept if (e.room_id in dms) == filters.is_dm]
        if filters.is_invited is not None:
            kept = [e for e in kept if (e.membership == "invite") == filters.is_invited]
        if filters.spaces is not None:
            spaces = [s for s in filters.spaces if s is not None]
            joined_spaces = [e.room_id for e in entries if e.room_id in spaces]
            children = await self.store.space_children(joined_spaces)
            kept = [e for e in kept if e.room_id in children]
        if filters.needs_create():
            types = await self.store.room_types([e.room_id for e in kept])
            if filters.room_types is not None:
                wanted = set(filters.room_types)
                kept = [e for e in kept if types.get(e.room_id) in wanted]
            if filters.not_room_types is not None:
                unwanted = set(filters.not_room_types)
                kept = [e for e in kept if types.get(e.room_id) not in unwanted]
        if filters.is_encrypted is not None:
            encrypted = await self.store.encrypted_rooms([e.room_id for e in kept])
            kept = [e for e in kept if (e.room_id in encrypted) == filters.is_encrypted]
        if filters.tags is not None or filters.not_tags is not None:
            tags = await self.store.room_tags(user_id)
            if filters.tags is not None:
                wanted_tags = set(filters.tags)
                kept = [e for e in kept if tags.get(e.room_id, set()) & wanted_tags]
            if filters.not_tags is not None:
                unwanted_tags = set(filters.not_tags)
                kept = [e for e in kept if not tags.get(e.room_id, set()) & unwanted_tags]
        return kept

    # -- one response --------------------------------------------------------------------

    async def _build(
        self, requester: Requester, request: SlidingRequest, previous: Snapshot | None
    ) -> _Built:
        user_id = requester.user_id
        device_id = requester.device_id
        token = self.reader.current_token()
        positions: dict[str, Any] = {
            name: self.userdata.position(name) for name in ("account_data", "receipts")
        }
        positions["typing"] = self.typing.token
        # What changed since the client's position (the read path's incremental read;
        # rooms with nothing new are skipped without a query).
        changed: dict[str, RoomTimeline] = {}
        #: The events range in which a membership moved (for the e2ee extension).
        moved: tuple[int, int] | None = None
        #: Where the incremental read started, and the rooms whose membership of the user
        #: moved since (their timelines may show older history): for the aggregations.
        since_floor: int | None = None
        moved_rooms: set[str] = set()
        if previous is not None:
            since: EventsToken = previous.positions["events"]
            limits = [c.config.timeline_limit for c in request.lists.values()]
            limits += [c.timeline_limit for c in request.room_subscriptions.values()]
            result = await self.reader.sync(
                user_id, since, timeline_limit=max(1, *limits), device_id=device_id
            )
            changed = result.rooms
            token = result.next_token
            since_floor = since.minimum
            moved_rooms = {str(e.get("room_id")) for e in result.membership_changes}
            if result.members_moved():
                moved = (since.minimum, token.maximum)
            all_entries = await self._room_list(
                user_id, previous.entries, changed, bool(result.membership_changes)
            )
        else:
            # A new connection starts from this process's last list for the user, if
            # any, brought up to date by what changed since (the read path's change
            # cache makes that cost the rooms that changed).
            known = self._lists.get(user_id)
            if known is None:
                all_entries = await self.store.room_list(user_id)
            else:
                result = await self.reader.sync(user_id, known[0], timeline_limit=1)
                token = result.next_token
                all_entries = await self._room_list(
                    user_id, known[1], result.rooms, bool(result.membership_changes)
                )
        self._lists.set(user_id, (token, all_entries))
        derived = self._derived(all_entries, user_id)
        by_id = derived.by_id
        entries = derived.listed
        if derived.self_left and previous is not None:
            # Rooms the user left themselves stay listed until the leave was sent on
            # this connection: only then is the list this connection's own.
            entries = [e for e in all_entries if self._listed(e, user_id, previous)]
        dms = await self._direct_rooms(user_id, positions["account_data"])

        # Which rooms, with which config.
        configs: dict[str, RoomConfig] = {}
        lists_of: dict[str, list[str]] = {}
        list_counts: dict[str, int] = {}
        for name, spec in request.lists.items():
            filtered = await self._filter(entries, spec.filters, user_id, dms)
            list_counts[name] = len(filtered)
            in_range = (
                filtered if spec.range is None else filtered[spec.range[0] : spec.range[1] + 1]
            )
            wanted_state = spec.config.required_state.for_user(user_id)
            for listed in in_range:
                here = RoomConfig(spec.config.timeline_limit, wanted_state)
                old = configs.get(listed.room_id)
                configs[listed.room_id] = here if old is None else old.combine(here)
                lists_of.setdefault(listed.room_id, []).append(name)
        for room_id, sub in request.room_subscriptions.items():
            found = by_id.get(room_id)
            # Subscriptions only reach rooms the user is, or was, a member of.
            if found is None:
                continue
            here = RoomConfig(sub.timeline_limit, sub.required_state.for_user(user_id))
            old = configs.get(room_id)
            configs[room_id] = here if old is None else old.combine(here)

        plans: list[_Plan] = []
        for room_id, config in configs.items():
            entry = by_id[room_id]
            sent = previous.rooms.get(room_id) if previous is not None else None
            was_live = previous is not None and room_id in previous.positions["window"]
            lists = lists_of.get(room_id, [])
            if entry.membership in ("invite", "knock"):
                if sent is None or sent.membership != entry.membership:
                    plans.append(_Plan(entry, config, lists, True, sent=sent))
                continue
            fresh = (
                sent is None
                or sent.membership in ("invite", "knock")
                or (not was_live and sent.activity != entry.activity)
            )
            if fresh:
                plans.append(_Plan(entry, config, lists, True))
                continue
            assert sent is not None
            expanded = config.timeline_limit > sent.timeline_limit
            if (
                expanded
                or room_id in changed
                or sent.membership != entry.membership
                or sent.config_key != config.required_state
                or sent.fields.get("is_dm") != (room_id in dms)
            ):
                plans.append(_Plan(entry, config, lists, False, expanded, sent=sent))

        # The timelines and the joined rooms' current state are independent reads: in
        # flight together (two pool connections), a response waits for the longer only.
        joined_ids = [p.entry.room_id for p in plans if p.entry.membership == "join"]
        states, _ = await asyncio.gather(
            self.store.current_state(joined_ids),
            self._timelines(user_id, device_id, plans, changed, since_floor, moved_rooms),
        )
        rooms_out, new_sent = await self._rooms(user_id, plans, dms, states)

        window = set(configs)
        extensions = await self._extensions(
            requester, request, previous, positions, window, by_id, plans, moved
        )
        rooms_map = dict(previous.rooms) if previous is not None else {}
        rooms_map.update(new_sent)
        positions["events"] = token
        positions["window"] = frozenset(window)
        positions["to_device"] = extensions.pop("_to_device_end", 0)
        # The key counts come in every e2ee answer; only device list changes are news.
        e2ee_news = extensions.pop("_e2ee_news", False)
        snapshot = Snapshot(positions, rooms_map, list_counts, all_entries)
        body: dict[str, Any] = {
            "lists": {name: {"count": count} for name, count in list_counts.items()},
            "rooms": rooms_out,
            "extensions": extensions,
        }
        counts_same = previous is not None and previous.list_counts == list_counts
        news = e2ee_news or any(v for k, v in extensions.items() if k != "e2ee")
        empty = not rooms_out and not news and counts_same
        return _Built(body, snapshot, empty, window)

    async def _room_list(
        self,
        user_id: str,
        cached: list[RoomEntry] | None,
        changed: dict[str, RoomTimeline],
        memberships_changed: bool,
    ) -> list[RoomEntry]:
        """The user's rooms by recency: read whole when the user's memberships changed
        (or nothing is known); otherwise the known list with the rooms that have new
        events moved up (so a wake costs what changed, not the number of rooms)."""
        if cached is None or memberships_changed:
            return await self.store.room_list(user_id)
        if not changed:
            return cached
        derived = self._derived(cached, user_id)
        before = [e for room_id in changed if (e := derived.by_id.get(room_id)) is not None]
        if not before:
            return cached
        # Only rooms with a new event of a bump type (or new events not all seen) can
        # have a new bump_stamp: one index walk for those.
        maybe_bumped = [
            e.room_id
            for e in before
            if e.membership == "join"
            and (
                changed[e.room_id].limited
                or any(ev.get("type") in BUMP_EVENT_TYPES for ev in changed[e.room_id].events)
            )
        ]
        bumps = await self.store.bump_stamps(maybe_bumped) if maybe_bumped else {}
        after = [
            replace(
                e,
                activity=max(e.activity, changed[e.room_id].latest_activity),
                bump=max(e.bump, bumps.get(e.room_id, 0)),
            )
            for e in before
        ]
        # Move the changed rooms in place (C-level copies and binary searches: a wake
        # costs the rooms that changed, not the rooms the user is in), and carry the
        # derived views over the same way (memberships did not change).
        entries = _moved(cached, before, after)
        moved_listed = [
            (b, a) for b, a in zip(before, after, strict=True) if b.room_id in derived.listed_ids
        ]
        by_id = dict(derived.by_id)
        by_id.update((e.room_id, e) for e in after)
        self._remember(
            _Derived(
                entries,
                _moved(derived.listed, [b for b, _ in moved_listed], [a for _, a in moved_listed]),
                derived.self_left,
                by_id,
                derived.joined,
                derived.listed_ids,
            )
        )
        return entries

    # -- timelines -----------------------------------------------------------------------

    async def _timelines(
        self,
        user_id: str,
        device_id: str | None,
        plans: list[_Plan],
        changed: dict[str, RoomTimeline],
        since_floor: int | None = None,
        moved_rooms: set[str] | None = None,
    ) -> None:
        """Fill each plan's timeline: the latest events for rooms sent whole (or with a
        wider limit), the new events for the others; then the server-side aggregations
        (``unsigned["m.relations"]``) of their events, as ``/sync`` bundles them."""
        reload: list[_Plan] = []
        for plan in plans:
            room_id = plan.entry.room_id
            if plan.entry.membership in ("invite", "knock") or plan.config.timeline_limit == 0:
                continue
            if plan.initial or plan.expanded:
                reload.append(plan)
            elif room_id in changed:
                plan.timeline = await self._trimmed(
                    user_id, changed[room_id], plan.config.timeline_limit
                )
        # The read path's page from each room's end, for all of them in one transaction
        # (one per distinct limit); `latest_rooms` would order every room of the user
        # first, a cost that follows their number.
        by_limit: dict[int, list[_Plan]] = {}
        for plan in reload:
            by_limit.setdefault(plan.config.timeline_limit, []).append(plan)
        for limit, group in by_limit.items():
            pages = await self.reader.latest_pages(
                user_id,
                [p.entry.room_id for p in group],
                limit=limit,
                device_id=device_id,
                # Their aggregations in the same transaction.
                aggregate=True,
            )
            for plan in group:
                page = pages[plan.entry.room_id]
                attach_bundles(page.events, page.aggregations)
                plan.timeline = _Timeline(page.events, page.limited, page.prev_batch.to_string())
                new = changed.get(plan.entry.room_id)
                if new is not None:
                    live = {e["event_id"] for e in new.events}
                    plan.timeline.num_live = sum(1 for e in page.events if e["event_id"] in live)
        await self._bundle(user_id, device_id, plans, since_floor, moved_rooms or set())

    async def _bundle(
        self,
        user_id: str,
        device_id: str | None,
        plans: list[_Plan],
        since_floor: int | None,
        moved_rooms: set[str],
    ) -> None:
        """Bundle the aggregations of the incremental timelines in one read (those read
        whole, initial or expanded, came with theirs from ``latest_pages``): every event
        of a room whose membership of the user moved (older history may be shown), and
        of the others only those the read path's change cache saw a relation to since
        ``since_floor`` (as an incremental ``/sync``: events after the position, whose
        relations can only be after it too, so a plain message costs no read)."""
        whole: list[ClientEvent] = []
        new: list[ClientEvent] = []
        for plan in plans:
            if plan.timeline is None or plan.initial or plan.expanded:
                continue
            if since_floor is None or plan.entry.room_id in moved_rooms:
                whole.extend(plan.timeline.events)
            else:
                new.extend(plan.timeline.events)
        if new and since_floor is not None:
            related = self.reader.may_have_relations_since(
                [str(e.get("event_id")) for e in new], since_floor
            )
            whole.extend(e for e in new if str(e.get("event_id")) in related)
        await bundle_aggregations(self.reader, user_id, device_id, whole)

    async def _trimmed(self, user_id: str, timeline: RoomTimeline, limit: int) -> _Timeline:
        events = timeline.events
        if len(events) <= limit:
            return _Timeline(
                events, timeline.limited, timeline.prev_batch.to_string(), num_live=len(events)
            )
        kept = events[-limit:]
        position: RoomPosition = await self.reader.position_of_event(
            timeline.room_id, kept[0]["event_id"]
        )
        return _Timeline(kept, True, position.to_string(), num_live=len(kept))

    # -- rooms ---------------------------------------------------------------------------

    async def _rooms(
        self,
        user_id: str,
        plans: list[_Plan],
        dms: set[str],
        states: dict[str, list[StateRow]],
    ) -> tuple[dict[str, Any], dict[str, RoomSent]]:
        """The response's rooms; ``states``: the current state rows of the joined ones."""
        out: dict[str, Any] = {}
        sent_now: dict[str, RoomSent] = {}
        invites = [p for p in plans if p.entry.membership in ("invite", "knock")]
        stripped = await self._invite_states(user_id, invites)
        joined = [p for p in plans if p.entry.membership == "join"]
        # Which state events to load: required state, and the heroes' member events.
        picks: dict[str, dict[tuple[str, str], str]] = {}
        heroes_of: dict[str, list[StateRow]] = {}
        load: set[str] = set()
        names: dict[str, str] = {}
        for plan in joined:
            room_id = plan.entry.room_id
            rows = states.get(room_id, [])
            picks[room_id] = self._required(plan, rows)
            load.update(picks[room_id].values())
            for r in rows:
                if r.event_type in (EventTypes.NAME, EventTypes.AVATAR) and r.state_key == "":
                    load.add(r.event_id)
                    if r.event_type == EventTypes.NAME:
                        names[room_id] = r.event_id
        events = await self.reader.store.get_events(load) if load else {}
        # Heroes name the rooms without a name (no name event, or an empty one).
        more: set[str] = set()
        for plan in joined:
            room_id = plan.entry.room_id
            name_event = events.get(names.get(room_id, ""))
            content = name_event.data.get("content") if name_event is not None else None
            name = content.get("name") if isinstance(content, dict) else None
            if not (isinstance(name, str) and name):
                heroes_of[room_id] = _heroes(states.get(room_id, []), user_id)
                more.update(r.event_id for r in heroes_of[room_id] if r.event_id not in events)
        if more:
            events.update(await self.reader.store.get_events(more))
        for plan in plans:
            entry, sent = plan.entry, plan.sent
            room_id = entry.room_id
            previous_fields = {} if plan.initial or sent is None else sent.fields
            room: dict[str, Any] = {}
            fields: dict[str, Any] = {"bump_stamp": entry.bump, "membership": entry.membership}
            fields["is_dm"] = room_id in dms
            state_sent: dict[tuple[str, str], str | None] = (
                {} if plan.initial or sent is None else dict(sent.state)
            )
            if entry.membership in ("invite", "knock"):
                state = stripped.get(room_id, [])
                room["stripped_state"] = state
                # Synapse's (and current clients') name for it.
                room["invite_state"] = state
            elif entry.membership == "join":
                rows = states.get(room_id, [])
                by_key = {(r.event_type, r.state_key): r for r in rows}
                name_row = by_key.get((EventTypes.NAME, ""))
                avatar_row = by_key.get((EventTypes.AVATAR, ""))
                fields["name"] = _content_str(events, name_row, "name")
                fields["avatar"] = _content_str(events, avatar_row, "url")
                fields["joined_count"] = sum(1 for r in rows if r.membership == "join")
                fields["invited_count"] = sum(1 for r in rows if r.membership == "invite")
                if room_id in heroes_of:
                    fields["heroes"] = [_hero(events, r) for r in heroes_of[room_id]]
                required = []
                for state_key, event_id in sorted(picks[room_id].items()):
                    if state_sent.get(state_key) != event_id and event_id in events:
                        required.append(client_event(events[event_id]))
                        state_sent[state_key] = event_id
                for state_key, was in list(state_sent.items()):
                    if was is not None and state_key not in by_key:
                        # Removed from the state: a stub says so.
                        required.append({"type": state_key[0], "state_key": state_key[1]})
                        state_sent[state_key] = None
                if plan.initial or required:
                    room["required_state"] = required
            if plan.initial:
                room["initial"] = True
            if plan.timeline is not None:
                room["timeline"] = plan.timeline.events
                room["prev_batch"] = plan.timeline.prev_batch
                room["limited"] = plan.timeline.limited
                room["num_live"] = plan.timeline.num_live
                if plan.expanded:
                    room["expanded_timeline"] = True
            elif plan.initial and entry.membership not in ("invite", "knock"):
                room["timeline"] = []
            for name, value in fields.items():
                if previous_fields.get(name, _MISSING) != value:
                    if name == "is_dm" and plan.initial and not value:
                        continue  # absent in an initial room: not a DM
                    if name in ("name", "avatar", "heroes") and value is None:
                        if not plan.initial and name in previous_fields:
                            room[name] = None  # removed since last sent
                        continue
                    room[name] = value
            if plan.lists:
                room["lists"] = plan.lists
            if entry.membership == "join":
                room.setdefault("notification_count", 0)
                room.setdefault("highlight_count", 0)
            out[room_id] = room
            limit_sent = max(
                plan.config.timeline_limit,
                0 if plan.initial or sent is None else sent.timeline_limit,
            )
            sent_now[room_id] = RoomSent(
                entry.membership,
                limit_sent if plan.timeline is not None or not plan.initial else 0,
                state_sent,
                fields,
                plan.config.required_state,
                entry.activity,
            )
        return out, sent_now

    def _required(self, plan: _Plan, rows: Sequence[StateRow]) -> dict[tuple[str, str], str]:
        """(type, state_key) -> event ID of the current state the config asks for."""
        wanted = plan.config.required_state
        picked = {
            (r.event_type, r.state_key): r.event_id
            for r in rows
            if wanted.matches(r.event_type, r.state_key)
        }
        if wanted.lazy_members and plan.timeline is not None:
            # Members of the timeline's senders and targets (not filtered by exclude).
            users = {str(e.get("sender")) for e in plan.timeline.events}
            users.update(
                str(e["state_key"])
                for e in plan.timeline.events
                if e.get("type") == EventTypes.MEMBER and "state_key" in e
            )
            for r in rows:
                if r.event_type == EventTypes.MEMBER and r.state_key in users:
                    picked[(r.event_type, r.state_key)] = r.event_id
        return picked

    async def _invite_states(
        self, user_id: str, invites: list[_Plan]
    ) -> dict[str, list[dict[str, Any]]]:
        """The read path's invite (and knock) view: the user's membership event and the
        room's descriptive state."""
        if not invites:
            return {}
        wanted = {p.entry.room_id for p in invites}
        total = sum(1 for _ in wanted)
        page = await self.reader.latest_rooms(
            user_id, room_limit=total + 50, event_limit=1, memberships=("invite", "knock")
        )
        found = {t.room_id: t.state for t in page.rooms if t.room_id in wanted}
        cursor = page.next_cursor
        while cursor is not None and len(found) < len(wanted):
            page = await self.reader.latest_rooms(
                user_id,
                room_limit=500,
                event_limit=1,
                memberships=("invite", "knock"),
                cursor=cursor,
            )
            found.update({t.room_id: t.state for t in page.rooms if t.room_id in wanted})
            cursor = page.next_cursor
        return found

    # -- extensions ----------------------------------------------------------------------

    async def _extensions(
        self,
        requester: Requester,
        request: SlidingRequest,
        previous: Snapshot | None,
        positions: dict[str, Any],
        window: set[str],
        by_id: dict[str, RoomEntry],
        plans: list[_Plan],
        moved: tuple[int, int] | None,
    ) -> dict[str, Any]:
        ext = request.extensions
        user_id = requester.user_id
        result: dict[str, Any] = {}
        joined_window = sorted(r for r in window if by_id[r].membership == "join")
        fresh = {p.entry.room_id for p in plans if p.initial}
        if ext.to_device and requester.device_id is not None:
            acknowledged = ext.to_device_since
            if acknowledged is None:
                acknowledged = previous.positions["to_device"] if previous is not None else 0
            upto = self.userdata.position("to_device")
            messages, end, _ = await self.userdata.to_device_messages(
                user_id, requester.device_id, acknowledged, upto
            )
            result["_to_device_end"] = end
            # Nothing new is no answer (the long poll goes on waiting).
            if messages or previous is None:
                result["to_device"] = {"next_batch": str(end), "events": messages}
        elif previous is not None:
            result["_to_device_end"] = previous.positions["to_device"]
        if ext.e2ee and requester.device_id is not None:
            result.update(await self._e2ee(requester, previous, positions, moved))
        elif previous is not None and "device_lists" in previous.positions:
            positions["device_lists"] = previous.positions["device_lists"]
        if ext.account_data:
            since = 0 if previous is None else previous.positions["account_data"]
            global_data, room_data = await self.userdata.account_data_since(
                user_id, since, positions["account_data"]
            )
            if fresh and since:
                _, fresh_data = await self.userdata.account_data_since(
                    user_id, 0, positions["account_data"]
                )
                for room_id in fresh:
                    if room_id in fresh_data:
                        room_data[room_id] = fresh_data[room_id]
            rooms = {r: _typed(data) for r, data in room_data.items() if r in window and data}
            if global_data or rooms:
                result["account_data"] = {"global": _typed(global_data), "rooms": rooms}
        if ext.receipts:
            since = 0 if previous is None else previous.positions["receipts"]
            live = [r for r in joined_window if r not in fresh]
            receipts = await self.userdata.receipts_since(live, since, positions["receipts"])
            starting = [r for r in joined_window if r in fresh]
            receipts.update(await self.userdata.receipts_since(starting, 0, positions["receipts"]))
            if receipts:
                result["receipts"] = {
                    "rooms": {r: {"type": "m.receipt", "content": c} for r, c in receipts.items()}
                }
        if ext.typing:
            since = -1 if previous is None else previous.positions["typing"]
            typing = self.typing.changed([r for r in joined_window if r not in fresh], since)
            typing.update(
                {
                    r: users
                    for r, users in self.typing.changed(
                        [r for r in joined_window if r in fresh], -1
                    ).items()
                    if users
                }
            )
            if typing:
                result["typing"] = {
                    "rooms": {
                        r: {"type": "m.typing", "content": {"user_ids": users}}
                        for r, users in typing.items()
                    }
                }
        return result

    async def _e2ee(
        self,
        requester: Requester,
        previous: Snapshot | None,
        positions: dict[str, Any],
        moved: tuple[int, int] | None,
    ) -> dict[str, Any]:
        """The ``e2ee`` extension (MSC3884), as /sync's device lists section: device list
        changes since the connection's last position (none on its first response: the
        client queries the keys it needs) and the device's one-time key counts and unused
        fallback key types, in every answer."""
        assert requester.device_id is not None
        user_id = requester.user_id
        if self.keys is None:
            body = {
                "device_lists": {"changed": [], "left": []},
                "device_one_time_keys_count": {},
                "device_unused_fallback_key_types": [],
            }
            return {"e2ee": body}
        upto = self.keys.position()
        positions["device_lists"] = upto
        since = None if previous is None else previous.positions.get("device_lists")
        changed: set[str] = set()
        left: set[str] = set()
        if since is not None and (upto > since or moved is not None):
            changed, left = await self.keys.changed_since(
                user_id, since, max(since, upto), membership_range=moved
            )
        counts, fallbacks = await self.keys.key_status(user_id, requester.device_id)
        body = {
            "device_lists": {"changed": sorted(changed), "left": sorted(left)},
            "device_one_time_keys_count": counts,
            "device_unused_fallback_key_types": fallbacks,
        }
        return {"e2ee": body, "_e2ee_news": bool(changed or left)}


_MISSING = object()
_RECENCY = operator.attrgetter("activity", "room_id")


def _typed(by_type: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": t, "content": c} for t, c in sorted(by_type.items())]


def _heroes(rows: Iterable[StateRow], user_id: str) -> list[StateRow]:
    """Joined members first, then invited, then left, in membership order (the
    ``m.heroes`` of ``/sync``), without the user."""
    rank = {"join": 0, "invite": 1, "leave": 2, "ban": 3}
    members = [
        r
        for r in rows
        if r.event_type == EventTypes.MEMBER and r.state_key != user_id and r.membership in rank
    ]
    members.sort(key=lambda r: (rank[r.membership or "leave"], r.stream))
    return members[:MAX_HEROES]


def _hero(events: dict[str, Any], row: StateRow) -> dict[str, Any]:
    hero: dict[str, Any] = {"user_id": row.state_key}
    event = events.get(row.event_id)
    content = event.data.get("content") if event is not None else None
    if isinstance(content, dict):
        if isinstance(content.get("displayname"), str):
            hero["displayname"] = content["displayname"]
        if isinstance(content.get("avatar_url"), str):
            hero["avatar_url"] = content["avatar_url"]
    return hero


def _content_str(events: dict[str, Any], row: StateRow | None, key: str) -> str | None:
    if row is None:
        return None
    event = events.get(row.event_id)
    content = event.data.get("content") if event is not None else None
    value = content.get(key) if isinstance(content, dict) else None
    return value if isinstance(value, str) and value else None


def sliding_sync_routes(
    accounts: Accounts, handler: SlidingSyncHandler, *, presence: PresenceService | None = None
) -> list[Route]:
    async def sliding_sync(request: web.Request) -> web.Response:
        requester = await authenticate(accounts, request)
        body = await read_json(request)
        parsed = parse_request(body, request.query)
        set_presence = request.query.get("set_presence", ONLINE)
        if set_presence not in PRESENCE_STATES:
            raise InvalidParamError("set_presence: online|offline|unavailable")
        if presence is None:
            return json_response(await handler.sync(requester, parsed))
        # As /sync: the device counts as syncing while the request lasts (Synapse's
        # sliding sync does not track presence; MSC4186 has no presence extension).
        async with presence.syncing(requester.user_id, requester.device_id, set_presence):
            answer = await handler.sync(requester, parsed)
        return json_response(answer)

    return [
        Route("POST", UNSTABLE_PATH, sliding_sync, absolute=True),
        Route("POST", STABLE_PATH, sliding_sync, absolute=True),
    ]
