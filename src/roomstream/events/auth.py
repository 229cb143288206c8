"""The authorization rules for room versions 1 to 12, as pure functions.

Nothing here touches storage, the clock or the network: every function decides from the
event in question and the auth events (a map from ``(type, state_key)`` to the event
holding that piece of state) it is handed. The same inputs always give the same answer,
which is what state resolution needs when it re-runs the rules over old events.

Rule numbers in comments follow the room version pages of the Matrix specification:
``v10``/``v11`` number the create rule 1, the auth-events rule 2, ``m.federate`` 3, the
membership rules 4, ... power levels 9; ``v12`` inserts its room ID rule as 2, so from
there on its numbers are one higher (membership 5, power levels 10). Comments cite both
where they differ, e.g. "rule 4.3.2 (v12: 5.3.2)".

Room versions 1 to 9 differ from v10 in these places only (each a ``RoomVersion`` flag;
Synapse's ``event_auth`` branches on the same flags):

- v1-v5 (``special_case_aliases_auth``): ``m.room.aliases`` is allowed iff its state key
  is the sender's server name, before the membership and power rules are consulted;
- v1, v2 (``event_ids_in_pdu``): an ``m.room.redaction`` by a sender below the redact
  level is allowed only when its event ID and the redacted event's ID have the same
  server part (from v3 who may redact is decided when the redaction is applied);
- v1-v5 (not ``limit_notifications_power_levels``): changes to ``notifications`` levels
  are not checked against the sender's level;
- v1-v6 (not ``knock_join_rule``): no ``knock`` membership or join rule;
- v1-v7 (not ``restricted_join_rule``): no ``restricted`` join rule, and
  ``join_authorised_via_users_server`` is not an auth event; v8, v9 have no
  ``knock_restricted`` (``knock_restricted_join_rule``, v10);
- v1-v9 (not ``enforce_int_power_levels``): power levels may be any JSON value Python's
  ``int()`` accepts (``"50"``, ``50.0``, ``true``), as Synapse reads them; a value it does
  not accept is refused in a power levels event being authorised.

Out of scope (checked elsewhere, before these rules run): event format and size,
signatures of the sender's server, and -- rule 4.2 (v12: 5.2) -- the signature of the
server of ``join_authorised_via_users_server``; those need keys, not room state.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, Final, TypeGuard

from roomstream.errors import AuthError
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import KNOWN_ROOM_VERSIONS, RoomVersion
from roomstream.events.types import EventTypes
from roomstream.grammar import MAX_ID_BYTES, is_user_id, utf8_length

__all__ = [
    "auth_types_for_event",
    "check_auth_events_list",
    "check_auth_rules",
    "get_named_level",
    "get_room_creators",
    "get_send_level",
    "get_user_power_level",
    "holds_redact_level",
    "redaction_applies",
]


CREATE_KEY: Final[StateKey] = (EventTypes.CREATE, "")
POWER_LEVELS_KEY: Final[StateKey] = (EventTypes.POWER_LEVELS, "")
JOIN_RULES_KEY: Final[StateKey] = (EventTypes.JOIN_RULES, "")

JOIN: Final = "join"
INVITE: Final = "invite"
LEAVE: Final = "leave"
BAN: Final = "ban"
KNOCK: Final = "knock"

PUBLIC: Final = "public"
RESTRICTED: Final = "restricted"
KNOCK_RESTRICTED: Final = "knock_restricted"

AUTHORISING_USER: Final = "join_authorised_via_users_server"

#: Defaults for the named levels when the power levels event (or the key) is absent.
#: The spec's definitions: invite 0; kick, ban, redact 50. ``state_default`` is 50 and
#: ``events_default`` 0 even when there is no power levels event at all (matrix-spec#1479
#: removed the old "0 without a power levels event" text for ``state_default``).
DEFAULT_LEVELS: Final[Mapping[str, int]] = {
    "invite": 0,
    "kick": 50,
    "ban": 50,
    "redact": 50,
    "events_default": 0,
    "state_default": 50,
    "users_default": 0,
}
#: Without a power levels event, the creator (v10, v11) has this level.
IMPLICIT_CREATOR_LEVEL: Final = 100

_NAMED_LEVELS: Final = (
    "users_default",
    "events_default",
    "state_default",
    "ban",
    "redact",
    "kick",
    "invite",
)
_LEVEL_MAPS: Final = ("events", "notifications")

# --------------------------------------------------------------------------------------
# Small helpers on identifiers and levels
# --------------------------------------------------------------------------------------


def _domain(user_id: str) -> str:
    """The server name of a user ID (everything after the first ``:``)."""
    return user_id.partition(":")[2]


def _is_int(value: object) -> TypeGuard[int]:
    # ``bool`` is a subclass of ``int`` in Python but ``true`` is not an integer in JSON.
    return type(value) is int


def _level(value: object, default: int) -> int:
    """A power level value, or ``default`` if absent or not an integer.

    From room version 10 a power levels event with a non-integer level is rejected (rule
    9.1-9.3, v12: 10.1-10.3), so an accepted one never holds one; the fallback only keeps
    this total over arbitrary input.
    """
    return value if type(value) is int else default


def _legacy_int(value: object) -> int | None:
    """A power level as room versions 1 to 9 read it: what Python's ``int()`` makes of
    the value (strings of digits, floats truncated, booleans), as Synapse computes it;
    ``None`` for anything ``int()`` refuses (objects, arrays, null, non-numeric text)."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, float, str)):
        try:
            return int(value)
        except (ValueError, OverflowError):
            return None
    return None


