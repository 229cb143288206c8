"""Profiles in the Client-Server API: reading a local user's display name and avatar,
changing one's own, and sending a change into every room the user is joined to.

The rules, Synapse's (``synapse.handlers.profile``) where the spec leaves a choice:

- a profile is served for a local user that exists (``404 M_NOT_FOUND`` otherwise, and
  for a user of another server: there is no federation to ask); the whole profile is
  ``404`` also when neither field is set, as Synapse answers;
- only the user changes their profile (``403 M_FORBIDDEN`` for anyone else; Synapse
  answers ``400 M_FORBIDDEN``); a display name is stripped of surrounding white space;
  values longer than 256 (display name) or 1,000 (avatar URL) characters, or holding
  U+0000, are ``400 M_INVALID_PARAM``; ``""`` unsets a field;
- a change is stored first, and the request answers then; the new membership events
  follow in the background (:class:`ProfileFanOut`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from typing import Any

from roomstream.accounts import Requester, parse_user_id
from roomstream.accounts.profiles import (
    MAX_AVATAR_URL_LENGTH,
    MAX_DISPLAYNAME_LENGTH,
    PROFILE_FIELDS,
    Profile,
    ProfileStore,
)
from roomstream.client.writes import RoomWriter
from roomstream.errors import ForbiddenError, InvalidParamError, NotFoundError
from roomstream.events.types import EventTypes
from roomstream.rooms.store import EventStore

__all__ = ["FANOUT_CONCURRENCY", "ProfileFanOut", "ProfileService"]

logger = logging.getLogger(__name__)

#: Membership events a process creates at once for profile changes (all users together):
#: a change to a user in many rooms neither floods the events writers nor holds back the
#: other requests they serve.
FANOUT_CONCURRENCY = 8
_LIMITS = {"displayname": MAX_DISPLAYNAME_LENGTH, "avatar_url": MAX_AVATAR_URL_LENGTH}


class ProfileService:
    """The profile API's rules over the profile store; changes go out through ``fanout``."""

    def __init__(self, server_name: str, store: ProfileStore, fanout: ProfileFanOut) -> None:
        self.server_name = server_name
        self.store = store
        self.fanout = fanout

    async def get_profile(self, user_id: str) -> Profile:
        """A local user's profile (400 for what is not a user ID, 404 for a user not
        known here)."""
        _, server = parse_user_id(user_id)
        if server != self.server_name:
            raise NotFoundError(
                f"profile of {user_id[:300]!r} not found: federation is not supported"
            )
        profile = await self.store.get(user_id)
        if profile is None:
            raise NotFoundError("profile not found")
        return profile

    async def set_field(self, requester: Requester, user_id: str, field: str, value: str) -> None:
        """Set the requester's own ``field`` (``displayname`` or ``avatar_url``) to
        ``value`` ("" unsets it), then send it into their rooms in the background.

        Answers once the profile is stored: every membership event created from then on
        (joins, invites, the fan-out's) carries the new value."""
        parse_user_id(user_id)
        if user_id != requester.user_id:
            raise ForbiddenError(f"cannot set the {field} of another user")
        if field not in PROFILE_FIELDS:
            raise InvalidParamError(f"not a profile field: {field[:100]!r}")
        if len(value) > _LIMITS[field]:
            raise InvalidParamError(f"{field} is too long (at most {_LIMITS[field]} characters)")
        if "\x00" in value:  # PostgreSQL text cannot hold it: refused on both engines
            raise InvalidParamError(f"{field} must not contain U+0000")
        if field == "displayname":
            value = value.strip()
        if not await self.store.set_field(user_id, field, value or None):
            raise NotFoundError("profile not found")
        self.fanout.schedule(user_id)


