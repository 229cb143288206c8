"""The read side: what each user may see, and the reads clients make (``docs/reading.md``).

- :mod:`~roomstream.reading.visibility`: the history visibility rules and what the
  persister records, at commit, so that reads apply them by range tests;
- :mod:`~roomstream.reading.format`: the one client event format;
- :mod:`~roomstream.reading.tokens`: opaque tokens (events-stream positions per writer,
  points in a room's topological order);
- :mod:`~roomstream.reading.reader`: :class:`RoomReader`, the reads behind one facade,
  each in a module named for it: :mod:`~roomstream.reading.timeline` (new events since a
  token), :mod:`~roomstream.reading.latest_rooms`, :mod:`~roomstream.reading.summaries`,
  :mod:`~roomstream.reading.pagination`, :mod:`~roomstream.reading.context`,
  :mod:`~roomstream.reading.members`, :mod:`~roomstream.reading.room_state`,
  :mod:`~roomstream.reading.events` (single events, the formatting cache),
  :mod:`~roomstream.reading.search` (full-text search of room events, and its index);

No HTTP here: the Client-Server API serves these. Refusals are the named errors of
:mod:`roomstream.errors` (``NotFoundError``, ``ForbiddenError``, ``InvalidParamError``);
only :func:`roomstream.httpbase.matrix_error_middleware` turns them into answers.
"""

from roomstream.reading.format import ClientEvent, client_event, encode_client_event
from roomstream.reading.participants import read_side_participants
from roomstream.reading.reader import MAX_LIMIT, RoomReader
from roomstream.reading.results import (
    EventContext,
    LatestRoomsPage,
    PaginationChunk,
    RoomPage,
    RoomsCursor,
    RoomStateView,
    RoomTimeline,
    SyncResult,
)
from roomstream.reading.search import SearchQuery, SearchResults
from roomstream.reading.tokens import (
    EventsToken,
    InvalidTokenError,
    PaginationToken,
    RoomPosition,
    parse_pagination_token,
)

__all__ = [
    "MAX_LIMIT",
    "ClientEvent",
    "EventContext",
    "EventsToken",
    "InvalidTokenError",
    "LatestRoomsPage",
    "PaginationChunk",
    "PaginationToken",
    "RoomPage",
    "RoomPosition",
    "RoomReader",
    "RoomStateView",
    "RoomTimeline",
    "RoomsCursor",
    "SearchQuery",
    "SearchResults",
    "SyncResult",
    "client_event",
    "encode_client_event",
    "parse_pagination_token",
    "read_side_participants",
]