def _level_in(value: object, default: int, version: RoomVersion) -> int:
    """A power level value under ``version``'s rules, or ``default`` if absent or unusable."""
    if version.enforce_int_power_levels:
        return _level(value, default)
    level = _legacy_int(value)
    return default if level is None else level


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _creators_of(create: Event) -> frozenset[str]:
    version = create.room_version
    if version.privileged_creators:
        extra = create.content.get("additional_creators")
        names = [create.sender]
        if isinstance(extra, list):
            names.extend(u for u in extra if isinstance(u, str))
        return frozenset(names)
    if version.implicit_room_creator:
        return frozenset((create.sender,))
    creator = create.content.get("creator")
    return frozenset((creator,)) if isinstance(creator, str) else frozenset()


def get_room_creators(auth_events: Mapping[StateKey, Event]) -> frozenset[str]:
    """The room creators according to the create event among ``auth_events``.

    v10: ``content.creator``; v11: the create event's ``sender``; v12: the sender plus
    ``content.additional_creators``. Empty if no create event is supplied.
    """
    create = auth_events.get(CREATE_KEY)
    return _creators_of(create) if create is not None else frozenset()


def _first_creator(create: Event) -> str | None:
    """The user whose join may directly follow the create event (rule 4.3.1, v12 5.3.1).

    v10: ``content.creator``; v11 and v12: the create event's sender only (v12's
    ``additional_creators`` must join like anyone else).
    """
    if create.room_version.implicit_room_creator:
        return create.sender
    creator = create.content.get("creator")
    return creator if isinstance(creator, str) else None


def get_named_level(auth_events: Mapping[StateKey, Event], name: str) -> int:
    """The ``invite``/``kick``/``ban``/``redact`` (or ``*_default``) level in force.

    Taken from the power levels event among ``auth_events``; the spec's default
    (:data:`DEFAULT_LEVELS`) when there is none or it lacks the key.
    """
    default = DEFAULT_LEVELS[name]
    power_levels = auth_events.get(POWER_LEVELS_KEY)
    if power_levels is None:
        return default
    return _level_in(power_levels.content.get(name), default, power_levels.room_version)


def get_user_power_level(user_id: str, auth_events: Mapping[StateKey, Event]) -> int | float:
    """A user's power level given the create and power levels events in ``auth_events``.

    Invariants:

    - v12: every room creator (create sender and ``additional_creators``) has
      ``float("inf")``, whatever the power levels event says; nobody else ever does.
    - With a power levels event: ``users[user_id]`` if present, else ``users_default``
      (itself defaulting to 0).
    - Without one: 100 for the creator in v10/v11 (``content.creator`` / create sender),
      0 for everyone else.

    The create event must be supplied for the creator rules to apply; without it every
    user is judged by the power levels event alone.
    """
    create = auth_events.get(CREATE_KEY)
    if (
        create is not None
        and create.room_version.privileged_creators
        and user_id in _creators_of(create)
    ):
        return math.inf
    power_levels = auth_events.get(POWER_LEVELS_KEY)
    if power_levels is not None:
        content = power_levels.content
        version = power_levels.room_version
        users_default = _level_in(
            content.get("users_default"), DEFAULT_LEVELS["users_default"], version
        )
        return _level_in(_mapping(content.get("users")).get(user_id), users_default, version)
    if create is not None and user_id in _creators_of(create):
        return IMPLICIT_CREATOR_LEVEL
    return 0


def get_send_level(event_type: str, state_key: str | None, power_levels: Event | None) -> int:
    """The *required power level* to send an event of this type (and state-ness).

    ``events[event_type]`` if the power levels event lists it, else ``state_default``
    (default 50) for state events, ``events_default`` (default 0) for others. Absent a
    power levels event the defaults apply unchanged: 50 for state, 0 otherwise.
    """
    if power_levels is None:
        return DEFAULT_LEVELS["state_default" if state_key is not None else "events_default"]
    content = power_levels.content
    version = power_levels.room_version
    specific = _mapping(content.get("events")).get(event_type)
    if version.enforce_int_power_levels:
        if _is_int(specific):
            return specific
    elif specific is not None and (legacy := _legacy_int(specific)) is not None:
        return legacy
    if state_key is not None:
        return _level_in(content.get("state_default"), DEFAULT_LEVELS["state_default"], version)
    return _level_in(content.get("events_default"), DEFAULT_LEVELS["events_default"], version)


