"""Typed views of stream rows: one named tuple per stream (per kind, for ``events``).

On the wire (RDATA, ``get_updates``) a row stays a JSON array in Synapse's field order
(:mod:`~roomstream.streams.registry`); these are its decoded view, so code reads
``row.room_id`` instead of ``data[1]``. Invariant, for every row type ``R`` and wire row
``w`` of its stream: ``R.from_wire(w).to_wire() == tuple(w)`` (``events`` rows: the pair
``(kind, tuple(data))``). ``from_wire`` raises :class:`TypeError` or :class:`ValueError`
on a row of the wrong shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "AccountDataRow",
    "DeviceListsRow",
    "EventRow",
    "EventsRow",
    "PresenceRow",
    "PushRulesRow",
    "ReceiptsRow",
    "StateRow",
    "ToDeviceRow",
    "TypingRow",
    "events_row_from_wire",
]


class EventRow(NamedTuple):
    """An ``events`` row of kind ``ev``: an event was persisted."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    redacts: str | None
    relates_to: str | None
    membership: str | None
    rejected: bool
    outlier: bool

    @property
    def member_user_id(self) -> str | None:
        """The user whose membership this event sets (None for any other event)."""
        # EventTypes.MEMBER (roomstream.events.types); streams sit below events.
        return self.state_key if self.type == "m.room.member" else None

    def to_wire(self) -> tuple[str, tuple[Any, ...]]:
        return ("ev", tuple(self))


class StateRow(NamedTuple):
    """An ``events`` row of kind ``state``: a room's current state changed."""

    room_id: str
    type: str
    state_key: str
    event_id: str | None

    def to_wire(self) -> tuple[str, tuple[Any, ...]]:
        return ("state", tuple(self))


EventsRow = EventRow | StateRow
"""A decoded ``events`` row (wire: ``[kind, data]``)."""


def events_row_from_wire(row: Sequence[Any]) -> EventsRow:
    """The typed view of an ``events`` wire row ``[kind, data]``."""
    kind, data = row
    if kind == "ev":
        return EventRow._make(data)
    if kind == "state":
        return StateRow._make(data)
    raise ValueError(f"unknown events row kind {kind!r}")


class AccountDataRow(NamedTuple):
    """An ``account_data`` row: global (``room_id`` None) or per room."""

    user_id: str
    room_id: str | None
    data_type: str

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> AccountDataRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class ReceiptsRow(NamedTuple):
    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: Any

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> ReceiptsRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class ToDeviceRow(NamedTuple):
    """A ``to_device`` row: ``entity`` is a local user ID (``@…``) or a remote server
    name (messages queued for federation)."""

    entity: str

    @property
    def local_user_id(self) -> str | None:
        entity = str(self.entity)
        return entity if entity.startswith("@") else None

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> ToDeviceRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class TypingRow(NamedTuple):
    room_id: str
    user_ids: list[str]

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> TypingRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class DeviceListsRow(NamedTuple):
    """A ``device_lists`` row: a user whose devices, device keys or cross-signing keys
    changed."""

    user_id: str

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> DeviceListsRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class PushRulesRow(NamedTuple):
    """A ``push_rules`` row: a user whose push rules changed."""

    user_id: str

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> PushRulesRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)


class PresenceRow(NamedTuple):
    """A ``presence`` row: a user's whole presence state (timestamps in ms, 0: never)."""

    user_id: str
    state: str
    last_active_ts: int
    last_federation_update_ts: int
    last_user_sync_ts: int
    status_msg: str | None
    currently_active: bool

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> PresenceRow:
        return cls._make(row)

    def to_wire(self) -> tuple[Any, ...]:
        return tuple(self)
