"""The client API on several processes (PostgreSQL, Redis replication): two events
writers and a reader. matrix-nio clients talk only to the reader; their rooms live on both
writers. A long-polling sync on the reader sees messages from both, its token carries both
writers' positions, and syncing goes on, missing nothing and repeating nothing, while a
writer is killed and restarted.

With account data and to-device written by ``w1`` and receipts and typing by ``w2``, a
client on the reader writes each of them (forwarded to their writer), creates rooms of
versions 10 and 11 and redacts in a version-10 room, and another user syncing on ``w1``
sees it all; a writer that is down makes those writes answer 503 ``M_UNAVAILABLE``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nio import AsyncClient, JoinResponse, RegisterResponse, RoomCreateResponse, SyncResponse

from roomstream.client.sync import SyncToken
from roomstream.config import parse_config
from roomstream.replication.sharding import writer_for_room
from tests.support.cluster import Cluster, joined, register, run_cluster, urls
from tests.support.homeserver import ServerProcess

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def messages(response: SyncResponse) -> list[tuple[str, str]]:
    return [
        (room_id, event.body)
        for room_id, room in response.rooms.join.items()
        for event in room.timeline.events
        if hasattr(event, "body")
    ]


async def send_retrying(client: AsyncClient, room_id: str, body: str) -> None:
    """Send until the room's writer accepts (it may be restarting: a 503)."""
    for _ in range(600):
        response = await client.room_send(
            room_id, "m.room.message", {"msgtype": "m.text", "body": body}, tx_id=body
        )
        if hasattr(response, "event_id"):
            return
        await asyncio.sleep(0.1)  # back off from a restarting writer; not synchronisation
    raise AssertionError(f"could not send {body}")


async def test_reader_syncs_rooms_of_two_writers_through_a_restart(
    cluster: tuple[dict[str, ServerProcess], dict[str, Any]],
) -> None:
    processes, raw = cluster
    config = parse_config(raw)
    reader_url = f"http://127.0.0.1:{raw['instances']['reader']['http_port']}"
    server = raw["server_name"]
    alice = AsyncClient(reader_url, f"@alice:{server}")
    bob = AsyncClient(reader_url, f"@bob:{server}")
    try:
        assert isinstance(await alice.register("alice", "pw-alice"), RegisterResponse)
        assert isinstance(await bob.register("bob", "pw-bob"), RegisterResponse)
        # Rooms until both writers own one (each new room lands on either: 2**-40 to fail).
        owned: dict[str, str] = {}
        for _ in range(40):
            created = await alice.room_create(invite=[bob.user_id])
            assert isinstance(created, RoomCreateResponse), created
            owner = writer_for_room(created.room_id, config.writers_of("events"))
            owned.setdefault(owner, created.room_id)
            if len(owned) == 2:
                break
        assert set(owned) == {"w1", "w2"}
        for room_id in owned.values():
            assert isinstance(await bob.join(room_id), JoinResponse)
        first = await bob.sync(timeout=0)
        assert isinstance(first, SyncResponse), first
        seen: list[tuple[str, str]] = []
        sent: list[tuple[str, str]] = []

        async def sync_until(expected: int) -> SyncResponse:
            """Long-poll on the reader until ``expected`` messages were seen in all."""
            last: SyncResponse | None = None
            while len(seen) < expected:
                response = await asyncio.wait_for(
                    bob.sync(timeout=30_000, since=bob.next_batch), 60
                )
                assert isinstance(response, SyncResponse), response
                seen.extend(messages(response))
                last = response
            assert last is not None
            return last

        for name in ("w1", "w2"):
            body = f"from {name}"
            poll = asyncio.create_task(sync_until(len(sent) + 1))
            await send_retrying(alice, owned[name], body)
            sent.append((owned[name], body))
            await poll
        token = SyncToken.parse(bob.next_batch).events
        assert token.position("w1") > 0 and token.position("w2") > 0
        assert token.position("w1") != token.position("w2") or token.minimum > 0

        # w1 dies: the reader keeps serving w2's room; w1 comes back and catches up.
        await processes["w1"].kill()
        body = "while w1 is down"
        await send_retrying(alice, owned["w2"], body)
        sent.append((owned["w2"], body))
        await sync_until(len(sent))
        await processes["w1"].start()
        for i in range(3):
            for name in ("w1", "w2"):
                body = f"after restart {name} {i}"
                await send_retrying(alice, owned[name], body)
                sent.append((owned[name], body))
        await sync_until(len(sent))
        assert sorted(seen) == sorted(sent)  # nothing missed, nothing twice
        for room_id in owned.values():
            in_room = [b for r, b in seen if r == room_id]
            assert in_room == [b for r, b in sent if r == room_id]  # in order per room
    finally:
        await alice.close()
        await bob.close()


