"""The room versions roomstream supports and the rules that differ between them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from roomstream.errors import UnsupportedRoomVersionError


class StateResolutionAlgorithm(Enum):
    V2 = "v2"
    #: Room version 12: the create event and the start of the mainline are treated specially.
    V2_1 = "v2.1"


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


ROOM_V10 = RoomVersion("10", StateResolutionAlgorithm.V2, False, False, False, False)
ROOM_V11 = RoomVersion("11", StateResolutionAlgorithm.V2, True, True, False, False)
ROOM_V12 = RoomVersion("12", StateResolutionAlgorithm.V2_1, True, True, True, True)

KNOWN_ROOM_VERSIONS: dict[str, RoomVersion] = {
    v.identifier: v for v in (ROOM_V10, ROOM_V11, ROOM_V12)
}
DEFAULT_ROOM_VERSION = ROOM_V12


def room_version(identifier: object) -> RoomVersion:
    """Look up a room version, or fail with ``M_UNSUPPORTED_ROOM_VERSION``."""
    if isinstance(identifier, str) and identifier in KNOWN_ROOM_VERSIONS:
        return KNOWN_ROOM_VERSIONS[identifier]
    raise UnsupportedRoomVersionError(f"unsupported room version {identifier!r}")
