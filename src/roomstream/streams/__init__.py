"""Streams: append-only logs of facts with stream IDs, their writers and their readers.

- :mod:`~roomstream.streams.positions`: the I/O-free position bookkeeping.
- :mod:`~roomstream.streams.id_generator`: reserving IDs from the database.
- :mod:`~roomstream.streams.registry`: the named streams, row formats, ``get_updates``.
- :mod:`~roomstream.streams.rows`: typed views of stream rows (named fields).
- :mod:`~roomstream.streams.change_cache`: "may X have changed since p?" caches.
- :mod:`~roomstream.streams.memory`: streams held in memory (typing).
"""

from roomstream.streams.change_cache import StreamChangeCache
from roomstream.streams.id_generator import StreamIdGenerator, StreamTableRef
from roomstream.streams.memory import InMemoryStream, StreamTooOldError
from roomstream.streams.positions import StreamPositionTracker, UnknownIdError
from roomstream.streams.registry import STREAMS, StreamDefinition, Update, get_stream
from roomstream.streams.streams import StreamSet

__all__ = [
    "STREAMS",
    "InMemoryStream",
    "StreamChangeCache",
    "StreamDefinition",
    "StreamIdGenerator",
    "StreamPositionTracker",
    "StreamSet",
    "StreamTableRef",
    "StreamTooOldError",
    "UnknownIdError",
    "Update",
    "get_stream",
]
