"""Rooms: persisting events with their orderings and state, creating local events, and
reading rooms back (state at any event, the DAG, pagination).

This package joins the lower layers: it uses ``events`` (format, authorization), ``state``
(state groups, resolution) and ``streams`` (stream orderings) over ``storage``.
"""

from roomstream.rooms.creation import LocalEventCreator, RoomPreset
from roomstream.rooms.persist import EventPersister, PersistedEvent
from roomstream.rooms.store import EventStore

__all__ = ["EventPersister", "EventStore", "LocalEventCreator", "PersistedEvent", "RoomPreset"]
