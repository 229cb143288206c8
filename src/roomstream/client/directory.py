"""The user directory and the public room list, read from the Spark views.

Both read the tables the views streaming job maintains (``roomstream.pipelines.views``,
migration 0002): ``view_user_directory`` (who is listed), ``view_room_state`` (the views'
copy of current state: memberships, join rules, and the event ID of every other state
entry) and ``view_room_stats`` (joined member counts). Event content the views do not copy
(display names' avatars, room names, topics, ...) is read from ``event_json`` by the event
IDs the views name, so an answer is as current as the views (the job's trigger interval
plus its batch time), never newer for one field than for another.

Rules (documented in ``docs/client_api.md``):

- directory search: a user is a candidate iff listed in ``view_user_directory``; the
  searcher sees a candidate iff the candidate is joined to a room whose join rule is
  ``public``, or both are joined to a common room (Synapse's default,
  ``search_all_users: false``, with "public" meaning the join rule only: the views do not
  copy history visibility). Every whitespace-separated word of the search term must occur,
  case-insensitively, in the user ID or the display name;
- public rooms: rooms published in the room directory (``rooms.is_public``, set by
  ``createRoom`` with ``visibility: public``) that the views know, most joined members
  first, then by room ID.

No HTTP here: handlers in :mod:`roomstream.client.directory_routes`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from roomstream.errors import InvalidParamError
from roomstream.events.types import EventTypes
from roomstream.storage import Database, Transaction

__all__ = [
    "DirectoryReader",
    "PublicRoom",
    "PublicRoomsPage",
    "RoomListToken",
    "UserSearchResult",
    "public_rooms_txn",
    "search_users_txn",
]

#: State read for a public room's entry: (type, the content key the entry shows).
ROOM_FIELDS = {
    EventTypes.NAME: "name",
    EventTypes.TOPIC: "topic",
    EventTypes.CANONICAL_ALIAS: "alias",
    EventTypes.AVATAR: "url",
    EventTypes.HISTORY_VISIBILITY: "history_visibility",
    EventTypes.GUEST_ACCESS: "guest_access",
}
MAX_SEARCH_LIMIT = 1000
MAX_ROOMS_LIMIT = 1000
#: Rooms examined per query while a generic search term filters the list.
SCAN_CHUNK = 200


@dataclass(frozen=True)
class UserSearchResult:
    results: list[dict[str, Any]]
    limited: bool


@dataclass(frozen=True)
class PublicRoom:
    room_id: str
    num_joined_members: int
    join_rule: str | None
    state: dict[str, str]  # ROOM_FIELDS value -> string content

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "room_id": self.room_id,
            "num_joined_members": self.num_joined_members,
            "world_readable": self.state.get("history_visibility") == "world_readable",
            "guest_can_join": self.state.get("guest_access") == "can_join",
            "join_rule": self.join_rule or "invite",
        }
        for key, out in (("name", "name"), ("topic", "topic"), ("url", "avatar_url")):
            if key in self.state:
                entry[out] = self.state[key]
        if "alias" in self.state:
            entry["canonical_alias"] = self.state["alias"]
        return entry


@dataclass(frozen=True)
class RoomListToken:
    """A position in the public room list: the key of a room (joined members, room ID) and
    the direction to read from it (``f``: rooms after it; ``b``: rooms before it)."""

    direction: str
    joined: int
    room_id: str

    _PATTERN = re.compile(r"([fb])(\d{1,15})\.(!.{1,255})")

    def to_string(self) -> str:
        return f"{self.direction}{self.joined}.{self.room_id}"

    @classmethod
    def parse(cls, raw: str) -> RoomListToken:
        match = cls._PATTERN.fullmatch(raw)
        if match is None:
            raise InvalidParamError("since: not a room list token")
        return cls(match[1], int(match[2]), match[3])


@dataclass(frozen=True)
class PublicRoomsPage:
    chunk: list[PublicRoom]
    next_batch: str | None
    prev_batch: str | None
    total_room_count_estimate: int

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "chunk": [room.to_json() for room in self.chunk],
            "total_room_count_estimate": self.total_room_count_estimate,
        }
        if self.next_batch is not None:
            body["next_batch"] = self.next_batch
        if self.prev_batch is not None:
            body["prev_batch"] = self.prev_batch
        return body


# -- shared helpers ----------------------------------------------------------------------


def _like_pattern(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _contents_txn(txn: Transaction, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Content of the given events (a redacted event's content counts as empty: every
    field shown here is one the redaction algorithm removes, or one nobody relies on)."""
    out: dict[str, dict[str, Any]] = {}
    ids = sorted(set(event_ids))
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        marks = ", ".join("?" * len(part))
        rows = txn.query(
            f"SELECT j.event_id, j.json, e.redacted_by FROM event_json j"
            f" LEFT JOIN events e ON e.event_id = j.event_id WHERE j.event_id IN ({marks})",
            part,
        )
        for event_id, raw, redacted_by in rows:
            content = {} if redacted_by else orjson.loads(raw).get("content")
            out[str(event_id)] = content if isinstance(content, dict) else {}
    return out