def _membership_of(user_id: str, auth_events: Mapping[StateKey, Event]) -> str | None:
    member = auth_events.get((EventTypes.MEMBER, user_id))
    return member.membership if member is not None else None


def _join_rule(auth_events: Mapping[StateKey, Event]) -> str:
    # Without a join rules event (or with a malformed one) the room is invite-only.
    join_rules = auth_events.get(JOIN_RULES_KEY)
    if join_rules is None:
        return INVITE
    rule = join_rules.content.get("join_rule")
    return rule if isinstance(rule, str) else INVITE


def _third_party_invite_token(content: Mapping[str, Any]) -> str | None:
    signed = _mapping(_mapping(content.get("third_party_invite")).get("signed"))
    token = signed.get("token")
    return token if isinstance(token, str) else None


# --------------------------------------------------------------------------------------
# Auth events selection and the checks on an event's own auth_events
# --------------------------------------------------------------------------------------


def auth_types_for_event(
    room_version: RoomVersion,
    event_type: str,
    state_key: str | None,
    sender: str,
    content: Mapping[str, Any],
) -> list[StateKey]:
    """The state keys whose current events an event's ``auth_events`` should reference.

    The auth events selection algorithm of the server-server spec, in this order, each
    key at most once: the create event (not in v12, where the room ID names it), the
    power levels, the sender's membership; and for ``m.room.member`` events the
    target's membership, the join rules (for ``join``, ``invite``, ``knock``), the
    ``m.room.third_party_invite`` named by ``third_party_invite.signed.token`` (for
    invites carrying one) and the ``join_authorised_via_users_server`` user's
    membership (for joins carrying one). Empty for ``m.room.create`` itself.
    """
    if event_type == EventTypes.CREATE:
        return []
    keys: list[StateKey] = []

    def add(key: StateKey) -> None:
        if key not in keys:
            keys.append(key)

    if not room_version.room_id_from_create_event:
        add(CREATE_KEY)
    add(POWER_LEVELS_KEY)
    add((EventTypes.MEMBER, sender))
    if event_type == EventTypes.MEMBER and state_key is not None:
        membership = content.get("membership")
        add((EventTypes.MEMBER, state_key))
        if membership in (JOIN, INVITE, KNOCK):
            add(JOIN_RULES_KEY)
        if membership == INVITE:
            token = _third_party_invite_token(content)
            if token is not None:
                add((EventTypes.THIRD_PARTY_INVITE, token))
        if membership == JOIN and room_version.restricted_join_rule:
            authoriser = content.get(AUTHORISING_USER)
            if isinstance(authoriser, str):
                add((EventTypes.MEMBER, authoriser))
    return keys


def _create_event_id_for_room(room_id: str) -> str:
    # v12 (MSC4291): the room ID is the create event's ID with the sigil "!" for "$".
    return "$" + room_id[1:]


def check_auth_events_list(
    event: Event,
    auth_events_by_id: Mapping[str, Event],
    *,
    rejected_event_ids: Collection[str] = frozenset(),
) -> dict[StateKey, Event]:
    """Check the event's own ``auth_events`` list and return it as a state map.

    ``auth_events_by_id`` must hold every event the event lists (more is fine); the caller
    passes the IDs of those it has rejected in ``rejected_event_ids``. The checks (rule 2,
    v12: rules 2 and 3):

    - every listed ID is known, is a state event, and is in the event's room;
    - no two listed events share a ``(type, state_key)``;
    - each listed event's key is one :func:`auth_types_for_event` calls for;
    - none of them was rejected;
    - v10/v11: the create event is among them;
    - v12: the create event is *not* listed; instead it is looked up by the ID derived
      from the room ID, must be known and not rejected, and is added to the returned map
      under ``(EventTypes.CREATE, "")`` so the map can go straight to
      :func:`check_auth_rules`.

    For an ``m.room.create`` event (which has no auth events) the result is empty.
    """
    if event.type == EventTypes.CREATE:
        return {}
    version = event.room_version
    room_id = event.room_id
    expected = set(
        auth_types_for_event(version, event.type, event.state_key, event.sender, event.content)
    )
    result: dict[StateKey, Event] = {}
    for auth_id in event.auth_event_ids:
        auth_event = auth_events_by_id.get(auth_id)
        if auth_event is None:
            raise AuthError(f"auth event {auth_id} of {event.event_id} is unknown")
        if auth_event.room_id != room_id:
            # Otherwise power granted in one room could be spent in another.
            raise AuthError(f"auth event {auth_id} is in room {auth_event.room_id}, not {room_id}")
        if not auth_event.is_state():
            raise AuthError(f"auth event {auth_id} is not a state event")
        key = auth_event.state_tuple
        if version.room_id_from_create_event and key == CREATE_KEY:
            # v12 rule 3.2: the room ID already names the create event.
            raise AuthError(f"auth_events must not list the m.room.create event {auth_id}")
        if key in result:
            raise AuthError(
                f"duplicate auth events for {key}: {result[key].event_id} and {auth_id}"
            )
        if key not in expected:
            raise AuthError(f"auth event {auth_id} for {key} is not one the rules call for")
        if auth_id in rejected_event_ids:
            raise AuthError(f"auth event {auth_id} was rejected")
        result[key] = auth_event
    if version.room_id_from_create_event:
        # v12 rule 2: the room ID must be the ID of an accepted create event.
        create_id = _create_event_id_for_room(room_id)
        create = auth_events_by_id.get(create_id)
        if create is None:
            raise AuthError(f"the create event {create_id} of room {room_id} is unknown")
        if create.type != EventTypes.CREATE or create.state_key != "":
            raise AuthError(f"room ID {room_id} does not name an m.room.create event")
        if create_id in rejected_event_ids:
            raise AuthError(f"the create event {create_id} of room {room_id} was rejected")
        result[CREATE_KEY] = create
    elif CREATE_KEY not in result:
        raise AuthError("no m.room.create event among the auth events")
    return result


