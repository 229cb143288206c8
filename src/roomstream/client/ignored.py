"""Ignored users (``m.ignored_user_list`` global account data, spec "Ignoring Users").

What is hidden from the ignoring user, as Synapse does it: the non-state events of
ignored senders in ``/sync`` timelines, ``/messages`` and ``/context`` (state events stay:
a client needs the room's state whoever set it), and invites they sent.

Each user's ignored set is cached on every process, so a sync costs no query for it.
Invalidation: the process that writes (or forwards) an account-data change forgets the
user's entry when the write returns, so that user's next request there sees it; every
other process forgets it when the ``account_data`` row reaches it over replication. A
read that raced an invalidation is never cached (a generation check), so an entry is never
older than the last invalidation it saw.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from roomstream.events.types import EventTypes
from roomstream.lru import LruCache
from roomstream.streams.rows import AccountDataRow

__all__ = [
    "IGNORED_USER_LIST",
    "IgnoredUsers",
    "hide_ignored",
    "ignored_from_content",
    "ignored_invite",
]

IGNORED_USER_LIST = "m.ignored_user_list"

Loader = Callable[[str], Awaitable[dict[str, Any] | None]]


def ignored_from_content(content: Any) -> frozenset[str]:
    """The user IDs an ``m.ignored_user_list`` content ignores (anything malformed
    ignores nobody: the content is the client's, stored as given)."""
    if not isinstance(content, dict):
        return frozenset()
    users = content.get("ignored_users")
    if not isinstance(users, dict):
        return frozenset()
    return frozenset(u for u in users if isinstance(u, str))


class IgnoredUsers:
    """user ID -> the users they ignore, cached (see the module docstring)."""

    def __init__(self, load: Loader) -> None:
        #: Reads a user's ``m.ignored_user_list`` content (None: never set).
        self._load = load
        self._cache: LruCache[str, frozenset[str]] = LruCache("ignored_users")
        #: Bumped by every invalidation: a read that started before one is not kept.
        self._generation = 0

    async def of(self, user_id: str) -> frozenset[str]:
        cached = self._cache.get(user_id)
        if cached is not None:
            return cached
        generation = self._generation
        ignored = ignored_from_content(await self._load(user_id))
        if generation == self._generation:
            self._cache.set(user_id, ignored)
        return ignored

    def invalidate(self, user_id: str) -> None:
        self._generation += 1
        self._cache.pop(user_id)

    def on_account_data_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """``account_data`` stream rows ``(user_id, room_id, data_type)``: forget the
        users whose global ignore list changed."""
        for wire in rows:
            if len(wire) < 3:
                continue
            # A longer row (a later format) starts with the same fields.
            row = AccountDataRow.from_wire(wire[:3])
            if row.room_id is None and row.data_type == IGNORED_USER_LIST:
                self.invalidate(str(row.user_id))


def hide_ignored(events: list[dict[str, Any]], ignored: frozenset[str]) -> list[dict[str, Any]]:
    """``events`` less the non-state events sent by an ignored user."""
    if not ignored:
        return events
    return [e for e in events if "state_key" in e or e.get("sender") not in ignored]


def ignored_invite(
    invite_state: list[dict[str, Any]], user_id: str, ignored: frozenset[str]
) -> bool:
    """Whether an invite (its stripped state) was sent by a user ``user_id`` ignores."""
    if not ignored:
        return False
    return any(
        e.get("type") == EventTypes.MEMBER
        and e.get("state_key") == user_id
        and e.get("sender") in ignored
        for e in invite_state
    )
