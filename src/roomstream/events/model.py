"""The in-memory form of a room event (a federation PDU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roomstream.events.room_versions import RoomVersion
from roomstream.events.types import EventTypes

StateKey = tuple[str, str]
"""A piece of room state is identified by (event type, state key)."""


def _referenced_ids(value: Any, room_version: RoomVersion) -> list[str]:
    """Room versions 1 and 2 name other events as ``[event_id, {"sha256": ...}]`` pairs;
    later versions list the IDs alone."""
    if room_version.event_ids_in_pdu:
        return [pair[0] for pair in value]
    return list(value)


class Event:
    """A PDU: the exact bytes it was received or created as, its parsed fields, its ID.

    Invariants: ``raw`` is never re-serialised (signatures stay valid, storage is
    lossless); ``data`` is ``raw`` parsed; ``event_id`` was computed from the reference
    hash by whoever built the event (tests may pass readable IDs for pure logic).
    """

    __slots__ = ("_room_id", "_state_key", "_type", "data", "event_id", "raw", "room_version")

    def __init__(
        self, data: dict[str, Any], room_version: RoomVersion, event_id: str, raw: bytes = b""
    ) -> None:
        self.data = data
        self.room_version = room_version
        self.event_id = event_id
        self.raw = raw
        # Read on every auth check and state lookup: derive once, not per access.
        etype = data.get("type")
        self._type = etype if isinstance(etype, str) else None
        key = data.get("state_key")
        self._state_key = key if isinstance(key, str) else None
        room_id = data.get("room_id")
        if isinstance(room_id, str):
            self._room_id: str | None = room_id
        elif room_version.room_id_from_create_event and etype == EventTypes.CREATE:
            self._room_id = "!" + event_id[1:]
        else:
            self._room_id = None

    def __repr__(self) -> str:
        return f"<Event {self.event_id} {self.type} {self.state_key!r} by {self.sender}>"

    @property
    def room_id(self) -> str:
        if self._room_id is None:
            raise ValueError(f"event {self.event_id} has no room_id")
        return self._room_id

    @property
    def type(self) -> str:
        if self._type is None:
            return str(self.data["type"])  # KeyError / odd value: as the data says
        return self._type

    @property
    def state_key(self) -> str | None:
        return self._state_key

    def is_state(self) -> bool:
        return self._state_key is not None

    @property
    def state_tuple(self) -> StateKey:
        if self._state_key is None:
            raise ValueError(f"event {self.event_id} is not a state event")
        return (self.type, self._state_key)

    @property
    def sender(self) -> str:
        return str(self.data["sender"])

    @property
    def content(self) -> Mapping[str, Any]:
        content = self.data.get("content")
        return content if isinstance(content, dict) else {}

    @property
    def membership(self) -> str | None:
        if self.type != EventTypes.MEMBER:
            return None
        membership = self.content.get("membership")
        return membership if isinstance(membership, str) else None

    @property
    def prev_event_ids(self) -> list[str]:
        """The IDs in ``prev_events`` (v1, v2: the first item of each pair)."""
        return _referenced_ids(self.data.get("prev_events", ()), self.room_version)

    @property
    def auth_event_ids(self) -> list[str]:
        """The IDs in ``auth_events`` (v1, v2: the first item of each pair)."""
        return _referenced_ids(self.data.get("auth_events", ()), self.room_version)

    @property
    def depth(self) -> int:
        return int(self.data.get("depth", 0))

    @property
    def origin_server_ts(self) -> int:
        return int(self.data.get("origin_server_ts", 0))

    @property
    def redacts(self) -> str | None:
        """The event a redaction redacts: in ``content`` from v11, top-level before."""
        if self.type != EventTypes.REDACTION:
            return None
        if self.room_version.updated_redaction_rules:
            redacts = self.content.get("redacts")
        else:
            redacts = self.data.get("redacts")
        return redacts if isinstance(redacts, str) else None