# --------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------


def _check_create(event: Event) -> None:
    """Rule 1: the create event, judged on its own."""
    version = event.room_version
    # 1.1: the create event starts the DAG.
    if event.prev_event_ids:
        raise AuthError("m.room.create event must not have prev_events")
    if version.room_id_from_create_event:
        # v12 1.2: the room ID is derived from the create event's ID, so it carries none.
        if "room_id" in event.data:
            raise AuthError("m.room.create event must not have a room_id in this room version")
    else:
        # v10/v11 1.2: a server may only create rooms in its own namespace.
        room_id = event.data.get("room_id")
        if not isinstance(room_id, str) or _domain(room_id) != _domain(event.sender):
            raise AuthError("m.room.create room_id domain does not match the sender's domain")
    # 1.3: an unknown room version cannot be authorised by rules we do not have. An
    # absent room_version means version 1, which we do not support either; a version that
    # differs from the one this event is being judged as would mean the wrong rules run.
    declared = event.content.get("room_version", "1")
    if not isinstance(declared, str) or declared not in KNOWN_ROOM_VERSIONS:
        raise AuthError(f"m.room.create has unsupported room_version {declared!r}")
    if declared != version.identifier:
        raise AuthError(
            f"m.room.create room_version {declared!r} is not the room version "
            f"{version.identifier!r} it is being authorised under"
        )
    # v10 1.4: the creator is named in content. v11+ use the sender and ignore any
    # "creator" key.
    if not version.implicit_room_creator and "creator" not in event.content:
        raise AuthError("m.room.create content has no creator property")
    # v12 1.4 (MSC4289): additional creators are user IDs like the sender.
    if version.privileged_creators and "additional_creators" in event.content:
        extra = event.content["additional_creators"]
        if not isinstance(extra, list) or not all(is_user_id(u) for u in extra):
            raise AuthError("m.room.create additional_creators must be an array of valid user IDs")


