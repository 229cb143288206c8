"""The filter language of the Client-Server API ("Filtering"), for ``/sync`` and
``/messages``: parsing with validation, matching, and ``event_fields`` projection.

A filter is validated once, when uploaded or given inline; a bad one is ``400
M_BAD_JSON`` (Synapse answers ``400 M_UNKNOWN`` with its JSON-schema message; the spec's
error for a malformed body is ``M_BAD_JSON``). Unknown keys are ignored, as Synapse does.

Matching (spec and Synapse agree):

- ``types`` / ``not_types`` are patterns where ``*`` matches any run of characters;
  ``not_*`` wins over the positive list; a missing positive list allows everything,
  an empty one nothing.
- ``senders`` / ``not_senders`` and ``rooms`` / ``not_rooms`` are exact.
- ``contains_url``: ``true`` keeps only events whose ``content.url`` is a string,
  ``false`` only those without one.
- ``limit`` bounds the number of events (timeline: the events read before filtering; see
  ``docs/client_api.md``); 0 is allowed (a timeline limit of 0 is a state-only sync).
- ``rooms`` / ``not_rooms`` must hold room IDs and ``senders`` / ``not_senders`` user IDs
  (``M_BAD_JSON`` otherwise, as Synapse refuses them).

:data:`EMPTY_ROOM_EVENT_FILTER` matches everything; :attr:`EventFilter.allows_all` lets
the callers skip matching altogether (the unfiltered sync pays nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from roomstream.errors import Codes, MatrixError
from roomstream.events.format import is_valid_room_id, is_valid_user_id
from roomstream.events.room_versions import ROOM_V11, ROOM_V12

__all__ = [
    "EMPTY_ROOM_EVENT_FILTER",
    "EMPTY_SYNC_FILTER",
    "EventFilter",
    "RoomEventFilter",
    "SyncFilter",
    "parse_field_path",
    "parse_room_event_filter",
    "parse_sync_filter",
    "project_fields",
]

#: Largest ``limit`` honoured (larger ones are clamped, as the reads' own maximum).
MAX_FILTER_LIMIT = 1000


def _bad(message: str) -> MatrixError:
    return MatrixError(400, Codes.BAD_JSON, message)


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def _string_list(definition: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    value = definition.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{where}{key} must be a list of strings")
    return tuple(value)


def _is_room_id(value: str) -> bool:
    # Filters are not tied to a room version: either form of room ID is one.
    return is_valid_room_id(value, ROOM_V11) or is_valid_room_id(value, ROOM_V12)


def _id_list(
    definition: Mapping[str, Any], key: str, where: str, kind: Literal["room", "user"]
) -> tuple[str, ...] | None:
    """A list of room or user IDs; an entry that is not one is ``M_BAD_JSON`` (as for
    any malformed filter: such an entry could never match, and the client meant
    something else)."""
    values = _string_list(definition, key, where)
    valid = _is_room_id if kind == "room" else is_valid_user_id
    for value in values or ():
        if not valid(value):
            raise _bad(f"{where}{key}: not a {kind} ID: {value[:80]!r}")
    return values


def _bool(definition: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = definition.get(key, default)
    if not isinstance(value, bool):
        raise _bad(f"{where}{key} must be a boolean")
    return value


def _object(definition: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = definition.get(key, {})
    if not isinstance(value, dict):
        raise _bad(f"{where}{key} must be an object")
    return value


@dataclass(frozen=True)
class EventFilter:
    """Spec ``EventFilter``: ``limit``, ``types``, ``not_types``, ``senders``,
    ``not_senders``. ``types`` patterns are compiled once."""

    limit: int | None = None
    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    senders: tuple[str, ...] | None = None
    not_senders: tuple[str, ...] = ()
    _types_re: tuple[re.Pattern[str], ...] | None = field(default=None, repr=False)
    _not_types_re: tuple[re.Pattern[str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.types is not None:
            object.__setattr__(self, "_types_re", tuple(_glob(t) for t in self.types))
        object.__setattr__(self, "_not_types_re", tuple(_glob(t) for t in self.not_types))

    @property
    def allows_all(self) -> bool:
        """Whether every event matches (``limit`` aside)."""
        return (
            self.types is None
            and not self.not_types
            and self.senders is None
            and not self.not_senders
        )

    def type_allowed(self, event_type: str) -> bool:
        if any(p.fullmatch(event_type) for p in self._not_types_re):
            return False
        return self._types_re is None or any(p.fullmatch(event_type) for p in self._types_re)

    def sender_allowed(self, sender: str | None) -> bool:
        if sender is not None and sender in self.not_senders:
            return False
        return self.senders is None or sender in self.senders

    def matches(self, event: Mapping[str, Any]) -> bool:
        """Whether ``event`` (a client-format event, or ``{"type", "content"}`` account
        data, whose missing sender only a ``senders`` list excludes) passes."""
        event_type = event.get("type")
        if not isinstance(event_type, str) or not self.type_allowed(event_type):
            return False
        return self.sender_allowed(event.get("sender"))

    def apply(self, events: Iterable[Mapping[str, Any]]) -> list[Any]:
        """The events that pass, at most ``limit`` of them (the first ones)."""
        kept = list(events) if self.allows_all else [e for e in events if self.matches(e)]
        return kept if self.limit is None else kept[: self.limit]


@dataclass(frozen=True)
class RoomEventFilter(EventFilter):
    """Spec ``RoomEventFilter`` (``StateFilter`` too): an :class:`EventFilter` plus
    ``rooms``, ``not_rooms``, ``contains_url``, ``lazy_load_members``,
    ``include_redundant_members``."""

    rooms: tuple[str, ...] | None = None
    not_rooms: tuple[str, ...] = ()
    contains_url: bool | None = None
    lazy_load_members: bool = False
    include_redundant_members: bool = False

    @property
    def allows_all(self) -> bool:
        return (
            super().allows_all
            and self.rooms is None
            and not self.not_rooms
            and self.contains_url is None
        )

    def room_allowed(self, room_id: str) -> bool:
        if room_id in self.not_rooms:
            return False
        return self.rooms is None or room_id in self.rooms

    def matches(self, event: Mapping[str, Any]) -> bool:
        if not super().matches(event):
            return False
        room_id = event.get("room_id")
        if isinstance(room_id, str) and not self.room_allowed(room_id):
            return False
        if self.contains_url is not None:
            content = event.get("content")
            has_url = isinstance(content, Mapping) and isinstance(content.get("url"), str)
            return has_url == self.contains_url
        return True


EMPTY_EVENT_FILTER = EventFilter()
EMPTY_ROOM_EVENT_FILTER = RoomEventFilter()


def _limit(definition: Mapping[str, Any], where: str) -> int | None:
    value = definition.get("limit")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where}limit must be an integer")
    if value < 0:
        # 0 is allowed: a timeline limit of 0 is a state-only sync.
        raise _bad(f"{where}limit must not be negative")
    return min(value, MAX_FILTER_LIMIT)


def _event_filter_fields(definition: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {
        "limit": _limit(definition, where),
        "types": _string_list(definition, "types", where),
        "not_types": _string_list(definition, "not_types", where) or (),
        "senders": _id_list(definition, "senders", where, "user"),
        "not_senders": _id_list(definition, "not_senders", where, "user") or (),
    }


def parse_event_filter(definition: Mapping[str, Any], where: str = "") -> EventFilter:
    return EventFilter(**_event_filter_fields(definition, where))


def parse_room_event_filter(definition: Mapping[str, Any], where: str = "") -> RoomEventFilter:
    """A ``RoomEventFilter`` (the ``filter`` of ``/messages``, the room sections of a
    sync filter); ``M_BAD_JSON`` if malformed."""
    if not isinstance(definition, Mapping):
        raise _bad(f"{where or 'filter'} must be an object")
    contains_url = definition.get("contains_url")
    if contains_url is not None and not isinstance(contains_url, bool):
        raise _bad(f"{where}contains_url must be a boolean")
    return RoomEventFilter(
        **_event_filter_fields(definition, where),
        rooms=_id_list(definition, "rooms", where, "room"),
        not_rooms=_id_list(definition, "not_rooms", where, "room") or (),
        contains_url=contains_url,
        lazy_load_members=_bool(definition, "lazy_load_members", where, False),
        include_redundant_members=_bool(definition, "include_redundant_members", where, False),
    )


def parse_field_path(path: str) -> tuple[str, ...]:
    """An ``event_fields`` entry as its keys: ``.`` separates them; ``\\.`` is a literal
    dot and ``\\\\`` a literal backslash (spec, "Filtering"). Any other escape, or an
    empty key, is ``M_BAD_JSON``."""
    keys: list[str] = []
    current: list[str] = []
    chars = iter(path)
    for char in chars:
        if char == "\\":
            escaped = next(chars, None)
            if escaped not in (".", "\\"):
                raise _bad(f"event_fields: bad escape in {path[:64]!r}")
            current.append(escaped)
        elif char == ".":
            keys.append("".join(current))
            current = []
        else:
            current.append(char)
    keys.append("".join(current))
    if any(k == "" for k in keys):
        raise _bad(f"event_fields: empty key in {path[:64]!r}")
    return tuple(keys)


def project_fields(event: Mapping[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    """Only the fields of ``event`` that ``paths`` name (with their nested objects made
    of just those fields); fields that are missing, or that a path runs through a
    non-object to reach, are left out."""
    result: dict[str, Any] = {}
    for path in paths:
        source: Any = event
        for key in path:
            if not isinstance(source, Mapping) or key not in source:
                break
            source = source[key]
        else:
            target = result
            for key in path[:-1]:
                existing = target.get(key)
                if not isinstance(existing, dict):
                    existing = target[key] = {}
                target = existing
            target[path[-1]] = source
    return result


@dataclass(frozen=True)
class SyncFilter:
    """A whole filter (``POST /user/{userId}/filter``, ``/sync?filter=``)."""

    presence: EventFilter = EMPTY_EVENT_FILTER
    account_data: EventFilter = EMPTY_EVENT_FILTER
    rooms: tuple[str, ...] | None = None
    not_rooms: tuple[str, ...] = ()
    include_leave: bool = False
    timeline: RoomEventFilter = EMPTY_ROOM_EVENT_FILTER
    state: RoomEventFilter = EMPTY_ROOM_EVENT_FILTER
    ephemeral: RoomEventFilter = EMPTY_ROOM_EVENT_FILTER
    room_account_data: RoomEventFilter = EMPTY_ROOM_EVENT_FILTER
    event_fields: tuple[tuple[str, ...], ...] | None = None
    event_format: Literal["client", "federation"] = "client"

    def room_allowed(self, room_id: str) -> bool:
        if room_id in self.not_rooms:
            return False
        return self.rooms is None or room_id in self.rooms

    def project(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``events`` reduced to ``event_fields`` (unchanged without it)."""
        if self.event_fields is None:
            return events
        return [project_fields(e, self.event_fields) for e in events]


