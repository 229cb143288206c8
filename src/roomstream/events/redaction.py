"""The redaction algorithm, per room version.

Redaction keeps only the parts of an event that the protocol needs (auth rules, the DAG,
hashes and signatures) and strips everything else. It is used for three things: to honour
``m.room.redaction`` events, to compute the *reference hash* (hence event IDs) and to
compute or check *signatures*. Because of the last two, it must match other servers
exactly: one extra or missing key changes event IDs and breaks signatures.

Room versions 1 to 10:

* top-level keys kept: ``event_id type room_id sender state_key content hashes signatures
  depth prev_events prev_state auth_events origin origin_server_ts membership``;
* content kept: ``m.room.member``: ``membership``, and from v9
  (``restricted_join_rule_fix``) ``join_authorised_via_users_server``;
  ``m.room.create``: ``creator``; ``m.room.join_rules``: ``join_rule``, and from v8
  (``restricted_join_rule``) ``allow``; ``m.room.power_levels``: ``ban events
  events_default kick redact state_default users users_default``;
  ``m.room.history_visibility``: ``history_visibility``; in v1 to v5
  (``special_case_aliases_auth``) ``m.room.aliases``: ``aliases``.

Room versions 11 and 12 (MSC2176, MSC3821), ``RoomVersion.updated_redaction_rules``:

* ``origin``, ``membership`` and ``prev_state`` are no longer kept at the top level;
* ``m.room.create`` keeps its entire content;
* ``m.room.power_levels`` also keeps ``invite``;
* ``m.room.redaction`` keeps ``redacts`` (which moved into content);
* ``m.room.member`` also keeps ``third_party_invite.signed``. When ``third_party_invite``
  is an object it is kept holding only ``signed`` (so ``{}`` if ``signed`` is absent);
  this matches Synapse and ruma, whose agreement is what makes event IDs interoperable.

``unsigned`` is never kept: it is not on the list, and it is excluded from hashes and
signatures anyway. Storage layers that want to keep local bookkeeping from ``unsigned``
on a redacted copy must add it back themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roomstream.events.room_versions import RoomVersion
from roomstream.events.types import EventTypes

_KEPT_TOP_LEVEL_ALL = frozenset(
    {
        "event_id",
        "type",
        "room_id",
        "sender",
        "state_key",
        "content",
        "hashes",
        "signatures",
        "depth",
        "prev_events",
        "auth_events",
        "origin_server_ts",
    }
)
_KEPT_TOP_LEVEL_V10 = _KEPT_TOP_LEVEL_ALL | {"prev_state", "origin", "membership"}

_CONTENT_V10: dict[str, tuple[str, ...]] = {
    EventTypes.MEMBER: ("membership", "join_authorised_via_users_server"),
    EventTypes.CREATE: ("creator",),
    EventTypes.JOIN_RULES: ("join_rule", "allow"),
    EventTypes.POWER_LEVELS: (
        "ban",
        "events",
        "events_default",
        "kick",
        "redact",
        "state_default",
        "users",
        "users_default",
    ),
    EventTypes.HISTORY_VISIBILITY: ("history_visibility",),
}
_CONTENT_V11: dict[str, tuple[str, ...]] = {
    EventTypes.MEMBER: ("membership", "join_authorised_via_users_server"),
    # m.room.create is handled specially: all of its content is kept.
    EventTypes.JOIN_RULES: ("join_rule", "allow"),
    EventTypes.POWER_LEVELS: (*_CONTENT_V10[EventTypes.POWER_LEVELS], "invite"),
    EventTypes.HISTORY_VISIBILITY: ("history_visibility",),
    EventTypes.REDACTION: ("redacts",),
}


def _older_version_keys(
    allowed: tuple[str, ...], event_type: object, room_version: RoomVersion
) -> tuple[str, ...]:
    """The v10 content keys adjusted for room versions 1 to 9."""
    if event_type == EventTypes.MEMBER and not room_version.restricted_join_rule_fix:
        return ("membership",)
    if event_type == EventTypes.JOIN_RULES and not room_version.restricted_join_rule:
        return ("join_rule",)
    if event_type == EventTypes.ALIASES and room_version.special_case_aliases_auth:
        return ("aliases",)
    return allowed


def redact(event_dict: Mapping[str, Any], room_version: RoomVersion) -> dict[str, Any]:
    """Return the redacted form of ``event_dict`` under ``room_version``'s rules.

    Invariants: the input is not modified; the result is a new top-level dict whose
    ``content`` is a new dict (nested values that are kept are shared, not copied, so
    treat the result as read-only or copy before mutating nested values); redaction is
    idempotent (``redact(redact(e)) == redact(e)``) and never changes the reference hash.
    A missing or non-object ``content`` is treated as empty.
    """
    updated = room_version.updated_redaction_rules
    kept_keys = _KEPT_TOP_LEVEL_ALL if updated else _KEPT_TOP_LEVEL_V10
    result = {k: v for k, v in event_dict.items() if k in kept_keys}

    content = event_dict.get("content")
    if not isinstance(content, Mapping):
        content = {}
    event_type = event_dict.get("type")

    new_content: dict[str, Any]
    if updated and event_type == EventTypes.CREATE:
        new_content = dict(content)
    else:
        table = _CONTENT_V11 if updated else _CONTENT_V10
        allowed = table.get(event_type, ()) if isinstance(event_type, str) else ()
        if not updated:
            allowed = _older_version_keys(allowed, event_type, room_version)
        new_content = {k: content[k] for k in allowed if k in content}
        if updated and event_type == EventTypes.MEMBER:
            third_party_invite = content.get("third_party_invite")
            if isinstance(third_party_invite, Mapping):
                kept_invite: dict[str, Any] = {}
                if "signed" in third_party_invite:
                    kept_invite["signed"] = third_party_invite["signed"]
                new_content["third_party_invite"] = kept_invite

    result["content"] = new_content
    return result
