"""Opaque tokens of the read path: a position in the events stream, and a position in one
room's topological order.

- :class:`EventsToken` is a position in the *events* stream seen as several single-writer
  streams (``docs/streams.md``): a ``minimum`` every writer has reached, plus the further
  position of each writer that is ahead of it. An event written by ``writer`` with stream
  ordering ``s`` is *covered* by the token when ``s <= token.position(writer)``. The
  client layer embeds it in its own sync token (next to typing, receipts, account data,
  to-device positions): :meth:`EventsToken.to_string` never contains ``_`` or ``/`` so it
  can be joined with other parts by either.
- :class:`RoomPosition` is a point *between* events of one room in topological order
  ``(topological_ordering, stream_ordering)``: an event at position ``e`` is *before* the
  point ``p`` when ``e < p`` and *after* it otherwise. The point just before an event is
  that event's own position, so paging back from ``p`` and then forward from the returned
  ``end`` meets the same events.

Both parse with :meth:`parse`, raising :class:`InvalidTokenError` (``M_INVALID_PARAM``,
HTTP 400) for anything they did not produce.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from roomstream.errors import InvalidParamError

__all__ = [
    "EventsToken",
    "InvalidTokenError",
    "PaginationToken",
    "RoomPosition",
    "parse_pagination_token",
]


class InvalidTokenError(InvalidParamError):
    """A token that this server did not hand out (or that is malformed): 400
    ``M_INVALID_PARAM``."""


_INT = r"-?[0-9]{1,19}"
_EVENTS_RE = re.compile(rf"s({_INT})")
_MULTI_RE = re.compile(rf"m({_INT})((?:~[^~.]+\.{_INT})+)")
_ROOM_RE = re.compile(rf"t({_INT})-({_INT})")


def _quote_writer(name: str) -> str:
    # Instance names are configuration identifiers; quote anything that could clash with
    # the separators ("~", ".") or with the sync token's own ("_", "/").
    return quote(name, safe="").replace(".", "%2E").replace("~", "%7E").replace("_", "%5F")


@dataclass(frozen=True, slots=True)
class EventsToken:
    """A position in the events stream, per writer.

    Invariant: every value of ``writers`` is greater than ``minimum`` (writers at the
    minimum are left out, so equal positions have equal tokens and equal strings).
    """

    minimum: int
    writers: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        trimmed = {w: p for w, p in sorted(self.writers.items()) if p > self.minimum}
        object.__setattr__(self, "writers", trimmed)

    @classmethod
    def from_positions(cls, positions: Mapping[str, int]) -> EventsToken:
        """The token of a set of writer positions (as ``StreamIdGenerator.get_positions``)."""
        if not positions:
            return cls(0)
        return cls(min(positions.values()), dict(positions))

    def position(self, writer: str) -> int:
        """Events of ``writer`` up to this stream ordering are covered by the token."""
        return self.writers.get(writer, self.minimum)

    @property
    def maximum(self) -> int:
        return max(self.writers.values(), default=self.minimum)

    def covers(self, writer: str, stream_ordering: int) -> bool:
        return stream_ordering <= self.position(writer)

    def advance(self, other: EventsToken) -> EventsToken:
        """The per-writer maximum of two tokens."""
        writers = set(self.writers) | set(other.writers)
        positions = {w: max(self.position(w), other.position(w)) for w in writers}
        return EventsToken(max(self.minimum, other.minimum), positions)

    def is_before_or_equal(self, other: EventsToken) -> bool:
        """True when everything this token covers, ``other`` covers too."""
        if self.minimum > other.minimum:
            return False
        return all(p <= other.position(w) for w, p in self.writers.items())

    def to_string(self) -> str:
        if not self.writers:
            return f"s{self.minimum}"
        parts = "".join(f"~{_quote_writer(w)}.{p}" for w, p in self.writers.items())
        return f"m{self.minimum}{parts}"

    @classmethod
    def parse(cls, text: str) -> EventsToken:
        match = _EVENTS_RE.fullmatch(text)
        if match:
            return cls(int(match.group(1)))
        match = _MULTI_RE.fullmatch(text)
        if not match:
            raise InvalidTokenError(f"invalid events token {text[:64]!r}")
        writers: dict[str, int] = {}
        for part in match.group(2)[1:].split("~"):
            name, _, position = part.rpartition(".")
            writers[unquote(name)] = int(position)
        return cls(int(match.group(1)), writers)

    def __str__(self) -> str:
        return self.to_string()


@dataclass(frozen=True, slots=True, order=True)
class RoomPosition:
    """A point between events in one room's topological order (see the module doc)."""

    topological_ordering: int
    stream_ordering: int

    @classmethod
    def of_event(cls, topological_ordering: int, stream_ordering: int) -> RoomPosition:
        """The point just before the event at this position."""
        return cls(topological_ordering, stream_ordering)

    @classmethod
    def after_event(cls, topological_ordering: int, stream_ordering: int) -> RoomPosition:
        """The point just after the event at this position (stream orderings are unique
        integers, so nothing lies between it and this point)."""
        return cls(topological_ordering, stream_ordering + 1)

    def as_tuple(self) -> tuple[int, int]:
        return (self.topological_ordering, self.stream_ordering)

    def to_string(self) -> str:
        return f"t{self.topological_ordering}-{self.stream_ordering}"

    @classmethod
    def parse(cls, text: str) -> RoomPosition:
        match = _ROOM_RE.fullmatch(text)
        if not match:
            raise InvalidTokenError(f"invalid room token {text[:64]!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return self.to_string()


PaginationToken = RoomPosition | EventsToken
"""Where pagination may start: a point in the room, or a position in the events stream
(then the first page holds events the stream token covers, in topological order)."""


def parse_pagination_token(text: str) -> PaginationToken:
    """A ``t…`` room token or an ``s…``/``m…`` events token."""
    if text.startswith("t"):
        return RoomPosition.parse(text)
    return EventsToken.parse(text)