# -- the user directory -------------------------------------------------------------------

_VISIBLE_TO = (
    "(EXISTS (SELECT 1 FROM view_room_state m JOIN view_room_stats r ON r.room_id = m.room_id"
    " WHERE m.type = 'm.room.member' AND m.state_key = d.user_id AND m.membership = 'join'"
    " AND r.is_public)"
    " OR EXISTS (SELECT 1 FROM view_room_state m JOIN view_room_state s"
    " ON s.room_id = m.room_id AND s.type = 'm.room.member' AND s.state_key = ?"
    " AND s.membership = 'join'"
    " WHERE m.type = 'm.room.member' AND m.state_key = d.user_id AND m.membership = 'join'))"
)


def search_users_txn(
    txn: Transaction, searcher: str, search_term: str, limit: int
) -> UserSearchResult:
    """Users the searcher may see whose ID or display name contains every word of
    ``search_term`` (case-insensitive; on SQLite only ASCII letters fold). Ordered by
    whether the display name or localpart starts with the first word, then by user ID;
    ``limited`` when more than ``limit`` matched."""
    words = search_term.lower().split()
    if not words or limit <= 0:
        return UserSearchResult([], False)
    conditions = []
    params: list[Any] = []
    for word in words[:16]:
        conditions.append(
            "(LOWER(d.user_id) LIKE ? ESCAPE '\\'"
            " OR LOWER(COALESCE(d.display_name, '')) LIKE ? ESCAPE '\\')"
        )
        params += [_like_pattern(word), _like_pattern(word)]
    first = words[0].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = txn.query(
        "SELECT d.user_id, d.display_name FROM view_user_directory d"
        f" WHERE {' AND '.join(conditions)} AND {_VISIBLE_TO}"
        " ORDER BY CASE WHEN LOWER(COALESCE(d.display_name, '')) LIKE ? ESCAPE '\\'"
        " OR LOWER(d.user_id) LIKE ? ESCAPE '\\' THEN 0 ELSE 1 END, d.user_id"
        " LIMIT ?",
        (*params, searcher, first, "@" + first, limit + 1),
    )
    found = [(str(r[0]), r[1]) for r in rows]
    limited = len(found) > limit
    found = found[:limit]
    avatars = _avatars_txn(txn, [user for user, _ in found])
    results = []
    for user_id, display_name in found:
        entry: dict[str, Any] = {"user_id": user_id}
        if display_name is not None:
            entry["display_name"] = display_name
        if user_id in avatars:
            entry["avatar_url"] = avatars[user_id]
        results.append(entry)
    return UserSearchResult(results, limited)


def _avatars_txn(txn: Transaction, users: Sequence[str]) -> dict[str, str]:
    """Each user's ``avatar_url`` from the same membership the views take the display name
    from: their joined membership with the highest stream ID (then the smallest room)."""
    if not users:
        return {}
    marks = ", ".join("?" * len(users))
    latest: dict[str, str] = {}
    for user_id, event_id in txn.query(
        "SELECT state_key, event_id FROM view_room_state WHERE type = ?"
        f" AND state_key IN ({marks}) AND membership = 'join'"
        " ORDER BY state_key, stream_id DESC, room_id",
        (EventTypes.MEMBER, *users),
    ):
        latest.setdefault(str(user_id), str(event_id))
    contents = _contents_txn(txn, list(latest.values()))
    out = {}
    for user_id, event_id in latest.items():
        url = contents.get(event_id, {}).get("avatar_url")
        if isinstance(url, str):
            out[user_id] = url
    return out


# -- the public room list -----------------------------------------------------------------

_PUBLISHED = (
    "FROM view_room_stats v JOIN rooms p ON p.room_id = v.room_id"
    " LEFT JOIN view_room_state jr ON jr.room_id = v.room_id"
    " AND jr.type = 'm.room.join_rules' AND jr.state_key = ''"
    " WHERE p.is_public"
)


