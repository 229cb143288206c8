"""Push rules and pushers across processes (PostgreSQL, Redis): rules changed on the
reader (written by the account_data writer w1) decide what w1, the one pushers writer,
delivers for events persisted by either events writer; ``/pushers/set`` on the reader is
forwarded to w1; the gateway gets each notification once, in order."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.support.cluster import USER_DATA_WRITERS, register, run_cluster, urls
from tests.support.push_gateway import gateway, pusher_body
from tests.support.wait import wait_for


async def test_one_process_delivers_what_rules_set_anywhere_call_for(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    writers = {**USER_DATA_WRITERS, "pushers": ["w1"]}
    async with (
        gateway() as gw,
        run_cluster(tmp_path, pg_database, writers) as (_, raw),
        aiohttp.ClientSession() as session,
    ):
        url = urls(raw)
        alice = (await register(session, url["w1"], "alice")).on(url["reader"])
        bob = (await register(session, url["w1"], "bob")).on(url["w2"])
        carol = (await register(session, url["w1"], "carol")).on(url["w1"])
        await alice.ok("POST", "/pushers/set", pusher_body(gw.url))
        assert len((await alice.on(url["w2"]).ok("GET", "/pushers"))["pushers"]) == 1
        await alice.ok("PUT", f"/pushrules/global/sender/{carol.user_id}", {"actions": []})
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
