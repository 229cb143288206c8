"""What another server may see of a room's events (Synapse's ``filter_events_for_server``).

The rules, for an event E and a server S, where "at E" means in the state *after* E (as
Synapse reads it: a server's own join event is visible to it):

1. a history visibility at E other than ``invited`` or ``joined`` (``shared``,
   ``world_readable``, an unknown value, or none): E is visible to S whole;
2. otherwise E is visible whole if some user of S is joined at E, or invited at E and
   the visibility is ``invited``;
3. otherwise S gets E *redacted* (the room version's redaction algorithm: the event's
   place in the DAG, its hashes and signatures stay, so S can still check and link it).

An event stored without state (an outlier) counts as rule 1, as Synapse does for an event
whose state it does not know. Erased users are not handled (roomstream has no erasure).

Which server may ask at all (in the room at the events asked about, or the room
``world_readable``) is :func:`host_in_room_at`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roomstream.events.model import Event, StateKey
from roomstream.events.redaction import redact
from roomstream.events.types import EventTypes
from roomstream.rooms.store import EventStore

HISTORY_VISIBILITY_KEY: StateKey = (EventTypes.HISTORY_VISIBILITY, "")


def server_of(user_id: str) -> str:
    """The server part of a user ID (everything after the first colon)."""
    return user_id.split(":", 1)[1] if ":" in user_id else ""


def visible_whole(visibility: str | None, server_memberships: Sequence[str | None]) -> bool:
    """Rules 1 and 2: ``server_memberships`` are the memberships at E of the asking
    server's users (those with a membership event in the state)."""
    if visibility not in ("invited", "joined"):
        return True
    if "join" in server_memberships:
        return True
    return visibility == "invited" and "invite" in server_memberships


async def _memberships_at(
    store: EventStore, state: Mapping[StateKey, str], server_name: str
) -> tuple[str | None, list[str | None]]:
    """(history visibility, memberships of ``server_name``'s users) in ``state``."""
    suffix = ":" + server_name
    wanted = [
        event_id
        for (etype, state_key), event_id in state.items()
        if etype == EventTypes.MEMBER and state_key.endswith(suffix)
    ]
    vis_id = state.get(HISTORY_VISIBILITY_KEY)
    if vis_id is not None:
        wanted.append(vis_id)
    events = await store.get_events(wanted)
    visibility: str | None = None
    if vis_id is not None and vis_id in events:
        value = events[vis_id].content.get("history_visibility")
        visibility = value if isinstance(value, str) else None
    memberships = [events[e].membership for e in wanted if e != vis_id and e in events]
    return visibility, memberships


async def filter_events_for_server(
    store: EventStore, server_name: str, events: Sequence[Event]
) -> list[dict[str, Any]]:
    """``events`` as ``server_name`` may see them (PDU dicts, in the same order): whole,
    or redacted (rule 3). Nothing is left out: a PDU redacted still links the DAG."""
    result: list[dict[str, Any]] = []
    for event in events:
        try:
            state = await store.get_state_at(event.event_id)
        except LookupError:  # an outlier: no state known (rule 1)
            result.append(dict(event.data))
            continue
        visibility, memberships = await _memberships_at(store, state, server_name)
        if visible_whole(visibility, memberships):
            result.append(dict(event.data))
        else:
            result.append(redact(event.data, event.room_version))
    return result


async def host_in_room_at(
    store: EventStore, room_id: str, server_name: str, event_ids: Sequence[str]
) -> bool:
    """Whether ``server_name`` may query the room at ``event_ids`` (as Synapse's
    ``_check_host_in_room`` and ``on_backfill_request``): one of its users is joined in
    the room's current state or in the state after one of the events, or the room's
    current history visibility is ``world_readable``."""
    current = await store.get_current_state(room_id)
    visibility, memberships = await _memberships_at(store, current, server_name)
    if visibility == "world_readable" or "join" in memberships:
        return True
    for event_id in event_ids:
        try:
            state = await store.get_state_at(event_id)
        except LookupError:
            continue
        _, memberships = await _memberships_at(store, state, server_name)
        if "join" in memberships:
            return True
    return False
