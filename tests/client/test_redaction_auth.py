"""Who may redact what, through the Client-Server API (both engines): a member without
the redact level may redact only their own events (``403 M_FORBIDDEN`` otherwise, before
any event is made), a moderator any event of the room, nobody an event of another room
(``400``); refused redactions leave the message intact for everyone, on every read path."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.homeserver import Homeserver, User
from tests.support.redaction import (
    intact,
    public_room,
    redacted_by,
    send,
    served,
)


async def redact(hs: Homeserver, user: User, room_id: str, event_id: str) -> tuple[int, Any]:
    return await hs.call(
        "PUT", f"/rooms/{room_id}/redact/{event_id}/{hs.txn()}", {"reason": "x"}, token=user.token
    )


async def redactions_in(hs: Homeserver, user: User, room_id: str) -> list[str]:
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=user.token)
    return [e["event_id"] for e in page["chunk"] if e["type"] == "m.room.redaction"]


@pytest.mark.parametrize("version", ["10", "12"])
async def test_member_without_the_redact_level_cannot_redact_anothers_message(
    homeserver: Homeserver, version: str
) -> None:
    alice, bob = await homeserver.register("alice"), await homeserver.register("bob")
    room_id = await public_room(homeserver, alice, bob, version)
    message = await send(homeserver, alice, room_id)
    status, body = await redact(homeserver, bob, room_id, message)
    assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
    # Nothing was made: no redaction event, and the message intact for both of them.
    assert await redactions_in(homeserver, alice, room_id) == []
    for user in (alice, bob):
        assert intact(await served(homeserver, user, room_id, message))
    meta = await homeserver.engine.store.get_meta([message])
    assert meta[message].redacted_by is None
    # The same through /send (from v11 `redacts` is in the content, where a client may
    # put it itself).
    if version != "10":
        status, body = await homeserver.call(
            "PUT",
            f"/rooms/{room_id}/send/m.room.redaction/{homeserver.txn()}",
            {"redacts": message},
            token=bob.token,
        )
        assert (status, body["errcode"]) == (403, "M_FORBIDDEN")
        assert await redactions_in(homeserver, alice, room_id) == []


async def test_moderator_redacts_anyones_and_members_their_own(homeserver: Homeserver) -> None:
    alice, bob = await homeserver.register("alice"), await homeserver.register("bob")
    room_id = await public_room(homeserver, alice, bob)
    bobs = await send(homeserver, bob, room_id)
    status, body = await redact(homeserver, alice, room_id, bobs)  # level 100
    assert status == 200, body
    for user in (alice, bob):
        assert redacted_by(await served(homeserver, user, room_id, bobs), body["event_id"])
    own = await send(homeserver, bob, room_id)
    status, body = await redact(homeserver, bob, room_id, own)  # level 0, own message
    assert status == 200, body
    for user in (alice, bob):
        assert redacted_by(await served(homeserver, user, room_id, own), body["event_id"])


async def test_redaction_of_another_rooms_event_is_refused(homeserver: Homeserver) -> None:
    alice, bob = await homeserver.register("alice"), await homeserver.register("bob")
    room_id = await public_room(homeserver, alice, bob)
    other = await public_room(homeserver, alice, bob)
    message = await send(homeserver, alice, other)
    # Neither the moderator nor the message's own sender can redact it from another room.
    for user in (alice, bob):
        status, body = await redact(homeserver, user, room_id, message)
        assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), body
    bobs = await send(homeserver, bob, other)
    status, body = await redact(homeserver, bob, room_id, bobs)
    assert (status, body["errcode"]) == (400, "M_INVALID_PARAM"), body
    for room in (room_id, other):
        assert await redactions_in(homeserver, alice, room) == []
    for user in (alice, bob):
        assert intact(await served(homeserver, user, other, message))
        assert intact(await served(homeserver, user, other, bobs))


async def test_redaction_of_an_unknown_event(homeserver: Homeserver) -> None:
    """As Synapse: 404 unless the sender holds the redact level (a moderator may redact an
    event the server has not seen yet; it applies if that event arrives)."""
    alice, bob = await homeserver.register("alice"), await homeserver.register("bob")
    room_id = await public_room(homeserver, alice, bob)
    unknown = "$" + "A" * 43
    status, body = await redact(homeserver, bob, room_id, unknown)
    assert (status, body["errcode"]) == (404, "M_NOT_FOUND")
    assert await redactions_in(homeserver, alice, room_id) == []
    status, body = await redact(homeserver, alice, room_id, unknown)
    assert status == 200, body
    assert await redactions_in(homeserver, alice, room_id) == [body["event_id"]]
