"""The filter language of the Client-Server API ("Filtering"), for ``/sync`` and
``/messages``: parsing with validation, matching, and ``event_fields`` projection.

A filter is validated once, when uploaded or given inline; a bad one is ``400
M_BAD_JSON`` (Synapse answers ``400 M_UNKNOWN`` with its JSON-schema message; the spec's
error for a malformed body is ``M_BAD_JSON``). Unknown keys are ignored, as Synapse does.

Matching (spec and Synapse agree):

- ``types`` / ``not_types`` are patterns where ``*`` matches any run of characters
  (:mod:`roomstream.glob`: no backtracking, at most :data:`~roomstream.glob.MAX_GLOB_LENGTH`
  characters; per list :data:`MAX_WILDCARD_PATTERNS` patterns holding a ``*`` and
  :data:`MAX_WILDCARDS` runs of ``*`` in all, else ``M_BAD_JSON``: so a list costs each
  event a bounded number of searches, whatever its patterns);
  ``not_*`` wins over the positive list; a missing positive list allows everything,
  an empty one nothing.
- ``senders`` / ``not_senders`` and ``rooms`` / ``not_rooms`` are exact (set lookups).
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from roomstream.errors import BadJsonError
from roomstream.glob import MAX_GLOB_LENGTH, Glob, compile_glob
from roomstream.grammar import is_pdu_sender, is_room_id

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
#: Most patterns holding a ``*`` in one ``types`` / ``not_types`` list, and most runs of
#: ``*`` (``**`` counts once) over all of them: each event is matched against each such
#: pattern, one search per run, so these bound what a filter costs an event (at worst
#: about 0.15 ms per distinct event type, once per type and request).
#: Patterns without ``*`` are one set lookup whatever their number.
MAX_WILDCARD_PATTERNS = 16
MAX_WILDCARDS = 64


def _bad(message: str) -> BadJsonError:
    return BadJsonError(message)


def _type_patterns(definition: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    """A ``types`` / ``not_types`` list, its patterns' sizes bounded."""
    patterns = _string_list(definition, key, where)
    if patterns is None:
        return None
    if any(len(p) > MAX_GLOB_LENGTH for p in patterns):
        raise _bad(f"{where}{key}: patterns are limited to {MAX_GLOB_LENGTH} characters")
    starred = [p for p in set(patterns) if "*" in p]
    if len(starred) > MAX_WILDCARD_PATTERNS:
        raise _bad(f"{where}{key}: at most {MAX_WILDCARD_PATTERNS} patterns with '*'")
    if sum(_star_runs(p) for p in starred) > MAX_WILDCARDS:
        raise _bad(f"{where}{key}: at most {MAX_WILDCARDS} '*' in all (a run counts once)")
    return patterns


def _star_runs(pattern: str) -> int:
    return sum(1 for i, c in enumerate(pattern) if c == "*" and (i == 0 or pattern[i - 1] != "*"))


@dataclass(frozen=True)
class _TypeMatcher:
    """Patterns without ``*`` as a set, the others compiled (:mod:`roomstream.glob`)."""

    exact: frozenset[str]
    globs: tuple[Glob, ...]
    #: Answers so far by value: events of a response share a few types. Bounded; a
    #: filter is parsed per request, so this lives as long as one.
    _seen: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, patterns: Iterable[str]) -> _TypeMatcher:
        unique = set(patterns)
        return cls(
            frozenset(p for p in unique if "*" not in p),
            tuple(compile_glob(p) for p in sorted(unique) if "*" in p),
        )

    def any_matches(self, value: str) -> bool:
        if value in self.exact:
            return True
        if not self.globs:
            return False
        known = self._seen.get(value)
        if known is None:
            known = any(g.matches(value) for g in self.globs)
            if len(self._seen) >= 4096:
                self._seen.clear()
            self._seen[value] = known
        return known