def check_auth_rules(event: Event, auth_events: Mapping[StateKey, Event]) -> None:
    """Raise :class:`AuthError` unless the rules allow ``event`` given ``auth_events``.

    ``auth_events`` maps ``(type, state_key)`` to the events the rules consult: the
    event's own auth events (see :func:`check_auth_events_list`), or the room state
    before it, or the current state. Extra entries are ignored. The create event must be
    present under ``(EventTypes.CREATE, "")`` -- in v12 too, although v12 events do not
    list it. The auth events' own validity (not rejected, right keys) is the caller's
    responsibility; this function checks only that they belong to the event's room.

    Invariants: pure (no I/O, no mutation of its arguments); a create event is judged on
    its own and ``auth_events`` ignored; every refusal names the rule's subject (who,
    what level, which key) in its message.
    """
    version = event.room_version
    if not version.strict_event_byte_limits:
        # v1-v10: well formed up to 255 code points, but over 255 bytes is rejected.
        for name, value in (("type", event.type), ("state_key", event.state_key)):
            if value is not None and utf8_length(value) > MAX_ID_BYTES:
                raise AuthError(f"{name} is longer than {MAX_ID_BYTES} bytes")
    if event.type == EventTypes.CREATE:
        _check_create(event)
        return

    room_id = event.room_id
    create = auth_events.get(CREATE_KEY)
    if create is None:
        raise AuthError("no m.room.create event among the auth events")
    # v12 rule 2: the room ID names the create event.
    expected_create_id = _create_event_id_for_room(room_id)
    if version.room_id_from_create_event and create.event_id != expected_create_id:
        raise AuthError(f"room ID {room_id} is not derived from the create event {create.event_id}")
    # Only the entries the rules consult are checked, so that a caller may pass a whole
    # state map without paying for every member in it.
    consulted = auth_types_for_event(
        version, event.type, event.state_key, event.sender, event.content
    )
    for key in (CREATE_KEY, *consulted):
        auth_event = auth_events.get(key)
        if auth_event is not None and auth_event.room_id != room_id:
            raise AuthError(
                f"auth event {auth_event.event_id} for {key} is in room "
                f"{auth_event.room_id}, not {room_id}"
            )

    # Rule 3 (v12: 4): a room that does not federate only admits its creator's server.
    if create.content.get("m.federate", True) is False and _domain(event.sender) != _domain(
        create.sender
    ):
        raise AuthError(
            f"room does not federate (m.federate is false) and {event.sender} is not on "
            "the creator's server"
        )

    # v1-v5 rule 4: m.room.aliases belongs to the server named by its state key.
    if event.type == EventTypes.ALIASES and version.special_case_aliases_auth:
        if not event.state_key:
            raise AuthError("m.room.aliases event must have a non-empty state_key")
        if event.state_key != _domain(event.sender):
            raise AuthError(
                f"m.room.aliases state_key {event.state_key} is not the server of the "
                f"sender {event.sender}"
            )
        return

    # Rule 4 (v12: 5).
    if event.type == EventTypes.MEMBER:
        _check_membership(event, auth_events, create)
        return

    # Rule 5 (v12: 6).
    sender_membership = _membership_of(event.sender, auth_events)
    if sender_membership != JOIN:
        raise AuthError(
            f"sender {event.sender} is not joined to the room (membership "
            f"{sender_membership or 'none'})"
        )

    sender_level = get_user_power_level(event.sender, auth_events)

    # Rule 6 (v12: 7): third-party invites need the invite level, nothing else.
    if event.type == EventTypes.THIRD_PARTY_INVITE:
        invite_level = get_named_level(auth_events, "invite")
        if sender_level < invite_level:
            raise AuthError(
                f"sender {event.sender} (power level {sender_level}) is below the invite "
                f"level {invite_level} needed for m.room.third_party_invite"
            )
        return

    # Rule 7 (v12: 8): the event type's required power level.
    power_levels = auth_events.get(POWER_LEVELS_KEY)
    send_level = get_send_level(event.type, event.state_key, power_levels)
    if sender_level < send_level:
        kind = "state event" if event.is_state() else "event"
        raise AuthError(
            f"sender {event.sender} (power level {sender_level}) is below the level "
            f"{send_level} required to send {kind} {event.type}"
        )

    # Rule 8 (v12: 9): state keyed by a user ID may only be set by that user.
    state_key = event.state_key
    if state_key is not None and state_key.startswith("@") and state_key != event.sender:
        raise AuthError(
            f"state_key {state_key} starts with @ and does not match the sender {event.sender}"
        )

    # Rule 9 (v12: 10).
    if event.type == EventTypes.POWER_LEVELS:
        _check_power_levels(event, auth_events, create, sender_level)

    # v1, v2 rule 10: a redaction from below the redact level must come from the server
    # of the event it redacts (judged by the servers in the two event IDs).
    if event.type == EventTypes.REDACTION and version.event_ids_in_pdu:
        redacts = event.redacts
        if (
            isinstance(redacts, str)
            and sender_level < get_named_level(auth_events, "redact")
            and _domain(event.event_id) != _domain(redacts)
        ):
            raise AuthError(
                f"{event.sender} (power level {sender_level}) is below the redact level "
                f"and {event.event_id} is not from the server of {redacts}"
            )

    # Rule 10 (v12: 11): otherwise, allow. Redactions are allowed here like any event
    # (v3 and later); whether they take effect is redaction_applies' question.


