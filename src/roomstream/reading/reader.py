"""The reads, behind one facade: :class:`RoomReader` (``docs/reading.md``).

Each read lives in a module named for it, with its SQL:

- :mod:`~roomstream.reading.timeline`: new events since a token (``/sync``);
- :mod:`~roomstream.reading.latest_rooms`: the latest events of the latest rooms;
- :mod:`~roomstream.reading.summaries`: room summaries (member counts, heroes);
- :mod:`~roomstream.reading.pagination`: pagination (``/messages``), latest pages;
- :mod:`~roomstream.reading.context`: context around an event;
- :mod:`~roomstream.reading.members`: members at a point;
- :mod:`~roomstream.reading.relations`: relations, threads, bundled aggregations;
- :mod:`~roomstream.reading.room_state`: a room's state as a user may see it, and the
  state at events and tokens;
- :mod:`~roomstream.reading.events`: single events, and the formatting cache every read
  formats with;
- :mod:`~roomstream.reading.search`: full-text search of room events (``/search``);
- :mod:`~roomstream.reading.changes`: the change caches (which rooms and users changed
  since a position), each user's rooms;
- :mod:`~roomstream.reading.timeline_rows`: timeline rows and what one user sees of a
  room (the segments every page is read by).

Every read runs its SQL in one database interaction (the hop to a worker thread costs
more than most of these queries) and formats events on the event loop with
:func:`roomstream.reading.format.client_event`. Visibility comes from what the persister
recorded (:mod:`roomstream.reading.visibility`). The transaction-ID records of sends are
the write path's (:mod:`roomstream.rooms.transaction_ids`); the reader only exposes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roomstream.reading.changes import ChangeTracker
from roomstream.reading.context import ContextReads
from roomstream.reading.events import EventFormatter, SingleEvents
from roomstream.reading.latest_rooms import LatestRooms
from roomstream.reading.members import Members
from roomstream.reading.pagination import Pagination
from roomstream.reading.relations import RelationReads
from roomstream.reading.room_state import RoomStateReads
from roomstream.reading.search import RoomSearch
from roomstream.reading.summaries import RoomSummaries
from roomstream.reading.timeline import NewEvents
from roomstream.reading.timeline_rows import MAX_LIMIT
from roomstream.reading.timestamps import TimestampReads
from roomstream.reading.tokens import EventsToken
from roomstream.rooms.store import EventStore
from roomstream.rooms.transaction_ids import TransactionIds
from roomstream.streams import StreamSet

if TYPE_CHECKING:
    from roomstream.rooms.engine import RoomEngine

__all__ = ["MAX_LIMIT", "RoomReader"]


class RoomReader:
    """The read side over one process's storage and streams: each read (``sync``,
    ``latest_rooms``, ``paginate``...) is the method of the module that owns it, bound
    in :meth:`__init__` under the name callers have always used.

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
        latest = LatestRooms(db, formatter, changes)
        pagination = Pagination(db, formatter)
        single = SingleEvents(db, formatter)
        transaction_ids = TransactionIds(db, clock=clock)
        # Each read is the owning module's method itself, bound here: the same names and
        # signatures as ever, and no extra call between a caller and the read.
        #: New events since a token (reading.timeline).
        self.sync = NewEvents(db, formatter, changes, latest).sync
        #: Member counts and heroes (reading.summaries).
        self.room_summaries = RoomSummaries(
            db, changes, cache_size=change_cache_size
        ).room_summaries
        #: The latest events of the latest rooms (reading.latest_rooms).
        self.latest_rooms = latest.latest_rooms
        #: Pagination (reading.pagination).
        self.position_of_event = pagination.position_of_event
        self.paginate = pagination.paginate
        self.latest_pages = pagination.latest_pages
        #: Context around an event (reading.context).
        self.context = ContextReads(db, formatter).context
        #: Members at a point (reading.members).
        self.members = Members(db, formatter).members
        #: A room's state as a user may see it (reading.room_state).
        room_state = RoomStateReads(db, formatter)
        self.room_state_for = room_state.room_state_for
        #: Full-text search of room events (reading.search).
        self.search = RoomSearch(db, formatter, room_state).search
        #: Relations, threads and bundled aggregations (reading.relations).
        relations = RelationReads(db, formatter)
        self.relations = relations.relations
        self.threads = relations.threads
        self.relation_aggregations = relations.aggregations
        #: Single events (reading.events).
        self.get_event = single.get_event
        self.is_visible = single.is_visible
        #: The nearest visible event to a timestamp (reading.timestamps).
        self.event_at_timestamp = TimestampReads(db).event_at_timestamp
        #: The write path's transaction-ID records (rooms.transaction_ids).
        self.record_transaction_id = transaction_ids.record_transaction_id
        self.transactions_of_device = transaction_ids.transactions_of_device
        self.event_for_transaction = transaction_ids.event_for_transaction
        #: The change caches (reading.changes).
        self.rooms_changed_since = changes.rooms_changed_since
        self.may_have_relations_since = changes.may_have_relations_since
        self.ingest_rows = changes.ingest_rows

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
