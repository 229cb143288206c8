"""Sending an event related to another (``m.relates_to``) through the API: shared by the
relations, threaded receipts and index rebuild tests."""

from __future__ import annotations

from typing import Any

from tests.support.homeserver import Homeserver, User


async def relate(
    hs: Homeserver,
    user: User,
    room_id: str,
    rel_type: str,
    parent: str,
    *,
    event_type: str = "m.room.message",
    body: str = "reply",
    key: str | None = None,
) -> str:
    relates: dict[str, Any] = {"rel_type": rel_type, "event_id": parent}
    content: dict[str, Any] = {"m.relates_to": relates}
    if key is not None:
        relates["key"] = key
    else:
        content.update({"msgtype": "m.text", "body": body})
    result = await hs.ok(
        "PUT", f"/rooms/{room_id}/send/{event_type}/{hs.txn()}", content, token=user.token
    )
    return str(result["event_id"])