def _check_membership(event: Event, auth_events: Mapping[StateKey, Event], create: Event) -> None:
    """Rule 4 (v12: 5): ``m.room.member`` events; the same in v10, v11 and v12."""
    target = event.state_key
    membership = event.content.get("membership")
    # 4.1: a membership event must name a target and a membership.
    if target is None:
        raise AuthError("m.room.member event has no state_key")
    if not isinstance(membership, str):
        raise AuthError("m.room.member event content has no membership")
    sender = event.sender

    target_membership = _membership_of(target, auth_events)
    sender_membership = _membership_of(sender, auth_events)
    join_rule = _join_rule(auth_events)
    version = event.room_version
    # Join rules of later room versions mean nothing (admit nobody) in earlier ones.
    invite_rules = (INVITE, KNOCK) if version.knock_join_rule else (INVITE,)
    restricted_rules = ((RESTRICTED,) if version.restricted_join_rule else ()) + (
        (KNOCK_RESTRICTED,) if version.knock_restricted_join_rule else ()
    )
    knock_rules = (KNOCK, KNOCK_RESTRICTED) if version.knock_restricted_join_rule else (KNOCK,)

    if membership == JOIN:
        # 4.3.1: the creator's own join, straight after the create event.
        prev = event.prev_event_ids
        if len(prev) == 1 and prev[0] == create.event_id and target == _first_creator(create):
            return
        # 4.3.2: nobody can join someone else.
        if sender != target:
            raise AuthError(f"{sender} cannot make {target} join (sender must match state_key)")
        # 4.3.3: a ban outlasts every join rule.
        if target_membership == BAN:
            raise AuthError(f"{sender} is banned from the room and cannot join")
        # 4.3.4: invite-only and knock rooms need an invite (or are a no-op re-join).
        if join_rule in invite_rules:
            if target_membership in (INVITE, JOIN):
                return
            raise AuthError(
                f"{sender} cannot join: join rule is {join_rule} and they are not invited"
            )
        # 4.3.5: restricted rooms admit the invited, or whoever a suitable member vouches for.
        if join_rule in restricted_rules:
            if target_membership in (INVITE, JOIN):
                return
            _check_authorising_user(event, auth_events, join_rule)
            return
        # 4.3.6
        if join_rule == PUBLIC:
            return
        # 4.3.7
        raise AuthError(f"{sender} cannot join: join rule {join_rule!r} admits nobody")

    if membership == INVITE:
        # 4.4.1: an invite on the strength of a third-party invite.
        if "third_party_invite" in event.content:
            _check_third_party_invite(event, auth_events, target_membership)
            return
        # 4.4.2
        if sender_membership != JOIN:
            raise AuthError(f"{sender} cannot invite: sender is not joined to the room")
        # 4.4.3
        if target_membership in (JOIN, BAN):
            state = "already joined" if target_membership == JOIN else "banned"
            raise AuthError(f"cannot invite {target}: target is {state}")
        # 4.4.4 / 4.4.5
        sender_level = get_user_power_level(sender, auth_events)
        invite_level = get_named_level(auth_events, "invite")
        if sender_level < invite_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) is below the invite level {invite_level}"
            )
        return

    if membership == LEAVE:
        # 4.5.1: leaving yourself: rejecting an invite, rescinding a knock, or leaving.
        if sender == target:
            if target_membership in (INVITE, JOIN) or (
                target_membership == KNOCK and version.knock_join_rule
            ):
                return
            raise AuthError(
                f"{sender} cannot leave: current membership is {target_membership or 'none'}"
            )
        # 4.5.2
        if sender_membership != JOIN:
            raise AuthError(f"{sender} cannot kick or unban: sender is not joined to the room")
        sender_level = get_user_power_level(sender, auth_events)
        target_level = get_user_power_level(target, auth_events)
        # 4.5.3: unbanning needs the ban level as well as (4.5.4) the kick level.
        ban_level = get_named_level(auth_events, "ban")
        if target_membership == BAN and sender_level < ban_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) is below the ban level {ban_level} "
                f"needed to unban {target}"
            )
        # 4.5.4 / 4.5.5
        kick_level = get_named_level(auth_events, "kick")
        if sender_level < kick_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) is below the kick level {kick_level} "
                f"needed to remove {target}"
            )
        if target_level >= sender_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) cannot kick {target} whose power "
                f"level {target_level} is not lower"
            )
        return

    if membership == BAN:
        # 4.6.1
        if sender_membership != JOIN:
            raise AuthError(f"{sender} cannot ban: sender is not joined to the room")
        # 4.6.2 / 4.6.3
        sender_level = get_user_power_level(sender, auth_events)
        target_level = get_user_power_level(target, auth_events)
        ban_level = get_named_level(auth_events, "ban")
        if sender_level < ban_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) is below the ban level {ban_level}"
            )
        if target_level >= sender_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) cannot ban {target} whose power "
                f"level {target_level} is not lower"
            )
        return

    if membership == KNOCK and version.knock_join_rule:
        # 4.7.1: knocking is only for rooms that invite it (v7+; knock_restricted v10+).
        if join_rule not in knock_rules:
            raise AuthError(f"{sender} cannot knock: join rule is {join_rule}, not knock")
        # 4.7.2
        if sender != target:
            raise AuthError(f"{sender} cannot knock on behalf of {target}")
        # 4.7.3 / 4.7.4: the banned, the invited and members have no reason to knock.
        if target_membership in (BAN, INVITE, JOIN):
            raise AuthError(f"{sender} cannot knock: current membership is {target_membership}")
        return

    # 4.8
    raise AuthError(f"unknown membership {membership!r}")


def _check_authorising_user(
    event: Event, auth_events: Mapping[StateKey, Event], join_rule: str
) -> None:
    """Rule 4.3.5.2: the ``join_authorised_via_users_server`` user may invite.

    A user with sufficient permission to invite is one who is joined (only joined users
    can invite, rule 4.4.2) and whose power level reaches the invite level. The check
    that the event is signed by that user's server is done with the signatures.
    """
    authoriser = event.content.get(AUTHORISING_USER)
    if not isinstance(authoriser, str):
        raise AuthError(
            f"{event.sender} cannot join a {join_rule} room uninvited without {AUTHORISING_USER}"
        )
    if _membership_of(authoriser, auth_events) != JOIN:
        raise AuthError(
            f"{AUTHORISING_USER} {authoriser} is not joined to the room, so cannot "
            "authorise the join"
        )
    level = get_user_power_level(authoriser, auth_events)
    invite_level = get_named_level(auth_events, "invite")
    if level < invite_level:
        raise AuthError(
            f"{AUTHORISING_USER} {authoriser} (power level {level}) is below the invite "
            f"level {invite_level}, so cannot authorise the join"
        )


