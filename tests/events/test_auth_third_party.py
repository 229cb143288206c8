"""Third-party invites: ``m.room.third_party_invite`` (rule 6, v12: 7) and the invites
that redeem them (rule 4.4.1, v12: 5.4.1)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from signedjson.key import encode_verify_key_base64, generate_signing_key, get_verify_key
from signedjson.sign import sign_json

from roomstream.events.auth import auth_types_for_event
from roomstream.events.model import Event
from roomstream.events.room_versions import RoomVersion
from tests.support.auth import ALICE, BOB, CAROL, Room, refused, standard_room, versions

TOKEN = "tok123"
IDENTITY_SERVER = "id.example"
ID_KEY = generate_signing_key("0")
OTHER_KEY = generate_signing_key("1")


def public_key(key: Any = ID_KEY) -> str:
    return str(encode_verify_key_base64(get_verify_key(key)))


def signed_block(mxid: str = BOB, token: str = TOKEN, key: Any = ID_KEY) -> dict[str, Any]:
    block: dict[str, Any] = {"mxid": mxid, "token": token}
    return dict(sign_json(block, IDENTITY_SERVER, key))


def room_with_3pid_invite(
    version: RoomVersion, invite_content: dict[str, Any] | None = None, **kwargs: Any
) -> Room:
    room = standard_room(version, members=[CAROL], **kwargs)
    content = invite_content or {
        "display_name": "b...@example.org",
        "key_validity_url": "https://id.example/_matrix/identity/v2/pubkey/isvalid",
        "public_key": public_key(),
    }
    room.send(room.make("m.room.third_party_invite", ALICE, content, state_key=TOKEN))
    return room


def invite(room: Room, signed: Any, sender: str = ALICE, target: str = BOB) -> Event:
    third_party: dict[str, Any] = {"display_name": "b...@example.org"}
    if signed is not None:
        third_party["signed"] = signed
    return room.member(sender, target, "invite", third_party_invite=third_party)


# --------------------------------------------------------------------------------------
# m.room.third_party_invite events
# --------------------------------------------------------------------------------------


@versions()
def test_third_party_invite_event_needs_invite_level(version: RoomVersion) -> None:
    room = standard_room(version, members=[CAROL], power_levels={"invite": 50})
    event = room.make("m.room.third_party_invite", CAROL, {"public_key": "x"}, state_key=TOKEN)
    refused(lambda: room.check(event), CAROL, "invite level 50", "m.room.third_party_invite")
    room.check(room.make("m.room.third_party_invite", ALICE, {}, state_key=TOKEN))


@versions()
def test_third_party_invite_event_ignores_state_default(version: RoomVersion) -> None:
    # Rule 6 allows on the invite level alone; the state_default of 50 does not apply.
    room = standard_room(version, members=[CAROL])
    room.check(room.make("m.room.third_party_invite", CAROL, {}, state_key=TOKEN))


@versions()
def test_third_party_invite_event_sender_must_be_joined(version: RoomVersion) -> None:
    room = standard_room(version)
    event = room.make("m.room.third_party_invite", BOB, {}, state_key=TOKEN)
    refused(lambda: room.check(event), BOB, "not joined")


# --------------------------------------------------------------------------------------
# Invites carrying third_party_invite
# --------------------------------------------------------------------------------------


@versions()
def test_valid_third_party_invite_is_allowed(version: RoomVersion) -> None:
    room = room_with_3pid_invite(version)
    room.check(invite(room, signed_block()))


@versions()
def test_public_keys_list_is_accepted(version: RoomVersion) -> None:
    content = {"public_key": public_key(OTHER_KEY), "public_keys": [{"public_key": public_key()}]}
    room = room_with_3pid_invite(version, content)
    room.check(invite(room, signed_block()))


@versions()
def test_selection_includes_the_third_party_invite(version: RoomVersion) -> None:
    room = room_with_3pid_invite(version)
    event = invite(room, signed_block())
    keys = auth_types_for_event(version, event.type, event.state_key, event.sender, event.content)
    assert ("m.room.third_party_invite", TOKEN) in keys
    assert room.state[("m.room.third_party_invite", TOKEN)].event_id in event.auth_event_ids


@versions()
def test_inviter_need_not_be_joined_any_more(version: RoomVersion) -> None:
    # The invite level was checked when the third-party invite was sent.
    room = room_with_3pid_invite(version)
    room.send(room.member(ALICE, ALICE, "leave"))
    room.check(invite(room, signed_block()))


@versions()
def test_third_party_invite_of_banned_user_is_refused(version: RoomVersion) -> None:
    room = room_with_3pid_invite(version)
    room.send(room.member(ALICE, BOB, "ban"))
    refused(lambda: room.check(invite(room, signed_block())), BOB, "banned")


@versions()
@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: None, "no signed"),
        (lambda s: "not an object", "no signed"),
        (lambda s: {k: v for k, v in s.items() if k != "token"}, "lacks mxid or token"),
        (lambda s: {k: v for k, v in s.items() if k != "mxid"}, "lacks mxid or token"),
        (lambda s: {**s, "mxid": CAROL}, "does not match"),
        (lambda s: {**s, "token": "other"}, "no m.room.third_party_invite"),
        (lambda s: {k: v for k, v in s.items() if k != "signatures"}, "not signed by any"),
        (lambda s: signed_block(key=OTHER_KEY), "not signed by any"),
        (lambda s: {**s, "extra": "tampered"}, "not signed by any"),
    ],
    ids=[
        "no-signed",
        "signed-not-object",
        "no-token",
        "no-mxid",
        "mxid-mismatch",
        "unknown-token",
        "no-signatures",
        "wrong-key",
        "tampered",
    ],
)
def test_invalid_third_party_invites_are_refused(
    version: RoomVersion, mutate: Any, reason: str
) -> None:
    room = room_with_3pid_invite(version)
    event = invite(room, mutate(copy.deepcopy(signed_block())))
    refused(lambda: room.check(event), reason)


@versions()
def test_third_party_invite_must_come_from_its_sender(version: RoomVersion) -> None:
    room = room_with_3pid_invite(version)
    refused(lambda: room.check(invite(room, signed_block(), sender=CAROL)), "did not send")


@versions()
def test_third_party_invite_with_unusable_public_key_is_refused(version: RoomVersion) -> None:
    room = room_with_3pid_invite(version, {"public_key": "!!not base64!!"})
    refused(lambda: room.check(invite(room, signed_block())), "not signed by any")
