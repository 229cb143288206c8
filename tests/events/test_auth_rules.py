"""The remaining rules for ordinary events: the create event must be there (and, in v12,
name the room), the sender must be joined (rule 5, v12: 6), user-keyed state (rule 8,
v12: 9), and redactions (auth as an ordinary event; ``can_redact`` for their effect)."""

from __future__ import annotations

from functools import partial

import pytest

from roomstream.events.auth import can_redact, check_auth_rules
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion

from .test_auth_support import (
    ALICE,
    ALICE_FRIEND,
    BOB,
    CAROL,
    DAVE,
    Room,
    refused,
    standard_room,
    versions,
)

CREATE_KEY = ("m.room.create", "")

# --------------------------------------------------------------------------------------
# The create event among the auth events
# --------------------------------------------------------------------------------------


@versions()
def test_create_event_must_be_supplied(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB])
    event = room.make("m.room.message", BOB, {"body": "hi"})
    state = {k: v for k, v in room.state.items() if k != CREATE_KEY}
    refused(lambda: check_auth_rules(event, state), "no m.room.create")


def test_v12_room_id_must_name_the_create_event() -> None:
    room = standard_room(ROOM_V12, members=[BOB])
    event = room.make("m.room.message", BOB, {"body": "hi"})
    other_create = Event(dict(room.create.data), ROOM_V12, "$othercreate")
    state = {**room.state, CREATE_KEY: other_create}
    refused(lambda: check_auth_rules(event, state), "!create", "not derived", "$othercreate")
    room.check(event)


@versions()
def test_auth_events_must_be_in_the_same_room(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB])
    event = room.make("m.room.message", BOB, {"body": "hi"})
    member = room.state[("m.room.member", BOB)]
    foreign = Event({**member.data, "room_id": "!elsewhere:b.example"}, version, "$foreign")
    state = {**room.state, ("m.room.member", BOB): foreign}
    refused(lambda: check_auth_rules(event, state), "$foreign", "!elsewhere:b.example")


# --------------------------------------------------------------------------------------
# The sender must be joined (rule 5, v12: 6)
# --------------------------------------------------------------------------------------


@versions()
@pytest.mark.parametrize(
    ("membership", "allowed"),
    [
        ("join", True),
        ("invite", False),
        ("leave", False),
        ("ban", False),
        ("knock", False),
        (None, False),
    ],
)
def test_sender_must_be_joined(version: RoomVersion, membership: str | None, allowed: bool) -> None:
    room = standard_room(version)
    if membership is not None:
        room.force(room.member(BOB, BOB, membership))
    for event in (
        room.make("m.room.message", BOB, {"body": "hi"}),
        room.make("m.room.redaction", BOB, {"redacts": "$e1"}, extra={"redacts": "$e1"}),
        room.make("org.example.state", BOB, {}, state_key=""),
    ):
        if allowed:
            if event.is_state():
                continue  # Bob lacks the state level; covered by the power tests
            room.check(event)
        else:
            refused(partial(room.check, event), BOB, "not joined", str(membership or "none"))


# --------------------------------------------------------------------------------------
# State keys that are user IDs (rule 8, v12: 9)
# --------------------------------------------------------------------------------------


@versions()
@pytest.mark.parametrize(
    ("state_key", "allowed"),
    [
        (BOB, True),
        ("", True),
        ("bob", True),
        (CAROL, False),
        ("@bob:b.example_device", False),
        ("@", False),
    ],
)
def test_user_keyed_state(version: RoomVersion, state_key: str, allowed: bool) -> None:
    room = standard_room(
        version, members=[BOB, CAROL], power_levels={"events": {"org.example.status": 0}}
    )
    event = room.make("org.example.status", BOB, {"status": "busy"}, state_key=state_key)
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), f"state_key {state_key}", "does not match", BOB)


