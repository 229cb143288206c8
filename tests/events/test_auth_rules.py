"""The remaining rules for ordinary events: the create event must be there (and, in v12,
name the room), the sender must be joined (rule 5, v12: 6), user-keyed state (rule 8,
v12: 9), and redactions (auth as an ordinary event; ``redaction_applies`` for their effect)."""

from __future__ import annotations

from functools import partial

import pytest

from roomstream.events.auth import check_auth_rules, redaction_applies
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from tests.support.auth import (
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


def target(room: Room, sender: str) -> Event:
    """The event ``$target`` of ``room``, sent by ``sender``."""
    return room.make("m.room.message", sender, {"body": "x"}, event_id="$target")


def applies(room: Room, sender: str, target_sender: str, local: str | None = None) -> bool:
    return redaction_applies(
        redaction(room, sender), target(room, target_sender), room.state, local_server=local
    )


@versions()
@pytest.mark.parametrize(
    ("sender", "redacts_sender", "local", "expected"),
    [
        (ALICE, BOB, None, True),  # at or above the redact level
        (CAROL, BOB, None, True),  # moderator at exactly the redact level
        (BOB, BOB, None, True),  # own event
        (BOB, "@bob2:b.example", None, True),  # same (remote) server
        (BOB, "@bob2:b.example", "b.example", False),  # same server, but ours: exact only
        (BOB, BOB, "b.example", True),  # our user's own event
        (CAROL, BOB, "c.example", True),  # our moderator
        (DAVE, BOB, None, False),  # neither
        (ALICE_FRIEND, ALICE, None, True),
        (ALICE_FRIEND, ALICE, "a.example", False),
    ],
)
def test_redaction_applies(
    version: RoomVersion, sender: str, redacts_sender: str, local: str | None, expected: bool
) -> None:
    room = standard_room(version, members=[BOB, CAROL, DAVE], users={CAROL: 50, DAVE: 49})
    assert redaction(room, sender).redacts == "$target"
    assert applies(room, sender, redacts_sender, local) is expected


@versions()
def test_redaction_never_applies_across_rooms_or_to_another_event(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB])
    elsewhere = Event({**target(room, BOB).data, "room_id": "!other:a.example"}, version, "$target")
    # Alice holds the redact level, Bob sent both: neither helps across rooms.
    for sender in (ALICE, BOB):
        assert not redaction_applies(
            redaction(room, sender), elsewhere, room.state, local_server=None
        )
        assert not redaction_applies(
            redaction(room, sender, "$other"), target(room, BOB), room.state, local_server=None
        )


@versions()
def test_redaction_follows_the_redact_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[DAVE], users={DAVE: 10}, power_levels={"redact": 10})
    assert applies(room, DAVE, BOB)
    room.set_power_levels({**room.state[("m.room.power_levels", "")].content, "redact": 11})
    assert not applies(room, DAVE, BOB)


def test_redaction_without_power_levels_event() -> None:
    # Default redact level 50: the v11 creator's implicit 100 suffices, others' 0 does not.
    room = Room(ROOM_V11)
    room.join(ALICE)
    assert applies(room, ALICE, BOB)
    assert not applies(room, DAVE, BOB)


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
    assert applies(room, DAVE, BOB) is expected


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
