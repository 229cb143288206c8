"""The spec's names for event types, membership states and join rules, spelled once.

Code compares against ``EventTypes.MEMBER`` rather than writing ``"m.room.member"``: a
typo in a constant's name fails at import (and under mypy), a typo in a string literal
silently never matches. Event types are open-ended (any client may send its own), so
these are plain ``str`` constants, not an enum: an event's ``type`` is compared with
them, never converted to them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EventTypes", "JoinRules", "Membership"]


class EventTypes:
    """Event types this server gives meaning to (spec: "Room Events", "State events")."""

    CREATE: Final = "m.room.create"
    MEMBER: Final = "m.room.member"
    POWER_LEVELS: Final = "m.room.power_levels"
    JOIN_RULES: Final = "m.room.join_rules"
    HISTORY_VISIBILITY: Final = "m.room.history_visibility"
    GUEST_ACCESS: Final = "m.room.guest_access"
    THIRD_PARTY_INVITE: Final = "m.room.third_party_invite"
    NAME: Final = "m.room.name"
    TOPIC: Final = "m.room.topic"
    AVATAR: Final = "m.room.avatar"
    CANONICAL_ALIAS: Final = "m.room.canonical_alias"
    #: Room versions 1 to 5 give it its own auth and redaction rules.
    ALIASES: Final = "m.room.aliases"
    ENCRYPTION: Final = "m.room.encryption"
    SERVER_ACL: Final = "m.room.server_acl"
    TOMBSTONE: Final = "m.room.tombstone"
    REDACTION: Final = "m.room.redaction"
    MESSAGE: Final = "m.room.message"
    ENCRYPTED: Final = "m.room.encrypted"


class Membership:
    """Values of an ``m.room.member`` event's ``content.membership``."""

    JOIN: Final = "join"
    INVITE: Final = "invite"
    KNOCK: Final = "knock"
    LEAVE: Final = "leave"
    BAN: Final = "ban"


class JoinRules:
    """Values of an ``m.room.join_rules`` event's ``content.join_rule``."""

    PUBLIC: Final = "public"
    INVITE: Final = "invite"
    KNOCK: Final = "knock"
    RESTRICTED: Final = "restricted"
    KNOCK_RESTRICTED: Final = "knock_restricted"
    PRIVATE: Final = "private"
