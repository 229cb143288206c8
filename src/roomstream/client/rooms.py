"""The Client-Server API's room actions, with their Matrix rules: room creation presets,
membership changes, sending with transaction IDs, state, redactions, aliases.

Authorization itself is the auth rules' job (:mod:`roomstream.events.auth`, applied when
the event is created on the owning writer); this module adds what the Client-Server API
layers on top: presets, idempotent transactions, alias resolution, duplicate state.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from roomstream.accounts import Requester, parse_user_id
from roomstream.client.aliases import AliasRules, canonical_aliases
from roomstream.client.remote_rooms import RemoteRooms, servers_to_try
from roomstream.client.request import optional
from roomstream.client.store import ClientStore
from roomstream.client.writes import RoomWriter
from roomstream.errors import (
    BadAliasError,
    BadJsonError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    InvalidParamError,
    MatrixError,
    NotFoundError,
    RoomInUseError,
)
from roomstream.events.room_versions import DEFAULT_ROOM_VERSION, room_version
from roomstream.events.types import EventTypes
from roomstream.grammar import is_room_alias, is_room_id_to_look_up
from roomstream.lru import LruCache
from roomstream.reading import RoomReader, client_event
from roomstream.rooms.creation import RoomPreset
from roomstream.rooms.persist import TransactionKey
from roomstream.rooms.store import EventStore
from roomstream.state.groups import StateMap

__all__ = ["CreateRoomRequest", "RoomService", "StateEvent"]

logger = logging.getLogger(__name__)

PRESETS = ("private_chat", "public_chat", "trusted_private_chat")
MEMBERSHIP_ACTIONS = ("invite", "kick", "ban", "unban")
#: Transaction IDs kept in memory per (room, user, device) (the sets: the
#: ``device_transactions`` cache).
DEVICE_TRANSACTIONS_KEPT = 10_000
#: Cached for a device whose transactions in a room are more than that (never mutated:
#: told apart by identity).
_TOO_MANY_TO_KEEP: dict[str, str] = {}


@dataclass(frozen=True)
class StateEvent:
    type: str
    state_key: str
    content: dict[str, Any]


@dataclass
class CreateRoomRequest:
    """A parsed ``POST /createRoom`` body."""

    preset: str | None = None
    visibility: str = "private"
    name: str | None = None
    topic: str | None = None
    invite: list[str] = field(default_factory=list)
    initial_state: list[StateEvent] = field(default_factory=list)
    room_version: str | None = None
    power_level_content_override: dict[str, Any] | None = None
    room_alias_name: str | None = None
    is_direct: bool = False
    #: Extra keys of the ``m.room.create`` content (``m.federate``, ``type``, ...).
    creation_content: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, body: dict[str, Any]) -> CreateRoomRequest:
        """A ``createRoom`` body, checked field by field (400 for what is malformed)."""
        visibility = optional(body, "visibility", str, "private")
        if visibility not in ("public", "private"):
            raise InvalidParamError("visibility must be public or private")
        invite = optional(body, "invite", list, [])
        if not all(isinstance(i, str) for i in invite):
            raise BadJsonError("invite must be a list of user IDs")
        return cls(
            preset=optional(body, "preset", str),
            visibility=visibility,
            name=optional(body, "name", str),
            topic=optional(body, "topic", str),
            invite=list(invite),
            initial_state=parse_state_events(optional(body, "initial_state", list, [])),
            room_version=optional(body, "room_version", str),
            power_level_content_override=optional(body, "power_level_content_override", dict),
            room_alias_name=optional(body, "room_alias_name", str),
            is_direct=optional(body, "is_direct", bool, False),
            creation_content=parse_creation_content(optional(body, "creation_content", dict, {})),
        )

    def to_json(self) -> dict[str, Any]:
        """The request as a ``createRoom`` body (``parse`` gives it back)."""
        return {
            "preset": self.preset,
            "visibility": self.visibility,
            "name": self.name,
            "topic": self.topic,
            "invite": list(self.invite),
            "initial_state": [
                {"type": s.type, "state_key": s.state_key, "content": s.content}
                for s in self.initial_state
            ],
            "room_version": self.room_version,
            "power_level_content_override": self.power_level_content_override,
            "room_alias_name": self.room_alias_name,
            "is_direct": self.is_direct,
            "creation_content": dict(self.creation_content),
        }


class RoomService:
    def __init__(
        self,
        server_name: str,
        writer: RoomWriter,
        events: EventStore,
        store: ClientStore,
        reader: RoomReader,
        *,
        remote: RemoteRooms | None = None,
    ) -> None:
        self.server_name = server_name
        #: Other servers' rooms and aliases (None: this server has no federation).
        self.remote = remote
        self.writer = writer
        self.events = events
        self.store = store
        self.reader = reader
        self.alias_rules = AliasRules(server_name, store, events)
        #: Room ID -> (the current state, its ``/state`` answer), least recently used first.
        self._state_json: LruCache[str, tuple[StateMap, bytes]] = LruCache("room_state_json")
        #: Held for the whole of an idempotent send, per (room, user, device).
        self._device_locks: weakref.WeakValueDictionary[tuple[str, str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        #: (room, user, device) -> {transaction ID: event ID}: every transaction of that
        #: device in a room this process writes (see ``send_once``).
        self._device_transactions: LruCache[tuple[str, str, str], dict[str, str]] = LruCache(
            "device_transactions"
        )

    # -- reading current state (for the rules here; clients read via roomstream.reading)

    async def current_state_content(
        self, room_id: str, event_type: str, state_key: str
    ) -> tuple[str, dict[str, Any], str] | None:
        """(event ID, content, sender) of one current state entry."""
        event_id = await self.events.get_current_state_entry(room_id, (event_type, state_key))
        if event_id is None:
            return None
        event = await self.events.get_event(event_id)
        if event is None:
            return None
        return event_id, dict(event.data.get("content") or {}), str(event.data.get("sender"))

    async def current_state_json(self, requester: Requester, room_id: str) -> bytes:
        """``GET /rooms/{id}/state``: the state the requester may read (see
        :meth:`_readable_state`) as client events, serialised.

        One database read for a member (the current state's event IDs, with the
        requester's membership). The serialised current state is cached per room together
        with the state map it was made from, and reused while the state read now is equal
        to it: the answer depends on nothing else (no viewer-specific fields), so a cached
        answer is never stale, on any process, without any invalidation. State at a
        leave is not cached (it is read rarely, and would evict the current state's).
        """
        state, membership = await self.events.get_current_state_and_membership(
            room_id, requester.user_id
        )
        readable = await self._readable_state(requester, room_id, state, membership)
        if readable is not state:
            events = await self.events.get_events(readable.values())
            return orjson.dumps([client_event(e) for e in events.values()])
        cached = self._state_json.get(room_id)
        if cached is not None and cached[0] == state:
            return cached[1]
        events = await self.events.get_events(state.values())
        body = orjson.dumps([client_event(e) for e in events.values()])
        self._state_json.set(room_id, (state, body))
        return body

    async def _readable_state(
        self, requester: Requester, room_id: str, current: StateMap, membership: str | None
    ) -> StateMap:
        """The state of the room the requester may read (spec, ``GET /rooms/{id}/state``;
        Synapse's rule): a member the current state (``current`` itself); one who left or
        was banned the state after their membership event (the point they left, as it
        stood then); anyone else the current state of a ``world_readable`` room. 403
        otherwise (also for an unknown room)."""
        if membership == "join":
            return current
        if membership in ("leave", "ban"):
            try:
                return await self.events.get_state_at(
                    current[(EventTypes.MEMBER, requester.user_id)]
                )
            except LookupError:  # an outlier membership (no state stored): nothing to serve
                pass
        elif await self._world_readable(current):
            return current
        raise ForbiddenError(f"user {requester.user_id} may not read the state of {room_id}")

    async def _world_readable(self, current: StateMap) -> bool:
        """Whether the room's current history visibility is ``world_readable``."""
        event_id = current.get((EventTypes.HISTORY_VISIBILITY, ""))
        event = None if event_id is None else await self.events.get_event(event_id)
        content = {} if event is None else event.data.get("content") or {}
        return content.get("history_visibility") == "world_readable"

    async def readable_state_entry(
        self, requester: Requester, room_id: str, event_type: str, state_key: str
    ) -> dict[str, Any] | None:
        """``GET /rooms/{id}/state/{type}/{key}``: the content of one entry of the state
        :meth:`_readable_state` allows (None: no such entry there). A member costs two
        index reads, as before: the whole state is read only for who is not joined."""
        membership = await self.membership(room_id, requester.user_id)
        if membership != "join":
            state, membership = await self.events.get_current_state_and_membership(
                room_id, requester.user_id
            )
            readable = await self._readable_state(requester, room_id, state, membership)
            event_id = readable.get((event_type, state_key))
            event = None if event_id is None else await self.events.get_event(event_id)
            return None if event is None else dict(event.data.get("content") or {})
        entry = await self.current_state_content(room_id, event_type, state_key)
        return None if entry is None else entry[1]

    async def membership(self, room_id: str, user_id: str) -> str | None:
        return await self.events.get_membership(room_id, user_id)

    async def require_joined(self, requester: Requester, room_id: str) -> None:
        if await self.membership(room_id, requester.user_id) != "join":
            raise ForbiddenError(f"user {requester.user_id} is not in room {room_id}")

    # -- creating rooms ----------------------------------------------------------------

    async def create_room(self, requester: Requester, request: CreateRoomRequest) -> str:
        """Create the room as ``request`` says; on a process that does not create rooms,
        the whole request is forwarded to one that does (:class:`RoomWriter`)."""
        if not self.writer.creates_rooms_here:
            return await self.writer.forward_create_room(requester.user_id, request.to_json())
        version = room_version(request.room_version or DEFAULT_ROOM_VERSION.identifier)
        preset = request.preset or (
            "public_chat" if request.visibility == "public" else "private_chat"
        )
        if preset not in PRESETS:
            raise InvalidParamError(f"unknown preset {preset!r}")
        for invitee in request.invite:
            parse_user_id(invitee)
        alias = None
        if request.room_alias_name is not None:
            alias = self._local_alias(f"#{request.room_alias_name}:{self.server_name}")
            if await self.store.get_alias(alias) is not None:
                raise RoomInUseError(f"room alias {alias} already taken")
        # Before the room exists: the only alias that can point to it is the one made
        # with it (room_alias_name).
        for state in request.initial_state:
            if state.type == EventTypes.CANONICAL_ALIAS and state.state_key == "":
                for named in canonical_aliases(state.content):
                    if named != alias:
                        raise BadAliasError(f"room alias {named} does not point to the room")
        sender = requester.user_id
        public = preset == "public_chat"
        room_id = await self.writer.create_room(
            sender,
            version,
            RoomPreset.PUBLIC_CHAT if public else RoomPreset.PRIVATE_CHAT,
            request.creation_content,
        )
        send = self.writer.send
        levels_override: dict[str, Any] = dict(request.power_level_content_override or {})
        if preset == "trusted_private_chat" and request.invite:
            users = dict(levels_override.get("users") or {})
            for invitee in request.invite:
                users.setdefault(invitee, 100)
            levels_override["users"] = users
        if levels_override:
            current = await self.current_state_content(room_id, EventTypes.POWER_LEVELS, "")
            levels = dict(current[1]) if current else {}
            if "users" in levels_override:
                levels_override["users"] = {
                    **(levels.get("users") or {}),
                    **levels_override["users"],
                }
            levels.update(levels_override)
            await send(room_id, sender, EventTypes.POWER_LEVELS, levels, state_key="")
        if alias is not None:
            if not await self.store.create_alias(alias, room_id, sender):
                raise RoomInUseError(f"room alias {alias} already taken")
            await send(room_id, sender, EventTypes.CANONICAL_ALIAS, {"alias": alias}, state_key="")
        if not public:
            await send(
                room_id, sender, EventTypes.GUEST_ACCESS, {"guest_access": "can_join"}, state_key=""
            )
        for state in request.initial_state:
            await send(room_id, sender, state.type, state.content, state_key=state.state_key)
        if request.name is not None:
            await send(room_id, sender, EventTypes.NAME, {"name": request.name}, state_key="")
        if request.topic is not None:
            await send(room_id, sender, EventTypes.TOPIC, {"topic": request.topic}, state_key="")
        for invitee in request.invite:
            content: dict[str, Any] = {"membership": "invite"}
            if request.is_direct:
                content["is_direct"] = True
            await send(room_id, sender, EventTypes.MEMBER, content, state_key=invitee)
        if request.visibility == "public":
            await self.store.set_room_public(room_id, True)
        return room_id

    # -- membership --------------------------------------------------------------------

    async def resolve_room(self, room_id_or_alias: str) -> str:
        return (await self._resolve_with_servers(room_id_or_alias))[0]

    async def _resolve_with_servers(self, room_id_or_alias: str) -> tuple[str, list[str]]:
        """The room ID, and the servers an alias's directory named (none for a local
        alias or a room ID). Another server's alias is asked of that server when this
        one has federation (``M_INVALID_PARAM`` otherwise, as before)."""
        if room_id_or_alias.startswith("#"):
            if (
                self.remote is not None
                and is_room_alias(room_id_or_alias)
                and room_id_or_alias.partition(":")[2] != self.server_name
            ):
                return await self.remote.resolve_alias(room_id_or_alias)
            found = await self.store.get_alias(self._local_alias(room_id_or_alias))
            if found is None:
                raise NotFoundError(f"room alias {room_id_or_alias} unknown")
            return found[0], []
        if not is_room_id_to_look_up(room_id_or_alias):
            raise InvalidParamError("expected a room ID or alias")
        return room_id_or_alias, []

    async def _remote_servers_for(
        self, room_id: str, user_id: str, given: Sequence[str]
    ) -> list[str] | None:
        """Where to join or leave ``room_id`` over federation, or None to do it here.

        Here when this server is in the room (a local member is joined) or has no
        federation; over federation when it does not know the room at all, or knows it
        only through an invite or a knock (an outlier), or all its users left a room
        others are still in. The servers: those given, the inviter's, the room ID's."""
        if self.remote is None:
            return None
        known = await self.events.get_room_version(room_id) is not None
        if known and await self.events.server_in_room(room_id, self.server_name):
            return None
        inviter: list[str] = []
        member_id = await self.events.get_current_state_entry(room_id, (EventTypes.MEMBER, user_id))
        member = None if member_id is None else await self.events.get_event(member_id)
        if member is not None and member.sender != user_id:
            inviter = [member.sender.partition(":")[2]]
        servers = servers_to_try(self.server_name, room_id, given, inviter)
        if not servers and known:
            return None  # a room of this server's own that everyone left: join here
        return servers

    async def join(
        self,
        requester: Requester,
        room_id_or_alias: str,
        content: Mapping[str, Any] | None = None,
        via: Sequence[str] | None = None,
    ) -> str:
        """Join the room; ``content``: the request body, whose keys go into the join
        event's content (``reason``, ``displayname``, custom keys: as Synapse), except
        ``membership`` (always ``join``) and ``join_authorised_via_users_server`` (the
        server's to set: a client naming an authorising user would bypass a restricted
        join rule, the event being signed by this server).

        A guest may join only a room whose ``m.room.guest_access`` is ``can_join`` (403
        ``M_FORBIDDEN`` otherwise, as Synapse: guests are a local notion, so this is the
        server's check, not an auth rule), and its join event says ``"kind": "guest"``."""
        room_id, alias_servers = await self._resolve_with_servers(room_id_or_alias)
        event_content = {k: v for k, v in (content or {}).items() if k not in _SERVER_JOIN_KEYS}
        event_content["membership"] = "join"
        remote = await self._remote_servers_for(
            room_id, requester.user_id, [*(via or ()), *alias_servers]
        )
        if remote is not None:
            if requester.is_guest:
                raise ForbiddenError("guests cannot join rooms of other servers")
            if not remote:
                raise NotFoundError(f"unknown room {room_id}, and no server in it is known to ask")
            assert self.remote is not None
            await self.remote.join(requester.user_id, room_id, remote, event_content)
            await self.store.unforget(requester.user_id, room_id)
            return room_id
        if await self.events.get_room_version(room_id) is None:
            raise NotFoundError(f"unknown room {room_id}")
        if await self.membership(room_id, requester.user_id) == "join":
            return room_id
        if requester.is_guest:
            guest_access = await self.current_state_content(room_id, EventTypes.GUEST_ACCESS, "")
            if guest_access is None or guest_access[1].get("guest_access") != "can_join":
                raise ForbiddenError("guest access not allowed")
            event_content["kind"] = "guest"
        await self.writer.send(
            room_id,
            requester.user_id,
            EventTypes.MEMBER,
            event_content,
            state_key=requester.user_id,
        )
        await self.store.unforget(requester.user_id, room_id)
        return room_id

    async def knock(
        self,
        requester: Requester,
        room_id_or_alias: str,
        reason: str | None,
        via: Sequence[str] | None = None,
    ) -> str:
        """Ask to join a room whose join rule is ``knock`` (or ``knock_restricted``); the
        auth rules refuse (403) other join rules and users already invited, joined or
        banned. A room this server is not in is knocked on through another server
        (``make_knock`` / ``send_knock``: ``via``, the alias's servers, the room ID's)."""
        room_id, alias_servers = await self._resolve_with_servers(room_id_or_alias)
        content: dict[str, Any] = {"membership": "knock"}
        if reason is not None:
            content["reason"] = reason
        remote = await self._remote_servers_for(
            room_id, requester.user_id, [*(via or ()), *alias_servers]
        )
        if remote:
            assert self.remote is not None
            await self.remote.knock(requester.user_id, room_id, remote, content)
            return room_id
        if await self.events.get_room_version(room_id) is None:
            raise NotFoundError(f"unknown room {room_id}")
        await self.writer.send(
            room_id, requester.user_id, EventTypes.MEMBER, content, state_key=requester.user_id
        )
        return room_id

    async def leave(self, requester: Requester, room_id: str) -> None:
        if await self.membership(room_id, requester.user_id) in (None, "leave"):
            raise ForbiddenError(f"user {requester.user_id} is not in room {room_id}")
        remote = await self._remote_servers_for(room_id, requester.user_id, [])
        if remote:
            # An invite or knock from a room this server is not in: rejected through
            # a server that is.
            assert self.remote is not None
            await self.remote.leave(requester.user_id, room_id, remote, {"membership": "leave"})
            return
        await self.writer.send(
            room_id,
            requester.user_id,
            EventTypes.MEMBER,
            {"membership": "leave"},
            state_key=requester.user_id,
        )

    async def change_membership(
        self, requester: Requester, room_id: str, action: str, target: str, reason: str | None
    ) -> None:
        """``invite``, ``kick``, ``ban`` or ``unban`` ``target``."""
        parse_user_id(target)
        await self.require_joined(requester, room_id)
        current = await self.membership(room_id, target)
        if action == "invite" and current == "join":
            raise ForbiddenError(f"{target} is already in the room")
        if action == "kick" and current not in ("join", "invite", "knock"):
            raise ForbiddenError(f"{target} is not in the room")
        if action == "unban" and current != "ban":
            raise ForbiddenError(f"{target} is not banned")
        membership = {"invite": "invite", "kick": "leave", "ban": "ban", "unban": "leave"}[action]
        content: dict[str, Any] = {"membership": membership}
        if reason is not None:
            content["reason"] = reason
        await self.writer.send(
            room_id, requester.user_id, EventTypes.MEMBER, content, state_key=target
        )

    async def forget(self, requester: Requester, room_id: str) -> None:
        if await self.membership(room_id, requester.user_id) in ("join", "invite", "knock"):
            raise BadRequestError("leave the room before forgetting it")
        await self.store.forget(requester.user_id, room_id)

    # -- sending -----------------------------------------------------------------------

    async def send_event(
        self,
        requester: Requester,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str,
    ) -> str:
        """``PUT /send``: the same (device, transaction ID) always gives the same event."""
        return await self.send_once(requester, room_id, txn_id, event_type, content, None)

    async def redact(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        reason: str | None,
        txn_id: str,
    ) -> str:
        content: dict[str, Any] = {} if reason is None else {"reason": reason}
        return await self.send_once(
            requester, room_id, txn_id, EventTypes.REDACTION, content, event_id
        )

    async def send_once(
        self,
        requester: Requester,
        room_id: str,
        txn_id: str,
        event_type: str,
        content: Mapping[str, Any],
        redacts: str | None,
    ) -> str:
        """Send an event unless this device already sent one with ``txn_id``; its ID.

        Carried out whole by the writer of the room (forwarded there from any other
        process), under a lock per (room, user, device): the look-up and the send are one
        critical section there, and the transaction ID is stored in the event's own write
        transaction, so neither concurrent retries (through any process) nor a crash
        between the two can give two events. The look-up is in memory once the device's
        transaction IDs in the room are loaded (:meth:`_transactions_of`). The sender's
        membership is checked by the auth rules when the event is created (403
        M_FORBIDDEN), not by a read here.
        """
        key = (requester.user_id, requester.device_id, txn_id)
        if not self.writer.writes_room(room_id):
            return await self.writer.forward_send_once(room_id, key, event_type, content, redacts)
        # Shielded: a request cancelled mid-send leaves the send to finish under the lock,
        # so that a retry waits for it and finds its transaction ID.
        return await asyncio.shield(
            self._send_once_here(room_id, key, event_type, content, redacts)
        )

    async def _send_once_here(
        self,
        room_id: str,
        key: TransactionKey,
        event_type: str,
        content: Mapping[str, Any],
        redacts: str | None,
    ) -> str:
        user_id, device_id, txn_id = key
        device_key = (room_id, user_id, device_id)
        lock = self._device_locks.get(device_key)
        if lock is None:
            lock = self._device_locks[device_key] = asyncio.Lock()
        async with lock:
            known = await self._transactions_of(device_key)
            if known is None:
                existing = await self.reader.event_for_transaction(room_id, *key)
            else:
                existing = known.get(txn_id)
            if existing is not None:
                return existing
            try:
                event_id = await self.writer.send(
                    room_id, user_id, event_type, content, redacts=redacts, transaction=key
                )
            except BaseException:
                # Whether it was stored is unknown here: the database will say.
                self._device_transactions.pop(device_key, None)
                raise
            if known is not None:
                known[txn_id] = event_id
                if len(known) > DEVICE_TRANSACTIONS_KEPT:
                    self._device_transactions.set(device_key, _TOO_MANY_TO_KEEP)
            return event_id

    async def _transactions_of(self, device_key: tuple[str, str, str]) -> dict[str, str] | None:
        """Every transaction ID the device used in the room, from memory once loaded;
        None if it used too many to keep (then each send looks its one up).

        Complete because this process is the room's only writer (``writes_room``): each
        event of the room, with its transaction ID, is persisted here, by ``send_once``
        under the device's lock, which also covers the loading. An entry dropped (least
        recently used) is loaded again from the database, which has every committed send.
        """
        known = self._device_transactions.get(device_key)
        if known is not None:
            return None if known is _TOO_MANY_TO_KEEP else known
        known = await self.reader.transactions_of_device(*device_key, DEVICE_TRANSACTIONS_KEPT)
        # Too many is remembered too: loading (and dropping) up to the limit's worth of
        # rows on every send of a busy device would make each send cost O(limit).
        self._device_transactions.set(device_key, _TOO_MANY_TO_KEEP if known is None else known)
        return known

    async def set_state(
        self,
        requester: Requester,
        room_id: str,
        event_type: str,
        state_key: str,
        content: dict[str, Any],
    ) -> str:
        """Send a state event; an identical one from the same sender is not sent again."""
        current = await self.current_state_content(room_id, event_type, state_key)
        if current is not None and current[1] == content and current[2] == requester.user_id:
            return current[0]
        if event_type == EventTypes.CANONICAL_ALIAS and state_key == "":
            previous = None if current is None else current[1]
            await self.alias_rules.check_canonical_alias(room_id, content, previous)
        if event_type != EventTypes.MEMBER:
            await self.require_joined(requester, room_id)
        event_id = await self.writer.send(
            room_id, requester.user_id, event_type, content, state_key=state_key
        )
        if event_type == EventTypes.GUEST_ACCESS and content.get("guest_access") != "can_join":
            await self._guests_leave(room_id)
        return event_id

    async def _guests_leave(self, room_id: str) -> None:
        """Guest access withdrawn: this server's guests joined to or invited into the room
        leave it, each by their own leave event (as Synapse's ``kick_guest_users``: the
        guest chooses to leave rather than being kicked by whoever changed the rule)."""
        state = await self.events.get_current_state(room_id)
        members = [
            event_id
            for (event_type, state_key), event_id in state.items()
            if event_type == EventTypes.MEMBER and state_key.endswith(":" + self.server_name)
        ]
        for event in (await self.events.get_events(members)).values():
            content = event.data.get("content") or {}
            if content.get("kind") != "guest" or content.get("membership") not in (
                "join",
                "invite",
            ):
                continue
            guest = str(event.data.get("state_key"))
            try:
                await self.writer.send(
                    room_id,
                    guest,
                    EventTypes.MEMBER,
                    {"membership": "leave"},
                    state_key=guest,
                )
            except MatrixError:
                # The others still leave; the rule stands either way (a guest who cannot
                # be made to leave is logged, as Synapse logs it).
                logger.warning("guest %s could not leave %s", guest, room_id, exc_info=True)

    # -- aliases -----------------------------------------------------------------------

    def _local_alias(self, alias: str) -> str:
        if not is_room_alias(alias):
            raise InvalidParamError(f"not a room alias: {alias[:300]!r}")
        if alias.partition(":")[2] != self.server_name:
            raise InvalidParamError(f"room aliases must end in :{self.server_name}")
        return alias

    async def create_alias(self, requester: Requester, alias: str, room_id: str) -> None:
        alias = self._local_alias(alias)
        if await self.events.get_room_version(room_id) is None:
            raise NotFoundError(f"unknown room {room_id}")
        await self.require_joined(requester, room_id)
        if not await self.store.create_alias(alias, room_id, requester.user_id):
            raise ConflictError(f"room alias {alias} already exists")

    async def get_alias(self, alias: str) -> str:
        found = await self.store.get_alias(self._local_alias(alias))
        if found is None:
            raise NotFoundError(f"room alias {alias} not found")
        return found[0]

    async def delete_alias(
        self, requester: Requester, alias: str, *, is_admin: bool = False
    ) -> None:
        """Its creator, a server admin or who may change the room's canonical alias."""
        found = await self.store.get_alias(self._local_alias(alias))
        if found is None:
            raise NotFoundError(f"room alias {alias} not found")
        room_id, creator = found
        if not await self.alias_rules.may_delete(
            requester.user_id, room_id, creator, is_admin=is_admin
        ):
            raise ForbiddenError(
                "only the alias's creator, a server admin or who may change the room's"
                " canonical alias may delete it",
            )
        await self.store.delete_alias(alias)

    # -- room lists --------------------------------------------------------------------

    async def joined_rooms(self, requester: Requester) -> list[str]:
        return await self.events.get_rooms_for_user(requester.user_id)

    async def joined_members(self, requester: Requester, room_id: str) -> dict[str, dict[str, Any]]:
        await self.require_joined(requester, room_id)
        state = await self.events.get_current_state(room_id)
        member_ids = [eid for (t, _), eid in state.items() if t == EventTypes.MEMBER]
        events = await self.events.get_events(member_ids)
        joined: dict[str, dict[str, Any]] = {}
        for event in events.values():
            content = event.data.get("content") or {}
            if content.get("membership") == "join":
                joined[str(event.data["state_key"])] = {
                    "display_name": content.get("displayname"),
                    "avatar_url": content.get("avatar_url"),
                }
        return joined

    # -- the deprecated send without a transaction ID -----------------------------------

    async def send_untracked(
        self, requester: Requester, room_id: str, event_type: str, content: Mapping[str, Any]
    ) -> str:
        """``POST /send/{type}`` (r0, no transaction ID): a new event at every call, not
        idempotent (as Synapse); on the room's writer, forwarded there if need be."""
        return await self.writer.send(room_id, requester.user_id, event_type, content)


#: Keys of a join request's body that never reach the join event's content.
_SERVER_JOIN_KEYS = frozenset({"membership", "join_authorised_via_users_server"})
#: ``creation_content`` keys the server sets itself (spec: it overwrites them).
_SERVER_CREATE_KEYS = frozenset({"creator", "room_version"})


def parse_creation_content(raw: dict[str, Any]) -> dict[str, Any]:
    """``createRoom``'s ``creation_content``: extra keys of the create event's content,
    kept as given (spec), less the keys the server sets (``creator``, ``room_version``).
    The keys the rules read are checked here, so that a bad one is ``400 M_BAD_JSON``
    rather than a create event the auth rules reject: ``m.federate`` (a boolean),
    ``type`` (a string), ``predecessor`` (an object), ``additional_creators`` (user IDs).
    """
    content = {k: v for k, v in raw.items() if k not in _SERVER_CREATE_KEYS}
    optional(content, "m.federate", bool)
    optional(content, "type", str)
    optional(content, "predecessor", dict)
    creators = optional(content, "additional_creators", list, [])
    for creator in creators:
        if not isinstance(creator, str):
            raise BadJsonError("additional_creators must be user IDs")
        try:
            parse_user_id(creator)
        except MatrixError:
            raise BadJsonError("additional_creators must be user IDs") from None
    return content


def parse_state_events(raw: Sequence[Any]) -> list[StateEvent]:
    result = []
    for item in raw:
        if not isinstance(item, dict):
            raise BadJsonError("initial_state entries must be objects")
        event_type, state_key = item.get("type"), item.get("state_key", "")
        content = item.get("content")
        if not isinstance(event_type, str) or not isinstance(state_key, str):
            raise BadJsonError("initial_state needs type and state_key")
        if not isinstance(content, dict):
            raise BadJsonError("initial_state content must be an object")
        result.append(StateEvent(event_type, state_key, content))
    return result
