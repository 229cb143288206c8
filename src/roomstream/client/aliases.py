"""The rules the Client-Server API applies to room aliases beyond their grammar: what an
``m.room.canonical_alias`` event may name, and who may delete an alias.

- ``m.room.canonical_alias`` (state key ``""``): its ``alias`` and every ``alt_aliases``
  entry it adds (entries the current event already has are not checked again, as
  Synapse does) must be aliases (``400 M_INVALID_PARAM`` if malformed) that exist on
  this server and point to the room (``400 M_BAD_ALIAS``). An alias of another server
  cannot be checked without federation, so it is ``M_BAD_ALIAS`` too.
- Deleting an alias: its creator, a server admin, or a member of the alias's room whose
  power level allows sending ``m.room.canonical_alias`` (Synapse's rule); anyone else
  ``403 M_FORBIDDEN``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from roomstream.client.store import ClientStore
from roomstream.errors import BadAliasError, InvalidParamError
from roomstream.events.auth import (
    CREATE_KEY,
    POWER_LEVELS_KEY,
    get_send_level,
    get_user_power_level,
)
from roomstream.events.types import EventTypes
from roomstream.grammar import is_room_alias
from roomstream.rooms.store import EventStore

__all__ = ["AliasRules", "canonical_aliases"]


def _invalid(message: str) -> InvalidParamError:
    return InvalidParamError(message)


def check_alias_grammar(alias: object) -> str:
    """A room alias (:func:`~roomstream.grammar.is_room_alias`); else
    ``400 M_INVALID_PARAM``."""
    if not isinstance(alias, str):
        raise _invalid(f"not a room alias: {str(alias)[:80]!r}")
    if not is_room_alias(alias):
        raise _invalid(f"not a room alias: {alias[:80]!r}")
    return alias


def canonical_aliases(
    content: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> list[str]:
    """The aliases an ``m.room.canonical_alias`` content names that must be checked: its
    ``alias`` (when set) and the ``alt_aliases`` that ``previous`` (the current event's
    content) does not already list. Malformed entries: ``400 M_INVALID_PARAM``."""
    result: list[str] = []
    alias = content.get("alias")
    if alias is not None and alias != "":
        result.append(check_alias_grammar(alias))
    alt = content.get("alt_aliases")
    if alt is None:
        return result
    if not isinstance(alt, list):
        raise _invalid("alt_aliases must be a list of room aliases")
    old = (previous or {}).get("alt_aliases")
    known = set(old) if isinstance(old, list) and all(isinstance(a, str) for a in old) else set()
    for entry in alt:
        check_alias_grammar(entry)
        if entry not in known and entry not in result:
            result.append(entry)
    return result


class AliasRules:
    def __init__(self, server_name: str, store: ClientStore, events: EventStore) -> None:
        self.server_name = server_name
        self.store = store
        self.events = events

    async def check_points_to(self, room_id: str, aliases: Iterable[str]) -> None:
        """Each alias exists here and names ``room_id``; else ``400 M_BAD_ALIAS``."""
        for alias in aliases:
            found = None
            if alias.endswith(":" + self.server_name):
                found = await self.store.get_alias(alias)
            if found is None or found[0] != room_id:
                raise BadAliasError(f"room alias {alias} does not point to the room")

    async def check_canonical_alias(
        self, room_id: str, content: Mapping[str, Any], previous: Mapping[str, Any] | None
    ) -> None:
        """An ``m.room.canonical_alias`` content about to be sent to ``room_id``, over
        the current one's ``previous`` content (None: none)."""
        await self.check_points_to(room_id, canonical_aliases(content, previous))

    async def may_delete(self, user_id: str, room_id: str, creator: str, *, is_admin: bool) -> bool:
        """Whether ``user_id`` may delete an alias of ``room_id`` made by ``creator``."""
        if user_id == creator or is_admin:
            return True
        if await self.events.get_membership(room_id, user_id) != "join":
            return False
        auth_events = {}
        for key in (CREATE_KEY, POWER_LEVELS_KEY):
            event_id = await self.events.get_current_state_entry(room_id, key)
            event = None if event_id is None else await self.events.get_event(event_id)
            if event is not None:
                auth_events[key] = event
        required = get_send_level(EventTypes.CANONICAL_ALIAS, "", auth_events.get(POWER_LEVELS_KEY))
        return get_user_power_level(user_id, auth_events) >= required