def _check_third_party_invite(
    event: Event, auth_events: Mapping[StateKey, Event], target_membership: str | None
) -> None:
    """Rule 4.4.1: an invite carrying ``third_party_invite``.

    The sender need not be joined: it must be whoever sent the
    ``m.room.third_party_invite`` (which needed the invite level, rule 6), and the
    identity server's signature over ``signed`` proves the invitee claimed the invite.
    """
    target = event.state_key
    # 4.4.1.1
    if target_membership == BAN:
        raise AuthError(f"cannot invite {target}: target is banned")
    # 4.4.1.2
    third_party_invite = event.content.get("third_party_invite")
    signed = third_party_invite.get("signed") if isinstance(third_party_invite, Mapping) else None
    if not isinstance(signed, Mapping):
        raise AuthError("third_party_invite has no signed property")
    # 4.4.1.3
    mxid = signed.get("mxid")
    token = signed.get("token")
    if not isinstance(mxid, str) or not isinstance(token, str):
        raise AuthError("third_party_invite.signed lacks mxid or token")
    # 4.4.1.4
    if mxid != target:
        raise AuthError(f"third_party_invite.signed.mxid {mxid} does not match {target}")
    # 4.4.1.5
    invite_event = auth_events.get((EventTypes.THIRD_PARTY_INVITE, token))
    if invite_event is None:
        raise AuthError(f"no m.room.third_party_invite in the room for token {token!r}")
    # 4.4.1.6
    if invite_event.sender != event.sender:
        raise AuthError(
            f"{event.sender} did not send the m.room.third_party_invite for token {token!r}"
        )
    # 4.4.1.7 / 4.4.1.8
    if not _signed_by_any_public_key(signed, invite_event.content):
        raise AuthError(
            "third_party_invite.signed is not signed by any public key of the "
            "m.room.third_party_invite"
        )


def _public_keys(content: Mapping[str, Any]) -> list[str]:
    keys: list[str] = []
    single = content.get("public_key")
    if isinstance(single, str):
        keys.append(single)
    many = content.get("public_keys")
    if isinstance(many, list):
        for entry in many:
            key = entry.get("public_key") if isinstance(entry, Mapping) else None
            if isinstance(key, str):
                keys.append(key)
    return keys


def _signed_by_any_public_key(signed: Mapping[str, Any], invite_content: Mapping[str, Any]) -> bool:
    """Whether any ed25519 signature in ``signed`` verifies with any of the public keys."""
    # Imported here: signature checks are the one non-trivial dependency of these rules,
    # and only third-party invites need them.
    from signedjson.key import decode_verify_key_bytes
    from signedjson.sign import SignatureVerifyException, verify_signed_json
    from unpaddedbase64 import decode_base64

    signatures = signed.get("signatures")
    if not isinstance(signatures, Mapping):
        return False
    for public_key in _public_keys(invite_content):
        try:
            key_bytes = decode_base64(public_key)
        except ValueError:
            continue
        for server, by_key_id in signatures.items():
            if not isinstance(server, str) or not isinstance(by_key_id, Mapping):
                continue
            for key_id in by_key_id:
                if not isinstance(key_id, str) or not key_id.startswith("ed25519:"):
                    continue
                try:
                    verify_key = decode_verify_key_bytes(key_id, key_bytes)
                    verify_signed_json(dict(signed), server, verify_key)
                except (SignatureVerifyException, ValueError, TypeError, KeyError):
                    continue
                return True
    return False


