"""Known-answer vectors shared by the event tests."""

from __future__ import annotations

from typing import Any

# Spec appendix "Cryptographic test vectors", "Event signing": the two example events and
# the content hashes the spec says they get.
SPEC_MINIMAL_EVENT: dict[str, Any] = {
    "room_id": "!x:domain",
    "sender": "@a:domain",
    "origin": "domain",
    "origin_server_ts": 1000000,
    "signatures": {},
    "hashes": {},
    "type": "X",
    "content": {},
    "prev_events": [],
    "auth_events": [],
    "depth": 3,
    "unsigned": {"age_ts": 1000000},
}
SPEC_MINIMAL_HASH = "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos"
SPEC_REDACTABLE_EVENT: dict[str, Any] = {
    "content": {"body": "Here is the message content"},
    "event_id": "$0:domain",
    "origin": "domain",
    "origin_server_ts": 1000000,
    "type": "m.room.message",
    "room_id": "!r:domain",
    "sender": "@u:domain",
    "signatures": {},
    "unsigned": {"age_ts": 1000000},
}
SPEC_REDACTABLE_HASH = "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g"

# A real event created by Synapse on jki.re (room version 5, whose redaction rules for
# m.room.create equal version 10's), with the event ID gomatrixserverlib's test suite
# expects for it under URL-safe (v4+) encoding.
REAL_CREATE_EVENT = (
    b'{"auth_events": [], "prev_events": [], "type": "m.room.create", "room_id": '
    b'"!uXDCzlYgCTHtiWCkEx:jki.re", "sender": "@erikj:jki.re", "content": {"room_version": '
    b'"5", "predecessor": {"room_id": "!gdRMqOrTFdOCYHNwOo:half-shot.uk", "event_id": '
    b'"$LP7ROBc4b+cMc1UE9haIz8q5AK2AIW4eJ90FfKLvyZI"}, "creator": "@erikj:jki.re"}, '
    b'"depth": 1, "prev_state": [], "state_key": "", "origin": "jki.re", "origin_server_ts": '
    b'1560284621137, "hashes": {"sha256": "IX6zuNiJpJPNf70BLleL3HSCpjKeq9Uhu7uUpyDjBmc"}, '
    b'"signatures": {"jki.re": {"ed25519:auto": "O4IyFfF2PPtGp5uaDm8t57dZbdh8vc8Q64LgCwvzYRVIt'
    b'AMI0uisfiAFaxkVT7MRpzh6N2QNN5NMRXZKmgPYDA"}}, "unsigned": {"age": 1321650}}'
)
REAL_CREATE_EVENT_ID = "$RrGxF28UrHLmoASHndYb9Jb_1SFww2ptmtur9INS438"