def _string_list(definition: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    value = definition.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{where}{key} must be a list of strings")
    return tuple(value)


def _id_list(
    definition: Mapping[str, Any], key: str, where: str, kind: Literal["room", "user"]
) -> tuple[str, ...] | None:
    """A list of room or user IDs; an entry that is not one is ``M_BAD_JSON`` (as for
    any malformed filter: such an entry could never match, and the client meant
    something else)."""
    values = _string_list(definition, key, where)
    # Filters are not tied to a room version: either form of room ID is one; senders
    # are matched against PDU senders, so anything a PDU may carry can be named.
    valid = is_room_id if kind == "room" else is_pdu_sender
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
    ``not_senders``. ``types`` patterns are compiled once, the lists made sets."""

    limit: int | None = None
    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    senders: tuple[str, ...] | None = None
    not_senders: tuple[str, ...] = ()
    _types: _TypeMatcher | None = field(default=None, repr=False, compare=False)
    _not_types: _TypeMatcher = field(
        default=_TypeMatcher(frozenset(), ()), repr=False, compare=False
    )
    _senders: frozenset[str] | None = field(default=None, repr=False, compare=False)
    _not_senders: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.types is not None:
            object.__setattr__(self, "_types", _TypeMatcher.of(self.types))
        object.__setattr__(self, "_not_types", _TypeMatcher.of(self.not_types))
        if self.senders is not None:
            object.__setattr__(self, "_senders", frozenset(self.senders))
        object.__setattr__(self, "_not_senders", frozenset(self.not_senders))

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
        if self._not_types.any_matches(event_type):
            return False
        return self._types is None or self._types.any_matches(event_type)

    def sender_allowed(self, sender: str | None) -> bool:
        if sender is not None and sender in self._not_senders:
            return False
        return self._senders is None or sender in self._senders

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
    ``include_redundant_members``, ``unread_thread_notifications`` (read from the
    timeline filter of a sync filter: per-thread unread counts, as Synapse)."""

    rooms: tuple[str, ...] | None = None
    not_rooms: tuple[str, ...] = ()
    contains_url: bool | None = None
    lazy_load_members: bool = False
    include_redundant_members: bool = False
    unread_thread_notifications: bool = False
    _rooms: frozenset[str] | None = field(default=None, repr=False, compare=False)
    _not_rooms: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _room_sets(self)

    @property
    def allows_all(self) -> bool:
        return (
            super().allows_all
            and self.rooms is None
            and not self.not_rooms
            and self.contains_url is None
        )

    def room_allowed(self, room_id: str) -> bool:
        if room_id in self._not_rooms:
            return False
        return self._rooms is None or room_id in self._rooms

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


def _room_sets(target: RoomEventFilter | SyncFilter) -> None:
    """``rooms`` / ``not_rooms`` as sets: one lookup per event, whatever their length."""
    if target.rooms is not None:
        object.__setattr__(target, "_rooms", frozenset(target.rooms))
    object.__setattr__(target, "_not_rooms", frozenset(target.not_rooms))


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
        "types": _type_patterns(definition, "types", where),
        "not_types": _type_patterns(definition, "not_types", where) or (),
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
        unread_thread_notifications=_bool(definition, "unread_thread_notifications", where, False),
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


#: ``event_fields`` as a tree of keys: ``None`` takes the whole value there.
FieldTrie = dict[str, "FieldTrie | None"]


def field_trie(paths: Iterable[tuple[str, ...]]) -> FieldTrie:
    """``paths`` merged into one tree (a path that is a prefix of another takes the
    whole value, as listing both would)."""
    root: FieldTrie = {}
    for path in paths:
        node = root
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if child is None:
                break  # a shorter path takes this value whole already
            node = child
        else:
            node[path[-1]] = None
    return root


def _project(source: Mapping[str, Any], trie: FieldTrie) -> dict[str, Any]:
    result: dict[str, Any] = {}
    # Walk whichever is smaller, so an event costs at most its own size whatever the
    # number of paths (a filter may list thousands).
    for key in trie if len(trie) <= len(source) else source:
        if key not in trie or key not in source:
            continue
        below, value = trie[key], source[key]
        if below is None:
            result[key] = value
        elif isinstance(value, Mapping):
            inner = _project(value, below)
            if inner:
                result[key] = inner
    return result


def project_fields(
    event: Mapping[str, Any], paths: Iterable[tuple[str, ...]] | FieldTrie
) -> dict[str, Any]:
    """Only the fields of ``event`` that ``paths`` name (with their nested objects made
    of just those fields); fields that are missing, or that a path runs through a
    non-object to reach, are left out. ``paths`` may be given as their
    :func:`field_trie`; the cost is then at most the event's size (recursion: at most
    the event's nesting, bounded when it was accepted)."""
    return _project(event, paths if isinstance(paths, dict) else field_trie(paths))


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
    _rooms: frozenset[str] | None = field(default=None, repr=False, compare=False)
    _not_rooms: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    _fields: FieldTrie | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _room_sets(self)
        if self.event_fields is not None:
            object.__setattr__(self, "_fields", field_trie(self.event_fields))

    def room_allowed(self, room_id: str) -> bool:
        if room_id in self._not_rooms:
            return False
        return self._rooms is None or room_id in self._rooms

    def project(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``events`` reduced to ``event_fields`` (unchanged without it)."""
        if self._fields is None:
            return events
        return [_project(e, self._fields) for e in events]


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