def _check_power_levels(
    event: Event,
    auth_events: Mapping[StateKey, Event],
    create: Event,
    sender_level: int | float,
) -> None:
    """Rule 9 (v12: 10): ``m.room.power_levels``.

    v10+ levels must be integers. v1-v9 levels are read with :func:`_legacy_int`, and
    one it cannot read is refused wherever a rule must read it (every ``users`` value,
    and any value that changes), since Synapse fails on those.
    """
    content = event.content
    version = event.room_version
    strict = version.enforce_int_power_levels
    level_maps = _LEVEL_MAPS if version.limit_notifications_power_levels else ("events",)
    if strict:
        # 9.1: the named levels are integers (v10+: no more stringy levels).
        for name in _NAMED_LEVELS:
            if name in content and not _is_int(content[name]):
                raise AuthError(f"power levels {name} must be an integer, not {content[name]!r}")
        # 9.2
        for name in _LEVEL_MAPS:
            if name in content:
                value = content[name]
                if not isinstance(value, Mapping) or not all(_is_int(v) for v in value.values()):
                    raise AuthError(f"power levels {name} must be an object of integers")
    # 9.3
    users = content.get("users", {})
    if not isinstance(users, Mapping):
        raise AuthError("power levels users must be an object")
    for user_id, value in users.items():
        if not is_user_id(user_id):
            raise AuthError(f"power levels users key {user_id!r} is not a valid user ID")
        if not (_is_int(value) if strict else _legacy_int(value) is not None):
            raise AuthError(f"power levels users[{user_id}] must be an integer, not {value!r}")
    # v12 10.4 (MSC4289): creators' power is fixed and infinite, so they cannot be listed.
    if version.privileged_creators:
        listed = sorted(set(users) & _creators_of(create))
        if listed:
            raise AuthError(f"power levels users must not list room creators: {listed}")

    # 9.4: the first power levels event is allowed as it stands.
    current = auth_events.get(POWER_LEVELS_KEY)
    if current is None:
        return
    old = current.content
    sender = event.sender

    def read(where: Mapping[str, Any], key: str) -> int | None:
        """The level at ``key`` (None if absent); v1-v9 refuse an unreadable one."""
        if key not in where:
            return None
        value = where[key]
        level = value if _is_int(value) else None if strict else _legacy_int(value)
        if level is None and not strict:
            raise AuthError(f"power level {key} is not an integer: {value!r}")
        return level

    def check(where: str, key: str, old_map: Mapping[str, Any], new_map: Mapping[str, Any]) -> None:
        old_value, new_value = read(old_map, key), read(new_map, key)
        if old_value == new_value:
            return
        # 9.8: others at or above your level are out of reach (you may lower yourself).
        if (
            where == "users"
            and key != sender
            and old_value is not None
            and (old_value >= sender_level)
        ):
            raise AuthError(
                f"{sender} (power level {sender_level}) cannot change the level of "
                f"{key}, whose current level {old_value} is not below their own"
            )
        # 9.5-9.7, 9.9: levels you may only move if they are, and stay, within your reach.
        label = key if not where else f"{where}[{key}]"
        if old_value is not None and old_value > sender_level:
            raise AuthError(
                f"{sender} (power level {sender_level}) cannot change {label} from "
                f"{old_value}, which is above their own level"
            )
        if new_value is not None and new_value > sender_level:
            target = f"the level of {key}" if where == "users" else label
            raise AuthError(
                f"{sender} (power level {sender_level}) cannot set {target} to "
                f"{new_value}, above their own level"
            )

    # 9.5: named levels.
    for name in _NAMED_LEVELS:
        check("", name, old, content)
    # 9.6 / 9.7: event and (v6+) notification levels, likewise.
    for map_name in level_maps:
        old_map, new_map = _mapping(old.get(map_name)), _mapping(content.get(map_name))
        for key in sorted(set(old_map) | set(new_map)):
            check(map_name, key, old_map, new_map)
    # 9.8 / 9.9: users.
    old_users = _mapping(old.get("users"))
    for user_id in sorted(set(old_users) | set(users)):
        check("users", user_id, old_users, users)


# --------------------------------------------------------------------------------------
# Redactions
# --------------------------------------------------------------------------------------


def holds_redact_level(sender: str, auth_events: Mapping[StateKey, Event]) -> bool:
    """Whether ``sender``'s power level reaches the *redact level* (default 50): such a
    sender may redact any event of the room (v12 creators, with infinite power, always)."""
    return get_user_power_level(sender, auth_events) >= get_named_level(auth_events, "redact")


def redaction_applies(
    redaction: Event,
    redacted: Event,
    auth_events: Mapping[StateKey, Event],
    *,
    local_server: str | None,
) -> bool:
    """Whether an accepted redaction may take effect on ``redacted``: the one rule every
    place that redacts anything (persisting, the import, the client API's refusal) uses.

    The auth rules accept a redaction event without asking who may redact what (v3 and
    later); "handling redactions" leaves that to the server. It applies iff

    - it is in the room of ``redacted`` and names it (never across rooms); and
    - its sender holds the redact level (:func:`holds_redact_level`, judged by
      ``auth_events``: the state at the redaction), or is ``redacted``'s sender, or -- only
      for a redaction from another server -- is on the server of ``redacted``'s sender
      (the spec's wording: a remote server is trusted to have checked its own users).

    ``local_server``: this server's name. Its own users are judged exactly (sender
    equality), since this server is the one that must check them; ``None`` treats every
    sender as remote. Pure: the same inputs always give the same answer.
    """
    if redaction.room_id != redacted.room_id or redaction.redacts != redacted.event_id:
        return False
    if holds_redact_level(redaction.sender, auth_events):
        return True
    if redaction.sender == redacted.sender:
        return True
    server = _domain(redaction.sender)
    return server != local_server and server == _domain(redacted.sender)
