"""``POST /rooms/{id}/upgrade``: replace a room by a new one of another version, as the
spec lists and Synapse does it (``RoomCreationHandler.upgrade_room``).

In order:

1. The requester must be joined to the old room with the power to send
   ``m.room.tombstone`` there; otherwise ``403 M_FORBIDDEN`` and nothing is created.
2. The new room is created as a ``private_chat`` (published in the directory if the old
   room was) with ``predecessor: {room_id}`` (and the old room's ``type`` and
   ``m.federate: false``) in its create event, and the old room's current
   ``m.room.join_rules``, ``name``, ``topic``, ``history_visibility``, ``guest_access``,
   ``avatar``, ``encryption``, ``server_acl`` and (for a space) ``m.space.child`` events
   copied as its initial state; its power levels are the old room's with the requester
   raised to the highest level any of them needs (so that they can send them all).
   The new room exists before the tombstone (its ID is not known in advance in room
   version 12, whose IDs are create-event hashes), so ``predecessor`` has no ``event_id``
   in any version: the spec has made it optional (v1.16), and clients follow
   ``room_id``.
3. Bans of the old room are repeated in the new one.
4. The tombstone (``replacement_room``) is sent into the old room.
5. The old room's local aliases point to the new room; its ``m.room.canonical_alias``
   moves (the alias and the local ``alt_aliases``), sent into both rooms.
6. The old room's ``invite`` and ``events_default`` levels are raised to
   ``max(users_default + 1, 50)`` (no one below that speaks or invites there any more),
   and the new room gets the old room's power levels as they were (in version 12 without
   the creators in ``users``: they have infinite power there).

Steps 5 and 6 are best effort, as in Synapse: an auth failure there is logged, the upgrade
stands. One upgrade of a room at a time on a process (a lock per old room).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from roomstream.accounts import Requester
from roomstream.client.rooms import CreateRoomRequest, RoomService, StateEvent
from roomstream.errors import ForbiddenError, MatrixError, NotFoundError
from roomstream.events.auth import (
    CREATE_KEY,
    POWER_LEVELS_KEY,
    get_send_level,
    get_user_power_level,
)
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion
from roomstream.events.types import EventTypes

__all__ = ["RoomUpgrades"]

logger = logging.getLogger(__name__)

SPACE_CHILD = "m.space.child"
#: The state keys copied into the new room (besides a space's children).
COPIED_STATE = (
    EventTypes.JOIN_RULES,
    EventTypes.NAME,
    EventTypes.TOPIC,
    EventTypes.HISTORY_VISIBILITY,
    EventTypes.GUEST_ACCESS,
    EventTypes.AVATAR,
    EventTypes.ENCRYPTION,
    EventTypes.SERVER_ACL,
)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class RoomUpgrades:
    def __init__(self, rooms: RoomService) -> None:
        self.rooms = rooms
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def upgrade(self, requester: Requester, old_room_id: str, version: RoomVersion) -> str:
        """Upgrade the room (see the module docstring); the new room's ID."""
        lock = self._locks.setdefault(old_room_id, asyncio.Lock())
        async with lock:
            return await self._upgrade(requester, old_room_id, version)

    async def _upgrade(self, requester: Requester, old_room_id: str, version: RoomVersion) -> str:
        rooms, events = self.rooms, self.rooms.events
        user_id = requester.user_id
        if await events.get_room_version(old_room_id) is None:
            raise NotFoundError(f"Unknown room id {old_room_id}")
        state = await events.get_current_state(old_room_id)
        wanted = [
            event_id
            for key, event_id in state.items()
            if key[0] in (*COPIED_STATE, SPACE_CHILD, EventTypes.CREATE, EventTypes.POWER_LEVELS)
            or key[0] == EventTypes.CANONICAL_ALIAS
            or (key[0] == EventTypes.MEMBER and key[1] == user_id)
        ]
        loaded = await events.get_events(wanted)
        old: dict[tuple[str, str], Event] = {
            key: loaded[event_id] for key, event_id in state.items() if event_id in loaded
        }
        create = old.get(CREATE_KEY)
        power_levels = old.get(POWER_LEVELS_KEY)
        member = old.get((EventTypes.MEMBER, user_id))
        if member is None or member.content.get("membership") != "join":
            raise ForbiddenError(f"user {user_id} is not in room {old_room_id}")
        auth_events = {
            key: event
            for key, event in ((CREATE_KEY, create), (POWER_LEVELS_KEY, power_levels))
            if event is not None
        }
        needed = get_send_level(EventTypes.TOMBSTONE, "", power_levels)
        if get_user_power_level(user_id, auth_events) < needed:
            raise ForbiddenError(f"user {user_id} may not upgrade room {old_room_id}")
        create_content = {} if create is None else dict(create.content)
        creation: dict[str, Any] = {"predecessor": {"room_id": old_room_id}}
        if create_content.get("m.federate", True) is False:
            creation["m.federate"] = False
        room_type = create_content.get("type")
        if room_type is not None:
            creation["type"] = room_type
        initial = [
            StateEvent(key[0], key[1], dict(event.content))
            for key, event in sorted(old.items())
            if (key[0] in COPIED_STATE and key[1] == "")
            or (key[0] == SPACE_CHILD and room_type == "m.space" and event.content)
        ]
        old_levels = {} if power_levels is None else dict(power_levels.content)
        request = CreateRoomRequest(
            preset="private_chat",
            visibility="public" if await rooms.store.is_room_public(old_room_id) else "private",
            initial_state=initial,
            room_version=version.identifier,
            power_level_content_override=_levels_to_copy(
                old_levels, user_id, version, raise_to_send_all=True
            ),
            creation_content=creation,
        )
        new_room_id = await rooms.create_room(requester, request)
        send = rooms.writer.send
        members = await events.get_events(
            event_id
            for (event_type, target), event_id in state.items()
            if event_type == EventTypes.MEMBER and target != user_id
        )
        for member_event in members.values():
            if member_event.content.get("membership") == "ban":
                await send(
                    new_room_id,
                    user_id,
                    EventTypes.MEMBER,
                    dict(member_event.content),
                    state_key=member_event.state_key,
                )
        tombstone = {"body": "This room has been replaced", "replacement_room": new_room_id}
        await send(old_room_id, user_id, EventTypes.TOMBSTONE, tombstone, state_key="")
        await self._move_aliases(user_id, old_room_id, new_room_id, old)
        await self._restrict_old_room(user_id, old_room_id, old_levels)
        if power_levels is not None:
            final = _levels_to_copy(old_levels, user_id, version, raise_to_send_all=False)
            await self._best_effort(
                send(new_room_id, user_id, EventTypes.POWER_LEVELS, final, state_key="")
            )
        return new_room_id

    async def _move_aliases(
        self, user_id: str, old_room_id: str, new_room_id: str, old: dict[tuple[str, str], Event]
    ) -> None:
        rooms = self.rooms
        await rooms.store.move_aliases(old_room_id, new_room_id)
        event = old.get((EventTypes.CANONICAL_ALIAS, ""))
        if event is None:
            return
        suffix = ":" + rooms.server_name
        old_content = dict(event.content)
        new_content: dict[str, Any] = {}
        alias = event.content.get("alias")
        if isinstance(alias, str) and alias.endswith(suffix):
            new_content["alias"] = alias
            old_content.pop("alias", None)
        alt = event.content.get("alt_aliases")
        if isinstance(alt, list) and alt:
            local = [a for a in alt if isinstance(a, str) and a.endswith(suffix)]
            remaining = [a for a in alt if a not in local]
            new_content["alt_aliases"] = local
            if remaining:
                old_content["alt_aliases"] = remaining
            else:
                old_content.pop("alt_aliases", None)
        send = rooms.writer.send
        canonical = EventTypes.CANONICAL_ALIAS
        await self._best_effort(send(old_room_id, user_id, canonical, old_content, state_key=""))
        await self._best_effort(send(new_room_id, user_id, canonical, new_content, state_key=""))

    async def _restrict_old_room(
        self, user_id: str, old_room_id: str, levels: dict[str, Any]
    ) -> None:
        if not levels:
            return
        restricted = max(_int(levels.get("users_default"), 0) + 1, 50)
        content = dict(levels)
        updated = False
        for name in ("invite", "events_default"):
            if _int(content.get(name), 0) < restricted:
                content[name] = restricted
                updated = True
        if updated:
            send = self.rooms.writer.send
            await self._best_effort(
                send(old_room_id, user_id, EventTypes.POWER_LEVELS, content, state_key="")
            )

    async def _best_effort(self, sending: Any) -> None:
        try:
            await sending
        except MatrixError as error:
            logger.warning("room upgrade: a best-effort event was refused: %s", error)


def _levels_to_copy(
    levels: dict[str, Any], user_id: str, version: RoomVersion, *, raise_to_send_all: bool
) -> dict[str, Any]:
    """The old room's power levels for the new room. ``raise_to_send_all``: with the
    requester at the highest level the copied state needs (Synapse's
    ``needed_power_level``: ``state_default``, ``ban`` and every ``events`` entry). In
    version 12 the requester, a creator of the new room, is left out of ``users``."""
    content = dict(levels)
    users = content.get("users")
    users = dict(users) if isinstance(users, dict) else {}
    if raise_to_send_all and not version.privileged_creators:
        events = content.get("events")
        event_levels = [
            v for v in (events.values() if isinstance(events, dict) else ()) if _int(v, -1) >= 0
        ]
        needed = max(
            _int(content.get("state_default"), 50), _int(content.get("ban"), 50), *event_levels
        )
        current = _int(users.get(user_id), _int(content.get("users_default"), 0))
        if current < needed:
            users[user_id] = needed
    if version.privileged_creators:
        users.pop(user_id, None)
    content["users"] = users
    return content