# -- writes forwarded to their stream's writer --------------------------------------------


async def test_reader_forwards_user_data_typing_rooms_and_v10_redactions(
    split_cluster: Cluster,
) -> None:
    _, raw = split_cluster
    url = urls(raw)
    async with aiohttp.ClientSession() as session:
        alice = await register(session, url["reader"], "alice")
        # Bob reads on w1, which writes neither receipts nor typing: he sees what the reader
        # forwarded to w2 by replication.
        bob = (await register(session, url["reader"], "bob")).on(url["w1"])
        bob_device = (await bob.on(url["reader"]).ok("GET", "/account/whoami"))["device_id"]

        # createRoom on the reader: the version and preset are the writer's to apply.
        rooms = {}
        for version, preset in (("10", "private_chat"), ("11", "public_chat")):
            created = await alice.ok(
                "POST",
                "/createRoom",
                {"room_version": version, "preset": preset, "invite": [bob.user_id]},
            )
            rooms[version] = room_id = created["room_id"]
            create = await alice.ok("GET", f"/rooms/{room_id}/state/m.room.create/")
            assert create["room_version"] == version
            rule = await alice.ok("GET", f"/rooms/{room_id}/state/m.room.join_rules/")
            assert rule["join_rule"] == ("invite" if preset == "private_chat" else "public")
            history = await alice.ok("GET", f"/rooms/{room_id}/messages?dir=b&limit=100")
            rules = [e for e in history["chunk"] if e["type"] == "m.room.join_rules"]
            assert len(rules) == 1, rules  # the preset's join rule, sent once
            await bob.ok("POST", f"/rooms/{room_id}/join", {})
        v10, v11 = rooms["10"], rooms["11"]
        await bob.sync_until(lambda r: v10 in r["rooms"]["join"] and v11 in r["rooms"]["join"])

        # A version-10 redaction sent on the reader: top-level redacts, forwarded.
        message = await alice.ok(
            "PUT", f"/rooms/{v10}/send/m.room.message/m1", {"msgtype": "m.text", "body": "oops"}
        )
        redaction = await alice.ok(
            "PUT", f"/rooms/{v10}/redact/{message['event_id']}/r1", {"reason": "typo"}
        )

        def redacted(response: dict[str, Any]) -> bool:
            events = joined(response, v10)["timeline"]["events"]
            return any(e["event_id"] == redaction["event_id"] for e in events)

        response = await bob.sync_until(redacted)
        events = {e["event_id"]: e for e in joined(response, v10)["timeline"]["events"]}
        assert events[redaction["event_id"]]["redacts"] == message["event_id"]
        assert "redacts" not in events[redaction["event_id"]]["content"]
        seen = await bob.ok("GET", f"/rooms/{v10}/event/{message['event_id']}")
        assert seen["content"] == {}  # the redaction applied

        # Receipts and typing (w2), to-device (w1), all sent on the reader.
        # A threaded receipt: validated on the reader, forwarded with its thread.
        await alice.ok(
            "POST", f"/rooms/{v10}/receipt/m.read/{message['event_id']}", {"thread_id": "main"}
        )
        await alice.ok("PUT", f"/rooms/{v11}/typing/{alice.user_id}", {"typing": True})
        await alice.ok(
            "PUT",
            "/sendToDevice/org.example.ping/d1",
            {"messages": {bob.user_id: {bob_device: {"n": 1}}}},
        )
        got: dict[str, Any] = {}

        def ephemeral(response: dict[str, Any]) -> bool:
            for room_id in (v10, v11):
                for event in joined(response, room_id)["ephemeral"]["events"]:
                    got[event["type"]] = event["content"]
            for event in response["to_device"]["events"]:
                got[event["type"]] = event
            return {"m.receipt", "m.typing", "org.example.ping"} <= set(got)

        await bob.sync_until(ephemeral)
        receipt = got["m.receipt"][message["event_id"]]["m.read"][alice.user_id]
        assert receipt["thread_id"] == "main"
        assert got["m.typing"] == {"user_ids": [alice.user_id]}
        assert got["org.example.ping"]["sender"] == alice.user_id
        assert got["org.example.ping"]["content"] == {"n": 1}

        # Account data (w1): global, per room, a tag and a read marker; alice reads hers on
        # w2, which writes none of it.
        await alice.ok("PUT", f"/user/{alice.user_id}/account_data/org.example.g", {"g": 1})
        room_data = f"/user/{alice.user_id}/rooms/{v11}/account_data/org.example.r"
        await alice.ok("PUT", room_data, {"r": 2})
        await alice.ok("PUT", f"/user/{alice.user_id}/rooms/{v11}/tags/u.work", {"order": 0.5})
        await alice.ok("POST", f"/rooms/{v10}/read_markers", {"m.fully_read": message["event_id"]})
        reading = alice.on(url["w2"])
        data: dict[str, Any] = {}

        def all_data(response: dict[str, Any]) -> bool:
            for event in response["account_data"]["events"]:
                if event["type"] != "m.push_rules":  # every initial sync has the defaults
                    data[event["type"]] = event["content"]
            for room_id in (v10, v11):
                for event in joined(response, room_id)["account_data"]["events"]:
                    data[f"{room_id} {event['type']}"] = event["content"]
            return len(data) == 4

        await reading.sync_until(all_data)
        assert data == {
            "org.example.g": {"g": 1},
            f"{v11} org.example.r": {"r": 2},
            f"{v11} m.tag": {"tags": {"u.work": {"order": 0.5}}},
            f"{v10} m.fully_read": {"event_id": message["event_id"]},
        }
        tags = await reading.ok("GET", f"/user/{alice.user_id}/rooms/{v11}/tags")
        assert tags == {"tags": {"u.work": {"order": 0.5}}}


