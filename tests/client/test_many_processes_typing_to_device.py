"""Across processes (PostgreSQL, Redis; typing written by ``w2``, to-device by ``w1``,
clients on the reader and on ``w1``): the typing writer expires a typing notification
whose timeout passed, and a client syncing on another process is told; a to-device
message forwarded to its writer with the same transaction ID is delivered once."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.support.cluster import Cluster, joined, register, urls

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


async def test_typing_expires_and_to_device_is_sent_once_across_processes(
    split_cluster: Cluster,
) -> None:
    _, raw = split_cluster
    url = urls(raw)
    async with aiohttp.ClientSession() as session:
        alice = await register(session, url["reader"], "alice")
        bob = (await register(session, url["reader"], "bob")).on(url["w1"])
        bob_device = (await bob.on(url["reader"]).ok("GET", "/account/whoami"))["device_id"]
        created = await alice.ok(
            "POST", "/createRoom", {"preset": "public_chat", "invite": [bob.user_id]}
        )
        room_id = created["room_id"]
        await bob.ok("POST", f"/rooms/{room_id}/join", {})
        await bob.sync_until(lambda r: room_id in r["rooms"]["join"])

        # Typing on the reader, forwarded to w2; expired there; Bob syncs on w1.
        await alice.ok(
            "PUT", f"/rooms/{room_id}/typing/{alice.user_id}", {"typing": True, "timeout": 300}
        )
        lists: list[list[str]] = []

        def typing_seen(response: dict[str, Any]) -> bool:
            for event in joined(response, room_id)["ephemeral"]["events"]:
                if event["type"] == "m.typing":
                    lists.append(event["content"]["user_ids"])
            return bool(lists) and lists[-1] == []

        await bob.sync_until(typing_seen)
        assert lists[-1] == [] and set(map(tuple, lists)) <= {(alice.user_id,), ()}

        # To-device on the reader, forwarded to w1: a retry is not delivered again.
        def ping(n: int) -> dict[str, Any]:
            return {"messages": {bob.user_id: {bob_device: {"n": n}}}}

        await alice.ok("PUT", "/sendToDevice/org.example.ping/d1", ping(1))
        await alice.ok("PUT", "/sendToDevice/org.example.ping/d1", ping(1))
        await alice.ok("PUT", "/sendToDevice/org.example.ping/d2", ping(2))
        received: list[int] = []

        def pings(response: dict[str, Any]) -> bool:
            received.extend(e["content"]["n"] for e in response["to_device"]["events"])
            return 2 in received

        await bob.sync_until(pings)
        assert received == [1, 2]
