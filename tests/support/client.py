"""Client-Server API steps shared by the client tests: rooms, messages, /sync with filters."""

from __future__ import annotations

import urllib.parse
from typing import Any

import orjson

from tests.support.homeserver import Homeserver, User


async def room_with(hs: Homeserver, owner: User, *others: User, preset: str = "public_chat") -> str:
    room_id: str = (await hs.ok("POST", "/createRoom", {"preset": preset}, token=owner.token))[
        "room_id"
    ]
    for other in others:
        await hs.ok(
            "POST", f"/rooms/{room_id}/invite", {"user_id": other.user_id}, token=owner.token
        )
        await hs.ok("POST", f"/rooms/{room_id}/join", {}, token=other.token)
    return room_id


async def send(hs: Homeserver, user: User, room_id: str, body: str) -> str:
    path = f"/rooms/{room_id}/send/m.room.message/{hs.txn()}"
    result = await hs.ok("PUT", path, {"msgtype": "m.text", "body": body}, token=user.token)
    return str(result["event_id"])


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message"]


def q(value: Any) -> str:
    return urllib.parse.quote(orjson.dumps(value).decode())


async def sync(hs: Homeserver, user: User, *, since: str | None = None, **params: Any) -> Any:
    query = [f"{k}={v}" for k, v in params.items()]
    if since is not None:
        query.append(f"since={since}&timeout=0")
    return await hs.ok("GET", "/sync?" + "&".join(query), token=user.token)


def state_keys(events: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(e["type"], e["state_key"]) for e in events}
