"""The reads, behind one facade: :class:`RoomReader` (``docs/reading.md``).

Each read lives in a module named for it, with its SQL:

- :mod:`~roomstream.reading.timeline`: new events since a token (``/sync``);
- :mod:`~roomstream.reading.latest_rooms`: the latest events of the latest rooms;
- :mod:`~roomstream.reading.summaries`: room summaries (member counts, heroes);
- :mod:`~roomstream.reading.pagination`: pagination (``/messages``), latest pages;
- :mod:`~roomstream.reading.context`: context around an event;
- :mod:`~roomstream.reading.members`: members at a point;
- :mod:`~roomstream.reading.room_state`: a room's state as a user may see it, and the
  state at events and tokens;
- :mod:`~roomstream.reading.events`: single events, and the formatting cache every read
  formats with;
- :mod:`~roomstream.reading.changes`: the change caches (which rooms and users changed
  since a position), each user's rooms;
- :mod:`~roomstream.reading.timeline_rows`: timeline rows and what one user sees of a
  room (the segments every page is read by).

Every read runs its SQL in one database interaction (the hop to a worker thread costs
more than most of these queries) and formats events on the event loop with
:func:`roomstream.reading.format.client_event`. Visibility comes from what the persister
recorded (:mod:`roomstream.reading.visibility`). The transaction-ID records of sends are
the write path's (:mod:`roomstream.rooms.transaction_ids`); the reader only forwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from roomstream.reading.changes import ChangeTracker
from roomstream.reading.context import ContextReads
from roomstream.reading.events import EventFormatter, SingleEvents
from roomstream.reading.format import ClientEvent
from roomstream.reading.latest_rooms import LatestRooms, StateChoice
from roomstream.reading.members import Members
from roomstream.reading.pagination import Pagination
from roomstream.reading.results import (
    EventContext,
    LatestRoomsPage,
    PaginationChunk,
    RoomPage,
    RoomsCursor,
    RoomStateView,
    SyncResult,
)
from roomstream.reading.room_state import RoomStateReads
from roomstream.reading.summaries import RoomSummaries
from roomstream.reading.timeline import NewEvents
from roomstream.reading.timeline_rows import MAX_LIMIT
from roomstream.reading.tokens import EventsToken, PaginationToken, RoomPosition
from roomstream.rooms.store import EventStore
from roomstream.rooms.transaction_ids import TransactionIds
from roomstream.streams import StreamSet

if TYPE_CHECKING:
    from roomstream.rooms.engine import RoomEngine

__all__ = ["MAX_LIMIT", "RoomReader"]


class RoomReader:
    """The read side over one process's storage and streams: one method per read,
    each forwarding to the module that owns it (see the module docstring).

    Safe to share between requests. Holds caches of which rooms and users changed at
    which events-stream position (fed from the events stream itself, so any process can
    run a reader: it sees what its stream positions say is complete), of each user's
    rooms, of room summaries and of formatted events.
    """

    def __init__(
        self,
        store: EventStore,
        streams: StreamSet,
        *,
        clock: Callable[[], float] = time.time,
        include_age: bool = True,
        change_cache_size: int = 100_000,
        # As many as the event cache's (EventStore; both are `caches` in the
        # configuration): a process's memory for served events levels off once that many
        # distinct events have been served (bench/bench_memory.py).
        format_cache_size: int = 20_000,
    ) -> None:
        self.store = store
        self.db = db = store.db
        self.streams = streams
        self._clock = clock
        self.changes = changes = ChangeTracker(db, streams, change_cache_size=change_cache_size)
        self.formatter = formatter = EventFormatter(
            store, clock=clock, include_age=include_age, cache_size=format_cache_size
        )
        self._latest = LatestRooms(db, formatter, changes)
        self._new_events = NewEvents(db, formatter, changes, self._latest)
        self._summaries = RoomSummaries(db, changes, cache_size=change_cache_size)
        self._pagination = Pagination(db, formatter)
        self._context = ContextReads(db, formatter)
        self._members = Members(db, formatter)
        self._room_state = RoomStateReads(db, formatter)
        self._events = SingleEvents(db, formatter)
        self._transaction_ids = TransactionIds(db, clock=clock)

    @classmethod
    def for_engine(cls, engine: RoomEngine, **kwargs: Any) -> RoomReader:
        """A reader over a :class:`~roomstream.rooms.engine.RoomEngine`'s store and streams."""
        return cls(engine.store, engine.streams, **kwargs)

    # -- tokens and change caches (reading.changes) ---------------------------------------

    def current_token(self) -> EventsToken:
        """The events position this process has seen complete, per writer."""
        return EventsToken.from_positions(self.streams.generator("events").get_positions())

    @property
    def ingested_floor(self) -> int:
        """See :attr:`ChangeTracker.ingested_floor`."""
        return self.changes.ingested_floor

    def rooms_changed_since(self, room_ids: Iterable[str], position: int) -> set[str]:
        """See :meth:`ChangeTracker.rooms_changed_since`."""
        return self.changes.rooms_changed_since(room_ids, position)

    def ingest_rows(
        self, writer: str, since: int, upto: int, updates: Sequence[tuple[int, Any]]
    ) -> bool:
        """See :meth:`ChangeTracker.ingest_rows`."""
        return self.changes.ingest_rows(writer, since, upto, updates)

    # -- the reads ---------------------------------------------------------------------

    async def sync(
        self,
        user_id: str,
        since: EventsToken | None,
        *,
        timeline_limit: int = 10,
        device_id: str | None = None,
        full_state: bool = False,
        lazy_members: bool = False,
    ) -> SyncResult:
        """See :meth:`roomstream.reading.timeline.NewEvents.sync`."""
        return await self._new_events.sync(
            user_id, since, timeline_limit=timeline_limit, device_id=device_id,
            full_state=full_state, lazy_members=lazy_members,
        )  # fmt: skip

    async def room_summaries(
        self, user_id: str, room_ids: Collection[str]
    ) -> dict[str, dict[str, Any]]:
        """See :meth:`roomstream.reading.summaries.RoomSummaries.room_summaries`."""
        return await self._summaries.room_summaries(user_id, room_ids)

    async def latest_rooms(
        self,
        user_id: str,
        *,
        room_limit: int = 20,
        event_limit: int = 20,
        cursor: RoomsCursor | None = None,
        state: StateChoice = "current",
        memberships: Collection[str] = ("join", "invite", "leave", "ban"),
        device_id: str | None = None,
        _token: EventsToken | None = None,
    ) -> LatestRoomsPage:
        """See :meth:`roomstream.reading.latest_rooms.LatestRooms.latest_rooms`."""
        return await self._latest.latest_rooms(
            user_id, room_limit=room_limit, event_limit=event_limit, cursor=cursor,
            state=state, memberships=memberships, device_id=device_id, _token=_token,
        )  # fmt: skip

    async def position_of_event(self, room_id: str, event_id: str) -> RoomPosition:
        """See :meth:`roomstream.reading.pagination.Pagination.position_of_event`."""
        return await self._pagination.position_of_event(room_id, event_id)

    async def paginate(
        self,
        user_id: str,
        room_id: str,
        from_token: PaginationToken | None,
        *,
        direction: Literal["b", "f"] = "b",
        limit: int = 10,
        to_token: PaginationToken | None = None,
        device_id: str | None = None,
    ) -> PaginationChunk:
        """See :meth:`roomstream.reading.pagination.Pagination.paginate`."""
        return await self._pagination.paginate(
            user_id, room_id, from_token, direction=direction, limit=limit,
            to_token=to_token, device_id=device_id,
        )  # fmt: skip

    async def latest_pages(
        self,
        user_id: str,
        room_ids: Sequence[str],
        *,
        limit: int,
        device_id: str | None = None,
    ) -> dict[str, RoomPage]:
        """See :meth:`roomstream.reading.pagination.Pagination.latest_pages`."""
        return await self._pagination.latest_pages(
            user_id, room_ids, limit=limit, device_id=device_id
        )

    async def context(
        self,
        user_id: str,
        room_id: str,
        event_id: str,
        *,
        before: int = 5,
        after: int = 5,
        device_id: str | None = None,
    ) -> EventContext:
        """See :meth:`roomstream.reading.context.ContextReads.context`."""
        return await self._context.context(
            user_id, room_id, event_id, before=before, after=after, device_id=device_id
        )

    async def members(
        self,
        user_id: str,
        room_id: str,
        *,
        at: PaginationToken | str | None = None,
        membership: Collection[str] | None = None,
        not_membership: Collection[str] | None = None,
        users: Collection[str] | None = None,
    ) -> list[ClientEvent]:
        """See :meth:`roomstream.reading.members.Members.members`."""
        return await self._members.members(
            user_id, room_id, at=at, membership=membership, not_membership=not_membership,
            users=users,
        )  # fmt: skip

    async def room_state_for(self, user_id: str, room_id: str) -> RoomStateView:
        """See :meth:`roomstream.reading.room_state.RoomStateReads.room_state_for`."""
        return await self._room_state.room_state_for(user_id, room_id)

    async def get_event(
        self, user_id: str, event_id: str, *, device_id: str | None = None
    ) -> ClientEvent | None:
        """See :meth:`roomstream.reading.events.SingleEvents.get_event`."""
        return await self._events.get_event(user_id, event_id, device_id=device_id)

    async def is_visible(self, user_id: str, event_id: str) -> bool:
        """See :meth:`roomstream.reading.events.SingleEvents.is_visible`."""
        return await self._events.is_visible(user_id, event_id)

    # -- transaction IDs (the write path's: roomstream.rooms.transaction_ids) -----------

    async def record_transaction_id(
        self, event_id: str, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> None:
        """See :meth:`roomstream.rooms.transaction_ids.TransactionIds.record_transaction_id`."""
        await self._transaction_ids.record_transaction_id(
            event_id, room_id, user_id, device_id, txn_id
        )

    async def transactions_of_device(
        self, room_id: str, user_id: str, device_id: str, limit: int
    ) -> dict[str, str] | None:
        """See :meth:`roomstream.rooms.transaction_ids.TransactionIds.transactions_of_device`."""
        return await self._transaction_ids.transactions_of_device(
            room_id, user_id, device_id, limit
        )

    async def event_for_transaction(
        self, room_id: str, user_id: str, device_id: str, txn_id: str
    ) -> str | None:
        """See :meth:`roomstream.rooms.transaction_ids.TransactionIds.event_for_transaction`."""
        return await self._transaction_ids.event_for_transaction(
            room_id, user_id, device_id, txn_id
        )
