"""Auth events selection and the checks on an event's own ``auth_events`` (rule 2, v12:
rules 2 and 3)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from roomstream.events.auth import auth_types_for_event, check_auth_events_list, check_auth_rules
from roomstream.events.model import Event, StateKey
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from tests.support.auth import ALICE, BOB, CAROL, Room, refused, standard_room, versions

CREATE: StateKey = ("m.room.create", "")
PL: StateKey = ("m.room.power_levels", "")
JR: StateKey = ("m.room.join_rules", "")


def member(user: str) -> StateKey:
    return ("m.room.member", user)


# --------------------------------------------------------------------------------------
# auth_types_for_event
# --------------------------------------------------------------------------------------

SELECTION_CASES: list[tuple[str, str | None, str, dict[str, Any], list[StateKey]]] = [
    ("m.room.message", None, BOB, {}, [PL, member(BOB)]),
    ("m.room.topic", "", BOB, {}, [PL, member(BOB)]),
    ("m.room.member", BOB, BOB, {"membership": "join"}, [PL, member(BOB), JR]),
    ("m.room.member", CAROL, BOB, {"membership": "invite"}, [PL, member(BOB), member(CAROL), JR]),
    ("m.room.member", BOB, BOB, {"membership": "knock"}, [PL, member(BOB), JR]),
    ("m.room.member", BOB, BOB, {"membership": "leave"}, [PL, member(BOB)]),
    ("m.room.member", CAROL, BOB, {"membership": "ban"}, [PL, member(BOB), member(CAROL)]),
    (
        "m.room.member",
        BOB,
        BOB,
        {"membership": "join", "join_authorised_via_users_server": CAROL},
        [PL, member(BOB), JR, member(CAROL)],
    ),
    (
        # Only joins name an authorising user.
        "m.room.member",
        BOB,
        BOB,
        {"membership": "leave", "join_authorised_via_users_server": CAROL},
        [PL, member(BOB)],
    ),
    (
        "m.room.member",
        CAROL,
        BOB,
        {"membership": "invite", "third_party_invite": {"signed": {"token": "t"}}},
        [PL, member(BOB), member(CAROL), JR, ("m.room.third_party_invite", "t")],
    ),
    (
        # A malformed third_party_invite names no token, so selects nothing more.
        "m.room.member",
        CAROL,
        BOB,
        {"membership": "invite", "third_party_invite": {"signed": "t"}},
        [PL, member(BOB), member(CAROL), JR],
    ),
    ("m.room.member", None, BOB, {"membership": "join"}, [PL, member(BOB)]),
]


@versions()
@pytest.mark.parametrize(
    ("event_type", "state_key", "sender", "content", "expected"), SELECTION_CASES
)
def test_auth_types_for_event(
    version: RoomVersion,
    event_type: str,
    state_key: str | None,
    sender: str,
    content: dict[str, Any],
    expected: list[StateKey],
) -> None:
    # v12 (MSC4291) never selects the create event; earlier versions always do, first.
    if not version.room_id_from_create_event:
        expected = [CREATE, *expected]
    assert auth_types_for_event(version, event_type, state_key, sender, content) == expected


@versions()
def test_create_event_has_no_auth_types(version: RoomVersion) -> None:
    assert auth_types_for_event(version, "m.room.create", "", ALICE, {}) == []


# --------------------------------------------------------------------------------------
# check_auth_events_list
# --------------------------------------------------------------------------------------


def room_and_join(version: RoomVersion) -> tuple[Room, Event]:
    room = standard_room(version, join_rule="invite")
    room.invite(ALICE, BOB)
    return room, room.member(BOB, BOB, "join")


def set_auth(event: Event, ids: list[str]) -> Event:
    return Event({**event.data, "auth_events": ids}, event.room_version, event.event_id)


@versions()
def test_valid_list_gives_the_map_check_auth_rules_needs(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    result = check_auth_events_list(event, room.events)
    assert set(result) == {CREATE, PL, JR, member(BOB)}
    assert all(result[key] is room.state[key] for key in result)
    check_auth_rules(event, result)
    listed = {room.events[i].state_tuple for i in event.auth_event_ids}
    assert (CREATE in listed) is not version.room_id_from_create_event


@versions()
def test_create_event_list_is_empty(version: RoomVersion) -> None:
    room = Room(version)
    assert check_auth_events_list(room.create, room.events) == {}


@versions()
def test_unknown_auth_event(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    event = set_auth(event, [*event.auth_event_ids, "$missing"])
    refused(lambda: check_auth_events_list(event, room.events), "$missing", "unknown")


@versions()
def test_auth_event_from_another_room(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    invite = room.state[member(BOB)]
    foreign = Event({**invite.data, "room_id": "!other:b.example"}, version, invite.event_id)
    events = {**room.events, invite.event_id: foreign}
    refused(lambda: check_auth_events_list(event, events), "!other:b.example")


@versions()
def test_duplicate_auth_event_keys(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    old_pl = room.state[PL]
    new_pl = room.set_power_levels(dict(old_pl.content))
    assert old_pl.event_id in event.auth_event_ids
    event = set_auth(event, [*event.auth_event_ids, new_pl.event_id])
    refused(lambda: check_auth_events_list(event, room.events), "duplicate", "m.room.power_levels")


@versions()
def test_same_auth_event_listed_twice(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    event = set_auth(event, [*event.auth_event_ids, event.auth_event_ids[-1]])
    refused(lambda: check_auth_events_list(event, room.events), "duplicate")


@versions()
def test_auth_event_the_rules_do_not_call_for(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB, CAROL])
    message = room.make("m.room.message", BOB, {"body": "hi"})
    # Join rules are selected for memberships, not for messages; nor is Carol's membership.
    for extra in (room.state[JR].event_id, room.state[member(CAROL)].event_id):
        bad = set_auth(message, [*message.auth_event_ids, extra])
        refused(partial(check_auth_events_list, bad, room.events), extra, "not one")


@versions()
def test_non_state_auth_event(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB])
    earlier = room.send(room.make("m.room.message", BOB, {"body": "one"}))
    message = room.make("m.room.message", BOB, {"body": "two"})
    bad = set_auth(message, [*message.auth_event_ids, earlier.event_id])
    refused(lambda: check_auth_events_list(bad, room.events), "not a state event")


@versions()
def test_rejected_auth_event(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    invite_id = room.state[member(BOB)].event_id
    refused(
        lambda: check_auth_events_list(event, room.events, rejected_event_ids={invite_id}),
        invite_id,
        "rejected",
    )


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11], ids=["10", "11"])
def test_create_must_be_listed_before_v12(version: RoomVersion) -> None:
    room, event = room_and_join(version)
    event = set_auth(event, [i for i in event.auth_event_ids if i != "$create"])
    refused(lambda: check_auth_events_list(event, room.events), "no m.room.create")


def test_v12_create_must_not_be_listed() -> None:
    room, event = room_and_join(ROOM_V12)
    event = set_auth(event, ["$create", *event.auth_event_ids])
    refused(lambda: check_auth_events_list(event, room.events), "must not list", "$create")


def test_v12_create_must_be_known() -> None:
    room, event = room_and_join(ROOM_V12)
    events = {k: v for k, v in room.events.items() if k != "$create"}
    refused(lambda: check_auth_events_list(event, events), "$create", "unknown")


def test_v12_create_must_not_be_rejected() -> None:
    room, event = room_and_join(ROOM_V12)
    refused(
        lambda: check_auth_events_list(event, room.events, rejected_event_ids={"$create"}),
        "$create",
        "rejected",
    )


def test_v12_room_id_must_name_a_create_event() -> None:
    room, event = room_and_join(ROOM_V12)
    # An event whose ID the room ID happens to name, but which is not a create event.
    impostor = Event({**room.state[PL].data}, ROOM_V12, "$create")
    events = {**room.events, "$create": impostor}
    refused(lambda: check_auth_events_list(event, events), "does not name an m.room.create")