class ProfileFanOut:
    """Sends a user's profile into every room they are joined to, as a new
    ``m.room.member`` join event whose content carries it (Synapse treats a profile
    change as a join). Off the request's path, on the process that took the change.

    Invariants:

    - after a change, each room the user is joined to when the fan-out reads their rooms
      gets a join event carrying the profile as stored when the event is created
      (:class:`~roomstream.rooms.creation.LocalEventCreator` reads it then), unless its
      current membership already carries exactly that profile (nothing is sent twice);
    - one user's fan-outs run one at a time, in order; a newer change supersedes the
      one running (it stops before its next room) and those waiting (they do nothing):
      the newest one covers every room with the newest profile;
    - at most :data:`FANOUT_CONCURRENCY` events are being created for fan-outs at once
      on this process;
    - only rooms where the user's membership is ``join`` when the room's turn comes get
      an event: a room left meanwhile is skipped rather than joined again. (The check
      and the event are not atomic: a leave in between, on the room's writer, is still
      followed by the join, as in Synapse.)
    - a room whose event fails (its writer unreachable, say) is logged and skipped; the
      others go on. Fan-outs running when the process stops are abandoned (a later
      change, or a join, brings the profile into those rooms).

    Rooms another process writes get their event through the ordinary forwarding of
    sends (:class:`~roomstream.client.writes.RoomWriter`).
    """

    def __init__(
        self,
        events: EventStore,
        writer: RoomWriter,
        store: ProfileStore,
        *,
        concurrency: int = FANOUT_CONCURRENCY,
    ) -> None:
        self.events = events
        self.writer = writer
        self.store = store
        self._slots = asyncio.Semaphore(concurrency)
        #: User -> the number of the newest change scheduled for them (numbers count up
        #: across users, never reused), while one is scheduled.
        self._newest: dict[str, int] = {}
        self._numbers = itertools.count(1)
        #: Held by the user's running fan-out.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        #: Fan-outs scheduled and not finished (held here so none is collected).
        self._tasks: set[asyncio.Task[None]] = set()
        #: Membership events this process created for fan-outs, and rooms that failed.
        self.sent = 0
        self.failed = 0

    def schedule(self, user_id: str) -> None:
        """Start sending ``user_id``'s stored profile into their rooms (returns at once)."""
        number = self._newest[user_id] = next(self._numbers)
        task = asyncio.get_running_loop().create_task(self._run(user_id, number))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    @property
    def pending(self) -> int:
        """Fan-outs scheduled and not finished."""
        return len(self._tasks)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("profile fan-out failed", exc_info=task.exception())

    def _superseded(self, user_id: str, number: int) -> bool:
        return self._newest.get(user_id) != number

    async def _run(self, user_id: str, number: int) -> None:
        lock = self._locks.get(user_id)
        if lock is None:
            lock = self._locks[user_id] = asyncio.Lock()
        try:
            async with lock:
                if self._superseded(user_id, number):
                    return  # a newer change is waiting for the lock: it does the work
                profile = await self.store.member_content(user_id)
                rooms = await self.events.get_rooms_for_user(user_id)
                await asyncio.gather(
                    *(self._update_room(user_id, number, room, profile) for room in rooms)
                )
        finally:
            if not self._superseded(user_id, number):
                del self._newest[user_id]

    async def _update_room(
        self, user_id: str, number: int, room_id: str, profile: dict[str, Any]
    ) -> None:
        async with self._slots:
            if self._superseded(user_id, number):
                return
            try:
                if not await self._needs_update(user_id, room_id, profile):
                    return
                # Shielded: an event being created is finished even if the fan-out is
                # abandoned (its persisting is not cut half-way).
                await asyncio.shield(
                    self.writer.send(
                        room_id,
                        user_id,
                        EventTypes.MEMBER,
                        {"membership": "join"},
                        state_key=user_id,
                    )
                )
                self.sent += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one room's failure does not stop the others
                self.failed += 1
                logger.warning("profile change of %s not sent to %s: %s", user_id, room_id, exc)

    async def _needs_update(self, user_id: str, room_id: str, profile: dict[str, Any]) -> bool:
        """Whether the user is joined to the room with another profile than ``profile``."""
        event_id = await self.events.get_current_state_entry(room_id, (EventTypes.MEMBER, user_id))
        event = None if event_id is None else await self.events.get_event(event_id)
        content = {} if event is None else event.data.get("content") or {}
        if content.get("membership") != "join":
            return False
        return any(content.get(f) != profile.get(f) for f in PROFILE_FIELDS)

    def close(self) -> None:
        """Abandon the fan-outs still running (the process is stopping)."""
        for task in list(self._tasks):
            task.cancel()