async def test_writes_for_a_down_writer_answer_503_matrix_json(split_cluster: Cluster) -> None:
    processes, raw = split_cluster
    url = urls(raw)
    async with aiohttp.ClientSession() as session:
        alice = await register(session, url["reader"], "alice")
        room_id = (await alice.ok("POST", "/createRoom", {}))["room_id"]
        await processes["w1"].kill()  # writes account data, to-device, and creates rooms
        await processes["w2"].kill()  # writes receipts and typing
        attempts = [
            ("PUT", f"/user/{alice.user_id}/account_data/org.example.g", {"g": 1}),
            ("PUT", f"/user/{alice.user_id}/rooms/{room_id}/tags/u.work", {}),
            ("PUT", "/sendToDevice/org.example.ping/d1", {"messages": {alice.user_id: {}}}),
            ("PUT", f"/rooms/{room_id}/typing/{alice.user_id}", {"typing": True}),
            ("POST", f"/rooms/{room_id}/read_markers", {"m.read": "$e"}),
            ("POST", "/createRoom", {"room_version": "10"}),
        ]
        for method, path, body in attempts:
            status, answer = await alice.call(method, path, body)
            assert status == 503, (path, status, answer)
            assert answer["errcode"] == "M_UNAVAILABLE", (path, answer)
            assert isinstance(answer["retry_after_ms"], int), (path, answer)


async def test_logout_on_one_process_ends_the_token_on_another(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    """Each process caches token owners; a logout on the reader (forwarded to w1, the
    ``caches`` writer, which streams the invalidation) ends the token on w2 as well."""
    async with run_cluster(tmp_path, pg_database, {"caches": ["w1"]}) as (_, raw):
        urls = {
            name: f"http://127.0.0.1:{raw['instances'][name]['http_port']}/_matrix/client/v3"
            for name in ("reader", "w2")
        }
        async with aiohttp.ClientSession() as session:
            body = {"username": "carol", "password": "pw-carol", "auth": {"type": "m.login.dummy"}}
            async with session.post(urls["reader"] + "/register", json=body) as resp:
                assert resp.status == 200
                token = (await resp.json())["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            async with session.get(urls["w2"] + "/account/whoami", headers=headers) as resp:
                assert resp.status == 200  # now in w2's token cache
            async with session.post(urls["reader"] + "/logout", headers=headers, json={}) as resp:
                assert resp.status == 200
            async with session.get(urls["reader"] + "/account/whoami", headers=headers) as resp:
                assert resp.status == 401  # at once where the logout was made
            for _ in range(300):  # until the caches row has reached w2 (bounded)
                async with session.get(urls["w2"] + "/account/whoami", headers=headers) as resp:
                    status, answer = resp.status, await resp.json()
                if status == 401:
                    break
                await asyncio.sleep(0.05)  # replication is asynchronous; not synchronisation
            assert (status, answer["errcode"]) == (401, "M_UNKNOWN_TOKEN")
