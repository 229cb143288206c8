"""Participants: what else writes inside the persister's transaction.

The persister stores events, their state and orderings. Other parts of the system must
record facts derived from each persisted batch *in the same transaction*, so that no
reader ever sees an event without them (the read side's visibility records are one:
``roomstream.reading.visibility``). The persister knows them only through
:class:`PersistParticipant`, and they are handed to it by whoever assembles the process
(``roomstream.homeserver``): ``rooms`` depends on nothing above it.

Invariant: for every batch the persister commits, each participant's
:meth:`PersistParticipant.record_txn` is called once per room of the batch, inside the
batch's transaction, with every stored event of that room (outliers, rejected and
soft-failed events included, flagged by ``in_timeline``); a participant that raises
rolls the whole batch back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from roomstream.events.model import Event, StateKey
from roomstream.storage import Transaction

__all__ = ["PersistParticipant", "TimelineInput"]


@dataclass(frozen=True, slots=True)
class TimelineInput:
    """What the persister hands over for each event it stores.

    ``in_timeline``: the event has state and was neither rejected nor soft-failed.
    ``state_before``/``state_after``: the room state before and after it (None for
    outliers). The persister's state maps are shared, never copied: participants may
    compare them by identity first.
    """

    event: Event
    stream_ordering: int
    instance_name: str
    in_timeline: bool
    state_before: Mapping[StateKey, str] | None
    state_after: Mapping[StateKey, str] | None

    @property
    def position(self) -> tuple[int, int]:
        """The event's place in the room's topological order: (depth, stream ordering)."""
        return (self.event.depth, self.stream_ordering)


class PersistParticipant(Protocol):
    """Something that records derived facts in the persister's transaction."""

    def record_txn(self, txn: Transaction, room_id: str, items: Sequence[TimelineInput]) -> None:
        """Record what this participant derives from ``items`` (one room's events of one
        batch, in the batch's order) in ``txn``."""
        ...
