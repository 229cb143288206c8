"""A sliding sync request body, parsed and validated (no I/O).

Both request shapes in use are accepted: the merged proposal's (``range``, and
``required_state`` as ``{"include": [...], "exclude": [...], "lazy_members": bool}``) and
the one Synapse ships and Element X sends (``ranges: [[start, end]]``, and
``required_state`` as ``[[type, state_key], ...]`` with ``"*"``, ``"$LAZY"``, ``"$ME"``).
Every malformed part is a ``400`` with ``M_INVALID_PARAM`` (or ``M_BAD_JSON``) naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from roomstream.errors import BadJsonError, InvalidParamError
from roomstream.events.types import EventTypes

__all__ = [
    "MAX_LISTS",
    "MAX_TIMELINE_LIMIT",
    "Extensions",
    "ListConfig",
    "RequiredState",
    "RoomConfig",
    "RoomFilters",
    "SlidingRequest",
    "parse_request",
]

MAX_LISTS = 100
MAX_SUBSCRIPTIONS = 1000
MAX_REQUIRED_STATE = 100
#: Timeline events per room in one response (the read path's page limit).
MAX_TIMELINE_LIMIT = 1000
MAX_TIMEOUT_MS = 120_000
WILDCARD = "*"
LAZY = "$LAZY"
ME = "$ME"
_MAX_ID = 255


def _bad(message: str) -> InvalidParamError:
    return InvalidParamError(message)


def _string(value: Any, what: str, *, max_length: int = _MAX_ID) -> str:
    if not isinstance(value, str) or len(value) > max_length:
        raise _bad(f"{what} must be a string of at most {max_length} characters")
    return value


def _flag(value: Any, what: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _bad(f"{what} must be a boolean")
    return value


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{what} must be an integer in {low}..{high}")
    return value


def _strings(value: Any, what: str, *, nullable: bool = False) -> tuple[str | None, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 1000:
        raise _bad(f"{what} must be a list")
    for item in value:
        if not (isinstance(item, str) or (nullable and item is None)):
            raise _bad(f"{what} must hold strings{' or null' if nullable else ''}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class RequiredState:
    """Which current state a room response carries.

    ``include``/``exclude``: (type, state_key) pairs, either may be ``"*"``; a state key
    may be ``"$ME"`` (the requesting user). ``lazy_members``: the member events of the
    senders (and targets) of the returned timeline events.
    """

    include: frozenset[tuple[str, str]] = frozenset()
    exclude: frozenset[tuple[str, str]] = frozenset()
    lazy_members: bool = False
    #: Other (include, exclude) pairs combined with this one: a state entry is wanted
    #: if any pair wants it (exclusions apply within their own pair only).
    others: frozenset[tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]] = frozenset()

    def pairs(
        self,
    ) -> frozenset[tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]]:
        own = frozenset([(self.include, self.exclude)]) if self.include else frozenset()
        return own | self.others

    def union(self, other: RequiredState) -> RequiredState:
        """The superset of what either returns (the proposal's combining rule)."""
        pairs = sorted(self.pairs() | other.pairs(), key=repr)
        if not pairs:
            return RequiredState(lazy_members=self.lazy_members or other.lazy_members)
        first, rest = pairs[0], frozenset(pairs[1:])
        return RequiredState(first[0], first[1], self.lazy_members or other.lazy_members, rest)

    def for_user(self, user_id: str) -> RequiredState:
        def sub(pairs: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
            return frozenset((t, user_id if k == ME else k) for t, k in pairs)

        return RequiredState(
            sub(self.include),
            sub(self.exclude),
            self.lazy_members,
            frozenset((sub(i), sub(e)) for i, e in self.others),
        )

    def matches(self, event_type: str, state_key: str) -> bool:
        def hit(pairs: frozenset[tuple[str, str]]) -> bool:
            return any(t in (WILDCARD, event_type) and k in (WILDCARD, state_key) for t, k in pairs)

        return any(hit(i) and not hit(e) for i, e in self.pairs())


@dataclass(frozen=True, slots=True)
class RoomConfig:
    timeline_limit: int
    required_state: RequiredState

    def combine(self, other: RoomConfig) -> RoomConfig:
        """The superset of two configs (the proposal's "combining room configs")."""
        return RoomConfig(
            max(self.timeline_limit, other.timeline_limit),
            self.required_state.union(other.required_state),
        )


@dataclass(frozen=True, slots=True)
class RoomFilters:
    is_dm: bool | None = None
    is_invited: bool | None = None
    is_encrypted: bool | None = None
    room_types: tuple[str | None, ...] | None = None
    not_room_types: tuple[str | None, ...] | None = None
    tags: tuple[str | None, ...] | None = None
    not_tags: tuple[str | None, ...] | None = None
    spaces: tuple[str | None, ...] | None = None

    def needs_create(self) -> bool:
        return self.room_types is not None or self.not_room_types is not None


@dataclass(frozen=True, slots=True)
class ListConfig:
    #: Inclusive (start, end); None: the whole filtered list.
    range: tuple[int, int] | None
    config: RoomConfig
    filters: RoomFilters


@dataclass(frozen=True, slots=True)
class Extensions:
    to_device: bool = False
    to_device_limit: int = 100
    to_device_since: int | None = None
    account_data: bool = False
    receipts: bool = False
    typing: bool = False
    #: device list changes and the device's key counts (MSC3884)
    e2ee: bool = False


@dataclass(frozen=True, slots=True)
class SlidingRequest:
    conn_id: str
    pos: str | None
    timeout_ms: int
    lists: dict[str, ListConfig] = field(default_factory=dict)
    room_subscriptions: dict[str, RoomConfig] = field(default_factory=dict)
    extensions: Extensions = Extensions()


def _pairs(items: Any, what: str) -> frozenset[tuple[str, str]]:
    if not isinstance(items, list) or len(items) > MAX_REQUIRED_STATE:
        raise _bad(f"{what} must be a list of at most {MAX_REQUIRED_STATE} entries")
    pairs = set()
    for item in items:
        if isinstance(item, list) and len(item) == 2:
            pairs.add((_string(item[0], f"{what} type"), _string(item[1], f"{what} state_key")))
        elif isinstance(item, dict):
            event_type = item.get("type", WILDCARD)
            state_key = item.get("state_key", WILDCARD)
            pairs.add((_string(event_type, f"{what} type"), _string(state_key, f"{what} key")))
        else:
            raise _bad(f"{what} entries must be [type, state_key] or {{type, state_key}}")
    return frozenset(pairs)


def _required_state(value: Any, what: str) -> RequiredState:
    if value is None:
        return RequiredState()
    if isinstance(value, list):
        # Synapse's shape: [type, "$LAZY"] on m.room.member asks for lazy members.
        pairs = _pairs(value, what)
        lazy = (EventTypes.MEMBER, LAZY) in pairs
        return RequiredState(frozenset(p for p in pairs if p[1] != LAZY), frozenset(), lazy)
    if isinstance(value, dict):
        include = _pairs(value.get("include", []), f"{what}.include")
        exclude = _pairs(value.get("exclude", []), f"{what}.exclude")
        lazy = _flag(value.get("lazy_members"), f"{what}.lazy_members") or False
        lazy = lazy or (EventTypes.MEMBER, LAZY) in include
        return RequiredState(frozenset(p for p in include if p[1] != LAZY), exclude, lazy)
    raise _bad(f"{what} must be a list or an object")


def _room_config(value: Any, what: str) -> RoomConfig:
    if not isinstance(value, dict):
        raise _bad(f"{what} must be an object")
    limit = _int(value.get("timeline_limit", 0), f"{what}.timeline_limit", 0, 2**31)
    return RoomConfig(
        min(limit, MAX_TIMELINE_LIMIT),
        _required_state(value.get("required_state"), f"{what}.required_state"),
    )


def _range(value: Any, what: str) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2):
        raise _bad(f"{what} must be [start, end]")
    start = _int(value[0], f"{what} start", 0, 2**31)
    end = _int(value[1], f"{what} end", 0, 2**31)
    if end < start:
        raise _bad(f"{what} end must not be before its start")
    return start, end


def _filters(value: Any, what: str) -> RoomFilters:
    if value is None:
        return RoomFilters()
    if not isinstance(value, dict):
        raise _bad(f"{what} must be an object")
    return RoomFilters(
        is_dm=_flag(value.get("is_dm"), f"{what}.is_dm"),
        is_invited=_flag(value.get("is_invited", value.get("is_invite")), f"{what}.is_invited"),
        is_encrypted=_flag(value.get("is_encrypted"), f"{what}.is_encrypted"),
        room_types=_strings(value.get("room_types"), f"{what}.room_types", nullable=True),
        not_room_types=_strings(
            value.get("not_room_types"), f"{what}.not_room_types", nullable=True
        ),
        tags=_strings(value.get("tags"), f"{what}.tags"),
        not_tags=_strings(value.get("not_tags"), f"{what}.not_tags"),
        spaces=_strings(value.get("spaces"), f"{what}.spaces"),
    )


def _list(value: Any, what: str) -> ListConfig:
    config = _room_config(value, what)
    assert isinstance(value, dict)
    ranges = value.get("range")
    if ranges is not None:
        window: tuple[int, int] | None = _range(ranges, f"{what}.range")
    elif value.get("ranges") is not None:
        # Synapse's shape: a list of ranges; clients send one. Several are merged into
        # the span covering them (a superset; the proposal has one range).
        many = value["ranges"]
        if not isinstance(many, list) or not 1 <= len(many) <= 10:
            raise _bad(f"{what}.ranges must be a list of 1..10 ranges")
        spans = [_range(r, f"{what}.ranges") for r in many]
        window = (min(s for s, _ in spans), max(e for _, e in spans))
    else:
        window = None
    return ListConfig(window, config, _filters(value.get("filters"), f"{what}.filters"))


def _enabled(section: Any, what: str) -> tuple[bool, Mapping[str, Any]]:
    if section is None:
        return False, {}
    if not isinstance(section, dict):
        raise _bad(f"{what} must be an object")
    return bool(_flag(section.get("enabled"), f"{what}.enabled")), section


def _extensions(value: Any) -> Extensions:
    if value is None:
        return Extensions()
    if not isinstance(value, dict):
        raise _bad("extensions must be an object")
    to_device, td = _enabled(value.get("to_device"), "extensions.to_device")
    since_raw = td.get("since")
    since = None
    if since_raw is not None:
        text = _string(since_raw, "extensions.to_device.since")
        if not text.isdigit() or len(text) > 18:
            raise _bad("extensions.to_device.since must be a position this server gave")
        since = int(text)
    limit = _int(td.get("limit", 100), "extensions.to_device.limit", 1, 1000)
    account_data, _ = _enabled(value.get("account_data"), "extensions.account_data")
    receipts, _ = _enabled(value.get("receipts"), "extensions.receipts")
    typing, _ = _enabled(value.get("typing"), "extensions.typing")
    e2ee, _ = _enabled(value.get("e2ee"), "extensions.e2ee")
    return Extensions(to_device, limit, since, account_data, receipts, typing, e2ee)


def _timeout(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        if not value.isdigit() or len(value) > 12:
            raise _bad("timeout must be a number of milliseconds")
        value = int(value)
    return min(_int(value, "timeout", 0, 2**53), MAX_TIMEOUT_MS)


def _keys(items: Iterable[str], what: str) -> None:
    for key in items:
        _string(key, what)


def parse_request(body: Any, query: Mapping[str, str]) -> SlidingRequest:
    """The request from its JSON body and query string (Synapse, and the clients built on
    it, put ``pos`` and ``timeout`` in the query; the proposal puts them in the body)."""
    if not isinstance(body, dict):
        raise BadJsonError("the request body must be a JSON object")
    conn_id = body.get("conn_id", "")
    if conn_id is None:
        conn_id = ""
    conn_id = _string(conn_id, "conn_id")
    pos = query.get("pos", body.get("pos"))
    if pos is not None:
        pos = _string(pos, "pos", max_length=200)
    timeout_ms = _timeout(query.get("timeout", body.get("timeout")))
    set_presence = query.get("set_presence", body.get("set_presence"))
    if set_presence is not None and set_presence not in ("online", "offline", "unavailable"):
        raise _bad("set_presence must be online, offline or unavailable")
    raw_lists = body.get("lists", {})
    raw_lists = {} if raw_lists is None else raw_lists
    if not isinstance(raw_lists, dict) or len(raw_lists) > MAX_LISTS:
        raise _bad(f"lists must be an object of at most {MAX_LISTS} lists")
    _keys(raw_lists, "list key")
    lists = {key: _list(value, f"lists.{key}") for key, value in raw_lists.items()}
    raw_subs = body.get("room_subscriptions", {})
    raw_subs = {} if raw_subs is None else raw_subs
    if not isinstance(raw_subs, dict) or len(raw_subs) > MAX_SUBSCRIPTIONS:
        raise _bad(f"room_subscriptions must be an object of at most {MAX_SUBSCRIPTIONS}")
    _keys(raw_subs, "room ID")
    subs = {
        room_id: _room_config(value, f"room_subscriptions.{room_id}")
        for room_id, value in raw_subs.items()
    }
    return SlidingRequest(
        conn_id, pos, timeout_ms, lists, subs, _extensions(body.get("extensions"))
    )
