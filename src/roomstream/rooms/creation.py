"""Creating events as local users: choose prev and auth events, sign, authorize, persist.

Creation in a room holds the room's persistence lock from choosing the prev events until
the event is stored, so concurrent senders in one room form a chain instead of forking
the DAG. Different rooms are created and persisted in parallel.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from signedjson.types import SigningKey

from roomstream.errors import AuthError, InvalidParamError, NotFoundError
from roomstream.events.auth import (
    auth_types_for_event,
    check_auth_rules,
    holds_redact_level,
    redaction_applies,
)
from roomstream.events.format import (
    build_event_dict,
    finalise_local_event,
    reference_hash_of,
    room_id_for_create_event,
)
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import DEFAULT_ROOM_VERSION, RoomVersion, room_version
from roomstream.events.types import EventTypes
from roomstream.rooms.persist import CREATE_KEY, EventPersister, PersistedEvent, TransactionKey

#: Spec limit on how many prev events an event may reference.
MAX_PREV_EVENTS = 20
#: Largest depth (canonical JSON integers stop at 2**53 - 1).
MAX_DEPTH = 2**53 - 1


#: Memberships whose new events carry the target's profile (as Synapse's event creation).
PROFILE_MEMBERSHIPS = frozenset({"join", "invite", "knock"})
#: A user's profile as membership content keys (``displayname``, ``avatar_url``: the set
#: ones); ``{}`` for a user with none.
MemberProfile = Callable[[str], Awaitable[Mapping[str, Any]]]
#: Gives an invite of another server's user to that server (``/invite`` v2), with the
#: room's stripped state for the invitee; returns the event as that server signed it too.
RemoteInvite = Callable[[Event, list[dict[str, Any]]], Awaitable[Event]]

#: The state an invitee is shown of a room before joining (Synapse's default
#: ``room_prejoin_state``), plus the inviter's own membership.
STRIPPED_STATE_KEYS: tuple[StateKey, ...] = (
    (EventTypes.CREATE, ""),
    (EventTypes.JOIN_RULES, ""),
    ("m.room.canonical_alias", ""),
    ("m.room.avatar", ""),
    ("m.room.encryption", ""),
    ("m.room.name", ""),
    ("m.room.topic", ""),
)


class RoomPreset(Enum):
    PRIVATE_CHAT = "private_chat"
    PUBLIC_CHAT = "public_chat"


@dataclass(frozen=True, slots=True)
class CreatedEvent:
    event: Event
    stream_ordering: int


class LocalEventCreator:
    """Builds, signs, authorizes and persists events sent by this server's users."""

    def __init__(
        self, persister: EventPersister, server_name: str, signing_key: SigningKey
    ) -> None:
        self.persister = persister
        self.server_name = server_name
        self.signing_key = signing_key
        #: Where new membership events find their target's profile (the accounts' profile
        #: store, set by the Client-Server API when it is assembled); None: no profiles.
        self.member_profile: MemberProfile | None = None
        #: How an invite of another server's user reaches that server before it is
        #: stored (federation, set by the process assembly); None: such invites are
        #: refused (403), as this server could not deliver them.
        self.remote_invite: RemoteInvite | None = None

    async def create_event(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: Mapping[str, Any],
        *,
        state_key: str | None = None,
        redacts: str | None = None,
        origin_server_ts: int | None = None,
        transaction: TransactionKey | None = None,
    ) -> CreatedEvent:
        """Create and persist one event; ``AuthError`` (M_FORBIDDEN) if not allowed,
        ``UnknownRoomError`` (404) for a room not known here, 400 for an ``m.room.create``.

        ``transaction``: the client's (user, device, transaction ID), stored with the
        event in its one write transaction.

        A join, invite or knock carries its target's profile (``displayname``,
        ``avatar_url``) where ``content`` does not give the key, as Synapse's event
        creation does: read once, before the room's lock is taken, from
        :attr:`member_profile`."""
        if not sender.endswith(":" + self.server_name):
            raise InvalidParamError(f"{sender} is not a local user")
        content = await self._with_profile(event_type, state_key, content)
        persister = self.persister
        async with persister.room_lock(room_id):
            version, extremities, current = await persister.get_room_state(room_id)
            if event_type == EventTypes.CREATE:
                # A room has exactly one create event, made by create_room.
                raise InvalidParamError(
                    f"{room_id} exists: it cannot get another m.room.create",
                )
            prevs = sorted(extremities)[:MAX_PREV_EVENTS]
            keys = auth_types_for_event(version, event_type, state_key, sender, content)
            auth_ids = [current[k] for k in keys if k in current]
            prev_events = await persister.get_events(prevs)
            depth = min(max((e.depth for e in prev_events.values()), default=0) + 1, MAX_DEPTH)
            auth_needed = {k: current[k] for k in [*keys, CREATE_KEY] if k in current}
            auth_events = await persister.get_events(auth_needed.values())
            # Room versions 1 and 2 cite each prev and auth event with its reference hash.
            hashes = (
                {
                    e.event_id: reference_hash_of(e)
                    for e in [*prev_events.values(), *auth_events.values()]
                }
                if version.event_ids_in_pdu
                else None
            )
            event = finalise_local_event(
                build_event_dict(
                    version,
                    event_type=event_type,
                    sender=sender,
                    content=content,
                    prev_events=prevs,
                    auth_events=auth_ids,
                    depth=depth,
                    room_id=room_id,
                    state_key=state_key,
                    redacts=redacts,
                    origin_server_ts=origin_server_ts,
                    reference_hashes=hashes,
                ),
                version,
                self.server_name,
                self.signing_key,
            )
            auth_map = {k: auth_events[v] for k, v in auth_needed.items()}
            check_auth_rules(event, auth_map)
            if event.type == EventTypes.REDACTION:
                await self._check_redaction(event, auth_map)
            remote_invitee = _remote_invitee(event, self.server_name)
            if remote_invitee:
                stripped = await self._stripped_state(current, sender)
            else:
                committed = await persister.prepare_room_locked(
                    room_id,
                    [event],
                    backfilled=False,
                    local=True,
                    transaction_ids=None if transaction is None else {event.event_id: transaction},
                )
        if remote_invitee:
            # Outside the room's lock: the invitee's server may take its time. The event
            # then arrives like one received (checked against the room's state of then).
            return await self._invite_remote(event, stripped)
        # The next event of the room can be built while this one commits.
        results = await committed
        return CreatedEvent(event, _only(results, event).stream_ordering)

    async def _stripped_state(
        self, current: Mapping[StateKey, str], inviter: str
    ) -> list[dict[str, Any]]:
        keys = [*STRIPPED_STATE_KEYS, (EventTypes.MEMBER, inviter)]
        found = await self.persister.get_events(current[k] for k in keys if k in current)
        return [
            {
                "type": e.type,
                "state_key": e.state_key,
                "content": dict(e.content),
                "sender": e.sender,
            }
            for e in found.values()
        ]

    async def _invite_remote(self, event: Event, stripped: list[dict[str, Any]]) -> CreatedEvent:
        if self.remote_invite is None:
            raise AuthError(
                f"{event.state_key} is on another server and this one has no federation"
            )
        signed = await self.remote_invite(event, stripped)
        if signed.event_id != event.event_id or signed.content != event.content:
            raise AuthError(f"{event.state_key}'s server answered the invite with another event")
        [result] = await self.persister.persist_events([signed])
        if result.rejected_reason is not None or result.soft_failed:
            raise AuthError(
                f"the invite no longer passes the room's rules: {result.rejected_reason}"
            )
        return CreatedEvent(signed, result.stream_ordering)

    async def _with_profile(
        self, event_type: str, state_key: str | None, content: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """``content``, with the target's profile fields it does not name when it is a
        membership that carries them (a client's own ``displayname``, even ``null``,
        is kept)."""
        if (
            self.member_profile is None
            or event_type != EventTypes.MEMBER
            or state_key is None
            or not state_key.endswith(":" + self.server_name)
            or content.get("membership") not in PROFILE_MEMBERSHIPS
        ):
            return content
        profile = await self.member_profile(state_key)
        missing = {k: v for k, v in profile.items() if k not in content}
        return {**content, **missing} if missing else content

    async def _check_redaction(
        self, redaction: Event, auth_events: Mapping[StateKey, Event]
    ) -> None:
        """Refuse a redaction a local user may not make, before anything is stored (the
        auth rules accept any redaction a member may send; see ``redaction_applies``).

        As Synapse answers: an event of another room is ``400 M_INVALID_PARAM``; a
        sender with the redact level may redact any event of the room, even one not
        known here yet (it applies if the event arrives, see ``EventPersister``); anyone
        else must name a known event (``404 M_NOT_FOUND``) that the rule lets them
        redact, in practice one they sent (``403 M_FORBIDDEN``).
        """
        target_id = redaction.redacts
        if target_id is None:
            return  # redacts nothing (the format checks require it where it matters)
        target = (await self.persister.get_events([target_id])).get(target_id)
        if target is not None and target.room_id != redaction.room_id:
            raise InvalidParamError(f"{target_id} is not an event of {redaction.room_id}")
        if holds_redact_level(redaction.sender, auth_events):
            return
        if target is None:
            raise NotFoundError(f"unknown event {target_id}")
        if not redaction_applies(redaction, target, auth_events, local_server=self.server_name):
            raise AuthError(
                f"{redaction.sender} may not redact {target_id}: only its sender, or a"
                " member with the redact level, may"
            )

    async def create_room(
        self,
        creator: str,
        *,
        version: RoomVersion | str = DEFAULT_ROOM_VERSION,
        preset: RoomPreset = RoomPreset.PRIVATE_CHAT,
        name: str | None = None,
        topic: str | None = None,
        origin_server_ts: int | None = None,
        creation_content: Mapping[str, Any] | None = None,
    ) -> tuple[str, list[CreatedEvent]]:
        """Create a room with its initial state; returns its ID and the events created.
        ``creation_content``: extra keys of the create event's content (the
        ``room_version`` and, before v11, ``creator`` keys are the server's)."""
        version = room_version(version) if isinstance(version, str) else version
        if not creator.endswith(":" + self.server_name):
            raise InvalidParamError(f"{creator} is not a local user")
        create_content: dict[str, Any] = {
            k: v for k, v in (creation_content or {}).items() if k != "creator"
        }
        create_content["room_version"] = version.identifier
        if not version.implicit_room_creator:
            create_content["creator"] = creator
        # v12 derives the room ID from the create event; older versions name it up front.
        room_id_field = (
            None
            if version.room_id_from_create_event
            else f"!{secrets.token_urlsafe(18)}:{self.server_name}"
        )
        create = finalise_local_event(
            build_event_dict(
                version,
                event_type=EventTypes.CREATE,
                sender=creator,
                content=create_content,
                prev_events=[],
                auth_events=[],
                depth=1,
                room_id=room_id_field,
                state_key="",
                origin_server_ts=origin_server_ts,
            ),
            version,
            self.server_name,
            self.signing_key,
        )
        room_id = room_id_for_create_event(create)
        persister = self.persister
        async with persister.room_lock(room_id):
            results = await persister.persist_room_locked(room_id, [create], False, True)
        created = [CreatedEvent(create, _only(results, create).stream_ordering)]
        users: dict[str, int] = {} if version.privileged_creators else {creator: 100}
        initial: list[tuple[str, str, dict[str, Any]]] = [
            (EventTypes.MEMBER, creator, {"membership": "join"}),
            (
                EventTypes.POWER_LEVELS,
                "",
                {
                    "users": users,
                    "users_default": 0,
                    "events_default": 0,
                    "state_default": 50,
                    "ban": 50,
                    "kick": 50,
                    "redact": 50,
                    "invite": 50 if preset is RoomPreset.PUBLIC_CHAT else 0,
                    "events": {},
                },
            ),
            (
                EventTypes.JOIN_RULES,
                "",
                {"join_rule": "public" if preset is RoomPreset.PUBLIC_CHAT else "invite"},
            ),
            (EventTypes.HISTORY_VISIBILITY, "", {"history_visibility": "shared"}),
        ]
        if name is not None:
            initial.append((EventTypes.NAME, "", {"name": name}))
        if topic is not None:
            initial.append((EventTypes.TOPIC, "", {"topic": topic}))
        for event_type, state_key, content in initial:
            created.append(
                await self.create_event(
                    room_id,
                    creator,
                    event_type,
                    content,
                    state_key=state_key,
                    origin_server_ts=origin_server_ts,
                )
            )
        return room_id, created


def _remote_invitee(event: Event, server_name: str) -> bool:
    """Whether ``event`` invites a user of another server (who must hear of it first)."""
    return (
        event.type == EventTypes.MEMBER
        and event.content.get("membership") == "invite"
        and event.state_key is not None
        and not event.state_key.endswith(":" + server_name)
    )


def _only(results: Mapping[str, PersistedEvent], event: Event) -> PersistedEvent:
    result = results[event.event_id]
    if result.rejected_reason is not None:
        # Local events are authorized before persisting; a rejection here means the
        # room's state moved under us, which the room lock rules out.
        raise AuthError(f"event rejected on persist: {result.rejected_reason}")
    return result