def _page_txn(
    txn: Transaction, after: RoomListToken | None, limit: int
) -> list[tuple[str, int, str | None]]:
    """Up to ``limit`` published rooms in list order from ``after`` (in its direction:
    ``b`` returns the rooms before it, in list order)."""
    params: list[Any] = []
    where = ""
    backwards = after is not None and after.direction == "b"
    if after is not None:
        op = "<" if backwards else ">"
        # list order is (joined DESC, room_id ASC): "after" means fewer members, or the
        # same number and a larger room ID.
        where = (
            f" AND (v.joined_members {'>' if backwards else '<'} ?"
            f" OR (v.joined_members = ? AND v.room_id {op} ?))"
        )
        params += [after.joined, after.joined, after.room_id]
    order = "v.joined_members, v.room_id DESC" if backwards else "v.joined_members DESC, v.room_id"
    rows = txn.query(
        f"SELECT v.room_id, v.joined_members, jr.join_rule {_PUBLISHED}{where}"
        f" ORDER BY {order} LIMIT ?",
        (*params, limit),
    )
    found = [(str(r[0]), int(r[1]), r[2]) for r in rows]
    return found[::-1] if backwards else found


def _describe_txn(
    txn: Transaction, rows: Sequence[tuple[str, int, str | None]]
) -> list[PublicRoom]:
    if not rows:
        return []
    room_ids = [r[0] for r in rows]
    marks = ", ".join("?" * len(room_ids))
    types = list(ROOM_FIELDS)
    entries = txn.query(
        "SELECT room_id, type, event_id FROM view_room_state"
        f" WHERE room_id IN ({marks}) AND state_key = '' AND type IN"
        f" ({', '.join('?' * len(types))})",
        (*room_ids, *types),
    )
    by_room: dict[str, dict[str, str]] = {}
    for room_id, etype, event_id in entries:
        by_room.setdefault(str(room_id), {})[str(etype)] = str(event_id)
    contents = _contents_txn(txn, [e for d in by_room.values() for e in d.values()])
    rooms = []
    for room_id, joined, join_rule in rows:
        state: dict[str, str] = {}
        for etype, event_id in by_room.get(room_id, {}).items():
            key = ROOM_FIELDS[etype]
            value = contents.get(event_id, {}).get(key)
            if isinstance(value, str) and value:
                state[key] = value
        rooms.append(PublicRoom(room_id, joined, join_rule, state))
    return rooms


def _matches(room: PublicRoom, words: Sequence[str]) -> bool:
    text = " ".join(room.state.get(k, "") for k in ("name", "topic", "alias")).lower()
    return all(w in text for w in words)


def public_rooms_txn(
    txn: Transaction, limit: int, since: RoomListToken | None, search_term: str | None
) -> PublicRoomsPage:
    """A page of the public room list. ``next_batch`` reads on past the page's last room,
    ``prev_batch`` (present when ``since`` is) reads back before its first; with a
    ``search_term`` (every word, case-insensitively, in the name, topic or canonical
    alias) rooms are examined :data:`SCAN_CHUNK` at a time until the page is full."""
    total = int(txn.query_one(f"SELECT COUNT(*) {_PUBLISHED}")[0])
    words = (search_term or "").lower().split()
    picked: list[PublicRoom] = []
    more = False
    cursor = since
    backwards = since is not None and since.direction == "b"
    while True:
        rows = _page_txn(txn, cursor, limit + 1 if not words else SCAN_CHUNK)
        rooms = _describe_txn(txn, rows)
        if backwards:
            rooms.reverse()  # nearest to the token first
        for room in rooms:
            if words and not _matches(room, words):
                continue
            if len(picked) == limit:
                more = True
                break
            picked.append(room)
        exhausted = len(rows) < (limit + 1 if not words else SCAN_CHUNK)
        if more or exhausted or not rows:
            break
        edge = rows[0] if backwards else rows[-1]
        cursor = RoomListToken("b" if backwards else "f", edge[1], edge[0])
    if backwards:
        picked.reverse()
    next_batch = prev_batch = None
    if picked:
        last, first = picked[-1], picked[0]
        if more if not backwards else since is not None:
            next_batch = RoomListToken("f", last.num_joined_members, last.room_id).to_string()
        if more if backwards else since is not None:
            prev_batch = RoomListToken("b", first.num_joined_members, first.room_id).to_string()
    return PublicRoomsPage(picked, next_batch, prev_batch, total)


class DirectoryReader:
    """The two reads on a database (async: each is one interaction)."""

    def __init__(self, database: Database) -> None:
        self.db = database

    async def search_users(self, searcher: str, search_term: str, limit: int) -> UserSearchResult:
        limit = max(0, min(limit, MAX_SEARCH_LIMIT))
        return await self.db.run_interaction(
            "search_users", search_users_txn, searcher, search_term, limit
        )

    async def public_rooms(
        self, limit: int | None, since: str | None, search_term: str | None
    ) -> PublicRoomsPage:
        token = RoomListToken.parse(since) if since else None
        size = MAX_ROOMS_LIMIT if limit is None else max(0, min(limit, MAX_ROOMS_LIMIT))
        return await self.db.run_interaction(
            "public_rooms", public_rooms_txn, size, token, search_term
        )
