"""Push rules and pushers across processes (PostgreSQL, Redis): rules changed on the
reader are written by the push_rules writer w2 and reach w1, the one pushers writer,
only through the ``push_rules`` stream (w1 also writes account data, whose rows no longer
invalidate rules); they decide what w1 delivers for events persisted by either events
writer and what its ``/notifications`` lists; ``/pushers/set`` on the reader is forwarded
to w1; the gateway gets each notification once, in order; a logout on the reader removes
the device's pusher on w1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.support.cluster import USER_DATA_WRITERS, Client, register, run_cluster, urls
from tests.support.push_gateway import gateway, pusher_body
from tests.support.wait import wait_for


async def _sender_rules(client: Client) -> list[str]:
    rules: list[dict[str, Any]] = await client.ok("GET", "/pushrules/global/sender/")
    return [r["rule_id"] for r in rules]


async def test_one_process_delivers_what_rules_set_anywhere_call_for(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    writers = {**USER_DATA_WRITERS, "pushers": ["w1"], "push_rules": ["w2"], "caches": ["w2"]}
    async with (
        gateway() as gw,
        run_cluster(tmp_path, pg_database, writers) as (_, raw),
        aiohttp.ClientSession() as session,
    ):
        url = urls(raw)
        alice = (await register(session, url["w1"], "alice")).on(url["reader"])
        alice_on_w1 = alice.on(url["w1"])
        bob = (await register(session, url["w1"], "bob")).on(url["w2"])
        carol = (await register(session, url["w1"], "carol")).on(url["w1"])
        await alice.ok("POST", "/pushers/set", pusher_body(gw.url))
        assert len((await alice.on(url["w2"]).ok("GET", "/pushers"))["pushers"]) == 1
        assert await _sender_rules(alice_on_w1) == []  # w1 caches alice's rules now
        await alice.ok("PUT", f"/pushrules/global/sender/{carol.user_id}", {"actions": []})

        async def w1_mutes_carol() -> bool:
            return await _sender_rules(alice_on_w1) == [carol.user_id]

        # The rule reaches w1 through the push_rules stream (its cached rules forgotten).
        await wait_for(w1_mutes_carol, 60, "the rule on w1")
        # What clients see: m.push_rules in /sync's account data, on any process.
        synced = await alice.on(url["w2"]).sync_until(
            lambda r: any(
                e["type"] == "m.push_rules"
                and carol.user_id in [x["rule_id"] for x in e["content"]["global"]["sender"]]
                for e in r.get("account_data", {}).get("events", [])
            )
        )
        assert synced["next_batch"]
        rooms = []
        for _ in range(2):  # rooms hash to both events writers, most likely
            room = (await bob.ok("POST", "/createRoom", {"preset": "public_chat"}))["room_id"]
            await alice.ok("POST", f"/join/{room}", {})
            await carol.ok("POST", f"/join/{room}", {})
            rooms.append(room)
        expected = []
        for i, room in enumerate(rooms * 2):
            for who, body in ((carol, f"muted {i}"), (bob, f"m{i}")):
                path = f"/rooms/{room}/send/m.room.message/t{i}"
                await who.ok("PUT", path, {"msgtype": "m.text", "body": body})
            expected.append(f"m{i}")
        await wait_for(lambda: len(gw.received) >= len(expected), 60, "every notification")
        assert sorted(gw.bodies()) == sorted(expected)
        # Per room, in the order the events arrived.
        for room in rooms:
            got = [n["content"]["body"] for n in gw.received if n["room_id"] == room]
            assert got == sorted(got, key=lambda b: int(b[1:]))
        listed = await alice_on_w1.ok("GET", "/notifications")
        assert all(
            not n["event"]["content"]["body"].startswith("muted") for n in listed["notifications"]
        )

        # Unmuted on the reader: w1 hears of it only from the stream again.
        await alice.ok("DELETE", f"/pushrules/global/sender/{carol.user_id}")

        async def w1_forgot_the_rule() -> bool:
            return await _sender_rules(alice_on_w1) == []

        await wait_for(w1_forgot_the_rule, 60, "the deletion on w1")
        # w1's /notifications now lists carol's messages (evaluated under the new rules),
        # and its pusher delivers what she sends next.
        listed = await alice_on_w1.ok("GET", "/notifications")
        bodies = [n["event"]["content"]["body"] for n in listed["notifications"]]
        assert sum(b.startswith("muted") for b in bodies) == len(expected)
        path = f"/rooms/{rooms[0]}/send/m.room.message/unmuted"
        await carol.ok("PUT", path, {"msgtype": "m.text", "body": "unmuted"})
        await wait_for(lambda: "unmuted" in gw.bodies(), 60, "carol's message pushed")
        assert len(gw.received) == len(expected) + 1

        # Logging out on the reader (carried out by the caches writer w2) removes the
        # pusher alice's device set, on the pushers writer w1.
        await alice.ok("POST", "/logout", {})
        login = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "alice"},
            "password": "pw-alice",
        }
        async with session.post(url["w2"] + "/_matrix/client/v3/login", json=login) as resp:
            assert resp.status == 200
            token = (await resp.json())["access_token"]
        again = Client(session, url["w1"], alice.user_id, token)
        assert (await again.ok("GET", "/pushers"))["pushers"] == []
