"""``GET /rooms/{id}/hierarchy``: the rooms of a space, walked depth first, as Synapse's
``room_summary.py`` walks the rooms it has (no federation: a child this server is not
in is left out, as Synapse leaves out a remote room it cannot summarise).

What a user may learn of a room (Synapse's ``_is_local_room_accessible``): its entry is
served when its join rule is ``public``, ``knock`` or ``knock_restricted``, or its history
is ``world_readable``, or the user is joined or invited, or its join rule is
``restricted`` / ``knock_restricted`` and the user is joined to a room its ``allow`` list
names. A room the user may not learn of is left out with its whole subtree (its children
are never read). The root must pass the same test, else ``403 M_FORBIDDEN``.

Order: a space's ``m.space.child`` events (current state, with a non-empty ``via`` list
of strings) by their valid ``order`` (printable ASCII, at most 50 characters; missing
ones last), then ``origin_server_ts``, then room ID; each room once, at its first place.

Pagination tokens are stateless (any process can continue a walk): the number of rooms
already served and a digest of the walk's parameters (requester, root, ``suggested_only``,
``max_depth``). A page re-walks from the root and skips the rooms served before, so a
change to the hierarchy between pages shifts the walk, as a changed queue does in
Synapse. A token of other parameters, or malformed, is ``400 M_INVALID_PARAM``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roomstream.errors import ForbiddenError, InvalidParamError
from roomstream.events.model import Event
from roomstream.events.types import EventTypes, JoinRules
from roomstream.rooms.store import load_events_txn
from roomstream.storage import Database, Transaction

__all__ = [
    "MAX_ROOMS",
    "HierarchyRequest",
    "RoomSummary",
    "SpaceHierarchy",
    "allowed_room_ids",
    "hierarchy_entry",
    "read_room_txn",
    "space_children",
]

#: Rooms per page at most (Synapse's ``MAX_ROOMS``), and the default.
MAX_ROOMS = 50
SPACE_CHILD = "m.space.child"
SPACE = "m.space"
_INVALID_ORDER = re.compile(r"[^\x20-\x7E]")
#: The state of a room an entry is built from (besides its m.space.child events).
_SUMMARY_TYPES = (
    EventTypes.CREATE,
    EventTypes.NAME,
    EventTypes.TOPIC,
    EventTypes.AVATAR,
    EventTypes.CANONICAL_ALIAS,
    EventTypes.JOIN_RULES,
    EventTypes.HISTORY_VISIBILITY,
    EventTypes.GUEST_ACCESS,
    EventTypes.ENCRYPTION,
)


@dataclass(frozen=True)
class HierarchyRequest:
    room_id: str
    suggested_only: bool = False
    max_depth: int | None = None
    limit: int | None = None
    from_token: str | None = None


@dataclass
class _Room:
    """One room as the walk reads it, in one transaction."""

    room_id: str
    known: bool
    joined_members: int = 0
    requester_membership: str | None = None
    state: dict[tuple[str, str], Event] = field(default_factory=dict)
    #: Rooms the requester is joined to, among those the join rule's allow list names.
    allowed_joined: bool = False

    def content(self, event_type: str) -> dict[str, Any]:
        event = self.state.get((event_type, ""))
        value = None if event is None else event.data.get("content")
        return value if isinstance(value, dict) else {}


class SpaceHierarchy:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def hierarchy(self, user_id: str, request: HierarchyRequest) -> dict[str, Any]:
        """One page of the walk (see the module docstring)."""
        digest = _digest(user_id, request)
        skip = _parse_token(request.from_token, digest)
        limit = MAX_ROOMS if request.limit is None else min(request.limit, MAX_ROOMS)
        root = await self._read(user_id, request.room_id)
        if not _accessible(root):
            raise ForbiddenError(
                f"User {user_id} not in room {request.room_id}, and room previews are disabled"
            )
        # The queue's next room is last; (room ID, depth).
        queue: list[tuple[str, int]] = [(request.room_id, 0)]
        processed: set[str] = set()
        served = 0
        rooms: list[dict[str, Any]] = []
        while queue and len(rooms) < limit:
            room_id, depth = queue.pop()
            if room_id in processed:
                continue
            processed.add(room_id)
            room = root if room_id == request.room_id else await self._read(user_id, room_id)
            if not room.known or not _accessible(room):
                continue
            children = _children(room, request.suggested_only)
            if served >= skip:
                rooms.append(_entry(room, children))
            served += 1
            if request.max_depth is None or depth < request.max_depth:
                queue.extend((e.state_key or "", depth + 1) for e in reversed(children))
        result: dict[str, Any] = {"rooms": rooms}
        if queue:
            result["next_batch"] = f"{served}~{digest}"
        return result

    async def _read(self, user_id: str, room_id: str) -> _Room:
        return await self.db.run_interaction("hierarchy_room", _read_txn, user_id, room_id)


def _read_txn(txn: Transaction, user_id: str, room_id: str) -> _Room:
    rows = txn.query(
        "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?"
        " AND (type IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (state_key = '' OR type = ?)"
        " OR type = ? AND state_key = ?)",
        (room_id, *_SUMMARY_TYPES, SPACE_CHILD, SPACE_CHILD, EventTypes.MEMBER, user_id),
    )
    count = txn.query_one(
        "SELECT COUNT(*) FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'join'",
        (room_id,),
    )
    if not rows or not count[0]:
        # Unknown, or nobody here is in it any more (Synapse's is_host_joined).
        return _Room(room_id, known=False)
    events = load_events_txn(txn, [str(r[2]) for r in rows])
    state = {(str(r[0]), str(r[1])): events[r[2]] for r in rows if r[2] in events}
    room = _Room(room_id, known=True, joined_members=int(count[0]), state=state)
    member = state.get((EventTypes.MEMBER, user_id))
    if member is not None:
        membership = (member.data.get("content") or {}).get("membership")
        room.requester_membership = membership if isinstance(membership, str) else None
    join_rule = room.content(EventTypes.JOIN_RULES).get("join_rule")
    if join_rule in (JoinRules.RESTRICTED, JoinRules.KNOCK_RESTRICTED):
        allowed = _allowed_rooms(room.content(EventTypes.JOIN_RULES))
        if allowed:
            marks = ",".join("?" * len(allowed))
            room.allowed_joined = (
                txn.query_one(
                    "SELECT 1 FROM current_state_events WHERE type = 'm.room.member'"
                    f" AND state_key = ? AND membership = 'join' AND room_id IN ({marks})",
                    (user_id, *allowed),
                )
                is not None
            )
    return room


# -- what the federation hierarchy (roomstream.federation.queries) reuses ---------------

#: One room as the walk reads it (its summary state, joined members, the requester's
#: membership).
RoomSummary = _Room


def read_room_txn(txn: Transaction, user_id: str, room_id: str) -> RoomSummary:
    """The room as the walk reads it for ``user_id`` (any string naming no member,
    e.g. ``""``, reads it for nobody in particular)."""
    return _read_txn(txn, user_id, room_id)


def space_children(room: RoomSummary, suggested_only: bool) -> list[Event]:
    """The room's ``m.space.child`` events in the walk's order (a space's only)."""
    return _children(room, suggested_only)


def hierarchy_entry(room: RoomSummary, children: Sequence[Event]) -> dict[str, Any]:
    """The room's entry, with ``children_state`` from ``children``."""
    return _entry(room, children)


def allowed_room_ids(room: RoomSummary) -> list[str]:
    """The rooms a ``restricted`` / ``knock_restricted`` join rule's allow list names
    (empty for any other join rule)."""
    join_rules = room.content(EventTypes.JOIN_RULES)
    if join_rules.get("join_rule") not in (JoinRules.RESTRICTED, JoinRules.KNOCK_RESTRICTED):
        return []
    return _allowed_rooms(join_rules)


def _allowed_rooms(join_rules: dict[str, Any]) -> list[str]:
    """The room IDs of the join rule's ``m.room_membership`` allow entries."""
    allow = join_rules.get("allow")
    if not isinstance(allow, list):
        return []
    return [
        str(entry["room_id"])
        for entry in allow
        if isinstance(entry, dict)
        and entry.get("type") == "m.room_membership"
        and isinstance(entry.get("room_id"), str)
    ][:100]


def _accessible(room: _Room) -> bool:
    """May the requester learn of this room (the module docstring's rule)?"""
    if not room.known:
        return False
    join_rule = room.content(EventTypes.JOIN_RULES).get("join_rule")
    if join_rule in (JoinRules.PUBLIC, JoinRules.KNOCK, JoinRules.KNOCK_RESTRICTED):
        return True
    if room.content(EventTypes.HISTORY_VISIBILITY).get("history_visibility") == "world_readable":
        return True
    if room.requester_membership in ("join", "invite"):
        return True
    return room.allowed_joined


def _children(room: _Room, suggested_only: bool) -> list[Event]:
    """The room's ``m.space.child`` events in the walk's order (a space's only)."""
    if room.content(EventTypes.CREATE).get("type") != SPACE:
        return []
    children = [
        e
        for (event_type, _), e in room.state.items()
        if event_type == SPACE_CHILD and _valid_via(e.data.get("content"))
    ]
    if suggested_only:
        children = [e for e in children if (e.data.get("content") or {}).get("suggested") is True]
    return sorted(children, key=_order_key)


def _valid_via(content: Any) -> bool:
    via = content.get("via") if isinstance(content, dict) else None
    return isinstance(via, list) and bool(via) and all(isinstance(v, str) for v in via)


def _order_key(child: Event) -> tuple[bool, str, int, str]:
    order = (child.data.get("content") or {}).get("order")
    if not isinstance(order, str) or len(order) > 50 or _INVALID_ORDER.search(order):
        order = None
    ts = child.data.get("origin_server_ts")
    return order is None, order or "", ts if isinstance(ts, int) else 0, child.state_key or ""


def _entry(room: _Room, children: Sequence[Event]) -> dict[str, Any]:
    """The room's hierarchy entry (Synapse's fields; absent values left out)."""
    create = room.content(EventTypes.CREATE)
    alias = room.content(EventTypes.CANONICAL_ALIAS).get("alias")
    entry: dict[str, Any] = {
        "room_id": room.room_id,
        "room_version": (
            room.state[(EventTypes.CREATE, "")].room_version.identifier
            if (EventTypes.CREATE, "") in room.state
            else None
        ),
        "name": _string(room.content(EventTypes.NAME).get("name")),
        "topic": _string(room.content(EventTypes.TOPIC).get("topic")),
        "canonical_alias": _string(alias),
        "num_joined_members": room.joined_members,
        "avatar_url": _string(room.content(EventTypes.AVATAR).get("url")),
        "join_rule": _string(room.content(EventTypes.JOIN_RULES).get("join_rule")),
        "world_readable": room.content(EventTypes.HISTORY_VISIBILITY).get("history_visibility")
        == "world_readable",
        "guest_can_join": room.content(EventTypes.GUEST_ACCESS).get("guest_access") == "can_join",
        "room_type": _string(create.get("type")),
        "encryption": _string(room.content(EventTypes.ENCRYPTION).get("algorithm")),
    }
    entry = {k: v for k, v in entry.items() if v is not None}
    entry["children_state"] = [
        {
            "type": SPACE_CHILD,
            "state_key": e.state_key,
            "content": e.data.get("content") or {},
            "sender": e.data.get("sender"),
            "origin_server_ts": e.data.get("origin_server_ts"),
        }
        for e in children
    ]
    return entry


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _digest(user_id: str, request: HierarchyRequest) -> str:
    key = f"{user_id}\0{request.room_id}\0{request.suggested_only}\0{request.max_depth}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _parse_token(token: str | None, digest: str) -> int:
    """How many rooms the pages before served (0 without a token)."""
    if token is None:
        return 0
    count, _, theirs = token.partition("~")
    if theirs != digest or not count.isascii() or not count.isdigit() or len(count) > 9:
        raise InvalidParamError("Unknown pagination token")
    return int(count)