EMPTY_SYNC_FILTER = SyncFilter()


def parse_sync_filter(definition: Any) -> SyncFilter:
    """A filter definition as a :class:`SyncFilter`; ``400 M_BAD_JSON`` if malformed."""
    if not isinstance(definition, Mapping):
        raise _bad("filter must be an object")
    room = _object(definition, "room", "")
    event_fields = _string_list(definition, "event_fields", "")
    event_format = definition.get("event_format", "client")
    if event_format not in ("client", "federation"):
        raise _bad("event_format must be client or federation")
    return SyncFilter(
        presence=parse_event_filter(_object(definition, "presence", ""), "presence."),
        account_data=parse_event_filter(_object(definition, "account_data", ""), "account_data."),
        rooms=_id_list(room, "rooms", "room.", "room"),
        not_rooms=_id_list(room, "not_rooms", "room.", "room") or (),
        include_leave=_bool(room, "include_leave", "room.", False),
        timeline=parse_room_event_filter(_object(room, "timeline", "room."), "room.timeline."),
        state=parse_room_event_filter(_object(room, "state", "room."), "room.state."),
        ephemeral=parse_room_event_filter(_object(room, "ephemeral", "room."), "room.ephemeral."),
        room_account_data=parse_room_event_filter(
            _object(room, "account_data", "room."), "room.account_data."
        ),
        event_fields=None
        if event_fields is None
        else tuple(parse_field_path(p) for p in event_fields),
        event_format="federation" if event_format == "federation" else "client",
    )
