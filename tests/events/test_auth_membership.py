"""Rule 4 (v12: 5): ``m.room.member`` events, and rule 3 (v12: 4), ``m.federate``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.events.room_versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from tests.support.auth import (
    ALICE,
    ALICE_FRIEND,
    ALL_VERSIONS,
    BOB,
    CAROL,
    DAVE,
    Room,
    refused,
    standard_room,
    versions,
)

# --------------------------------------------------------------------------------------
# Join: the creator's first join (4.3.1)
# --------------------------------------------------------------------------------------


@versions()
def test_creator_join_directly_after_create_is_allowed(version: RoomVersion) -> None:
    room = Room(version)
    room.check(room.member(ALICE, ALICE, "join"))


@versions()
def test_creator_join_needs_create_as_only_prev_event(version: RoomVersion) -> None:
    room = Room(version)
    event = room.member(ALICE, ALICE, "join")
    event.data["prev_events"] = ["$create", "$elsewhere"]
    # Without the special case the join rule (no event: invite) applies.
    refused(lambda: room.check(event), "not invited")


def test_v10_creator_comes_from_content() -> None:
    room = Room(ROOM_V10, create_content={"creator": BOB})
    room.check(room.member(BOB, BOB, "join"))
    refused(lambda: room.check(room.member(ALICE, ALICE, "join")), "not invited")


def test_v11_ignores_content_creator() -> None:
    room = Room(ROOM_V11, create_content={"creator": BOB})
    room.check(room.member(ALICE, ALICE, "join"))
    refused(lambda: room.check(room.member(BOB, BOB, "join")), "not invited")


def test_v12_additional_creators_do_not_get_the_first_join() -> None:
    room = Room(ROOM_V12, create_content={"additional_creators": [BOB]})
    refused(lambda: room.check(room.member(BOB, BOB, "join")), "not invited")
    room.check(room.member(ALICE, ALICE, "join"))


# --------------------------------------------------------------------------------------
# Join: the join rules (4.3.2 - 4.3.7)
# --------------------------------------------------------------------------------------


@versions()
def test_cannot_join_someone_else(version: RoomVersion) -> None:
    room = standard_room(version)
    refused(lambda: room.check(room.member(ALICE, BOB, "join")), "sender must match state_key")


@versions()
@pytest.mark.parametrize(
    ("join_rule", "prior", "allowed"),
    [
        ("public", None, True),
        ("public", "leave", True),
        ("invite", None, False),
        ("invite", "leave", False),
        ("invite", "invite", True),
        ("knock", None, False),
        ("knock", "knock", False),
        ("knock", "invite", True),
        ("restricted", "invite", True),
        ("knock_restricted", "invite", True),
        ("private", None, False),
        ("org.example.custom", "invite", False),
    ],
)
def test_join_rules(version: RoomVersion, join_rule: str, prior: str | None, allowed: bool) -> None:
    room = standard_room(version, join_rule=join_rule)
    if prior is not None:
        room.force(room.member(BOB, BOB, prior))
    event = room.member(BOB, BOB, "join")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), BOB, "cannot join", join_rule)


@versions()
def test_without_join_rules_event_room_is_invite_only(version: RoomVersion) -> None:
    room = Room(version)
    room.join(ALICE)
    refused(lambda: room.check(room.member(BOB, BOB, "join")), "join rule is invite")
    room.invite(ALICE, BOB)
    room.check(room.member(BOB, BOB, "join"))


@versions()
def test_rejoin_while_joined_is_allowed_in_invite_room(version: RoomVersion) -> None:
    # A profile change is a join over a join.
    room = standard_room(version, join_rule="invite", members=[])
    room.check(room.member(ALICE, ALICE, "join", displayname="Alice"))


@versions()
@pytest.mark.parametrize("join_rule", ["public", "invite", "knock", "restricted"])
def test_banned_user_cannot_join(version: RoomVersion, join_rule: str) -> None:
    room = standard_room(version, join_rule=join_rule, members=[BOB])
    room.send(room.member(ALICE, BOB, "ban"))
    refused(lambda: room.check(room.member(BOB, BOB, "join")), "banned")


@settings(max_examples=60, deadline=None)
@given(
    version=st.sampled_from(ALL_VERSIONS),
    join_rule=st.sampled_from(["public", "invite", "knock", "restricted", "knock_restricted"]),
    authoriser=st.sampled_from([None, ALICE, CAROL]),
    invite_level=st.integers(min_value=-10, max_value=100),
)
def test_banned_join_is_always_refused(
    version: RoomVersion, join_rule: str, authoriser: str | None, invite_level: int
) -> None:
    """Invariant: whatever the join rule, levels or authoriser, a banned user cannot join."""
    room = standard_room(
        version, join_rule=join_rule, members=[BOB, CAROL], power_levels={"invite": invite_level}
    )
    room.send(room.member(ALICE, BOB, "ban"))
    content = {"join_authorised_via_users_server": authoriser} if authoriser else {}
    refused(lambda: room.check(room.member(BOB, BOB, "join", **content)), "banned")


# --------------------------------------------------------------------------------------
# Join: restricted rooms (4.3.5)
# --------------------------------------------------------------------------------------

AUTH_KEY = "join_authorised_via_users_server"


@versions()
@pytest.mark.parametrize("join_rule", ["restricted", "knock_restricted"])
def test_restricted_join_via_authorising_member(version: RoomVersion, join_rule: str) -> None:
    room = standard_room(version, join_rule=join_rule, members=[CAROL])
    room.check(room.member(BOB, BOB, "join", **{AUTH_KEY: CAROL}))


@versions()
@pytest.mark.parametrize("join_rule", ["restricted", "knock_restricted"])
def test_restricted_join_without_authoriser_is_refused(
    version: RoomVersion, join_rule: str
) -> None:
    room = standard_room(version, join_rule=join_rule)
    refused(lambda: room.check(room.member(BOB, BOB, "join")), AUTH_KEY, join_rule)


@versions()
def test_restricted_join_authoriser_must_be_joined(version: RoomVersion) -> None:
    room = standard_room(version, join_rule="restricted")
    event = room.member(BOB, BOB, "join", **{AUTH_KEY: CAROL})
    refused(lambda: room.check(event), AUTH_KEY, CAROL, "not joined")
    room.force(room.member(CAROL, CAROL, "invite"))
    refused(lambda: room.check(event), CAROL, "not joined")


@versions()
def test_restricted_join_authoriser_needs_invite_level(version: RoomVersion) -> None:
    room = standard_room(
        version, join_rule="restricted", members=[CAROL], power_levels={"invite": 50}
    )
    event = room.member(BOB, BOB, "join", **{AUTH_KEY: CAROL})
    refused(lambda: room.check(event), CAROL, "power level 0", "invite level 50")
    room.check(room.member(BOB, BOB, "join", **{AUTH_KEY: ALICE}))


def test_v12_creator_can_always_authorise_restricted_join() -> None:
    room = standard_room(ROOM_V12, join_rule="restricted", power_levels={"invite": 10**9})
    room.check(room.member(BOB, BOB, "join", **{AUTH_KEY: ALICE}))


@versions()
def test_restricted_join_by_invitee_needs_no_authoriser(version: RoomVersion) -> None:
    room = standard_room(version, join_rule="restricted")
    room.invite(ALICE, BOB)
    room.check(room.member(BOB, BOB, "join"))


# --------------------------------------------------------------------------------------
# Invite (4.4.2 - 4.4.5)
# --------------------------------------------------------------------------------------


@versions()
def test_member_may_invite_at_default_invite_level(version: RoomVersion) -> None:
    room = standard_room(version, join_rule="invite", members=[])
    room.invite(ALICE, CAROL)
    room.join(CAROL)
    # Carol has level 0 and the invite level defaults to 0.
    room.check(room.member(CAROL, BOB, "invite"))


@versions()
def test_invite_needs_invite_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[CAROL], power_levels={"invite": 50})
    refused(lambda: room.check(room.member(CAROL, BOB, "invite")), "invite level 50")
    room.check(room.member(ALICE, BOB, "invite"))


@versions()
@pytest.mark.parametrize("sender_membership", [None, "invite", "leave", "knock", "ban"])
def test_inviter_must_be_joined(version: RoomVersion, sender_membership: str | None) -> None:
    room = standard_room(version)
    if sender_membership is not None:
        room.force(room.member(CAROL, CAROL, sender_membership))
    refused(lambda: room.check(room.member(CAROL, BOB, "invite")), CAROL, "not joined")


@versions()
@pytest.mark.parametrize(("state", "reason"), [("join", "already joined"), ("ban", "banned")])
def test_cannot_invite_joined_or_banned(version: RoomVersion, state: str, reason: str) -> None:
    room = standard_room(version, members=[BOB])
    if state == "ban":
        room.send(room.member(ALICE, BOB, "ban"))
    refused(lambda: room.check(room.member(ALICE, BOB, "invite")), BOB, reason)


@versions()
@pytest.mark.parametrize("state", ["invite", "leave", "knock"])
def test_can_invite_from_other_states(version: RoomVersion, state: str) -> None:
    room = standard_room(version, join_rule="knock")
    room.force(room.member(BOB, BOB, state))
    room.check(room.member(ALICE, BOB, "invite"))


# --------------------------------------------------------------------------------------
# Leave, kick and unban (4.5)
# --------------------------------------------------------------------------------------


@versions()
@pytest.mark.parametrize(
    ("state", "allowed"),
    [
        ("join", True),
        ("invite", True),
        ("knock", True),
        ("leave", False),
        ("ban", False),
        (None, False),
    ],
)
def test_leaving_yourself(version: RoomVersion, state: str | None, allowed: bool) -> None:
    room = standard_room(version, join_rule="knock")
    if state is not None:
        room.force(room.member(BOB, BOB, state))
    event = room.member(BOB, BOB, "leave")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), BOB, "cannot leave", str(state or "none"))


@versions()
def test_kicker_must_be_joined(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB], users={CAROL: 100})
    refused(lambda: room.check(room.member(CAROL, BOB, "leave")), CAROL, "not joined")


@versions()
def test_kick_needs_kick_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB, CAROL], users={CAROL: 49})
    refused(lambda: room.check(room.member(CAROL, BOB, "leave")), "kick level 50")
    room.check(room.member(ALICE, BOB, "leave"))


@versions()
@pytest.mark.parametrize(("target_level", "allowed"), [(49, True), (50, False), (51, False)])
def test_kick_needs_target_below_sender(
    version: RoomVersion, target_level: int, allowed: bool
) -> None:
    room = standard_room(version, members=[BOB, CAROL], users={CAROL: 50, BOB: target_level})
    event = room.member(CAROL, BOB, "leave")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), "cannot kick", f"power level {target_level}")


@versions()
def test_unban_needs_ban_level_as_well_as_kick_level(version: RoomVersion) -> None:
    room = standard_room(
        version, members=[BOB, CAROL], users={CAROL: 60}, power_levels={"kick": 50, "ban": 70}
    )
    room.send(room.member(ALICE, BOB, "ban"))
    refused(lambda: room.check(room.member(CAROL, BOB, "leave")), "ban level 70", "unban")
    room.check(room.member(ALICE, BOB, "leave"))


@versions()
def test_unban_also_needs_kick_level(version: RoomVersion) -> None:
    room = standard_room(
        version, members=[BOB, CAROL], users={CAROL: 60}, power_levels={"kick": 70, "ban": 50}
    )
    room.send(room.member(ALICE, BOB, "ban"))
    refused(lambda: room.check(room.member(CAROL, BOB, "leave")), "kick level 70")


# --------------------------------------------------------------------------------------
# Ban (4.6)
# --------------------------------------------------------------------------------------


@versions()
def test_banner_must_be_joined(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB], users={CAROL: 100})
    refused(lambda: room.check(room.member(CAROL, BOB, "ban")), CAROL, "not joined")


@versions()
def test_ban_needs_ban_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[BOB, CAROL], users={CAROL: 49})
    refused(lambda: room.check(room.member(CAROL, BOB, "ban")), "ban level 50")


@versions()
@pytest.mark.parametrize(("target_level", "allowed"), [(49, True), (50, False)])
def test_ban_needs_target_below_sender(
    version: RoomVersion, target_level: int, allowed: bool
) -> None:
    room = standard_room(version, members=[BOB, CAROL], users={CAROL: 50, BOB: target_level})
    event = room.member(CAROL, BOB, "ban")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), "cannot ban", BOB)


@versions()
def test_can_ban_a_user_who_never_joined(version: RoomVersion) -> None:
    room = standard_room(version)
    room.check(room.member(ALICE, DAVE, "ban"))


def test_v12_nobody_can_ban_or_kick_a_creator() -> None:
    room = Room(ROOM_V12, create_content={"additional_creators": [BOB]})
    room.join(ALICE)
    room.set_power_levels({"users": {CAROL: 100}})
    room.set_join_rule("public")
    room.join(BOB)
    room.join(CAROL)
    refused(lambda: room.check(room.member(CAROL, ALICE, "ban")), "power level inf")
    # Creators are equal: infinite is not below infinite.
    refused(lambda: room.check(room.member(BOB, ALICE, "ban")), "cannot ban")
    refused(lambda: room.check(room.member(BOB, ALICE, "leave")), "cannot kick")
    room.check(room.member(BOB, CAROL, "ban"))


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11], ids=["10", "11"])
def test_before_v12_the_creator_can_be_banned_by_a_higher_user(version: RoomVersion) -> None:
    room = standard_room(version, members=[CAROL], users={CAROL: 100})
    # Alice lowers herself; Carol at 100 then outranks her.
    room.set_power_levels({"users": {ALICE: 10, CAROL: 100}})
    room.check(room.member(CAROL, ALICE, "ban"))


# --------------------------------------------------------------------------------------
# Knock (4.7)
# --------------------------------------------------------------------------------------


@versions()
@pytest.mark.parametrize(
    ("join_rule", "allowed"),
    [
        ("knock", True),
        ("knock_restricted", True),
        ("public", False),
        ("invite", False),
        ("restricted", False),
    ],
)
def test_knock_needs_knock_join_rule(version: RoomVersion, join_rule: str, allowed: bool) -> None:
    room = standard_room(version, join_rule=join_rule)
    event = room.member(BOB, BOB, "knock")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), "cannot knock", join_rule)


@versions()
def test_cannot_knock_for_someone_else(version: RoomVersion) -> None:
    room = standard_room(version, join_rule="knock")
    refused(lambda: room.check(room.member(ALICE, BOB, "knock")), "on behalf of")


@versions()
@pytest.mark.parametrize(
    ("state", "allowed"),
    [
        (None, True),
        ("leave", True),
        ("knock", True),
        ("ban", False),
        ("invite", False),
        ("join", False),
    ],
)
def test_knock_depends_on_current_membership(
    version: RoomVersion, state: str | None, allowed: bool
) -> None:
    room = standard_room(version, join_rule="knock")
    if state is not None:
        room.force(room.member(BOB, BOB, state))
    event = room.member(BOB, BOB, "knock")
    if allowed:
        room.check(event)
    else:
        refused(lambda: room.check(event), "cannot knock", f"membership is {state}")


# --------------------------------------------------------------------------------------
# Malformed memberships (4.1, 4.8)
# --------------------------------------------------------------------------------------


@versions()
def test_member_event_needs_state_key(version: RoomVersion) -> None:
    room = standard_room(version)
    event = room.make("m.room.member", BOB, {"membership": "join"})
    refused(lambda: room.check(event), "state_key")


@versions()
@pytest.mark.parametrize("content", [{}, {"membership": None}, {"membership": 1}])
def test_member_event_needs_membership(version: RoomVersion, content: dict[str, object]) -> None:
    room = standard_room(version)
    event = room.make("m.room.member", BOB, content, state_key=BOB)
    refused(lambda: room.check(event), "no membership")


@versions()
def test_unknown_membership_is_refused(version: RoomVersion) -> None:
    room = standard_room(version)
    refused(lambda: room.check(room.member(ALICE, ALICE, "wander")), "unknown membership")


# --------------------------------------------------------------------------------------
# m.federate (rule 3, v12: 4)
# --------------------------------------------------------------------------------------


@versions()
def test_unfederated_room_refuses_other_servers(version: RoomVersion) -> None:
    room = Room(version, create_content={"m.federate": False})
    room.join(ALICE)
    room.set_join_rule("public")
    refused(lambda: room.check(room.member(BOB, BOB, "join")), "m.federate", BOB)
    room.check(room.member(ALICE_FRIEND, ALICE_FRIEND, "join"))


@versions()
@pytest.mark.parametrize("federate", [True, "false", 0])
def test_only_literal_false_stops_federation(version: RoomVersion, federate: object) -> None:
    room = Room(version, create_content={"m.federate": federate})
    room.join(ALICE)
    room.set_join_rule("public")
    room.check(room.member(BOB, BOB, "join"))
