"""Power: who has which level (incl. v12's infinite creators), the required power level
of an event, and rule 9 (v12: 10) on ``m.room.power_levels`` events."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.errors import AuthError
from roomstream.events.auth import (
    get_room_creators,
    get_send_level,
    get_user_power_level,
)
from roomstream.events.model import Event
from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from roomstream.grammar import is_user_id
from tests.support.auth import (
    ALICE,
    ALL_VERSIONS,
    BOB,
    CAROL,
    DAVE,
    ERIN,
    PRE_V12,
    Room,
    creator_users,
    refused,
    standard_room,
    versions,
)

CREATE_KEY = ("m.room.create", "")
PL_KEY = ("m.room.power_levels", "")


def pl_event(room: Room, content: dict[str, Any], sender: str = ALICE) -> Event:
    return room.make("m.room.power_levels", sender, content, state_key="")


# --------------------------------------------------------------------------------------
# get_user_power_level
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "create_content", "expected"),
    [
        (ROOM_V10, {}, {ALICE: 100, BOB: 0}),
        (ROOM_V10, {"creator": BOB}, {ALICE: 0, BOB: 100}),
        (ROOM_V11, {"creator": BOB}, {ALICE: 100, BOB: 0}),
        (ROOM_V11, {"additional_creators": [BOB]}, {ALICE: 100, BOB: 0}),
        (ROOM_V12, {}, {ALICE: math.inf, BOB: 0}),
        (ROOM_V12, {"additional_creators": [BOB]}, {ALICE: math.inf, BOB: math.inf, CAROL: 0}),
    ],
    ids=["v10", "v10-content-creator", "v11-ignores-creator", "v11-no-extra", "v12", "v12-extra"],
)
def test_levels_without_power_levels_event(
    version: RoomVersion, create_content: dict[str, Any], expected: dict[str, float]
) -> None:
    room = Room(version, create_content=create_content)
    for user, level in expected.items():
        assert get_user_power_level(user, room.state) == level


@versions()
def test_levels_from_power_levels_event(version: RoomVersion) -> None:
    room = standard_room(version, users={BOB: 75})
    assert get_user_power_level(BOB, room.state) == 75
    assert get_user_power_level(CAROL, room.state) == 0
    expected_creator = math.inf if version.privileged_creators else 100
    assert get_user_power_level(ALICE, room.state) == expected_creator
    room.set_power_levels({"users": creator_users(version, {BOB: 75}), "users_default": 5})
    assert get_user_power_level(CAROL, room.state) == 5
    assert get_user_power_level(BOB, room.state) == 75


@pytest.mark.parametrize("version", PRE_V12, ids=["10", "11"])
def test_creator_loses_implicit_100_once_power_levels_exist(version: RoomVersion) -> None:
    room = standard_room(version)
    room.set_power_levels({"users": {ALICE: 10}})
    assert get_user_power_level(ALICE, room.state) == 10


def test_v12_creators_stay_infinite_whatever_power_levels_say() -> None:
    room = Room(ROOM_V12, create_content={"additional_creators": [BOB]})
    room.join(ALICE)
    # Forced: such an event could never be accepted, but the level must not move.
    room.force(pl_event(room, {"users": {ALICE: 0, BOB: 1}, "users_default": 0}))
    assert get_user_power_level(ALICE, room.state) == math.inf
    assert get_user_power_level(BOB, room.state) == math.inf
    assert get_room_creators(room.state) == {ALICE, BOB}


def test_without_create_event_only_power_levels_count() -> None:
    room = standard_room(ROOM_V12, users={BOB: 20})
    state = {PL_KEY: room.state[PL_KEY]}
    assert get_user_power_level(ALICE, state) == 0
    assert get_user_power_level(BOB, state) == 20
    assert get_user_power_level(ALICE, {}) == 0


# --------------------------------------------------------------------------------------
# get_send_level and the required power level (rule 7, v12: 8)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "event_type", "state_key", "expected"),
    [
        (None, "m.room.message", None, 0),
        (None, "m.room.topic", "", 50),
        ({}, "m.room.message", None, 0),
        ({}, "m.room.topic", "", 50),
        ({"events_default": 10, "state_default": 60}, "m.room.message", None, 10),
        ({"events_default": 10, "state_default": 60}, "m.room.topic", "", 60),
        ({"events": {"m.room.topic": 5}, "state_default": 60}, "m.room.topic", "", 5),
        ({"events": {"m.room.message": 70}}, "m.room.message", None, 70),
        # The events map applies whether or not the event is state.
        ({"events": {"m.custom": 30}}, "m.custom", "", 30),
        ({"events": {"m.custom": 30}}, "m.custom", None, 30),
        # Malformed values (never accepted from v10) fall back to the defaults.
        ({"events": {"m.room.topic": "5"}}, "m.room.topic", "", 50),
        ({"state_default": True}, "m.room.topic", "", 50),
    ],
)
def test_get_send_level(
    content: dict[str, Any] | None, event_type: str, state_key: str | None, expected: int
) -> None:
    room = Room(ROOM_V11)
    power_levels = None if content is None else pl_event(room, content)
    assert get_send_level(event_type, state_key, power_levels) == expected


@versions()
def test_state_needs_50_even_without_power_levels_event(version: RoomVersion) -> None:
    room = Room(version)
    room.join(ALICE)
    room.set_join_rule("public")  # Alice: 100 (v12: infinite) without a power levels event
    room.join(BOB)
    topic = room.make("m.room.topic", BOB, {"topic": "hi"}, state_key="")
    refused(lambda: room.check(topic), BOB, "power level 0", "level 50", "m.room.topic")
    room.check(room.make("m.room.message", BOB, {"body": "hi"}))
    room.check(room.make("m.room.topic", ALICE, {"topic": "hi"}, state_key=""))


@versions()
def test_events_default_and_overrides(version: RoomVersion) -> None:
    room = standard_room(
        version,
        members=[BOB],
        users={BOB: 10},
        power_levels={"events_default": 20, "events": {"m.reaction": 10}},
    )
    message = room.make("m.room.message", BOB, {"body": "x"})
    refused(lambda: room.check(message), "level 20", "event m.room.message")
    room.check(room.make("m.reaction", BOB, {}))


# --------------------------------------------------------------------------------------
# Rule 9.1 - 9.3 (v12: 10.1 - 10.3): integer-only, well-formed content
# --------------------------------------------------------------------------------------

NAMED = ["users_default", "events_default", "state_default", "ban", "redact", "kick", "invite"]


@versions()
@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("value", ["50", 50.0, True, None, [50]], ids=repr)
def test_named_levels_must_be_integers(version: RoomVersion, name: str, value: object) -> None:
    room = standard_room(version)
    content = {"users": creator_users(version, {}), name: value}
    refused(lambda: room.check(pl_event(room, content)), name, "must be an integer")


@versions()
@pytest.mark.parametrize("name", ["events", "notifications"])
@pytest.mark.parametrize(
    "value", [["m.room.message"], {"m.room.message": "50"}, {"room": 5.0}, {"x": False}, 7]
)
def test_level_maps_must_hold_integers(version: RoomVersion, name: str, value: object) -> None:
    room = standard_room(version)
    content = {"users": creator_users(version, {}), name: value}
    refused(lambda: room.check(pl_event(room, content)), name, "object of integers")


@versions()
@pytest.mark.parametrize(
    ("users", "reason"),
    [
        ([BOB], "must be an object"),
        ({BOB: "50"}, "must be an integer"),
        ({BOB: 1.5}, "must be an integer"),
        ({"bob": 10}, "not a valid user ID"),
        ({"@bob": 10}, "not a valid user ID"),
        ({"@bob:b.example:port": 10}, "not a valid user ID"),
    ],
)
def test_users_must_map_user_ids_to_integers(
    version: RoomVersion, users: object, reason: str
) -> None:
    room = standard_room(version)
    refused(lambda: room.check(pl_event(room, {"users": users})), "users", reason)


def naive_is_user_id(user_id: object) -> bool:
    """The grammar spelled out step by step: ``@``, a non-empty localpart of printable
    ASCII up to the first ``:``, a server name, at most 255 UTF-8 bytes."""
    if not isinstance(user_id, str) or not user_id.startswith("@"):
        return False
    if len(user_id.encode("utf-8")) > 255:
        return False
    localpart, sep, server = user_id[1:].partition(":")
    if not sep or not localpart:
        return False
    if any(not 0x21 <= ord(c) <= 0x7E for c in localpart):
        return False
    host, port = server, None
    if not host.startswith("[") and ":" in host:
        host, _, port = host.partition(":")
    elif host.startswith("[") and "]:" in host:
        host, _, port = host.partition("]:")
        host += "]"
    if port is not None and not (1 <= len(port) <= 5 and all(c in "0123456789" for c in port)):
        return False
    if host.startswith("["):
        inner = host[1:-1]
        return (
            host.endswith("]")
            and 2 <= len(inner) <= 45
            and all(c in "0123456789abcdefABCDEF:." for c in inner)
        )
    return bool(host) and all(c.isascii() and (c.isalnum() or c in ".-") for c in host)


# Characters that matter to the grammar, a few that must be refused, and non-ASCII.
_ID_ALPHABET = st.sampled_from("@:[].-09azAZ_=/~ !\x7f\x00\n\u00e9\u4e2d\U0001f600")


@given(
    st.one_of(
        st.text(_ID_ALPHABET, max_size=12),
        st.builds(
            lambda local, server, port: f"@{local}:{server}{port}",
            st.text(_ID_ALPHABET, max_size=6),
            st.one_of(st.text(_ID_ALPHABET, max_size=8), st.just("[::1]")),
            st.one_of(st.just(""), st.from_regex(re.compile(r":[0-9]{0,7}"), fullmatch=True)),
        ),
        # Around the 255-byte bound, with one- and multi-byte characters.
        st.builds(
            lambda n, tail: "@" + "a" * n + ":" + tail,
            st.integers(240, 260),
            st.sampled_from(["b.example", "b.example:8448", "\u00e9.example"]),
        ),
        st.integers(),
        st.none(),
    )
)
def test_user_id_grammar_agrees_with_the_naive_definition(user_id: object) -> None:
    assert is_user_id(user_id) == naive_is_user_id(user_id), user_id


def test_user_id_grammar_examples() -> None:
    for good in ("@bob:b.example", "@x:[::1]:8448", "@!=~:1.2.3.4:80", "@a" + "b" * 240 + ":c.d"):
        assert is_user_id(good), good
    for bad in (
        "@:b.example",
        "@b\u00e9b:b.example",
        "@bob:b.example:port",
        "@bob:",
        "bob",
        "@a" + "b" * 250 + ":c.de",
        "@bob:b_example",
        "@bob:[::1]:",
    ):
        assert not is_user_id(bad), bad


@versions()
def test_well_formed_power_levels_are_allowed(version: RoomVersion) -> None:
    room = standard_room(version)
    content = {
        "users": creator_users(version, {BOB: 50, "@x:[::1]:8448": 1}),
        "users_default": 0,
        "events_default": 0,
        "state_default": 50,
        "ban": 50,
        "kick": 50,
        "redact": 50,
        "invite": 0,
        "events": {"m.room.name": 50},
        "notifications": {"room": 50},
    }
    room.check(pl_event(room, content))


# --------------------------------------------------------------------------------------
# v12 10.4: creators cannot appear in users
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("listed", [ALICE, BOB], ids=["sender-of-create", "additional"])
def test_v12_users_must_not_list_creators(listed: str) -> None:
    room = Room(ROOM_V12, create_content={"additional_creators": [BOB]})
    room.join(ALICE)
    event = pl_event(room, {"users": {listed: 100}})
    refused(lambda: room.check(event), "must not list room creators", listed)
    room.check(pl_event(room, {"users": {CAROL: 100}}))


@pytest.mark.parametrize("version", PRE_V12, ids=["10", "11"])
def test_creator_may_be_listed_before_v12(version: RoomVersion) -> None:
    room = Room(version, create_content={"additional_creators": [BOB]})
    room.join(ALICE)
    room.check(pl_event(room, {"users": {ALICE: 100, BOB: 100}}))


# --------------------------------------------------------------------------------------
# Rule 9.4 - 9.9 (v12: 10.5 - 10.10): changes
# --------------------------------------------------------------------------------------


@versions()
def test_first_power_levels_event_is_allowed_as_it_stands(version: RoomVersion) -> None:
    room = Room(version)
    room.join(ALICE)
    room.check(pl_event(room, {"users": creator_users(version, {BOB: 10**6}), "ban": 10**6}))


def moderated_room(version: RoomVersion, **power_levels: Any) -> Room:
    """Carol is a moderator at 50; Bob at 10; Dave at 50 too."""
    return standard_room(
        version,
        members=[BOB, CAROL, DAVE],
        users={CAROL: 50, BOB: 10, DAVE: 50},
        power_levels=power_levels,
    )


def carol_sets(room: Room, **changes: Any) -> Event:
    content = dict(room.state[PL_KEY].content)
    for key, value in changes.items():
        if value is None:
            content.pop(key, None)
        else:
            content[key] = value
    return pl_event(room, content, sender=CAROL)


@versions()
@pytest.mark.parametrize(
    ("start", "change", "allowed", "reason"),
    [
        ({"kick": 50}, {"kick": 40}, True, ""),
        ({"kick": 40}, {"kick": 50}, True, ""),
        ({"kick": 40}, {"kick": 51}, False, "cannot set kick to 51"),
        ({"ban": 60}, {"ban": 40}, False, "cannot change ban from 60"),
        ({"ban": 60}, {"ban": None}, False, "cannot change ban from 60"),
        ({}, {"redact": 50}, True, ""),
        ({}, {"redact": 51}, False, "cannot set redact to 51"),
        ({"users_default": 60}, {"users_default": 60}, True, ""),
        ({"state_default": 100}, {"state_default": 100}, True, ""),
    ],
    ids=[
        "lower",
        "raise-to-own",
        "raise-above-own",
        "change-from-above",
        "remove-from-above",
        "add-at-own",
        "add-above-own",
        "unchanged-above-users_default",
        "unchanged-above-state_default",
    ],
)
def test_named_level_changes(
    version: RoomVersion,
    start: dict[str, int],
    change: dict[str, int | None],
    allowed: bool,
    reason: str,
) -> None:
    room = moderated_room(version, events={"m.room.power_levels": 50}, **start)
    event = carol_sets(room, **change)
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), CAROL, "power level 50", reason)


@versions()
@pytest.mark.parametrize("map_name", ["events", "notifications"])
@pytest.mark.parametrize(
    ("start", "new", "allowed", "reason"),
    [
        ({"m.x": 10}, {"m.x": 50}, True, ""),
        ({"m.x": 10}, {"m.x": 51}, False, "cannot set"),
        ({"m.x": 60}, {"m.x": 10}, False, "cannot change"),
        ({"m.x": 60}, {}, False, "cannot change"),
        ({}, {"m.x": 51}, False, "cannot set"),
        ({"m.x": 60}, {"m.x": 60, "m.y": 0}, True, ""),
    ],
    ids=["raise-to-own", "raise-above", "lower-from-above", "remove-above", "add-above", "keep"],
)
def test_level_map_changes(
    version: RoomVersion,
    map_name: str,
    start: dict[str, int],
    new: dict[str, int],
    allowed: bool,
    reason: str,
) -> None:
    events = {"m.room.power_levels": 50}
    start_content: dict[str, Any] = {map_name: {**start}}
    if map_name == "events":
        start_content["events"].update(events)
        new = {**new, **events}
    else:
        start_content["events"] = events
    room = moderated_room(version, **start_content)
    event = carol_sets(room, **{map_name: new})
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), f"{map_name}[m.x]", reason)


@versions()
@pytest.mark.parametrize(
    ("users_change", "allowed", "reason"),
    [
        ({BOB: 50}, True, ""),
        ({BOB: 51}, False, f"cannot set the level of {BOB} to 51"),
        ({BOB: None}, True, ""),
        ({ERIN: 50}, True, ""),
        ({ERIN: 51}, False, "to 51"),
        ({DAVE: 10}, False, f"cannot change the level of {DAVE}"),
        ({DAVE: None}, False, f"cannot change the level of {DAVE}"),
        ({CAROL: 20}, True, ""),
        ({CAROL: None}, True, ""),
        ({CAROL: 51}, False, f"cannot set the level of {CAROL} to 51"),
    ],
    ids=[
        "raise-other-to-own",
        "raise-other-above",
        "remove-lower-other",
        "add-at-own",
        "add-above",
        "demote-equal",
        "remove-equal",
        "demote-self",
        "remove-self",
        "raise-self",
    ],
)
def test_users_changes(
    version: RoomVersion, users_change: dict[str, int | None], allowed: bool, reason: str
) -> None:
    room = moderated_room(version, events={"m.room.power_levels": 50})
    users = dict(room.state[PL_KEY].content["users"])
    for user, level in users_change.items():
        if level is None:
            users.pop(user, None)
        else:
            users[user] = level
    event = carol_sets(room, users=users)
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), CAROL, reason)


@versions()
def test_sender_needs_send_level_for_power_levels(version: RoomVersion) -> None:
    # Rule 7 applies before rule 9: the default state_default of 50 guards the event.
    room = moderated_room(version)
    room.check(carol_sets(room, users_default=0))
    content = dict(room.state[PL_KEY].content, users_default=0)
    event = pl_event(room, content, sender=BOB)
    refused(lambda: room.check(event), BOB, "power level 10", "m.room.power_levels")


def test_v12_creator_may_set_any_level() -> None:
    room = moderated_room(ROOM_V12, ban=10**9)
    room.check(pl_event(room, {"users": {BOB: 10**9}, "ban": 10**10, "users_default": 10**9}))


@pytest.mark.parametrize("version", PRE_V12, ids=["10", "11"])
def test_before_v12_the_creator_is_bounded_by_own_level(version: RoomVersion) -> None:
    room = moderated_room(version)
    event = pl_event(room, {"users": {ALICE: 100, BOB: 101}})
    refused(lambda: room.check(event), ALICE, "power level 100", "to 101")


# --------------------------------------------------------------------------------------
# Invariant: nobody sets a level above their own
# --------------------------------------------------------------------------------------

_levels = st.integers(min_value=-5, max_value=120)


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(ALL_VERSIONS),
    sender_level=st.integers(min_value=50, max_value=100),
    old=st.dictionaries(st.sampled_from(NAMED), _levels, max_size=3),
    new=st.dictionaries(st.sampled_from(NAMED), _levels, max_size=3),
    old_users=st.dictionaries(st.sampled_from([BOB, DAVE]), _levels, max_size=2),
    new_users=st.dictionaries(st.sampled_from([BOB, DAVE]), _levels, max_size=2),
    new_events=st.dictionaries(st.sampled_from(["m.a", "m.b"]), _levels, max_size=2),
)
def test_nobody_can_set_a_level_above_their_own(
    version: RoomVersion,
    sender_level: int,
    old: dict[str, int],
    new: dict[str, int],
    old_users: dict[str, int],
    new_users: dict[str, int],
    new_events: dict[str, int],
) -> None:
    """Invariant: an accepted change never introduces a value above the sender's level,
    and never alters a value that was above it (or, for other users, at it)."""
    room = standard_room(version, members=[CAROL])
    start: dict[str, Any] = {
        "users": creator_users(version, {**old_users, CAROL: sender_level}),
        "events": {"m.room.power_levels": 50},
        **old,
    }
    room.force(pl_event(room, start))
    content: dict[str, Any] = {
        "users": {**new_users, CAROL: sender_level},
        "events": {"m.room.power_levels": 50, **new_events},
        **new,
    }
    if not version.privileged_creators:
        content["users"][ALICE] = 100
    event = pl_event(room, content, sender=CAROL)
    try:
        room.check(event)
    except AuthError:
        return
    for name in NAMED:
        if new.get(name) != old.get(name):
            assert new.get(name, -math.inf) <= sender_level
            assert old.get(name, -math.inf) <= sender_level
    for key, value in new_events.items():
        assert value <= sender_level or value == start["events"].get(key)
    for user in {BOB, DAVE}:
        if new_users.get(user) != old_users.get(user):
            assert new_users.get(user, -math.inf) <= sender_level
            assert old_users.get(user, -math.inf) < sender_level


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(ALL_VERSIONS),
    sender_level=st.integers(min_value=50, max_value=100),
    data=st.data(),
)
def test_setting_a_lower_user_is_allowed_iff_not_above_own_level(
    version: RoomVersion, sender_level: int, data: st.DataObject
) -> None:
    """Two-sided: for a user currently below the sender, any new level up to the sender's
    own is accepted and any level above it refused."""
    old = data.draw(st.integers(min_value=-100, max_value=sender_level - 1), label="old")
    new = data.draw(st.integers(min_value=-100, max_value=300), label="new")
    users = {CAROL: sender_level, BOB: old}
    room = standard_room(
        version,
        members=[BOB, CAROL],
        users=users,
        power_levels={"events": {"m.room.power_levels": 50}},
    )
    content = dict(room.state[PL_KEY].content)
    content["users"] = {**content["users"], BOB: new}
    event = pl_event(room, content, sender=CAROL)
    if new <= sender_level:
        room.check(event)
    else:
        refused(lambda: room.check(event), "above their own level")
