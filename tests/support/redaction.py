"""A message in a public room and how it is served (intact or redacted), for the
redaction tests."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from tests.support.homeserver import Homeserver, User

TIMELINE = quote(orjson.dumps({"room": {"timeline": {"limit": 50}}}).decode())


BODY = {"msgtype": "m.text", "body": "keep me"}


async def public_room(hs: Homeserver, alice: User, bob: User, version: str = "12") -> str:
    """A ``public_chat`` room made by Alice (level 100) that Bob (level 0) joined."""
    created = await hs.ok(
        "POST", "/createRoom", {"preset": "public_chat", "room_version": version}, token=alice.token
    )
    room_id = str(created["room_id"])
    await hs.ok("POST", f"/join/{room_id}", {}, token=bob.token)
    return room_id


async def send(hs: Homeserver, user: User, room_id: str) -> str:
    sent = await hs.ok(
        "PUT", f"/rooms/{room_id}/send/m.room.message/{hs.txn()}", BODY, token=user.token
    )
    return str(sent["event_id"])


async def served(hs: Homeserver, user: User, room_id: str, event_id: str) -> list[dict[str, Any]]:
    """The event as ``user`` is served it by /sync, /messages and /event."""
    synced = await hs.ok("GET", f"/sync?filter={TIMELINE}", token=user.token)
    timeline = synced["rooms"]["join"][room_id]["timeline"]["events"]
    page = await hs.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=50", token=user.token)
    single = await hs.ok("GET", f"/rooms/{room_id}/event/{event_id}", token=user.token)
    found = [
        *(e for e in timeline if e["event_id"] == event_id),
        *(e for e in page["chunk"] if e["event_id"] == event_id),
        single,
    ]
    assert len(found) == 3, found
    return found


def intact(events: list[dict[str, Any]]) -> bool:
    return all(
        e["content"] == BODY and "redacted_because" not in e.get("unsigned", {}) for e in events
    )


def redacted_by(events: list[dict[str, Any]], redaction_id: str) -> bool:
    return all(
        e["content"] == {} and e["unsigned"]["redacted_because"]["event_id"] == redaction_id
        for e in events
    )
