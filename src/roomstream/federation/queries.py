"""The queries other servers make of this one (Server-Server API), without HTTP (the
handlers are :mod:`roomstream.federation.query_routes`).

Each answers what Synapse's federation handler answers, from this server's own data:

- profile (``/query/profile``): a local user's ``displayname`` / ``avatar_url`` (those
  set; one with ``field``); 404 ``M_NOT_FOUND`` for a user not known here;
- directory (``/query/directory``): a local alias's ``room_id`` and ``servers`` (the
  servers in the room, this one first); 404 ``M_NOT_FOUND`` for an unknown alias;
- ``/publicRooms``: the local room directory, the page the client API serves;
- ``/user/devices/{userId}``: a local user's devices that have keys (with signatures),
  the ``device_lists`` position as ``stream_id``, and the master and self-signing keys
  when set (display names are not shared: Synapse's
  ``allow_device_name_lookup_over_federation`` default);
- ``/user/keys/query`` and ``/user/keys/claim``: the client API's answers for local
  users (no user-signing keys: they are only ever their owner's; no ``failures``);
- ``/hierarchy/{roomId}``: the room's entry (with ``children_state``) and its direct
  children this server is in, each if the origin may learn of it, Synapse's rule for a
  server: a public, knock or knock_restricted join rule, world-readable history, a user
  of the origin joined or invited, or a restricted join rule naming a room the origin is
  in; else the room is ``inaccessible_children`` (the root: 404 ``M_NOT_FOUND``);
- ``/media/download`` and ``/media/thumbnail``: local media, answered
  ``multipart/mixed`` (a JSON part, ``{}``, then the content), see
  :func:`multipart_head`.

A user, alias or key query naming another server is 400 ``M_UNKNOWN`` ("not hosted on
this homeserver"), as in Synapse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from roomstream.accounts.service import parse_user_id
from roomstream.client import ClientProcess
from roomstream.client.directory import DirectoryReader, PublicRoomsPage
from roomstream.client.profiles import ProfileService
from roomstream.client.spaces import (
    RoomSummary,
    allowed_room_ids,
    hierarchy_entry,
    read_room_txn,
    space_children,
)
from roomstream.client.store import ClientStore
from roomstream.e2e import E2eKeys
from roomstream.errors import (
    BadRequestError,
    ForbiddenError,
    InvalidParamError,
    NotFoundError,
)
from roomstream.events.types import EventTypes, JoinRules
from roomstream.federation.membership import hosts_in_room_txn, is_host_in_room_txn, server_of
from roomstream.grammar import is_room_alias
from roomstream.media import Download, MediaRepository
from roomstream.media.safety import download_headers
from roomstream.rooms.engine import RoomEngine
from roomstream.storage import Database, Transaction

__all__ = [
    "MAX_ROOMS_PER_SPACE",
    "PROFILE_FIELDS",
    "FederationQueries",
    "MediaAnswer",
    "multipart_head",
    "multipart_tail",
]

#: Children of a space looked at per federation hierarchy request (Synapse's).
MAX_ROOMS_PER_SPACE = 50
PROFILE_FIELDS = ("displayname", "avatar_url")
#: Users, or devices of a user, one key query may name.
MAX_QUERY_USERS = 1000


def _not_hosted(what: str) -> BadRequestError:
    return BadRequestError(f"{what} is not hosted on this homeserver")


@dataclass(frozen=True)
class MediaAnswer:
    """A federation media answer: the multipart framing around the content."""

    download: Download
    boundary: str

    @property
    def content_type(self) -> str:
        return f"multipart/mixed; boundary={self.boundary}"

    def head(self) -> bytes:
        return multipart_head(self.boundary, self.download)

    def tail(self) -> bytes:
        return multipart_tail(self.boundary)

    @property
    def length(self) -> int:
        return len(self.head()) + self.download.blob.size + len(self.tail())


def multipart_head(boundary: str, download: Download) -> bytes:
    """Everything before the content: the JSON part (``{}``: no linked media) and the
    content part's headers (its type and disposition as a client download's)."""
    headers = download_headers(download.media_type, download.name)
    return (
        f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{{}}\r\n"
        f"--{boundary}\r\nContent-Type: {headers['Content-Type']}\r\n"
        f"Content-Disposition: {headers['Content-Disposition']}\r\n\r\n"
    ).encode()


def multipart_tail(boundary: str) -> bytes:
    return f"\r\n--{boundary}--\r\n".encode()


def _origin_may_see(txn: Transaction, room: RoomSummary, origin: str) -> bool:
    """Synapse's ``_is_local_room_accessible`` for a server (see the module docstring)."""
    if not room.known:
        return False
    join_rule = room.content(EventTypes.JOIN_RULES).get("join_rule")
    if join_rule in (JoinRules.PUBLIC, JoinRules.KNOCK, JoinRules.KNOCK_RESTRICTED):
        return True
    if room.content(EventTypes.HISTORY_VISIBILITY).get("history_visibility") == "world_readable":
        return True
    if is_host_in_room_txn(txn, room.room_id, origin) or _is_host_invited_txn(
        txn, room.room_id, origin
    ):
        return True
    return any(is_host_in_room_txn(txn, other, origin) for other in allowed_room_ids(room))


