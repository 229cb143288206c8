"""The room versions roomstream supports (1 to 12) and the rules that differ between them.

Each :class:`RoomVersion` is a set of flags; the modules that branch on the version ask
for the flag that names the rule, never for the identifier. The flags and the versions
that have them (the spec's room version pages; Synapse calls them the same names):

========================================  ==========================================
flag                                      versions
========================================  ==========================================
``event_id_format``                       v1, v2: ``$opaque:server`` in the PDU;
                                          v3: ``$`` + standard base64 reference hash;
                                          v4+: ``$`` + URL-safe base64
``state_resolution``                      v1: state resolution v1; v2-v11: v2;
                                          v12: v2.1
``enforce_key_validity``                  v5+
``special_case_aliases_auth``             v1-v5 (also the ``aliases`` redaction rule)
``strict_canonical_json``                 v6+
``limit_notifications_power_levels``      v6+
``knock_join_rule``                       v7+
``restricted_join_rule``                  v8+
``restricted_join_rule_fix``              v9+ (redaction keeps
                                          ``join_authorised_via_users_server``)
``knock_restricted_join_rule``            v10+
``enforce_int_power_levels``              v10+
``strict_event_byte_limits``              v11+ (before: ``type`` and ``state_key``
                                          over 255 bytes but not 255 code points
                                          are accepted, then rejected by the rules)
``updated_redaction_rules``               v11+
``implicit_room_creator``                 v11+
``room_id_from_create_event``             v12
``privileged_creators``                   v12
========================================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from roomstream.errors import UnsupportedRoomVersionError


class StateResolutionAlgorithm(Enum):
    #: Room version 1: the original algorithm (depth and SHA-1 of the event ID order).
    V1 = "v1"
    V2 = "v2"
    #: Room version 12: the create event and the start of the mainline are treated specially.
    V2_1 = "v2.1"


class EventIdFormat(Enum):
    """How an event's ID is found and how it names other events."""

    #: v1, v2: the PDU carries ``event_id`` (``$opaque_id:server_name``), and
    #: ``prev_events``/``auth_events`` are ``[event_id, {"sha256": ...}]`` pairs.
    SERVER_PART = "v1"
    #: v3: ``$`` + standard unpadded base64 of the reference hash; plain ID lists.
    BASE64 = "v3"
    #: v4 and later: ``$`` + URL-safe unpadded base64 of the reference hash.
    URL_SAFE_BASE64 = "v4"


@dataclass(frozen=True, slots=True)
class RoomVersion:
    identifier: str
    state_resolution: StateResolutionAlgorithm
    #: v11+: redaction keeps ``m.room.create`` content whole, ``redacts`` moves into content,
    #: power levels keep ``invite``, and the create event has no ``creator`` key.
    updated_redaction_rules: bool
    #: v11+: the sender of the create event is the room creator.
    implicit_room_creator: bool
    #: v12: the create event has no ``room_id``; the room ID is derived from its event ID,
    #: and the create event is not listed in other events' ``auth_events``.
    room_id_from_create_event: bool
    #: v12: the create event's sender and ``additional_creators`` have infinite power.
    privileged_creators: bool
    event_id_format: EventIdFormat = EventIdFormat.URL_SAFE_BASE64
    #: v5+: a signing key must be valid (``valid_until_ts``) when the event was sent.
    enforce_key_validity: bool = True
    #: v1-v5: ``m.room.aliases`` has its own auth rule (state key = sender's server) and
    #: redaction keeps its ``aliases``.
    special_case_aliases_auth: bool = False
    #: v6+: event JSON holds only integers in ``[-(2**53)+1, 2**53-1]``, no floats.
    strict_canonical_json: bool = True
    #: v6+: power level changes to ``notifications`` are checked like ``events``.
    limit_notifications_power_levels: bool = True
    #: v7+: the ``knock`` join rule and membership.
    knock_join_rule: bool = True
    #: v8+: the ``restricted`` join rule, ``join_authorised_via_users_server`` and the
    #: ``allow`` key kept by redaction of join rules.
    restricted_join_rule: bool = True
    #: v9+: redaction keeps ``join_authorised_via_users_server`` of member events.
    restricted_join_rule_fix: bool = True
    #: v10+: the ``knock_restricted`` join rule.
    knock_restricted_join_rule: bool = True
    #: v10+: power levels must be integers; before, strings such as ``"50"`` count.
    enforce_int_power_levels: bool = True
    #: v11+: ``type`` and ``state_key`` over 255 UTF-8 bytes make a PDU malformed. Before,
    #: only over 255 code points do; one between the two is well formed but rejected by
    #: the auth rules (stored as rejected, as Synapse does, so the DAG stays whole).
    strict_event_byte_limits: bool = True

    @property
    def event_ids_in_pdu(self) -> bool:
        """v1, v2: the event ID is a field of the PDU, not a hash of it."""
        return self.event_id_format is EventIdFormat.SERVER_PART


ROOM_V10 = RoomVersion(
    "10", StateResolutionAlgorithm.V2, False, False, False, False, strict_event_byte_limits=False
)
ROOM_V11 = RoomVersion("11", StateResolutionAlgorithm.V2, True, True, False, False)
ROOM_V12 = RoomVersion("12", StateResolutionAlgorithm.V2_1, True, True, True, True)
ROOM_V9 = replace(
    ROOM_V10, identifier="9", knock_restricted_join_rule=False, enforce_int_power_levels=False
)
ROOM_V8 = replace(ROOM_V9, identifier="8", restricted_join_rule_fix=False)
ROOM_V7 = replace(ROOM_V8, identifier="7", restricted_join_rule=False)
ROOM_V6 = replace(ROOM_V7, identifier="6", knock_join_rule=False)
ROOM_V5 = replace(
    ROOM_V6,
    identifier="5",
    special_case_aliases_auth=True,
    strict_canonical_json=False,
    limit_notifications_power_levels=False,
)
ROOM_V4 = replace(ROOM_V5, identifier="4", enforce_key_validity=False)
ROOM_V3 = replace(ROOM_V4, identifier="3", event_id_format=EventIdFormat.BASE64)
ROOM_V2 = replace(ROOM_V3, identifier="2", event_id_format=EventIdFormat.SERVER_PART)
ROOM_V1 = replace(ROOM_V2, identifier="1", state_resolution=StateResolutionAlgorithm.V1)

KNOWN_ROOM_VERSIONS: dict[str, RoomVersion] = {
    v.identifier: v
    for v in (
        ROOM_V1,
        ROOM_V2,
        ROOM_V3,
        ROOM_V4,
        ROOM_V5,
        ROOM_V6,
        ROOM_V7,
        ROOM_V8,
        ROOM_V9,
        ROOM_V10,
        ROOM_V11,
        ROOM_V12,
    )
}
DEFAULT_ROOM_VERSION = ROOM_V12


def room_version(identifier: object) -> RoomVersion:
    """Look up a room version, or fail with ``M_UNSUPPORTED_ROOM_VERSION``."""
    if isinstance(identifier, str) and identifier in KNOWN_ROOM_VERSIONS:
        return KNOWN_ROOM_VERSIONS[identifier]
    raise UnsupportedRoomVersionError(f"unsupported room version {identifier!r}")
