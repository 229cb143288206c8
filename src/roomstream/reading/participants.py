"""What the read side records in the persister's transactions."""

from __future__ import annotations

from roomstream.reading.relations import RelationsRecorder
from roomstream.reading.search import SearchIndexer
from roomstream.reading.visibility import VisibilityRecorder
from roomstream.rooms.participants import PersistParticipant


def read_side_participants() -> list[PersistParticipant]:
    """Fresh participants for one persister: the visibility recorder (each keeps its own
    per-room memory, so one persister's must not be shared with another's) and the
    relations index and the search index's writer."""
    return [VisibilityRecorder(), RelationsRecorder(), SearchIndexer()]