@versions()
def test_even_the_creator_cannot_set_others_user_keyed_state(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB])
    event = room.make("org.example.status", ALICE, {}, state_key=BOB)
    refused(lambda: room.check(event), "does not match the sender")


# --------------------------------------------------------------------------------------
# Redactions
# --------------------------------------------------------------------------------------


def redaction(room: Room, sender: str, target: str = "$target") -> Event:
    # v11+ carry redacts in content, earlier versions at the top level.
    if room.version.updated_redaction_rules:
        return room.make("m.room.redaction", sender, {"redacts": target})
    return room.make("m.room.redaction", sender, {}, extra={"redacts": target})


@versions()
def test_redaction_is_authorised_like_any_event(version: RoomVersion) -> None:
    # The redact level is not an auth rule: Bob at 0 may send a redaction...
    room = standard_room(version, members=[BOB], power_levels={"redact": 50})
    room.check(redaction(room, BOB))
    # ...unless its send level says otherwise.
    room.set_power_levels(
        {
            **room.state[("m.room.power_levels", "")].content,
            "events": {"m.room.redaction": 20},
        }
    )
    refused(lambda: room.check(redaction(room, BOB)), "level 20", "m.room.redaction")


@versions()
@pytest.mark.parametrize(
    ("sender", "redacts_sender", "expected"),
    [
        (ALICE, BOB, True),  # at or above the redact level
        (CAROL, BOB, True),  # moderator at exactly the redact level
        (BOB, BOB, True),  # own event
        (BOB, "@bob2:b.example", True),  # same server
        (DAVE, BOB, False),  # neither
        (DAVE, None, False),  # target unknown: only the redact level helps
        (CAROL, None, True),
        (ALICE_FRIEND, ALICE, True),
    ],
)
def test_can_redact(
    version: RoomVersion, sender: str, redacts_sender: str | None, expected: bool
) -> None:
    room = standard_room(version, members=[BOB, CAROL, DAVE], users={CAROL: 50, DAVE: 49})
    assert redaction(room, sender).redacts == "$target"
    assert can_redact(redaction(room, sender), room.state, redacts_sender) is expected


@versions()
def test_can_redact_follows_the_redact_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[DAVE], users={DAVE: 10}, power_levels={"redact": 10})
    assert can_redact(redaction(room, DAVE), room.state, BOB)
    room.set_power_levels({**room.state[("m.room.power_levels", "")].content, "redact": 11})
    assert not can_redact(redaction(room, DAVE), room.state, BOB)


def test_can_redact_without_power_levels_event() -> None:
    # Default redact level 50: the v11 creator's implicit 100 suffices, others' 0 does not.
    room = Room(ROOM_V11)
    room.join(ALICE)
    assert can_redact(redaction(room, ALICE), room.state, BOB)
    assert not can_redact(redaction(room, DAVE), room.state, BOB)


@pytest.mark.parametrize(
    ("version", "expected"),
    [(ROOM_V10, False), (ROOM_V11, False), (ROOM_V12, True)],
    ids=["10", "11", "12"],
)
def test_additional_creator_redacts_only_in_v12(version: RoomVersion, expected: bool) -> None:
    room = Room(version, create_content={"additional_creators": [DAVE]})
    room.join(ALICE)
    room.set_power_levels(
        {"users": {ALICE: 100} if version is not ROOM_V12 else {}, "redact": 10**9}
    )
    assert can_redact(redaction(room, DAVE), room.state, BOB) is expected


@versions()
def test_entries_the_rules_do_not_consult_are_ignored(version: RoomVersion) -> None:
    # A caller may pass a whole state map; an unrelated entry cannot affect the answer.
    room = standard_room(version, members=[BOB])
    event = room.make("m.room.message", BOB, {"body": "hi"})
    stray = Event(
        {**room.state[("m.room.member", ALICE)].data, "room_id": "!elsewhere:b.example"},
        version,
        "$stray",
    )
    check_auth_rules(event, {**room.state, ("org.example.unrelated", ""): stray})