def _is_host_invited_txn(txn: Transaction, room_id: str, server_name: str) -> bool:
    rows = txn.query(
        "SELECT state_key FROM current_state_events WHERE room_id = ?"
        " AND type = 'm.room.member' AND membership = 'invite'",
        (room_id,),
    )
    return any(server_of(str(r[0])) == server_name for r in rows)


def _federation_entry(room: RoomSummary, children: Sequence[Any] | None) -> dict[str, Any]:
    """The room's entry as Synapse sends it to servers: with ``allowed_room_ids`` for a
    restricted join rule; ``children_state`` only for the root (``children`` given)."""
    entry = hierarchy_entry(room, children or [])
    if children is None:
        del entry["children_state"]
    allowed = allowed_room_ids(room)
    if allowed:
        entry["allowed_room_ids"] = allowed
    return entry


class FederationQueries:
    """The queries (see the module docstring), over the client layer's services.

    ``public_rooms_over_federation``: whether ``/publicRooms`` answers (Synapse's
    ``allow_public_rooms_over_federation``; off there by default, on here as the
    issue asks); off: 403 ``M_FORBIDDEN``."""

    def __init__(
        self,
        server_name: str,
        db: Database,
        *,
        profiles: ProfileService,
        aliases: ClientStore,
        directory: DirectoryReader,
        keys: E2eKeys,
        media: MediaRepository,
        public_rooms_over_federation: bool = True,
    ) -> None:
        self.server_name = server_name
        self.db = db
        self.profiles = profiles
        self.aliases = aliases
        self.room_directory = directory
        self.keys = keys
        self.media = media
        self.public_rooms_over_federation = public_rooms_over_federation

    @classmethod
    def for_client_process(cls, process: ClientProcess, engine: RoomEngine) -> FederationQueries:
        return cls(
            process.config.server_name,
            engine.db,
            profiles=process.profiles,
            aliases=process.store,
            directory=DirectoryReader(engine.db),
            keys=process.keys,
            media=process.media,
        )

    def _local_user(self, user_id: str) -> str:
        _, server = parse_user_id(user_id)
        if server != self.server_name:
            raise _not_hosted("User")
        return user_id

    # -- profile and directory -----------------------------------------------------------

    async def profile(self, user_id: str, field: str | None) -> dict[str, Any]:
        profile = await self.profiles.get_profile(self._local_user(user_id))
        answer = profile.to_json()
        if field is not None:
            answer = {k: v for k, v in answer.items() if k == field}
        return answer

    async def directory(self, room_alias: str) -> dict[str, Any]:
        if not is_room_alias(room_alias):
            raise InvalidParamError(f"not a room alias: {room_alias[:80]!r}")
        if room_alias.partition(":")[2] != self.server_name:
            raise _not_hosted("Room Alias")
        found = await self.aliases.get_alias(room_alias)
        if found is None:
            raise NotFoundError(f"Room alias {room_alias} not found")
        room_id = found[0]
        hosts = await self.db.run_interaction("alias_servers", hosts_in_room_txn, room_id)
        others = [h for h in hosts if h != self.server_name]
        return {"room_id": room_id, "servers": [self.server_name, *others]}

    async def public_rooms(
        self, limit: int | None, since: str | None, search_term: str | None
    ) -> PublicRoomsPage:
        if not self.public_rooms_over_federation:
            raise ForbiddenError("Public room lists are not shared over federation")
        return await self.room_directory.public_rooms(limit, since, search_term)

    # -- devices and keys ----------------------------------------------------------------

    async def user_devices(self, user_id: str) -> dict[str, Any]:
        user_id = self._local_user(user_id)
        position = self.keys.position()
        # The keys with every signature on them, formatted as /keys/query does.
        answer = await self.keys.query(self.server_name, {user_id: []})
        by_device = orjson.loads(orjson.dumps(answer["device_keys"][user_id]))
        result: dict[str, Any] = {
            "user_id": user_id,
            "stream_id": position,
            "devices": [
                {"device_id": device_id, "keys": keys}
                for device_id, keys in sorted(by_device.items())
            ],
        }
        for kind in ("master", "self_signing"):
            key = answer[f"{kind}_keys"].get(user_id)
            if key is not None:
                result[f"{kind}_key"] = orjson.loads(orjson.dumps(key))
        return result

    async def query_keys(self, device_keys: Mapping[str, list[str]]) -> dict[str, Any]:
        if len(device_keys) > MAX_QUERY_USERS:
            raise InvalidParamError(f"at most {MAX_QUERY_USERS} users per query")
        for user_id in device_keys:
            self._local_user(user_id)
        # The requester is no user here: nobody's user-signing key is included.
        answer = await self.keys.query(self.server_name, device_keys)
        answer.pop("failures", None)
        return answer

    async def claim_keys(self, one_time_keys: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        if sum(len(d) for d in one_time_keys.values()) > MAX_QUERY_USERS:
            raise InvalidParamError(f"at most {MAX_QUERY_USERS} devices per claim")
        for user_id in one_time_keys:
            self._local_user(user_id)
        answer = await self.keys.claim(one_time_keys)
        return {"one_time_keys": answer["one_time_keys"]}

    # -- spaces ----------------------------------------------------------------------------

    async def hierarchy(self, origin: str, room_id: str, suggested_only: bool) -> dict[str, Any]:
        def txn(t: Transaction) -> dict[str, Any] | None:
            root = read_room_txn(t, "", room_id)
            if not _origin_may_see(t, root, origin):
                return None
            children = space_children(root, suggested_only)
            rooms: list[dict[str, Any]] = []
            inaccessible: list[str] = []
            for child in children[:MAX_ROOMS_PER_SPACE]:
                child_id = child.state_key or ""
                if not is_host_in_room_txn(t, child_id, self.server_name):
                    continue
                room = read_room_txn(t, "", child_id)
                if _origin_may_see(t, room, origin):
                    rooms.append(_federation_entry(room, None))
                else:
                    inaccessible.append(child_id)
            return {
                "room": _federation_entry(root, children),
                "children": rooms,
                "inaccessible_children": inaccessible,
            }

        found = await self.db.run_interaction("federation_hierarchy", txn)
        if found is None:
            raise NotFoundError(f"Unknown room: {room_id}")
        return found

    # -- media -----------------------------------------------------------------------------

    async def media_download(self, media_id: str, timeout_ms: int, boundary: str) -> MediaAnswer:
        found = await self.media.download(
            self.server_name, media_id, authenticated=True, timeout_ms=timeout_ms
        )
        return MediaAnswer(found, boundary)

    async def media_thumbnail(
        self,
        media_id: str,
        width: int,
        height: int,
        method: str,
        animated: bool,
        timeout_ms: int,
        boundary: str,
    ) -> MediaAnswer:
        found = await self.media.thumbnail(
            self.server_name,
            media_id,
            width,
            height,
            method,
            animated=animated,
            authenticated=True,
            timeout_ms=timeout_ms,
        )
        return MediaAnswer(found, boundary)
