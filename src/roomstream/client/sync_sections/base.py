"""The section protocol: one part of the ``/sync`` token and of its response.

A section owns one part of the token (a position in one stream), reads what changed for
a user between two positions of it, puts that in the response, and says which rows of
its stream concern which users and rooms (so the notifier wakes only their syncs).

Invariants a section keeps:

- ``current_position()`` is read for every section *before* any section collects, and a
  section collects nothing past it (what is not yet complete is for the next sync).
- ``collect`` returns the position the next token carries for the section: everything
  up to it was sent (or is not for this user).
- ``wake_keys(row)`` names every user or room whose sync ``collect`` would answer
  differently once ``row`` is complete (a missed key is a sync that sleeps past news);
  :func:`sharers_key` names the users who share a room with someone.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from roomstream.client.filtering import SyncFilter
from roomstream.client.ignored import IgnoredUsers
from roomstream.client.presence_store import PresenceStore
from roomstream.client.push_store import PushRulesStore
from roomstream.client.store import ClientStore
from roomstream.client.typing import TypingState
from roomstream.client.userdata import UserData
from roomstream.e2e import E2eKeys
from roomstream.e2e.service import KeyStatus
from roomstream.reading import RoomReader

__all__ = [
    "SyncContext",
    "SyncSection",
    "SyncServices",
    "UserDataSection",
    "events",
    "room_key",
    "sharers_key",
    "user_key",
]

_POSITION = re.compile(r"[0-9]{1,18}")


def user_key(user_id: str) -> str:
    """The wake key of a user (a sync registers under its user and its rooms)."""
    return "u" + user_id


def room_key(room_id: str) -> str:
    """The wake key of a room."""
    return "r" + room_id


#: The first character of :func:`sharers_key` keys (no sync registers under one).
SHARERS_PREFIX = "s"


def sharers_key(user_id: str) -> str:
    """The wake key of every user sharing a room with ``user_id``: the notifier looks up
    the rooms ``user_id`` is joined to and wakes those rooms' keys (a sync registers
    under its user and rooms only)."""
    return SHARERS_PREFIX + user_id


def events(items: list[Any]) -> dict[str, Any]:
    """A response part of the ``{"events": [...]}`` shape."""
    return {"events": items}


@dataclass(frozen=True)
class SyncServices:
    """What sections read from (each takes what it needs in ``from_services``)."""

    reader: RoomReader
    userdata: UserData
    typing: TypingState
    store: ClientStore
    #: Whom each user ignores (None: nobody ignores anyone).
    ignored: IgnoredUsers | None = None
    #: Device keys and the device_lists stream (None: no end-to-end encryption).
    keys: E2eKeys | None = None
    #: The presence stream's table (None: no presence in /sync).
    presence: PresenceStore | None = None
    #: Users' push rules, for unread counts (None: the server defaults for everyone).
    push_rules: PushRulesStore | None = None


@dataclass
class SyncContext:
    """One ``/sync`` build, shared by its sections: the request and the response so far.

    ``initial``: no token, or ``full_state`` (per-user data is sent whole). The handler
    fills ``body`` with every top-level key, empty, before the sections run; a section
    replaces its own keys. Per-room data of joined rooms (account data, ephemeral events)
    goes into ``room_account_data`` / ``room_ephemeral``; the rooms section merges it
    into the joined rooms once every section has collected."""

    user_id: str
    device_id: str
    filter: SyncFilter
    full_state: bool
    timeline_limit: int
    incremental: bool
    body: dict[str, Any]
    load_joined_rooms: Callable[[], Awaitable[list[str]]]
    #: room -> its account data events (already filtered).
    room_account_data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: room -> its ephemeral events (filtered once merged: the filter's limit is per room).
    room_ephemeral: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Where a joined room that only per-room data brings paginates back from.
    prev_batch: str = ""
    #: Whether the response has something to say (a long poll ends when it has).
    has_news: bool = False
    #: The events stream range ``(after, upto]`` of an incremental sync in which some
    #: membership in the user's rooms (or the user's own) moved, as the rooms section
    #: saw it (None: none moved, or not incremental): the device lists section reads
    #: who came to share, or stopped sharing, a room with the user there.
    membership_range: tuple[int, int] | None = None
    #: The device's key status (one-time key counts, unused fallback key types) when a
    #: section read it already in this build (the to-device section, with the messages:
    #: one round trip for both); None: the device lists section reads it.
    key_status: KeyStatus | None = None
    _joined: list[str] | None = None

    @property
    def initial(self) -> bool:
        return not self.incremental or self.full_state

    async def joined_rooms(self) -> list[str]:
        """The rooms the user is joined to, read at most once per build (and only when
        a section needs them)."""
        if self._joined is None:
            self._joined = await self.load_joined_rooms()
        return self._joined


class SyncSection(ABC):
    """One part of the sync token and response (see the module docstring).

    ``name`` names the token part and the section; ``stream`` is the stream whose rows
    may wake a sync for it. Positions are ints unless a section overrides
    ``parse_position``/``format_position``; a token without the part (older than the
    section) means ``ZERO``."""

    name: ClassVar[str]
    stream: ClassVar[str]
    ZERO: ClassVar[Any] = 0

    @classmethod
    @abstractmethod
    def from_services(cls, services: SyncServices) -> Self:
        """The section of a sync handler reading from ``services``."""

    @staticmethod
    def parse_position(text: str) -> Any:
        """ValueError if ``text`` is not a position of this section."""
        if not _POSITION.fullmatch(text):
            raise ValueError(text)
        return int(text)

    @staticmethod
    def format_position(position: Any) -> str:
        return str(position)

    @staticmethod
    @abstractmethod
    def wake_keys(row: Sequence[Any]) -> list[str]:
        """The users (:func:`user_key`) and rooms (:func:`room_key`) a wire row of
        ``stream`` concerns; raises TypeError/ValueError/IndexError on a malformed row."""

    @abstractmethod
    def current_position(self) -> Any:
        """Where the stream is complete now (the ``upto`` of the next :meth:`collect`)."""

    @abstractmethod
    async def collect(self, ctx: SyncContext, since: Any | None, upto: Any) -> Any:
        """Put what changed in ``(since, upto]`` for ``ctx``'s user into the response
        (``since`` None: no token); the position for the next token."""

    async def finish(self, ctx: SyncContext) -> None:  # noqa: B027 (optional hook)
        """After every section collected (in registration order)."""


class UserDataSection(SyncSection):
    """A section over one of :class:`~roomstream.client.userdata.UserData`'s streams
    (its ``stream``): positions are the stream's complete position."""

    def __init__(self, userdata: UserData) -> None:
        self.userdata = userdata

    @classmethod
    def from_services(cls, services: SyncServices) -> Self:
        return cls(services.userdata)

    def current_position(self) -> int:
        return self.userdata.position(self.stream)
